"""Where the console's events come from: a live supervisor, or a recording replayed.

Both give the app the same things: a ClusterState kept current, every event handed to one
handler (which only buffers it), a clock, and ``submit`` for commands (a replay ignores them).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from mscon.agent.protocol import (
    LogBatch,
    Metric,
    MetricBatch,
    NodeSummary,
    ProcExited,
    ProcHung,
    ProcStarted,
    Telemetry,
    TelemetryBatch,
    rank_of,
)
from mscon.console.detach.attach import Attacher
from mscon.console.engine.bus import Subscription
from mscon.console.engine.commands import Command, StopJob
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptStarted,
    Event,
    NodeUpdate,
    RunFinished,
    RunResult,
    StragglerCleared,
    StragglerFlagged,
)
from mscon.console.engine.lines_wanted import default_lines
from mscon.console.engine.state import ClusterState
from mscon.console.engine.stragglers import StragglerPolicy, StragglerWatch
from mscon.console.engine.supervisor import Supervisor

Handler = Callable[[Event], None]

SLURM_NO_DETACH = "Detach is not possible with Slurm nodes: the srun step ends with the console."

# The view keeps every log batch and lifecycle event; metrics beyond this backlog are skipped.
TUI_LAG_LIMIT = 20_000
TUI_HARD_LIMIT = 1_000_000


class Source(ABC):
    """Events in, commands out."""

    live: bool = False

    def __init__(self) -> None:
        self.state = ClusterState()
        self.result: RunResult | None = None
        self.done = asyncio.Event()
        self.stop_requested = False
        self._task: asyncio.Task[int] | None = None

    @property
    def title(self) -> str:
        return "live" if self.live else "replay"

    @property
    def accepts_commands(self) -> bool:
        return self.live

    @abstractmethod
    async def _run(self, handler: Handler) -> int: ...

    def start(self, handler: Handler) -> None:
        """Start producing events (on the running loop); idempotent."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._main(handler), name="mscon-source")

    async def _main(self, handler: Handler) -> int:
        try:
            return await self._run(handler)
        finally:
            self.done.set()

    @property
    def started(self) -> bool:
        return self._task is not None

    def submit(self, cmd: Command) -> bool:
        """Send a command; False when this source ignores commands (a replay)."""
        return False

    @property
    def detach_refused(self) -> str | None:
        """Why this run cannot be detached (as ``--detach`` is refused), or None."""
        return None

    def now_ns(self) -> int:
        return time.time_ns()

    async def finish(self) -> int:
        """Stop what is still running and wait for the end; the run's exit code."""
        if self._task is None:
            return 0
        if not self._task.done():
            self.submit(StopJob("the console was closed"))
        return await self._task


class LiveSource(Source):
    """A Supervisor run in the same loop; the view is one more sink on its bus."""

    live = True

    def __init__(self, supervisor: Supervisor | Attacher) -> None:
        super().__init__()
        self.sup = supervisor
        self.state = supervisor.state  # the supervisor's own picture: current before the event is sent
        self.subscription: Subscription | None = None
        self._opened: set[int] = set()  # ranks whose pane was opened

    async def _run(self, handler: Handler) -> int:
        self.subscription = self.sup.bus.add_sink(
            "tui", handler, lag_limit=TUI_LAG_LIMIT, hard_limit=TUI_HARD_LIMIT
        )
        self._show_lines()
        result = await self.sup.run()
        self.result = result
        return result.exit_code

    @property
    def detach_refused(self) -> str | None:
        inv = getattr(self.sup, "inv", None)
        if getattr(inv, "slurm", None) is not None:
            # As the --detach flag: srun's step ends with the console (its cgroup with it), and a
            # detach secret would cross the Slurm link.
            return SLURM_NO_DETACH
        return None

    def rank_in_sight(self, name: str) -> None:
        """A rank's pane was opened: its lines are wanted from now on (and its recent ones)."""
        rank = rank_of(name)
        if rank is not None and rank not in self._opened:
            self._opened.add(rank)
            self._show_lines()

    def _show_lines(self) -> None:
        """What the panes show (issue 44): every rank's lines in a small run; in a large one rank
        0's and those of the ranks whose pane was opened (the others' are on their nodes)."""
        want = getattr(self.sup, "want_lines", None)  # an Attacher's agents are not subscribed
        inv = getattr(self.sup, "inv", None)
        if want is None or inv is None:
            return
        base = default_lines(inv.world_size)
        want("tui", None if base is None else base | self._opened)

    def submit(self, cmd: Command) -> bool:
        if isinstance(cmd, StopJob):
            self.stop_requested = True
        self.sup.submit(cmd)
        return True

    async def finish(self) -> int:
        # A run this console started stops with it; an attached run is only left (Attacher).
        if self._task is None:
            return 0
        if not self._task.done():
            self.submit(self.sup.closing_command())
        return await self._task


def event_time_ns(ev: Event) -> int | None:
    """When an event happened by its own clock (agent or console), where it says."""
    if isinstance(ev, AgentEvent):
        msg = ev.msg
        if isinstance(msg, LogBatch | ProcStarted | ProcExited | ProcHung):
            return msg.ts_ns or None
        if isinstance(msg, Metric | Telemetry | NodeSummary):
            return int(msg.ts * 1e9) if msg.ts else None
        if isinstance(msg, MetricBatch | TelemetryBatch):
            last = (msg.metrics or (None,))[-1] if isinstance(msg, MetricBatch) else (msg.items or (None,))[0]
            return int(last.ts * 1e9) if last is not None and last.ts else None
        return getattr(msg, "ts_ns", None) or None
    if isinstance(ev, NodeUpdate | AttemptStarted | AttemptEnded):
        return ev.ts_ns or None
    return None


class ReplaySource(Source):
    """A recording (``mscon run --events``) fed into a ClusterState at ``speed`` x real time
    (0: as fast as possible), in recorded order; gaps longer than ``max_gap_s`` are shortened."""

    def __init__(
        self,
        events: Sequence[Event],
        speed: float = 1.0,
        max_gap_s: float = 2.0,
        policy: StragglerPolicy | None = None,
    ) -> None:
        super().__init__()
        self.events = list(events)
        self.speed = speed
        self.max_gap_s = max_gap_s
        # A recording with no straggler events (made before the engine derived them) gets them
        # derived here, as the engine would have with ``policy`` (its verdicts do not depend on time).
        recorded = any(isinstance(ev, StragglerFlagged | StragglerCleared) for ev in self.events)
        self.stragglers = None if recorded else StragglerWatch(policy or StragglerPolicy(), self.state)
        self.position = 0
        self._clock_ns: int | None = None  # the recording's time at the last event replayed

    def now_ns(self) -> int:
        """The recording's clock: what the elapsed time reads is the same at any speed."""
        return self._clock_ns if self._clock_ns is not None else 0

    async def _run(self, handler: Handler) -> int:
        for i, ev in enumerate(self.events):
            t = event_time_ns(ev)
            if t is not None:
                if self._clock_ns is not None and t > self._clock_ns and self.speed > 0:
                    gap = min((t - self._clock_ns) / 1e9, self.max_gap_s)
                    await asyncio.sleep(gap / self.speed)
                if self._clock_ns is None or t > self._clock_ns:
                    self._clock_ns = t
            if self.speed <= 0 and i % 500 == 499:
                await asyncio.sleep(0)  # as fast as possible, but the view keeps breathing
            self.state.apply(ev)
            self.position = i + 1
            if isinstance(ev, RunFinished):
                self.result = ev.result
            handler(ev)
            if self.stragglers is not None and isinstance(ev, AgentEvent):
                msg = ev.msg
                if isinstance(msg, Metric | MetricBatch | NodeSummary):
                    # A summary holds several ranks' metrics: the watch takes them one by one.
                    for one in msg.metrics if isinstance(msg, NodeSummary) else (msg,):
                        for derived in self.stragglers.observe(ev.attempt, one):
                            self.state.apply(derived)
                            handler(derived)
        return self.result.exit_code if self.result is not None else 0
