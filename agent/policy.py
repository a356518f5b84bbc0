"""The run's policy: one state machine, driven by the console's supervisor and by a detached run's
node-0 coordinator alike.

Pure: no I/O and no clock of its own (every input carries ``now``, monotonic seconds), stdlib
only, Python 3.8, so the agent carries it to the nodes. A host turns what it hears (agent
messages, operator commands, ticks, a rank's progress) into its inputs (``policy_types.py``,
re-exported here), calls ``RunPolicy.step`` and carries out the actions it returns, in order.
``step`` is the only way in: it looks the input up in ``TABLE`` by (``RunPhase``, input type), one
small handler per row (the shape of h11's ``_state.py``). Neither host decides anything itself:

- a rank fails, hangs, or a node is lost or cannot start its processes: stop every node;
- attempt 0 waits for every node's word on a kept standby (``ADOPT_WAIT_S`` at most): warm when
  all adopted theirs, cold at once when one did not or was lost (all or nothing);
- every node has stopped: restart the group while the budget lasts (an operator's restart does
  not use it): at once when its ranks had stepped, after the backoff when it failed in start-up;
  with no budget left, an interactive run waits for the operator (``r`` restarts, ``q`` ends with
  the failed attempt's verdict), a headless one ends;
- a restart is warm (``StartAttempt.warm``: the processes of the standby cluster the spares joined
  during the attempt) when every node has said its spares for it are ready, else cold; when every
  node's are ready or still joining (a fault soon after a warm restart, whose spares start at its
  first step), it waits for them up to ``standby_wait_s`` (a cold start's cost over a warm one's,
  as the run measured them), then starts cold;
- every worker succeeded: the scheduler gets ``SCHEDULER_LINGER_S`` to exit, then it is stopped;
- a node that has not confirmed a stop within grace + ``STOP_CONFIRM_S`` is cut off;
- a detached coordinator's follower not heard from for the watchdog period is cut off and lost
  (``liveness.py``: a link that ends is not lost yet, the follower dials again); one that comes
  back while the attempt stops is told to stop again;
- a rank silent for its hang limit is inspected, with the ranks nearly as long silent (the agents
  answer with hang reports); on a detached run too: the coordinator hears every rank's progress.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, List

from .liveness import Liveness

# The inputs and actions (policy_types.py), read by the hosts as policy.Begin, policy.EndRun, ...
from .policy_types import (  # noqa: F401 - re-exported
    INPUTS,
    Action,
    AgentFailed,
    AttemptOver,
    AwaitAdoption,
    AwaitOperator,
    Begin,
    CutOff,
    EndRun,
    Force,
    Heard,
    Input,
    Inspect,
    LinkLost,
    NodeDone,
    NodeLost,
    Outcome,
    PeerLost,
    ProgressReport,
    RankExited,
    RankHung,
    RankProgress,
    RankStarted,
    RankStepped,
    Redial,
    Restarting,
    RestartRefused,
    RestartRequested,
    Resume,
    RunPhase,
    StandbyChanged,
    StartAttempt,
    Status,
    StepReport,
    StopAll,
    StopCause,
    StopNode,
    StopRequested,
    StopScheduler,
    Tick,
    Verdict,
    from_message,
)
from .protocol import StandbyPhase

SCHEDULER_LINGER_S = 5.0  # after every worker succeeded, the scheduler gets this long to exit
STOP_CONFIRM_S = 15.0  # beyond the grace period: a node that has not confirmed its stop is cut off
WATCHDOG_FLOOR_S = 5.0
DEFAULT_GRACE_S = 3.0  # SIGTERM -> SIGKILL, when neither the inventory nor a message says
DETACHED_OPERATOR_WAIT_S = 900.0  # a detached run that failed with no budget waits this long for `r`
# The hang limit when the inventory sets none (hang.timeout_s), derived from what each rank did:
FIRST_STEPS_LIMIT_S = 900.0  # until a rank's steps have a pace (start-up, cluster join, compile)
STEADY_FLOOR_S = 9.0  # over MindSpore's ~5 s of teardown silence; + inspection: named within 10 s
# Workers this close to their hang limit when another passes its own are inspected with it.
SILENT_TOGETHER_S = 1.0
STEADY_FACTOR = 20.0  # x the longest gap between its step reports so far in the attempt
# Before attempt 0, for every node's word on the standby an earlier run kept (restart.keep_warm_s):
# at once, or once its spares have joined (seconds, never more than a cold launch would take).
ADOPT_WAIT_S = 30.0
# How long a restart waits for a joining standby before this run has timed a cold start (attempt 0
# was warm, or a coordinator took the run over): the same bound, for the same reason.
STANDBY_WAIT_S = ADOPT_WAIT_S
FINISHING_LIMIT_S = 120.0  # once a worker finished: the others may be in teardown (barrier, exit)
ALL_FINISHED = "all ranks finished"  # the reason of a run or attempt whose every rank exited 0


def after_restarts(n: int) -> str:
    """What a verdict's reason ends with after ``n`` restarts ("" when there were none)."""
    return " (after %d restart%s)" % (n, "s" if n != 1 else "") if n > 0 else ""


def watchdog_s(keepalive_s: float) -> float:
    """How long an agent waits for word from its console (or coordinator) before it stops its
    ranks: a few keepalives missed."""
    return max(WATCHDOG_FLOOR_S, 3 * keepalive_s + 2)


def silent_too_long(last_progress: float, now: float, timeout_s: float) -> bool:
    """The hang rule, on whichever clock the caller keeps (both arguments on the same one)."""
    return timeout_s > 0 and now - last_progress > timeout_s


def attempt_outcome(workers: frozenset, ok_workers: set) -> Outcome:
    """An attempt whose processes have all ended: every worker finished (a success, whatever the
    scheduler or a node did after), or a failure. Also how an attach names an attempt that ended
    before the detach with no word of the policy's in the journals."""
    return Outcome.SUCCEEDED if workers and workers <= ok_workers else Outcome.FAILED


def standby_complete(states: dict, nodes: tuple) -> bool:
    """A standby cluster can take the attempt only when every node's spares have joined it
    (``states``: node -> its last ``StandbyPhase``): one node's cold ranks cannot join a formed
    cluster."""
    return all(states.get(n) is StandbyPhase.READY for n in nodes)


def standby_coming(states: dict, nodes: tuple) -> bool:
    """Not complete yet, but it may be: every node's spares are joining or ready (none lost, none
    silent)."""
    coming = (StandbyPhase.JOINING, StandbyPhase.READY)
    return all(states.get(n) in coming for n in nodes) and not standby_complete(states, nodes)


class HangRule:
    """How long a rank may stay silent (no log line, no metric) before it is inspected.

    ``fixed_s`` (the inventory's ``hang.timeout_s``) wins. Otherwise the limit follows the job, as
    NVIDIA's fault-tolerance launcher derives its timeouts: until a rank's step reports have a pace
    (two of them), ``FIRST_STEPS_LIMIT_S`` (start-up and graph compile take minutes); then
    ``STEADY_FACTOR`` times the longest gap between its step reports so far, never under
    ``STEADY_FLOOR_S``. Gaps are measured on the rank's own clock (the metric's ``ts``), so a
    console that reads late does not stretch them."""

    def __init__(self, fixed_s: float | None = None) -> None:
        self.fixed_s = fixed_s
        self._last: dict[str, float] = {}  # rank -> ts of its last step report
        self._gap: dict[str, float] = {}  # rank -> longest gap between two of its step reports

    def stepped(self, name: str, ts: float) -> None:
        last = self._last.get(name)
        if last is None or ts > last:
            if last is not None and ts - last > self._gap.get(name, 0.0):
                self._gap[name] = ts - last
            self._last[name] = ts

    def limit(self, name: str, finishing: bool = False) -> tuple[float, str]:
        """Seconds, and why that long (the summary says which limit fired). ``finishing``: a
        worker already finished, so the others may be past their last step, in teardown."""
        if self.fixed_s is not None:
            return self.fixed_s, "hang.timeout_s"
        gap = self._gap.get(name)
        if gap is None:
            return FIRST_STEPS_LIMIT_S, "the limit before its steps have a pace (start-up, compile)"
        limit = max(STEADY_FLOOR_S, STEADY_FACTOR * gap)
        if finishing and limit < FINISHING_LIMIT_S:
            return FINISHING_LIMIT_S, "the limit once a worker has finished (the others may be in teardown)"
        return limit, "%g x its longest gap between steps, %.3g s" % (STEADY_FACTOR, gap)

    def floor(self) -> float:
        """No rank's ``limit`` is under this: a rank silent for less needs no look at its own."""
        return self.fixed_s if self.fixed_s is not None else min(FIRST_STEPS_LIMIT_S, STEADY_FLOOR_S)

    def pace(self, name: str) -> tuple | None:
        """(ts of its last step report, its longest gap or None); None before any step report:
        what an agent tells a detached coordinator, whose rule ``merge``s it."""
        last = self._last.get(name)
        return None if last is None else (last, self._gap.get(name))

    def merge(self, name: str, last: float | None, gap: float | None) -> None:
        """Another rule's record of the rank (its agent's, which read every step report)."""
        if last is not None and last > self._last.get(name, float("-inf")):
            self._last[name] = last
        if gap is not None and gap > self._gap.get(name, 0.0):
            self._gap[name] = gap


class SilenceWatch:
    """Each rank's last progress (the host's monotonic seconds), and a heap of the moments each
    rank's silence may reach its hang limit, so that a tick looks at the ranks whose moment has
    come, not at every rank: at 80,000 ranks a pass over all of them every tick was the policy's
    largest cost (bench/scale.py --profile-phases).

    A moment is a lower bound: first the progress plus the shortest limit any rank can have
    (``HangRule.floor``), then, once it comes, plus the rank's own limit. A rank's limit only grows
    (its longest gap between steps, a worker finished), so a moment is never late. A newer progress
    leaves the older entry stale, dropped when it comes to the top; a rank not watched when its
    moment comes (exited, being inspected) is dropped until its next progress."""

    def __init__(self, floor: float) -> None:
        self.floor = floor
        self._last: dict[str, float] = {}
        self._heap: list[tuple[float, str, float]] = []  # (moment, rank, its last progress then)

    def __getitem__(self, name: str) -> float:
        return self._last[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._last.get(name, default)

    def set(self, name: str, when: float) -> None:
        self._last[name] = when
        heapq.heappush(self._heap, (when + self.floor, name, when))
        if len(self._heap) > 4 * len(self._last) + 1024:  # stale entries: the heap kept small
            live = {(n, w): m for m, n, w in self._heap if self._last.get(n) == w}
            self._heap = [(m, n, w) for (n, w), m in live.items()]
            heapq.heapify(self._heap)

    def near(
        self, now: float, early: float, limit_of: Callable[[str], tuple], watched: Callable[[str], bool]
    ) -> list[tuple[str, float, float, str]]:
        """(rank, last progress, limit, why) of each watched rank silent for more than its limit
        less ``early``; they stay watched (the caller's inspection is what drops them)."""
        heap, last = self._heap, self._last
        found: list[tuple[str, float, float, str]] = []
        seen: set[str] = set()
        later: list[tuple[float, str, float]] = []
        # A moment is when + limit; the rule is now - when > limit - early: the two round apart by
        # far less than a microsecond, so moments that close are looked at too (and kept).
        horizon = now + early + 1e-6
        while heap and heap[0][0] < horizon:
            _, name, when = heapq.heappop(heap)
            if last.get(name) != when or name in seen or not watched(name):
                continue
            seen.add(name)
            limit, why = limit_of(name)
            later.append((when + limit, name, when))
            if silent_too_long(when, now, limit) or silent_too_long(when, now, limit - early):
                found.append((name, when, limit, why))  # past its limit, or within ``early`` of it
        for entry in later:
            heapq.heappush(heap, entry)
        return found


# ------------------------------------------------------------------ the machine


@dataclass(frozen=True)
class PolicyConfig:
    nodes: tuple[str, ...]
    workers: dict[str, str]  # worker (rank) name -> its node; the scheduler is not a worker
    max_restarts: int = 0
    backoff_s: float = 0.0
    grace_s: float = DEFAULT_GRACE_S
    hang_timeout_s: float | None = None  # None: derived from each rank's pace (HangRule)
    can_reconnect: bool = True  # False on a detached coordinator: a lost node ends the run
    operator_wait_s: float | None = None  # None: no operator to wait for; inf: wait while it stays
    # Nodes whose word the host reports (Heard, LinkLost): a detached coordinator's followers. A
    # console's links have their own keepalives: a link it loses is a NodeLost.
    watched: tuple[str, ...] = ()
    watchdog_s: float = WATCHDOG_FLOOR_S


def restart_may_come(max_restarts: int, operator_wait_s: float | None) -> bool:
    """A restart may come in this run: a budget, or an operator who may press r after a failure.
    Only then does the trainer keep checkpoints and snapshots (they cost, and pay only then; a
    restarted attempt resumes from them, so every attempt of such a run keeps them)."""
    return max_restarts > 0 or operator_wait_s is not None


def restart_may_follow(restarts_left: int, operator_wait_s: float | None) -> bool:
    """A restart may still follow the attempt about to start: budget left, or an operator. Spares
    are prepared only then (a standby cluster's join costs the running ranks CPU)."""
    return operator_wait_s is not None or restarts_left > 0


@dataclass
class _Attempt:
    number: int
    started: float
    done: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    started_nodes: set[str] = field(default_factory=set)
    live: set[str] = field(default_factory=set)  # workers started and not exited
    ok_workers: set[str] = field(default_factory=set)
    failed: bool = False
    stop_cause: StopCause | None = None
    stop_sent_at: float | None = None
    stop_code: int = 0
    stop_reason: str = ""
    restart_after: bool = False  # the operator asked for a restart while a failure stop ran
    workers_done_at: float | None = None
    sched_stopped: bool = False
    progress: SilenceWatch = field(init=False)  # each rank's last progress (HangRule.floor)
    inspected: set[str] = field(default_factory=set)
    stepped: bool = False  # a rank reported a step: past start-up (a failure now restarts at once)
    hang: HangRule = field(default_factory=HangRule)
    warm: bool = False  # started on the standby cluster
    timed: bool = True  # its start is known (not one a coordinator took over): its start-up is timed
    first_steps: set[str] = field(default_factory=set)  # workers that made their first step

    def __post_init__(self) -> None:
        self.progress = SilenceWatch(self.hang.floor())


class PolicyError(RuntimeError):
    """An input the table refuses in the current phase: a host's mistake, said at once."""


class RunPolicy:
    """``step`` looks each input up in ``TABLE`` by (phase, input type) and runs that row's handler;
    the handlers below are grouped by the phase whose rows they are."""

    def __init__(self, config: PolicyConfig, restarts_left: int | None = None) -> None:
        self.config = config
        self.phase = RunPhase.IDLE
        self.restarts_left = config.max_restarts if restarts_left is None else restarts_left
        self.att = _Attempt(-1, 0.0)
        self.restart_at: float | None = None
        self.wait_until: float | None = None
        self._workers: frozenset[str] = frozenset(config.workers)
        # node -> its last word on its spares for attempt ``standby_for``
        self.standby: dict[str, StandbyPhase] = {}
        self.standby_for = -1
        self._standby_until = 0.0  # a restart due waits for a joining standby until then
        self._joining_at: float | None = None  # the first word that the standby_for one is joining
        # How long this run's last standby took from its first joining word to every node's ready.
        self.standby_join_s: float | None = None
        # A cold (False) and a warm (True) attempt's start-up, to every worker's first step, as
        # this run last measured them (the wait for a joining standby is worth at most their gap).
        self.startup_s: dict[bool, float] = {}
        self.liveness = Liveness(config.watched, config.watchdog_s, 0.0)  # counts from Begin/Resume
        self._begun = False  # the host said Begin: attempt 0 starts once no adoption is awaited
        self._adopting: set[str] = set()  # nodes whose word on their kept standby is awaited
        self._adopt_until = 0.0

    # ------------------------------------------------------------ what hosts read

    @property
    def attempt(self) -> int:
        return self.att.number

    @property
    def done_nodes(self) -> frozenset:
        """The nodes whose processes of the current attempt have all exited (or that were lost)."""
        return frozenset(self.att.done)

    def standby_ready(self) -> tuple:
        """The nodes whose standby for the next attempt is ready (what a coordinator is handed)."""
        if self.standby_for != self.att.number + 1:
            return ()
        return tuple(n for n in self.config.nodes if self.standby.get(n) is StandbyPhase.READY)

    def warm_for(self, number: int) -> bool:
        """Attempt ``number`` would start on the standby cluster (``standby_complete``)."""
        return number == self.standby_for and standby_complete(self.standby, self.config.nodes)

    def standby_wait_s(self) -> float:
        """How long a restart may wait for a standby still joining: what a cold start costs over a
        warm one, as this run measured them (waiting longer could not beat starting cold now);
        ``STANDBY_WAIT_S`` until a cold start has been timed."""
        cold = self.startup_s.get(False)
        if cold is None:
            return STANDBY_WAIT_S
        return max(0.0, cold - self.startup_s.get(True, 0.0))

    # ------------------------------------------------------------ the one entry point

    def step(self, ev: Input) -> list[Action]:
        out: list[Action] = []
        self._dispatch(ev, out)
        return out

    def _dispatch(self, ev: Input, out: list[Action]) -> None:
        TABLE[(self.phase, type(ev))](self, ev, out)

    # ------------------------------------------------------------ rows of every phase but ENDED

    def _ignore(self, ev: Input, out: list[Action]) -> None:
        """Not this phase's business: a stale report, or one that changes nothing now."""

    def _refuse(self, ev: Input, out: list[Action]) -> None:
        raise PolicyError("%s in phase %s: the host's mistake" % (type(ev).__name__, self.phase))

    def _heard(self, ev: Heard, out: list[Action]) -> None:
        self.liveness.step(ev)

    def _link_lost(self, ev: LinkLost, out: list[Action]) -> None:
        self.liveness.step(ev)

    def _standby(self, ev: StandbyChanged, out: list[Action]) -> None:
        if ev.attempt > self.att.number:  # else stale: that attempt has started already
            if ev.attempt != self.standby_for:
                self.standby, self.standby_for, self._joining_at = {}, ev.attempt, None
            self.standby[ev.node] = ev.state
            if ev.state is StandbyPhase.JOINING and self._joining_at is None:
                self._joining_at = ev.now
            elif self._joining_at is not None and standby_complete(self.standby, self.config.nodes):
                self.standby_join_s, self._joining_at = ev.now - self._joining_at, None

    def _interrupt(self, ev: StopRequested, out: list[Action]) -> None:
        """No attempt runs: the run ends, interrupted."""
        self._end(Verdict(Status.INTERRUPTED, ev.reason, ev.exit_code), out)

    def _watchdog(self, ev: Tick, out: list[Action]) -> bool:
        """A watched peer silent for the watchdog period is cut off and lost (its NodeLost row
        decides). True when that moved the phase on: the tick then went to the new phase's row."""
        phase = self.phase
        for lost in self.liveness.step(ev):
            assert isinstance(lost, PeerLost)
            out.append(CutOff((lost.node,), lost.why))
            self._dispatch(NodeLost(lost.node, lost.why, ev.now), out)
            if self.phase is RunPhase.ENDED:
                return True
        if self.phase is phase:
            return False
        self._dispatch(ev, out)
        return True

    # ------------------------------------------------------------ IDLE: before attempt 0

    def _await_adoption(self, ev: AwaitAdoption, out: list[Action]) -> None:
        self._adopting, self._adopt_until = set(ev.nodes), ev.now + ADOPT_WAIT_S
        self._maybe_begin(ev.now, out)

    def _begin(self, ev: Begin, out: list[Action]) -> None:
        self._begun = True
        self.liveness = Liveness(self.config.watched, self.config.watchdog_s, ev.now)
        self._maybe_begin(ev.now, out)

    def _resume(self, ev: Resume, out: list[Action]) -> None:
        self.att = _Attempt(ev.attempt, ev.now, hang=HangRule(self.config.hang_timeout_s))
        self.phase = RunPhase.RUNNING
        self.liveness = Liveness(self.config.watched, self.config.watchdog_s, ev.now)
        self.att.timed = False  # started before this host heard of it: its start-up is not timed
        self.standby = {n: StandbyPhase.READY for n in ev.standby_ready}
        self.standby_for = ev.attempt + 1 if ev.standby_ready else -1

    def _standby_idle(self, ev: StandbyChanged, out: list[Action]) -> None:
        self._standby(ev, out)
        if ev.attempt == 0 and ev.node in self._adopting:
            if ev.state is StandbyPhase.READY:
                self._adopting.discard(ev.node)
            elif ev.state is StandbyPhase.LOST:
                self._adopting.clear()  # all or nothing: attempt 0 starts cold, now
        self._maybe_begin(ev.now, out)

    def _lost_idle(self, ev: NodeLost, out: list[Action]) -> None:
        self.standby.pop(ev.node, None)
        self._adopting.clear()  # its spares went with its agent: cold (its Start finds it lost)
        self._maybe_begin(ev.now, out)

    def _tick_idle(self, ev: Tick, out: list[Action]) -> None:
        if self._watchdog(ev, out):
            return
        if self._adopting and ev.now >= self._adopt_until:
            self._adopting.clear()  # a node that did not answer: cold
        self._maybe_begin(ev.now, out)

    def _maybe_begin(self, now: float, out: list[Action]) -> None:
        if self._begun and not self._adopting:
            self._start(0, now, out)

    # ------------------------------------------------------------ RUNNING and STOPPING: an attempt

    def _rank_started(self, ev: RankStarted, out: list[Action]) -> None:
        att = self.att
        att.started_nodes.add(ev.node)
        att.progress.set(ev.name, ev.now)
        if ev.name in self._workers:
            att.live.add(ev.name)

    def _rank_exited(self, ev: RankExited, out: list[Action]) -> None:
        att = self.att
        att.live.discard(ev.name)
        if ev.ok:
            if ev.worker:
                att.ok_workers.add(ev.name)
                if att.workers_done_at is None and self._workers <= att.ok_workers:
                    att.workers_done_at = ev.now
        elif not ev.stopped_by_agent:
            reason = "%s on %s failed (%s)" % (ev.name, ev.node, ev.detail)
            self._fail(reason, ev.name, ev.now, out)

    def _rank_stepped(self, ev: RankStepped, out: list[Action]) -> None:
        att = self.att
        att.stepped = True
        att.progress.set(ev.name, ev.now)
        if att.timed and ev.name in self._workers and ev.name not in att.first_steps:
            att.first_steps.add(ev.name)
            if len(att.first_steps) == len(self._workers):  # every worker's first step: started up
                self.startup_s[att.warm] = ev.now - att.started

    def _rank_hung(self, ev: RankHung, out: list[Action]) -> None:
        self._fail("%s on %s is hung (%s)" % (ev.name, ev.node, ev.why), ev.name, ev.now, out)

    def _agent_failed(self, ev: AgentFailed, out: list[Action]) -> None:
        if ev.node not in self.att.started_nodes:  # it could not even start its processes
            self._fail("%s: %s" % (ev.node, ev.message), ev.node, ev.now, out)

    def _node_done(self, ev: NodeDone, out: list[Action]) -> None:
        self.att.done.add(ev.node)
        self._maybe_over(ev.now, out)

    def _progress(self, ev: RankProgress, out: list[Action]) -> None:
        """Never moves a rank's last progress back (a report that took longer on its way)."""
        att = self.att
        if ev.now <= att.progress.get(ev.name, float("-inf")):
            return
        att.progress.set(ev.name, ev.now)
        att.inspected.discard(ev.name)  # alive after all (its agent saw it too): watched again

    def _step_report(self, ev: StepReport, out: list[Action]) -> None:
        self._progress(RankProgress(ev.name, ev.now), out)
        self.att.stepped = True
        self.att.hang.stepped(ev.name, ev.ts)

    def _progress_report(self, ev: ProgressReport, out: list[Action]) -> None:
        if ev.at is not None:
            self._progress(RankProgress(ev.name, ev.at), out)
        if ev.pace is not None:
            self.att.stepped = True
            self.att.hang.merge(ev.name, ev.pace[0], ev.pace[1])

    def _lost_running(self, ev: NodeLost, out: list[Action]) -> None:
        if self._mark_lost(ev.node):
            self._fail("lost the node %s: %s" % (ev.node, ev.why), ev.node, ev.now, out)
        self._maybe_over(ev.now, out)

    def _lost_stopping(self, ev: NodeLost, out: list[Action]) -> None:
        self._mark_lost(ev.node)
        self._maybe_over(ev.now, out)

    def _heard_stopping(self, ev: Heard, out: list[Action]) -> None:
        back = self.liveness.is_down(ev.node)
        self.liveness.step(ev)
        if back and ev.node not in self.att.done:  # its link was down as the stop went
            out.append(StopNode(ev.node, self.att.stop_reason))

    def _stop_first(self, ev: StopRequested, out: list[Action]) -> None:
        att = self.att
        att.stop_cause, att.stop_code, att.stop_reason = StopCause.OPERATOR, ev.exit_code, ev.reason
        att.stop_sent_at = ev.now
        self.phase = RunPhase.STOPPING
        out.append(StopAll(ev.reason, None, announce=True))

    def _stop_again(self, ev: StopRequested, out: list[Action]) -> None:
        att = self.att
        if att.stop_cause is StopCause.OPERATOR:  # a second stop: stop waiting for the agents
            out.append(Force())
            out.append(AttemptOver(att.number, Outcome.INTERRUPTED, att.stop_reason))
            self._end(Verdict(Status.INTERRUPTED, att.stop_reason, att.stop_code), out)
        else:  # the run ends once the attempt has stopped, interrupted
            att.stop_cause, att.stop_code, att.stop_reason = StopCause.OPERATOR, ev.exit_code, ev.reason
            out.append(StopAll(ev.reason, None, announce=False))

    def _restart_running(self, ev: RestartRequested, out: list[Action]) -> None:
        why = "%s: the whole group restarts (a rank cannot rejoin a running collective)" % ev.reason
        self._stop(StopCause.RESTART, why, None, ev.now, out)

    def _restart_stopping(self, ev: RestartRequested, out: list[Action]) -> None:
        if self.att.stop_cause is StopCause.FAILURE:
            self.att.restart_after = True  # once the failed attempt has stopped
        else:  # the operator's stop or restart is under way already
            out.append(RestartRefused("the run is stopping"))

    def _tick_attempt(self, ev: Tick, out: list[Action]) -> None:
        if self._watchdog(ev, out):
            return
        att, cfg, now = self.att, self.config, ev.now
        if att.stop_sent_at is not None and now - att.stop_sent_at > cfg.grace_s + STOP_CONFIRM_S:
            late = tuple(n for n in cfg.nodes if n not in att.done)
            if late:
                att.done.update(late)
                att.lost.update(late)
                out.append(CutOff(late))
                self._maybe_over(now, out)
                if self.phase not in (RunPhase.RUNNING, RunPhase.STOPPING):
                    return
        if att.workers_done_at is not None and not att.sched_stopped:
            if now - att.workers_done_at > SCHEDULER_LINGER_S:
                att.sched_stopped = True
                out.append(StopScheduler())
        if self.phase is RunPhase.RUNNING:
            self._inspect_silent(now, out)

    # ------------------------------------------------------------ BACKOFF: between attempts

    def _restart_now(self, ev: RestartRequested, out: list[Action]) -> None:
        self.restart_at = ev.now  # cut the backoff short
        self._dispatch(Tick(ev.now), out)

    def _lost_between(self, ev: NodeLost, out: list[Action]) -> None:
        self.standby.pop(ev.node, None)  # its spares went with its agent

    def _tick_backoff(self, ev: Tick, out: list[Action]) -> None:
        if self._watchdog(ev, out):
            return
        self._maybe_start(ev.now, out)

    def _standby_backoff(self, ev: StandbyChanged, out: list[Action]) -> None:
        self._standby(ev, out)
        self._maybe_start(ev.now, out)  # a restart waiting for this standby: warm now, or cold

    def _maybe_start(self, now: float, out: list[Action]) -> None:
        """The next attempt, once its restart is due, unless every node's standby for it is still
        joining or ready (not every one ready) and the wait for it is still worth it."""
        if self.restart_at is None or now < self.restart_at:
            return
        number = self.att.number + 1
        waiting = number == self.standby_for and standby_coming(self.standby, self.config.nodes)
        if waiting and now < self._standby_until and self._ready_in_time():
            return
        self._start(number, now, out)

    def _ready_in_time(self) -> bool:
        """The joining standby is expected ready before the wait stops being worth it: by the time
        this run's last standby took to join, counted from this one's first joining word (a spare
        started 1 s before the fault has its import ahead of it: ~10 s on a loaded 2-core node,
        no better than a cold start). Not timed yet: it may be."""
        if self.standby_join_s is None or self._joining_at is None:
            return True
        return self._joining_at + self.standby_join_s < self._standby_until

    # ------------------------------------------------------------ AWAITING_OPERATOR: r or q

    def _give_up(self, ev: StopRequested, out: list[Action]) -> None:
        self._end(Verdict(Status.FAILED), out)  # q: the failed attempt's verdict stands

    def _restart_by_operator(self, ev: RestartRequested, out: list[Action]) -> None:
        if self.att.lost and not self.config.can_reconnect:
            return
        why = "restart requested by the operator after attempt %d failed" % self.att.number
        self._restart(ev.now, why, 0.0, out)

    def _lost_awaiting(self, ev: NodeLost, out: list[Action]) -> None:
        self._mark_lost(ev.node)
        if not self.config.can_reconnect:
            self._end(Verdict(Status.FAILED, self._lost_reason()), out)

    def _tick_awaiting(self, ev: Tick, out: list[Action]) -> None:
        if self._watchdog(ev, out):
            return
        if self.wait_until is not None and ev.now >= self.wait_until:
            self._end(Verdict(Status.FAILED), out)

    # ------------------------------------------------------------ what the rows share

    def _mark_lost(self, node: str) -> bool:
        """The node is lost for the attempt; True when it had not finished it."""
        self.standby.pop(node, None)  # its spares went with its agent
        att = self.att
        was_done = node in att.done
        att.lost.add(node)
        att.done.add(node)
        return not was_done

    def _fail(self, reason: str, trigger: str, now: float, out: list[Action]) -> None:
        self.att.failed = True
        self._stop(StopCause.FAILURE, reason, trigger, now, out)

    def _stop(
        self, cause: StopCause, reason: str, trigger: str | None, now: float, out: list[Action]
    ) -> None:
        att = self.att
        if att.stop_cause is not None:
            return
        att.stop_cause = cause
        att.stop_sent_at = now
        att.stop_reason = reason
        self.phase = RunPhase.STOPPING
        out.append(StopAll(reason, trigger, announce=True))

    def _maybe_over(self, now: float, out: list[Action]) -> None:
        att = self.att
        if len(att.done) < len(self.config.nodes):
            return
        cause = att.stop_cause
        succeeded = attempt_outcome(self._workers, att.ok_workers) is Outcome.SUCCEEDED
        if cause is StopCause.OPERATOR:
            out.append(AttemptOver(att.number, Outcome.INTERRUPTED, att.stop_reason))
            self._end(Verdict(Status.INTERRUPTED, att.stop_reason, att.stop_code), out)
        elif cause is StopCause.RESTART:
            out.append(AttemptOver(att.number, Outcome.RESTART_REQUESTED))
            self._restart(now, "restart requested", self.config.backoff_s, out)
        elif succeeded:
            out.append(AttemptOver(att.number, Outcome.SUCCEEDED))
            self._end(Verdict(Status.SUCCEEDED, ALL_FINISHED + after_restarts(att.number), 0), out)
        else:
            out.append(AttemptOver(att.number, Outcome.FAILED))
            if att.lost and not self.config.can_reconnect:
                self._end(Verdict(Status.FAILED, self._lost_reason()), out)
            elif att.restart_after:
                self._restart(
                    now, "restart requested by the operator after attempt %d failed" % att.number, 0.0, out
                )
            elif self.restarts_left > 0:
                self.restarts_left -= 1
                self._restart(now, "attempt %d failed" % att.number, self._failure_backoff(), out)
            elif self.config.operator_wait_s is not None and self.config.operator_wait_s > 0:
                self.phase = RunPhase.AWAITING_OPERATOR
                wait = self.config.operator_wait_s
                finite = wait != float("inf")
                self.wait_until = now + wait if finite else None
                out.append(AwaitOperator(att.number, wait if finite else None))
            else:
                self._end(Verdict(Status.FAILED), out)

    def _failure_backoff(self) -> float:
        """The wait before restarting a failed attempt: none once its ranks had stepped (a fault in
        training: every second idle is lost time, and the cause is gone with the process), the
        configured backoff for a failure before any step (a start-up failure repeats: do not spin)."""
        return 0.0 if self.att.stepped else self.config.backoff_s

    def _lost_reason(self) -> str:
        return "lost %s: reconnecting a node needs the console (mscon attach)" % ", ".join(
            sorted(self.att.lost)
        )

    def _restart(self, now: float, why: str, backoff_s: float, out: list[Action]) -> None:
        self.phase = RunPhase.BACKOFF
        self.wait_until = None
        self.restart_at = now + backoff_s
        self._standby_until = now + self.standby_wait_s()  # the backoff counts towards the wait
        out.append(Restarting(self.att.number + 1, why, backoff_s, self.restarts_left))
        if backoff_s <= 0:
            self._dispatch(Tick(now), out)

    def _start(self, number: int, now: float, out: list[Action]) -> None:
        warm = self.warm_for(number)
        self.standby, self.standby_for = {}, -1
        self.att = _Attempt(number, now, hang=HangRule(self.config.hang_timeout_s), warm=warm)
        self.restart_at = None
        self.phase = RunPhase.RUNNING
        out.append(StartAttempt(number, warm))

    def _end(self, verdict: Verdict, out: list[Action]) -> None:
        self.phase = RunPhase.ENDED
        out.append(EndRun(verdict))

    def _inspect_silent(self, now: float, out: list[Action]) -> None:
        """Inspect the workers silent past their limit, and with them those within
        ``SILENT_TOGETHER_S`` of theirs: ranks waiting in a collective fall silent with the rank
        they wait for, and whose limit passes first on the console's clock is chance (log reads,
        ticks). The first report stops the attempt; a rank not inspected by then has no stack, and
        the root cause could not tell the rank that stopped from the ones waiting on it."""
        att, cfg = self.att, self.config
        due: dict[tuple[str, float, str], list[str]] = {}
        near: dict[tuple[str, float, str], list[str]] = {}
        finishing = bool(att.ok_workers)
        quiet = att.progress.near(
            now,
            SILENT_TOGETHER_S,
            lambda n: att.hang.limit(n, finishing=finishing),
            lambda n: n in att.live and n not in att.inspected,
        )
        for name, last, limit, why in sorted(quiet):
            if silent_too_long(last, now, limit):
                due.setdefault((cfg.workers[name], limit, why), []).append(name)
            else:
                near.setdefault((cfg.workers[name], limit, why), []).append(name)
        if not due:
            return
        first = min(n for names in due.values() for n in names)
        for (node, limit, why), names in due.items():
            att.inspected.update(names)
            out.append(Inspect(node, tuple(names), "no progress for %g s (%s)" % (limit, why), limit))
        for (node, limit, why), names in near.items():
            att.inspected.update(names)
            reason = "no progress for %g s (%s); inspected up to %g s early, with %s" % (
                limit,
                why,
                SILENT_TOGETHER_S,
                first,
            )
            out.append(Inspect(node, tuple(names), reason, limit - SILENT_TOGETHER_S))


# ------------------------------------------------------------------ the table

Handler = Callable[[RunPolicy, Any, List[Action]], None]
_R = RunPolicy

# The rows each phase handles; every other input is ``_ignore``d there (``_table`` fills them in).
_EVERY_PHASE: dict[type, Handler] = {Heard: _R._heard, LinkLost: _R._link_lost, StandbyChanged: _R._standby}
_ATTEMPT: dict[type, Handler] = {  # RUNNING and STOPPING
    RankStarted: _R._rank_started,
    RankExited: _R._rank_exited,
    RankStepped: _R._rank_stepped,
    RankHung: _R._rank_hung,
    AgentFailed: _R._agent_failed,
    NodeDone: _R._node_done,
    RankProgress: _R._progress,
    StepReport: _R._step_report,
    ProgressReport: _R._progress_report,
    Tick: _R._tick_attempt,
}
ROWS: dict[RunPhase, dict[type, Handler]] = {
    RunPhase.IDLE: {
        AwaitAdoption: _R._await_adoption,
        Begin: _R._begin,
        Resume: _R._resume,
        StandbyChanged: _R._standby_idle,
        NodeLost: _R._lost_idle,
        StopRequested: _R._interrupt,
        Tick: _R._tick_idle,
    },
    RunPhase.RUNNING: {
        **_ATTEMPT,
        NodeLost: _R._lost_running,
        StopRequested: _R._stop_first,
        RestartRequested: _R._restart_running,
    },
    RunPhase.STOPPING: {
        **_ATTEMPT,
        NodeLost: _R._lost_stopping,
        StopRequested: _R._stop_again,
        RestartRequested: _R._restart_stopping,
        Heard: _R._heard_stopping,
    },
    RunPhase.BACKOFF: {
        StandbyChanged: _R._standby_backoff,
        NodeLost: _R._lost_between,
        StopRequested: _R._interrupt,
        RestartRequested: _R._restart_now,
        Tick: _R._tick_backoff,
    },
    RunPhase.AWAITING_OPERATOR: {
        NodeLost: _R._lost_awaiting,
        StopRequested: _R._give_up,
        RestartRequested: _R._restart_by_operator,
        Tick: _R._tick_awaiting,
    },
    RunPhase.ENDED: {},  # the run is over: every input is ignored
}


def _table() -> dict[tuple[RunPhase, type], Handler]:
    table: dict[tuple[RunPhase, type], Handler] = {}
    for phase in RunPhase:
        shared = _EVERY_PHASE if phase is not RunPhase.ENDED else {}
        rows = {**shared, **ROWS[phase]}
        for kind in INPUTS:
            refused = kind is Resume and phase is not RunPhase.IDLE
            default = RunPolicy._refuse if refused else RunPolicy._ignore
            table[(phase, kind)] = rows.get(kind, default)
    return table


# (phase, input type) -> the handler: every pair has one.
TABLE: dict[tuple[RunPhase, type], Handler] = _table()
