"""The run's policy: one state machine, driven by the console's supervisor and by a detached run's
node-0 coordinator alike.

Pure: no I/O and no clock of its own (every input carries ``now``, monotonic seconds), stdlib
only, Python 3.8, so the agent carries it to the nodes. A host turns what it hears (agent
messages, operator commands, ticks) into its inputs (``policy_types.py``, re-exported here), calls
``RunPolicy.step`` and carries out the actions it returns, in order. Neither host decides anything
itself:

- a rank fails, hangs, or a node is lost or cannot start its processes: stop every node;
- attempt 0 waits for every node's word on a kept standby (``ADOPT_WAIT_S`` at most): warm when
  all adopted theirs, cold at once when one did not or was lost (all or nothing);
- every node has stopped: restart the group while the budget lasts (an operator's restart does
  not use it): at once when its ranks had stepped, after the backoff when it failed in start-up;
  with no budget left, an interactive run waits for the operator (``r`` restarts, ``q`` ends with
  the failed attempt's verdict), a headless one ends;
- a restart is warm (``StartAttempt.warm``: the processes of the standby cluster the spares joined
  during the attempt) when every node has said its spares for it are ready, else cold;
- every worker succeeded: the scheduler gets ``SCHEDULER_LINGER_S`` to exit, then it is stopped;
- a node that has not confirmed a stop within grace + ``STOP_CONFIRM_S`` is cut off;
- a detached coordinator's follower not heard from for the watchdog period is cut off and lost
  (``liveness.py``: a link that ends is not lost yet, the follower dials again); one that comes
  back while the attempt stops is told to stop again;
- a rank silent for its hang limit is inspected, with the ranks nearly as long silent (the agents
  answer with hang reports); on a detached run too: the coordinator hears every rank's progress.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .liveness import Liveness

# The inputs and actions (policy_types.py), read by the hosts as policy.Begin, policy.EndRun, ...
from .policy_types import (  # noqa: F401 - re-exported
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
    Phase,
    RankExited,
    RankHung,
    RankStarted,
    RankStepped,
    Redial,
    Restarting,
    RestartRefused,
    RestartRequested,
    StandbyChanged,
    StartAttempt,
    Status,
    StopAll,
    StopCause,
    StopNode,
    StopRequested,
    StopScheduler,
    Tick,
    Verdict,
    from_message,
)

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


def standby_complete(ready: dict, nodes: tuple) -> bool:
    """A standby cluster can take the attempt only when every node's spares have joined it
    (``ready``: node -> its last word): one node's cold ranks cannot join a formed cluster."""
    return all(ready.get(n) for n in nodes)


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
    progress: dict[str, float] = field(default_factory=dict)
    inspected: set[str] = field(default_factory=set)
    stepped: bool = False  # a rank reported a step: past start-up (a failure now restarts at once)
    hang: HangRule = field(default_factory=HangRule)


class RunPolicy:
    def __init__(self, config: PolicyConfig, restarts_left: int | None = None) -> None:
        self.config = config
        self.phase = Phase.IDLE
        self.restarts_left = config.max_restarts if restarts_left is None else restarts_left
        self.att = _Attempt(-1, 0.0)
        self.restart_at: float | None = None
        self.wait_until: float | None = None
        self._workers: frozenset[str] = frozenset(config.workers)
        self._ending_verdict: Verdict | None = None
        # node -> its spares for attempt ``standby_for`` have joined their standby cluster
        self.standby: dict[str, bool] = {}
        self.standby_for = -1
        self.liveness = Liveness(config.watched, config.watchdog_s, 0.0)  # counts from Begin/resume
        self._begun = False  # the host said Begin: attempt 0 starts once no adoption is awaited
        self._adopting: set[str] = set()  # nodes whose word on their kept standby is awaited
        self._adopt_until = 0.0

    # ------------------------------------------------------------ host helpers

    @property
    def attempt(self) -> int:
        return self.att.number

    def resume(self, attempt: int, now: float, standby_ready: tuple = ()) -> None:
        """Take over an attempt already running (a detached run's coordinator), with the nodes whose
        standby for the next attempt had said it was ready (``standby_ready``)."""
        self.att = _Attempt(attempt, now, hang=HangRule(self.config.hang_timeout_s))
        self.phase = Phase.RUNNING
        self.liveness = Liveness(self.config.watched, self.config.watchdog_s, now)
        self.standby = {n: True for n in standby_ready}
        self.standby_for = attempt + 1 if standby_ready else -1

    @property
    def done_nodes(self) -> frozenset:
        """The nodes whose processes of the current attempt have all exited (or that were lost)."""
        return frozenset(self.att.done)

    def standby_ready(self) -> tuple:
        """The nodes whose standby for the next attempt is ready (what a coordinator is handed)."""
        if self.standby_for != self.att.number + 1:
            return ()
        return tuple(n for n in self.config.nodes if self.standby.get(n))

    def warm_for(self, number: int) -> bool:
        """Attempt ``number`` would start on the standby cluster (``standby_complete``)."""
        return number == self.standby_for and standby_complete(self.standby, self.config.nodes)

    def progress(self, name: str, now: float) -> None:
        """A rank made progress (a log line, a metric) at ``now``: kept apart from ``step`` for its
        rate. Never moves a rank's last progress back (a report that took longer on its way)."""
        att = self.att
        if now <= att.progress.get(name, float("-inf")):
            return
        att.progress[name] = now
        if att.inspected:
            att.inspected.discard(name)  # alive after all (its agent saw it too): watched again

    def stepped(self, name: str, ts: float, now: float) -> None:
        """A step report of a rank (its clock's ``ts``): progress, and the pace its hang limit follows."""
        self.progress(name, now)
        self.att.stepped = True
        self.att.hang.stepped(name, ts)

    def heard(self, name: str, at: float | None, pace: tuple | None) -> None:
        """What a detached coordinator hears of a rank from its node's agent (``LinkProgress``, its
        own agent's alike): its last progress ``at`` on this host's clock (None: no new progress),
        and its step pace as the agent's ``HangRule`` has it (``HangRule.pace``)."""
        if at is not None:
            self.progress(name, at)
        if pace is not None:
            self.att.stepped = True
            self.att.hang.merge(name, pace[0], pace[1])

    # ------------------------------------------------------------ the dispatcher

    def step(self, ev: Input) -> list[Action]:
        out: list[Action] = []
        if self.phase is Phase.ENDED:
            return out
        if isinstance(ev, (Begin, AwaitAdoption)):
            pass  # before attempt 0 only (below)
        elif isinstance(ev, Heard):
            back = self.liveness.is_down(ev.node)
            self.liveness.step(ev)
            att = self.att
            if back and self.phase is Phase.STOPPING and ev.node not in att.done:
                out.append(StopNode(ev.node, att.stop_reason))  # its link was down as the stop went
        elif isinstance(ev, LinkLost):
            self.liveness.step(ev)
        elif isinstance(ev, Tick):
            self._tick(ev.now, out)
        elif isinstance(ev, StopRequested):
            self._stop_requested(ev, out)
        elif isinstance(ev, RestartRequested):
            self._restart_requested(ev, out)
        elif isinstance(ev, NodeLost):
            self.standby.pop(ev.node, None)  # its spares went with its agent
            self._node_lost(ev, out)
        elif isinstance(ev, StandbyChanged):
            if ev.attempt > self.att.number:  # else stale: that attempt has started already
                if ev.attempt != self.standby_for:
                    self.standby, self.standby_for = {}, ev.attempt
                self.standby[ev.node] = ev.ready
        elif self.phase in (Phase.RUNNING, Phase.STOPPING):
            self._attempt_input(ev, out)
        if self.phase is Phase.IDLE:
            self._before_start(ev, out)
        return out

    def _before_start(self, ev: Input, out: list[Action]) -> None:
        """Begin, and the wait for the nodes' word on their kept standbys (the standby rule above
        has recorded it): attempt 0 starts once the host began and nobody's word is awaited."""
        if isinstance(ev, AwaitAdoption):
            self._adopting, self._adopt_until = set(ev.nodes), ev.now + ADOPT_WAIT_S
        elif isinstance(ev, Begin):
            self._begun = True
            self.liveness = Liveness(self.config.watched, self.config.watchdog_s, ev.now)
        elif isinstance(ev, StandbyChanged) and ev.attempt == 0 and ev.node in self._adopting:
            if ev.ready:
                self._adopting.discard(ev.node)
            else:
                self._adopting.clear()  # all or nothing: attempt 0 starts cold, now
        elif isinstance(ev, NodeLost):
            self._adopting.clear()  # its spares went with its agent: cold (its Start finds it lost)
        elif isinstance(ev, Tick):
            if self._adopting and ev.now >= self._adopt_until:
                self._adopting.clear()  # a node that did not answer: cold
        else:
            return
        if self._begun and not self._adopting:
            self._start(0, ev.now, out)

    def _attempt_input(self, ev: Input, out: list[Action]) -> None:
        att = self.att
        if isinstance(ev, RankStarted):
            att.started_nodes.add(ev.node)
            att.progress[ev.name] = ev.now
            if ev.name in self._workers:
                att.live.add(ev.name)
        elif isinstance(ev, RankExited):
            att.live.discard(ev.name)
            if ev.ok:
                if ev.worker:
                    att.ok_workers.add(ev.name)
                    if att.workers_done_at is None and self._workers <= att.ok_workers:
                        att.workers_done_at = ev.now
            elif not ev.stopped_by_agent:
                att.failed = True
                self._stop(
                    StopCause.FAILURE,
                    "%s on %s failed (%s)" % (ev.name, ev.node, ev.detail),
                    ev.name,
                    ev.now,
                    out,
                )
        elif isinstance(ev, RankStepped):
            att.stepped = True
            att.progress[ev.name] = ev.now
        elif isinstance(ev, RankHung):
            att.failed = True
            self._stop(
                StopCause.FAILURE, "%s on %s is hung (%s)" % (ev.name, ev.node, ev.why), ev.name, ev.now, out
            )
        elif isinstance(ev, AgentFailed):
            if ev.node not in att.started_nodes:  # it could not even start its processes
                att.failed = True
                self._stop(StopCause.FAILURE, "%s: %s" % (ev.node, ev.message), ev.node, ev.now, out)
        elif isinstance(ev, NodeDone):
            att.done.add(ev.node)
            self._maybe_over(ev.now, out)

    # ------------------------------------------------------------ stops and restarts

    def _stop(
        self, cause: StopCause, reason: str, trigger: str | None, now: float, out: list[Action]
    ) -> None:
        att = self.att
        if att.stop_cause is not None:
            return
        att.stop_cause = cause
        att.stop_sent_at = now
        att.stop_reason = reason
        self.phase = Phase.STOPPING
        out.append(StopAll(reason, trigger, announce=True))

    def _stop_requested(self, ev: StopRequested, out: list[Action]) -> None:
        att = self.att
        if self.phase in (Phase.IDLE, Phase.BACKOFF):
            self._end(Verdict(Status.INTERRUPTED, ev.reason, ev.exit_code), out)
        elif self.phase is Phase.AWAITING_OPERATOR:
            self._end(Verdict(Status.FAILED), out)  # q: the failed attempt's verdict stands
        elif att.stop_cause is StopCause.OPERATOR:
            out.append(Force())  # a second stop: stop waiting for the agents
            out.append(AttemptOver(att.number, Outcome.INTERRUPTED, att.stop_reason))
            self._end(Verdict(Status.INTERRUPTED, att.stop_reason, att.stop_code), out)
        else:
            first = att.stop_cause is None
            att.stop_cause, att.stop_code, att.stop_reason = StopCause.OPERATOR, ev.exit_code, ev.reason
            if first:
                att.stop_sent_at = ev.now
                self.phase = Phase.STOPPING
            out.append(StopAll(ev.reason, None, announce=first))

    def _restart_requested(self, ev: RestartRequested, out: list[Action]) -> None:
        att = self.att
        if self.phase is Phase.RUNNING:
            att.stop_cause = None
            self._stop(
                StopCause.RESTART,
                "%s: the whole group restarts (a rank cannot rejoin a running collective)" % ev.reason,
                None,
                ev.now,
                out,
            )
        elif self.phase is Phase.STOPPING:
            if att.stop_cause is StopCause.FAILURE:
                att.restart_after = True  # once the failed attempt has stopped
            else:  # the operator's stop or restart is under way already
                out.append(RestartRefused("the run is stopping"))
        elif self.phase is Phase.BACKOFF:
            self.restart_at = ev.now  # cut the backoff short
            self._tick(ev.now, out)
        elif self.phase is Phase.AWAITING_OPERATOR:
            if self.att.lost and not self.config.can_reconnect:
                return
            self._restart(
                ev.now, "restart requested by the operator after attempt %d failed" % att.number, 0.0, out
            )

    def _node_lost(self, ev: NodeLost, out: list[Action]) -> None:
        att = self.att
        if self.phase not in (Phase.RUNNING, Phase.STOPPING, Phase.AWAITING_OPERATOR):
            return
        was_done = ev.node in att.done
        att.lost.add(ev.node)
        att.done.add(ev.node)
        if self.phase is Phase.AWAITING_OPERATOR:
            if not self.config.can_reconnect:
                self._end(Verdict(Status.FAILED, self._lost_reason()), out)
            return
        if self.phase is Phase.RUNNING and not was_done:
            att.failed = True
            self._stop(StopCause.FAILURE, "lost the node %s: %s" % (ev.node, ev.why), ev.node, ev.now, out)
        self._maybe_over(ev.now, out)

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
                self.phase = Phase.AWAITING_OPERATOR
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
        self.phase = Phase.BACKOFF
        self.wait_until = None
        self.restart_at = now + backoff_s
        out.append(Restarting(self.att.number + 1, why, backoff_s, self.restarts_left))
        if backoff_s <= 0:
            self._tick(now, out)

    def _start(self, number: int, now: float, out: list[Action]) -> None:
        warm = self.warm_for(number)
        self.standby, self.standby_for = {}, -1
        self.att = _Attempt(number, now, hang=HangRule(self.config.hang_timeout_s))
        self.restart_at = None
        self.phase = Phase.RUNNING
        out.append(StartAttempt(number, warm))

    def _end(self, verdict: Verdict, out: list[Action]) -> None:
        self.phase = Phase.ENDED
        out.append(EndRun(verdict))

    # ------------------------------------------------------------ timers

    def _tick(self, now: float, out: list[Action]) -> None:
        for lost in self.liveness.step(Tick(now)):
            assert isinstance(lost, PeerLost)
            out.append(CutOff((lost.node,), lost.why))
            self.standby.pop(lost.node, None)
            self._node_lost(NodeLost(lost.node, lost.why, now), out)
            if self.phase is Phase.ENDED:
                return
        att, cfg = self.att, self.config
        if self.phase is Phase.BACKOFF:
            if self.restart_at is not None and now >= self.restart_at:
                self._start(att.number + 1, now, out)
            return
        if self.phase is Phase.AWAITING_OPERATOR:
            if self.wait_until is not None and now >= self.wait_until:
                self._end(Verdict(Status.FAILED), out)
            return
        if self.phase not in (Phase.RUNNING, Phase.STOPPING):
            return
        if att.stop_sent_at is not None and now - att.stop_sent_at > cfg.grace_s + STOP_CONFIRM_S:
            late = tuple(n for n in cfg.nodes if n not in att.done)
            if late:
                att.done.update(late)
                att.lost.update(late)
                out.append(CutOff(late))
                self._maybe_over(now, out)
                if self.phase not in (Phase.RUNNING, Phase.STOPPING):
                    return
        if att.workers_done_at is not None and not att.sched_stopped:
            if now - att.workers_done_at > SCHEDULER_LINGER_S:
                att.sched_stopped = True
                out.append(StopScheduler())
        if self.phase is Phase.RUNNING:
            self._inspect_silent(now, out)

    def _inspect_silent(self, now: float, out: list[Action]) -> None:
        """Inspect the workers silent past their limit, and with them those within
        ``SILENT_TOGETHER_S`` of theirs: ranks waiting in a collective fall silent with the rank
        they wait for, and whose limit passes first on the console's clock is chance (log reads,
        ticks). The first report stops the attempt; a rank not inspected by then has no stack, and
        the root cause could not tell the rank that stopped from the ones waiting on it."""
        att, cfg = self.att, self.config
        due: dict[tuple[str, float, str], list[str]] = {}
        near: dict[tuple[str, float, str], list[str]] = {}
        for name in sorted(att.live - att.inspected):
            limit, why = att.hang.limit(name, finishing=bool(att.ok_workers))
            last = att.progress.get(name, att.started)
            if silent_too_long(last, now, limit):
                due.setdefault((cfg.workers[name], limit, why), []).append(name)
            elif silent_too_long(last, now, limit - SILENT_TOGETHER_S):
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
