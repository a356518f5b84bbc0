"""The run's summary as JSON: ``summary.json`` in the run folder, and the ``--json`` copy.

Every writer of a summary goes through here, so the file has one shape (``RunResult.to_json()``,
plus sections added after the run such as ``preflight``) wherever it is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, TextIO

from mscon.console.engine.bus import EventBus
from mscon.console.engine.events import JobState, RunResult, json_default
from mscon.console.engine.state import ClusterState
from mscon.console.transport.private_copy import private_text, private_write

SUMMARY_JSON = "summary.json"
# ``--json -``: the summary goes to stdout (and the rank output to stderr, so the JSON stays whole).
STDOUT = Path("-")


def json_target(text: str) -> Path:
    """``--json``'s argument: ``-`` is stdout; any other path is made absolute, so a file that is
    really named ``-`` can still be written as ``./-``."""
    return STDOUT if text == "-" else Path(text).absolute()


def is_stdout(path: Path | None) -> bool:
    return path == STDOUT


def summary_file(logs_dir: Path) -> Path:
    """Where the run folder keeps its summary."""
    return logs_dir / SUMMARY_JSON


def write_summary(path: Path, result: RunResult, **sections: Any) -> None:
    """Write ``result`` (and any extra top-level ``sections``) to ``path``; OSError if it cannot."""
    doc: dict[str, Any] = json_default(result)  # one level: the rest is converted as it is written
    doc.update(sections)
    write_json(path, doc)


def add_to_summary(path: Path, **sections: Any) -> bool:
    """Add top-level sections to a summary already written; False where there is none to add to
    (it was not written, and the run said why) or it cannot be rewritten."""
    if is_stdout(path):
        return False  # what went to stdout cannot be read back: write it whole, once, instead
    try:
        if _append_sections(path, sections):
            return True
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            return False
        doc.update(sections)
        write_json(path, doc)
    except (OSError, ValueError):
        return False
    return True


def _append_sections(path: Path, sections: dict[str, Any]) -> bool:
    """``sections`` written before the closing brace of a summary ``write_json`` wrote (``{``, one
    top-level key a line at indent 2, ``}``) that has none of them yet: the same bytes as loading
    it and writing it again, without a dict per rank summary (twice per rank: 80,000 ranks are
    hundreds of MiB of them). False, having changed nothing, for any other file."""
    keys: set[str] = set()
    with path.open("rb") as f:
        if f.readline() != b"{\n":
            return False
        last = b""
        for line in f:
            if line.startswith(b'  "'):
                keys.add(json.loads(line[2 : line.index(b'": ') + 1]))
            last = line
        size = f.tell()
    if last != b"}\n" or keys & sections.keys() or not sections:
        return False
    out = io.StringIO()
    for i, (k, v) in enumerate(sections.items()):
        out.write(("," if i else "") + ("\n" if i else "") + f"  {json.dumps(k)}: ")
        _dump(v, out, 2)
    body = out.getvalue()

    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))  # 0600 since write_json made it
    try:
        # over the last value's newline and "}\n": the file only grows
        os.pwrite(fd, (",\n" + body + "\n}\n").encode("utf-8"), size - 3)
    finally:
        os.close(fd)
    return True


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write a JSON document to ``path`` (``STDOUT``: to stdout); OSError if it cannot."""

    def write(f: TextIO) -> None:
        # Streamed, never one string: a summary of 80,000 ranks is tens of MiB of JSON.
        _dump(doc, f, 0)
        f.write("\n")

    if is_stdout(path):
        write(sys.stdout)
        sys.stdout.flush()
        return
    # Written in place, not renamed over: --json may name a pipe or /dev/stdout. 0600: it names
    # the run's hosts, ranks and the root cause's log lines.
    private_write(path, write)


# A list or dict with more members than this is written one compact member a line, by json's C
# encoder: json's indented output is pure Python, 3.7 s of CPU for 1,000 nodes' summary. Smaller
# ones are written as ``json.dump(indent=2)`` writes them (the same bytes, up to that size).
BIG = 1024
_LOOK_DEPTH = 3  # how deep a big container is looked for below a value (an attempt's ranks: 2)
_JSON_TYPES = (dict, list, tuple, str, int, float, bool, type(None))
_COMPACT = json.JSONEncoder(default=json_default).encode  # one encoder for every member


def _json_value(value: Any) -> Any:
    """A value as json takes it: a dataclass, message or enum through ``json_default`` (one level)."""
    return value if isinstance(value, _JSON_TYPES) else json_default(value)


def _holds_big(value: Any, depth: int = _LOOK_DEPTH) -> bool:
    value = _json_value(value)
    if not isinstance(value, (dict, list, tuple)):
        return False
    if len(value) > BIG:
        return True
    members = value.values() if isinstance(value, dict) else value
    plain = (str, int, float)
    return depth > 0 and any(_holds_big(m, depth - 1) for m in members if not isinstance(m, plain))


def _dump(value: Any, f: TextIO, indent: int, compact: bool = False) -> None:
    """``value`` at ``indent``: the document and containers that hold a big one, a member a line;
    a big container's members compact; anything else as ``indent=2`` writes it."""
    value = _json_value(value)
    if compact:
        f.write(_COMPACT(value))
        return
    if isinstance(value, dict) and value and (indent == 0 or _holds_big(value)):
        members: Any = ((json.dumps(k) + ": ", v) for k, v in value.items())
        opening, closing, size = "{", "}", len(value)
    elif isinstance(value, (list, tuple)) and value and _holds_big(value):
        members = (("", v) for v in value)
        opening, closing, size = "[", "]", len(value)
    else:
        f.write(json.dumps(value, indent=2, default=json_default).replace("\n", "\n" + " " * indent))
        return
    pad = "\n" + " " * (indent + 2)
    f.write(opening)
    for i, (key, v) in enumerate(members):
        f.write(("," if i else "") + pad + key)
        _dump(v, f, indent + 2, compact=size > BIG)
    f.write("\n" + " " * indent + closing)


def run_result(
    state: ClusterState,
    run_id: str,
    logs_dir: Path,
    status: JobState,
    code: int,
    reason: str,
    wall_s: float,
    bus: EventBus,
) -> RunResult:
    """The run's summary from ClusterState (the supervisor's, and an attached console's)."""
    last = state.attempt
    root = state.root_cause() if status is JobState.FAILED and last is not None else None
    return RunResult(
        run_id=run_id,
        status=status,
        exit_code=code,
        reason=reason,
        root_cause=root,
        ranks=state.rank_summaries() if last is not None else (),
        wall_s=wall_s,
        logs_dir=str(logs_dir),
        attempts=state.attempt_summaries(),
        divergent_ranks=tuple(sorted(state.divergent)),
        dropped=bus.dropped(),
        stragglers=state.straggler_summaries(),
        fetched=state.fetch_summaries(),
    )


def save_traceback(logs_dir: Path) -> None:
    """The exception being handled, in the run folder's engine-error.txt (an internal error)."""
    with contextlib.suppress(OSError):
        private_text(logs_dir / "engine-error.txt", traceback.format_exc())
