"""The headless view: rank output prefixed on stdout, mscon's own lines and the summary on stderr."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO

from mscon.agent.protocol import SCHEDULER_RANK

from .bus import Subscription
from .events import (
    AgentError,
    LogBatch,
    LogsFetched,
    Metric,
    NodeState,
    NodeStatus,
    Notice,
    ProcExited,
    ReplicaDivergence,
    RunFinished,
    RunResult,
    RunStarted,
    RunStopping,
)

_PALETTE = ("36", "32", "35", "34", "33", "96", "92", "95", "94", "93")  # ANSI foreground colours


class HeadlessReporter:
    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
        json_path: Path | None = None,
        quiet_states: bool = False,
    ) -> None:
        self.out = out or sys.stdout
        # Colour the prefixes only for a person at a terminal (and never with NO_COLOR set).
        self.colour = self.out.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        self._prefixes: dict[tuple[str, str], str] = {}
        self.err = err or sys.stderr
        self.json_path = json_path
        self.quiet_states = quiet_states
        self.result: RunResult | None = None

    def _prefix(self, node: str, name: str) -> str:
        key = (node, name)
        if key not in self._prefixes:
            text = f"[{node} {name}] "
            if self.colour:
                text = f"\x1b[{_PALETTE[len(self._prefixes) % len(_PALETTE)]}m{text}\x1b[0m"
            self._prefixes[key] = text
        return self._prefixes[key]

    def note(self, text: str) -> None:
        self.err.write(f"mscon: {text}\n")
        self.err.flush()

    async def consume(self, events: Subscription) -> None:
        async for event in events:
            self.handle(event)

    def handle(self, event: object) -> None:
        if isinstance(event, LogBatch):
            prefix = self._prefix(event.node, event.name)
            # One write per batch of whole lines: output of two ranks never mixes inside a line.
            self.out.write("".join(prefix + line + "\n" for line in event.lines))
            self.out.flush()
        elif isinstance(event, RunStarted):
            self.note(
                f"run {event.run_id}: {event.world_size} ranks on {len(event.nodes)} node(s) "
                f"({', '.join(event.nodes)}); logs -> {event.logs_dir}"
            )
        elif isinstance(event, NodeState):
            if event.status in (NodeStatus.UNREACHABLE, NodeStatus.LOST):
                self.note(f"{event.node}: {event.status.value}: {event.detail}")
            elif not self.quiet_states and event.status is NodeStatus.RUNNING:
                self.note(f"{event.node}: agent up ({event.detail}), ranks starting")
        elif isinstance(event, ProcExited):
            if not event.ok and not event.stopped_by_agent:
                what = f"killed by {event.signal}" if event.signal else f"exit code {event.exitcode}"
                self.note(f"{_who(event.name, event.node)} failed: {what}")
        elif isinstance(event, Metric):
            if event.profile_dir:
                self.note(f"{_who(event.name, event.node)}: profiler output in {event.profile_dir}")
        elif isinstance(event, ReplicaDivergence):
            self.note(
                f"WARNING: replicas diverged at step {event.step}: {', '.join(event.ranks)} "
                f"differ from the others' parameters ({event.majority}); check seeds and data masks"
            )
        elif isinstance(event, Notice):
            self.note(event.text)
        elif isinstance(event, RunStopping):
            self.note(f"stopping every rank on every node: {event.reason}")
        elif isinstance(event, AgentError):
            self.note(f"{event.node}: agent: {event.message}")
        elif isinstance(event, LogsFetched):
            if event.error:
                self.note(f"{event.node}: could not fetch logs: {event.error}")
        elif isinstance(event, RunFinished):
            self.result = event.result
            self.finish(event.result)

    def finish(self, result: RunResult) -> None:
        self.err.write(format_summary(result))
        self.err.flush()
        if self.json_path is not None:
            self.json_path.parent.mkdir(parents=True, exist_ok=True)
            self.json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")


def _who(name: str, node: str) -> str:
    return f"{name} on {node}" if name != "sched" else f"the scheduler on {node}"


def format_summary(result: RunResult) -> str:
    header = ("node", "rank", "status", "last step", "last loss", "wall s", "")
    rows = [header]
    for r in sorted(result.ranks, key=lambda r: (r.rank == SCHEDULER_RANK, r.rank)):
        rows.append(
            (
                r.node,
                "sched" if r.rank == SCHEDULER_RANK else str(r.rank),
                r.status,
                "-" if r.last_step is None else str(r.last_step),
                "-" if r.last_loss is None else f"{r.last_loss:.4f}",
                "-" if r.wall_s is None else f"{r.wall_s:.1f}",
                r.role,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    head = f"mscon: run {result.run_id} {result.status.value} in {result.wall_s:.1f} s: {result.reason}"
    lines = ["", head]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    rc = result.root_cause
    if rc is not None:
        what = f"killed by {rc.signal}" if rc.signal else f"exit code {rc.exitcode}"
        lines.append("")
        clock = f"by the agent clock on {rc.node}"
        lines.append(f"Root cause (first failure, {clock}): {_who(rc.name, rc.node)}, {what}")
        shown = rc.traceback.splitlines()[-12:] if rc.traceback else list(rc.tail[-10:])
        if shown:
            lines.append("  last lines:")
            lines.extend("    " + line for line in shown)
    if result.divergent_ranks:
        lines.append(f"replicas that diverged: {', '.join(result.divergent_ranks)}")
    lines.append(f"logs: {result.logs_dir}")
    lines.append(f"exit code: {result.exit_code}")
    return "\n".join(lines) + "\n"
