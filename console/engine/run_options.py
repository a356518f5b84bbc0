"""What one ``mscon run`` (or ``mscon check``) asks of the Supervisor beyond the inventory: the
command line's overrides and choices."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mscon.agent import layout
from mscon.console.engine.stragglers import DEFAULT_FACTOR, DEFAULT_WINDOW
from mscon.console.preflight.runner import Preflight


@dataclass(frozen=True, slots=True)
class RunOptions:
    script: str | None = None  # overrides the inventory's job.script (relative to workdir)
    args: tuple[str, ...] | None = None
    run_id: str | None = None
    logs_root: Path = Path(layout.LOGS_DIR)
    accept_new_host_keys: bool = False
    max_restarts: int | None = None  # overrides restart.max_restarts
    preflight: Preflight | None = None  # checks before the first attempt (mscon check, mscon run)
    detach: bool = False  # detach as soon as the first attempt has started (mscon run --detach)
    straggler_factor: float = DEFAULT_FACTOR  # --straggler-factor: flag a rank F x the others' step time
    straggler_window: int = DEFAULT_WINDOW  # --straggler-window: over its last N steps
    # After a failed attempt with no restart left: None ends the run (headless); a number of
    # seconds (inf: while the console stays) keeps the agents and waits for the operator's r or q.
    operator_wait_s: float | None = None
    fetch: tuple[str, ...] = ()  # --fetch: parts of run folders copied back too (layout.FETCHED_ON_REQUEST)
    spares: bool = True  # --no-spares: no next-attempt processes started ahead (agent/spares.py)
    # The nodes are this run's: it adopts or ends the standby an earlier run kept there (not so a
    # run nested in another, preflight's smoke test).
    owns_nodes: bool = True
