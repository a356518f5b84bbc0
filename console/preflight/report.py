"""The headless view of preflight: a node x check table, the checks across nodes, then what to do.

A sink of the event bus like the headless reporter: it reads only ``CheckReported`` and
``ChecksFinished`` (plus the run's start, unreachable nodes and its end), so the TUI, a recording
and this table show the same results. ``mscon check`` prints the table on stdout; before
``mscon run`` the same block goes to stderr (stdout is the ranks'), in full only when something
failed. Colour only for a person at a terminal, never with NO_COLOR set.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from mscon.console.engine.events import (
    CheckReported,
    ChecksFinished,
    CheckStatus,
    Event,
    NodeState,
    NodeUpdate,
    Notice,
    RunFinished,
    RunResult,
    RunStarted,
    dump,
)
from mscon.console.preflight.checks import ALL
from mscon.console.transport.base import TransportKind
from mscon.console.views.plain import printable

_CELL = 16  # characters of a value shown in the table (the full value is in the list below it)
_COLOURS = {CheckStatus.OK: "32", CheckStatus.WARN: "33", CheckStatus.FAIL: "1;31", CheckStatus.NA: "2"}
_MARK = {CheckStatus.OK: "", CheckStatus.WARN: "! ", CheckStatus.FAIL: "X ", CheckStatus.NA: ""}
_RANK = {CheckStatus.FAIL: 3, CheckStatus.WARN: 2, CheckStatus.OK: 1, CheckStatus.NA: 0}


def wants_colour(stream: TextIO) -> bool:
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _paint(text: str, status: CheckStatus, colour: bool) -> str:
    return f"\x1b[{_COLOURS[status]}m{text}\x1b[0m" if colour and text.strip() else text


def _clip(text: str, width: int) -> str:
    """At most ``width`` characters, cut at a word where one is near ("23.5 GiB free~")."""
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    if text[width - 1] == " " or space < width // 2:  # already at a word's end, or one long word
        return cut + "~"
    return cut[:space] + "~"


@dataclass(frozen=True, slots=True)
class _Cell:
    status: CheckStatus
    text: str


def _group(name: str) -> str:
    """The table's column of a result: gpu.count and gpu.driver share "gpu", limits.* "limits"."""
    return name.split(".", 1)[0]


def _cell(results: Sequence[CheckReported]) -> _Cell:
    """One column of one node: the worst of its results, with that result's value."""
    worst = max(results, key=lambda r: _RANK[r.status])
    if worst.status is CheckStatus.NA:
        return _Cell(worst.status, "n/a")
    if len(results) > 1 and worst.status is CheckStatus.OK:
        one = {r.value for r in results}
        return _Cell(worst.status, results[0].value if len(one) == 1 and results[0].value else "ok")
    sub = worst.name.split(".", 1)[1] + ": " if "." in worst.name and len(results) > 1 else ""
    text = sub + (worst.value or worst.status.value)
    return _Cell(worst.status, _MARK[worst.status] + printable(text))


def format_table(results: Sequence[CheckReported], nodes: Sequence[str], colour: bool = False) -> list[str]:
    """The node x check table, the checks across nodes, and every warn/fail with its remedy."""
    per_node = [r for r in results if r.node != ALL]
    order = [n for n in nodes] + sorted({r.node for r in per_node} - set(nodes))
    columns: list[str] = []
    for r in per_node:
        if _group(r.name) not in columns:
            columns.append(_group(r.name))
    cells: dict[tuple[str, str], _Cell] = {}
    for node in order:
        for col in columns:
            found = [r for r in per_node if r.node == node and _group(r.name) == col]
            if found:
                cells[(node, col)] = _cell(found)
    everywhere_na = [
        c
        for c in columns
        if all(cells.get((n, c), _Cell(CheckStatus.NA, "")).status is CheckStatus.NA for n in order)
    ]
    shown = [c for c in columns if c not in everywhere_na]
    lines: list[str] = []
    if shown:
        widths = [max(len("node"), *(len(printable(n)) for n in order))]
        for col in shown:
            widths.append(
                max(len(col), *(len(_clip(cells[(n, col)].text, _CELL)) for n in order if (n, col) in cells))
            )
        header = ["node", *shown]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        for node in order:
            row = [printable(node).ljust(widths[0])]
            for col, w in zip(shown, widths[1:], strict=True):
                cell = cells.get((node, col), _Cell(CheckStatus.NA, "-"))
                row.append(_paint(_clip(cell.text, _CELL).ljust(w), cell.status, colour))
            lines.append("  ".join(row).rstrip())
    if everywhere_na:
        lines.append(f"n/a on every node: {', '.join(everywhere_na)}")
    cluster = [r for r in results if r.node == ALL]
    if cluster:
        lines.append("")
        lines.append("across nodes:")
        width = max(len(r.name) for r in cluster)
        for r in cluster:
            status = _paint(r.status.value.ljust(4), r.status, colour)
            lines.append(f"  {r.name.ljust(width)}  {status}  {printable(r.value)}")
    # The same finding on several nodes (a limit, a missing package) is listed once, naming them all.
    same: dict[tuple[CheckStatus, str, str, str], list[str]] = {}
    for r in results:
        if r.status in (CheckStatus.FAIL, CheckStatus.WARN):
            same.setdefault((r.status, r.name, r.value, r.remedy), []).append(r.node)
    rank = {n: i for i, n in enumerate([ALL, *order])}
    for where in same.values():
        where.sort(key=lambda n: rank.get(n, len(rank)))
    bad = sorted(same.items(), key=lambda kv: (-_RANK[kv[0][0]], rank.get(kv[1][0], len(rank)), kv[0][1]))
    if bad:
        lines.append("")
        lines.append("to fix:")
        for (status, name, value, remedy), where in bad:
            nodes = "all nodes" if where == [ALL] else ", ".join(map(printable, where))
            lines.append(
                f"  {_paint(status.value.upper(), status, colour)} {nodes}: {name}: {printable(value)}"
            )
            if remedy:
                lines.append(f"       -> {printable(remedy)}")
    return lines


def _reach_only(r: CheckReported) -> bool:
    """A result of preflight's unreachable nodes: a transport's failure, or an agent's protocol."""
    return r.name in _REACH_NAMES or r.name == "protocol"


_REACH_NAMES = frozenset(k.value for k in TransportKind)


def counts(results: Sequence[CheckReported]) -> dict[CheckStatus, int]:
    out = dict.fromkeys(CheckStatus, 0)
    for r in results:
        out[r.status] += 1
    return out


def preflight_record(results: Sequence[CheckReported], finished: ChecksFinished | None) -> dict[str, Any]:
    """What a run's summary.json records of its preflight."""
    c = counts(results)
    return {
        "ok": c[CheckStatus.OK],
        "warn": c[CheckStatus.WARN],
        "fail": c[CheckStatus.FAIL],
        "failed": list(finished.failed) if finished else [],
        "skipped": list(finished.skipped) if finished else [],
        "warnings": [f"{r.node}: {r.name} ({r.value})" for r in results if r.status is CheckStatus.WARN],
        "results": [dump(r) for r in results],
    }


class CheckReporter:
    """``full``: mscon check (table on ``out``, always); otherwise the block before a run (on ``err``,
    the table only when a check failed, else one line and the warnings)."""

    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
        full: bool = True,
    ) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.full = full
        self.colour = wants_colour(self.out if full else self.err)
        self.nodes: list[str] = []
        self.inventory = ""
        self.results: list[CheckReported] = []
        self.finished: ChecksFinished | None = None
        self.result: RunResult | None = None

    def _write(self, stream: TextIO, text: str) -> None:
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass  # closed: nothing left to tell

    def note(self, text: str) -> None:
        self._write(self.err, f"mscon: {text}\n")

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.nodes, self.inventory = list(event.nodes), event.inventory
        elif isinstance(event, CheckReported):
            self.results.append(event)
        elif isinstance(event, ChecksFinished):
            self.finished = event
            self._show()
        elif not self.full:
            return  # the headless reporter says the rest of a run
        elif isinstance(event, NodeUpdate) and event.state in (NodeState.UNREACHABLE, NodeState.LOST):
            self.note(f"{printable(event.node)}: {event.state.value}: {printable(event.detail)}")
        elif isinstance(event, Notice):
            self.note(event.text)
        elif isinstance(event, RunFinished):
            self.result = event.result
            self._end(event.result)

    def _show(self) -> None:
        c = counts(self.results)
        if c[CheckStatus.FAIL] and all(_reach_only(r) for r in self.results):
            # Nodes that could not be reached: each one's line (cause, transport, remedy) is out
            # already; a table of them would say it again, and no --skip-check applies.
            return
        skipped = self.finished.skipped if self.finished else ()
        tally = f"{c[CheckStatus.OK]} ok, {c[CheckStatus.WARN]} warn, {c[CheckStatus.FAIL]} fail"
        skip_note = f"; skipped (--skip-check): {', '.join(skipped)}" if skipped else ""
        if self.full:
            self._write(self.out, "\n".join(format_table(self.results, self.nodes, self.colour)) + "\n")
            if skip_note:
                self.note(skip_note.removeprefix("; "))
            return
        if c[CheckStatus.FAIL]:
            lines = format_table(self.results, self.nodes, self.colour)
            self._write(self.err, "".join(f"mscon: {line}\n" if line else "\n" for line in lines))
            self.note(
                f"preflight: {tally}{skip_note}; not launching (--skip-check NAME or --no-check to launch)"
            )
            return
        self.note(f"preflight: {tally} on {len(self.nodes)} node(s){skip_note}")
        for r in self.results:
            if r.status is CheckStatus.WARN:
                where = "all nodes" if r.node == ALL else printable(r.node)
                remedy = f" -> {printable(r.remedy)}" if r.remedy else ""
                self.note(f"  warning: {where}: {r.name}: {printable(r.value)}{remedy}")

    def _end(self, result: RunResult) -> None:
        c = counts(self.results)
        if self.finished is None:  # it ended before the checks could run (e.g. the scheduler address)
            self.note(printable(result.reason))
        tally = f"{c[CheckStatus.FAIL]} failed, {c[CheckStatus.WARN]} warning(s)"
        self.note(
            f"check {result.status.value} in {result.wall_s:.1f} s: {tally}; exit code {result.exit_code}"
        )

    def document(self, result: RunResult) -> dict[str, Any]:
        """mscon check --json: the outcome and every result."""
        return {
            "run_id": result.run_id,
            "inventory": self.inventory,
            "nodes": self.nodes,
            "status": result.status.value,
            "exit_code": result.exit_code,
            "reason": result.reason,
            "wall_s": result.wall_s,
            **preflight_record(self.results, self.finished),
        }
