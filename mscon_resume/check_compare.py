"""The resume check's judgement: what a relaunched run (R) wrote and printed, against the
uninterrupted run (U) of the same script, rank by rank (``check.py`` runs them).

Pure over files: metrics JSON lines and captured output, no MindSpore.
"""

from __future__ import annotations

import enum
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Fields a record may differ in between two runs that compute the same: when and how fast.
TIMING = frozenset({"ts", "arrive_ts", "step_time_s", "samples_per_s"})
REFUSES = "refuses to resume"
LIBRARY = "mscon_resume:"  # the library's own lines: a relaunch says other things than the first run
_RESUMES_AFTER = re.compile(r"resumes after step (\d+)")
# MindSpore's C++ log lines ("[WARNING] ME(1234,...)", "[ERROR] MD(...)"): pids and times differ
_FRAMEWORK_LOG = re.compile(r"^\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|EXCEPTION)\] [A-Z_]+\(")


class Kind(enum.Enum):
    """The verdict kinds; the value is the check's exit code."""

    EXACT = 0
    DIFFERS = 1
    USAGE = 2
    REFUSED = 3
    FAILS = 4
    STARTS_OVER = 5


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    line: str  # the one line printed first
    details: tuple[str, ...] = ()

    @property
    def code(self) -> int:
        return self.kind.value


@dataclass(frozen=True)
class RankRun:
    """One rank of one run, read back from its files."""

    records: tuple[dict[str, Any], ...]
    lines: tuple[str, ...]  # everything it printed, stdout and stderr

    @property
    def steps(self) -> dict[int, dict[str, Any]]:
        return {r["step"]: r for r in self.records if _is_step(r)}

    @property
    def finals(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in self.records:
            final = r.get("final")
            if isinstance(final, dict) and "stage" in final:
                out.setdefault(str(final["stage"]), final)
        return out

    @property
    def resumed_after(self) -> int:
        """The step this run resumed after, by its line or its resume record (0: none)."""
        steps = [int(m.group(1)) for m in map(_RESUMES_AFTER.search, self.lines) if m]
        for r in self.records:
            what = r.get("resume")
            if isinstance(what, dict) and isinstance(what.get("step"), int):
                steps.append(what["step"])
        return max(steps, default=0)

    @property
    def refusal(self) -> str | None:
        return next((line.strip() for line in self.lines if REFUSES in line), None)

    @property
    def printed(self) -> tuple[str, ...]:
        """The script's own lines: without the library's and MindSpore's log lines."""
        return tuple(
            line
            for line in self.lines
            if not line.startswith(LIBRARY) and not _FRAMEWORK_LOG.match(line) and line.strip()
        )

    def start_reason(self) -> str:
        """Why a run started over, in its own words if it gave any."""
        for r in self.records:
            what = r.get("resume")
            if isinstance(what, dict) and what.get("reason"):
                return str(what["reason"])
            if isinstance(what, dict):
                return f"its resume record says step {what.get('step')} ({what.get('source')})"
        said = [line.strip() for line in self.lines if line.startswith(LIBRARY)]
        if said:
            return said[0]
        if not self.records:
            return "no mscon_resume line or metrics record (does the script use mscon_resume?)"
        return ""


@dataclass(frozen=True)
class Run:
    """One run of the script: its exit status (None: killed, or still running at the timeout)."""

    code: int | None
    ranks: tuple[RankRun, ...]
    timed_out: bool = False

    def last_line(self) -> str:
        for rank in self.ranks:
            for line in reversed(rank.lines):
                if line.strip():
                    return line.strip()
        return "(no output)"


@dataclass(frozen=True)
class Difference:
    rank: int
    what: str
    uninterrupted: str
    relaunched: str

    def line(self) -> str:
        where = f"rank {self.rank} {self.what}"
        return f"differs: {where}: uninterrupted {self.uninterrupted} / relaunched {self.relaunched}"


# ------------------------------------------------------------------ reading


def read_records(path: Path) -> tuple[dict[str, Any], ...]:
    """The JSON object lines of a metrics file; a line cut by a kill, or anything else, is skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return tuple(out)


def read_lines(path: Path, same: dict[str, str] | None = None) -> tuple[str, ...]:
    """A captured output's lines; ``same``: texts to replace (each run's own folder names one
    placeholder, so a script that prints its state folder prints the same in every run)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    for old, new in (same or {}).items():
        text = text.replace(old, new)
    return tuple(text.splitlines())


# ------------------------------------------------------------------ comparing


def _is_step(record: dict[str, Any]) -> bool:
    step = record.get("step")
    return isinstance(step, int) and not isinstance(step, bool) and "resume" not in record


def _same(a: Any, b: Any) -> bool:
    """Equal, floats bit for bit (a loss off in its last bit is a different computation)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return bool(a == b)


def _show(value: Any) -> str:
    return "(missing)" if value is _MISSING else repr(value)


_MISSING = object()


def compare_steps(u: RankRun, r: RankRun) -> tuple[tuple[str, str, str] | None, int]:
    """(the first difference as (what, uninterrupted, relaunched), or None; steps compared)."""
    u_steps, r_steps = u.steps, r.steps
    compared = 0
    for step in sorted(r_steps):
        mine = u_steps.get(step)
        if mine is None:
            return (f"step {step}", "(no such step)", "a record"), compared
        theirs = r_steps[step]
        for key in [k for k in mine if k not in TIMING] + [
            k for k in theirs if k not in TIMING and k not in mine
        ]:
            a, b = mine.get(key, _MISSING), theirs.get(key, _MISSING)
            if a is _MISSING or b is _MISSING or not _same(a, b):
                return (f"step {step} {key}", _show(a), _show(b)), compared
        compared += 1
    if u_steps and r_steps and max(r_steps) != max(u_steps):
        return ("last step", str(max(u_steps)), str(max(r_steps))), compared
    if u_steps and not r_steps:
        return ("steps", f"{len(u_steps)} records", "none"), compared
    return None, compared


def compare_finals(u: RankRun, k: RankRun, r: RankRun) -> tuple[str, str, str] | None:
    """Every stage U finished must be in R with the same digest; R may lack one K finished before
    the kill (the relaunch starts after it)."""
    u_finals, r_finals = u.finals, r.finals
    for stage, mine in u_finals.items():
        theirs = r_finals.get(stage)
        if theirs is None:
            if stage in k.finals:
                continue
            return (f"final of stage {stage}", f"digest {mine.get('digest')}", "(never finished)")
        if mine.get("digest") == theirs.get("digest"):
            continue
        a, b = mine.get("parts") or {}, theirs.get("parts") or {}
        for key in list(a) + [key for key in b if key not in a]:
            if a.get(key) != b.get(key):
                return (f"final of stage {stage} part {key}", str(a.get(key)), str(b.get(key)))
        return (f"final of stage {stage}", f"digest {mine.get('digest')}", f"digest {theirs.get('digest')}")
    for stage, theirs in r_finals.items():
        if stage not in u_finals:
            return (f"final of stage {stage}", "(never finished)", f"digest {theirs.get('digest')}")
    return None


def compare_lines(u: tuple[str, ...], r: tuple[str, ...]) -> tuple[str, str, str] | None:
    """R's lines equal U's aligned from the end (R, resumed, prints fewer); R's first lines before
    that may be reprints of lines U printed earlier (a resumed epoch's header), nothing else."""
    same = 0
    while same < len(u) and same < len(r) and u[-1 - same] == r[-1 - same]:
        same += 1
    earlier = set(u[: len(u) - same])
    for j in range(len(r) - same):
        if r[j] not in earlier:
            at = len(u) - (len(r) - j)
            return (f"printed line {j + 1}", repr(u[at]) if at >= 0 else "(nothing)", repr(r[j]))
    return None


def compare_rank(
    rank: int, u: RankRun, k: RankRun, r: RankRun, u_code: int | None, r_code: int | None
) -> tuple[Difference | None, int]:
    """(the rank's first difference or None, the steps compared)."""
    found, compared = compare_steps(u, r)
    found = found or compare_finals(u, k, r) or compare_lines(u.printed, r.printed)
    if found is None and u_code != r_code:
        found = ("exit code", _code(u_code), _code(r_code))
    return (Difference(rank, *found) if found else None), compared


def _code(code: int | None) -> str:
    return "(still running)" if code is None else str(code)


# ------------------------------------------------------------------ the verdict


def judge(u: Run, k: Run, r: Run, details: tuple[str, ...] = ()) -> Verdict:
    """The verdict on three runs of one script: U uninterrupted, K killed, R relaunched."""
    if u.timed_out or u.code != 0:
        how = "still running at the timeout" if u.timed_out else f"exit {u.code}"
        return Verdict(Kind.FAILS, f"the script fails uninterrupted ({how}): {u.last_line()}", details)
    for rank in r.ranks:
        if rank.refusal is not None:
            return Verdict(Kind.REFUSED, f"refused: {rank.refusal}", details)
    empty = RankRun((), ())
    compared = 0
    for i, mine in enumerate(u.ranks):
        theirs = r.ranks[i] if i < len(r.ranks) else empty
        killed = k.ranks[i] if i < len(k.ranks) else empty
        diff, n = compare_rank(i, mine, killed, theirs, u.code, None if r.timed_out else r.code)
        if diff is not None:
            return Verdict(Kind.DIFFERS, diff.line(), details)
        compared = compared if i else n
    first = r.ranks[0] if r.ranks else empty
    after = first.resumed_after
    if not after:
        reason = first.start_reason()
        return Verdict(
            Kind.STARTS_OVER,
            "starts over (exact, but no resume)" + (f": {reason}" if reason else ""),
            details,
        )
    return Verdict(
        Kind.EXACT, f"resumes exactly (rank 0 resumed after step {after}; {compared} steps compared)", details
    )
