"""``.gitignore`` patterns, as git reads them, for the workdir sync (``pathspec`` is not a dependency).

The subset of gitwildmatch that covers real ignore files: ``#`` comments and blank lines, ``!``
to re-include, ``\\`` escapes, a trailing ``/`` for folders only, a ``/`` at the start or in the
middle anchoring the pattern to the file's folder (else it matches a name at any depth), ``*``,
``?`` and ``[...]`` within one path part, and ``**`` as a whole part (``**/x``, ``x/**``,
``a/**/b``). The last rule that matches wins; as in git, nothing under an ignored folder can be
re-included (the walker never enters it). Not covered: trailing-space escapes and the
``core.excludesFile``/``info/exclude`` files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

GITIGNORE = ".gitignore"


@dataclass(frozen=True, slots=True)
class Rule:
    regex: re.Pattern[str]  # matches the path relative to the rule's base folder
    negate: bool
    dir_only: bool
    base: str  # the folder of the file that holds the rule, relative to the workdir ("" at its top)


def parse(lines: list[str], base: str = "") -> list[Rule]:
    """The rules of one ignore file whose folder is ``base`` (relative, "/"-separated)."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        line = line.rstrip(" ")
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        regex = body if anchored or line.startswith("**/") else "(?:.*/)?" + body
        rules.append(Rule(re.compile(regex, re.DOTALL), negate, dir_only, base))
    return rules


def _translate(pattern: str) -> str:
    out = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body[:1] in "!^":
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def ignored(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    """Whether ``rel`` (relative to the workdir, "/"-separated) is ignored by ``rules``."""
    verdict = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.base:
            if not rel.startswith(rule.base + "/"):
                continue
            sub = rel[len(rule.base) + 1 :]
        else:
            sub = rel
        if rule.regex.fullmatch(sub):
            verdict = not rule.negate
    return verdict


def read_rules(folder: Path, base: str) -> list[Rule]:
    """The rules of ``folder``'s ``.gitignore`` (none if it has none or it cannot be read)."""
    path = folder / GITIGNORE
    try:
        if path.is_symlink() or not path.is_file():
            return []
        return parse(path.read_text(encoding="utf-8", errors="replace").splitlines(), base)
    except OSError:
        return []
