"""ClusterState: the one picture of the cluster, a pure function of the events so far.

The supervisor, the summary, the headless reporter and the TUI read it; a recording replays into
the same state. The root cause of an attempt is computed here and nowhere else (``root_cause``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from mscon.agent.protocol import (
    AgentError,
    AllExited,
    Evidence,
    LogBatch,
    Metric,
    MetricBatch,
    Milestone,
    NodeSummary,
    ProcExited,
    ProcHung,
    ProcStarted,
    RankPhase,
    RankResumed,
    Telemetry,
    TelemetryBatch,
    by_rank,
)
from mscon.console.engine.events import (
    HANG_EXIT_CODE,
    NODE_LOST_EXIT_CODE,
    AgentEvent,
    AttemptEnded,
    AttemptPhases,
    AttemptResume,
    AttemptStarted,
    AttemptSummary,
    AwaitingOperator,
    CheckReported,
    ChecksFinished,
    CheckStatus,
    Event,
    Failure,
    FailureKind,
    FetchSummary,
    JobState,
    LinesShown,
    LogsFetched,
    NodeState,
    NodeUpdate,
    RankState,
    RankSummary,
    ReplicaDivergence,
    Restarting,
    RunFinished,
    RunResult,
    RunStarted,
    StandbyUpdated,
    Stopping,
    StragglerCleared,
    StragglerFlagged,
    StragglerSummary,
)
from mscon.console.engine.loss_history import LossHistory, limit_for
from mscon.console.engine.phases import PhaseClock
from mscon.console.engine.resume import Reached, frontier, rank_start, verdict
from mscon.console.engine.root_cause import first_failure, waits_on_peers
from mscon.console.engine.state_views import HISTORY, HISTORY_BUDGET, TAIL, AttemptView, NodeView, RankView


class ClusterState:
    def __init__(self) -> None:
        self.run_id = ""
        self.logs_dir = ""
        self.max_restarts = 0
        self.world_size = 0
        self.job = JobState.CONNECTING
        self.nodes: dict[str, NodeView] = {}
        self.ranks: dict[str, RankView] = {}
        self.attempts: list[AttemptView] = []
        self.divergent: set[str] = set()
        self.result: RunResult | None = None
        self.checks: dict[tuple[str, str], CheckReported] = {}  # (node, check) -> latest result
        self.checks_finished: ChecksFinished | None = None
        self.flagged: dict[str, StragglerFlagged] = {}  # stragglers of this attempt not cleared since
        self._straggled: dict[tuple[int, str], StragglerSummary] = {}  # every one of the run, for the summary
        self.fetched: dict[str, FetchSummary] = {}  # node -> its run folder copied back at the end
        # node -> what its standby for the coming attempt said last (StandbyUpdated; the latest
        # one's ``warm`` is the policy's word on the whole cluster)
        self.standby: dict[str, StandbyUpdated] = {}
        self.standby_warm = False
        self.events = 0
        self._clock = PhaseClock()  # where each attempt's start-up time went (phases())
        # Workers of the attempt and their successful exits so far: workers_succeeded() is asked
        # at every exit, and a full scan each time is quadratic in the ranks (8,000: seconds).
        self._workers = 0
        self._ok_exits = 0
        # Kept as the events come, for views that refresh many times a second at 80,000 ranks
        # (a scan of every rank per frame was most of a paint): the workers, in all and by
        # node, how many are in each state and how many have started; each node's latest check
        # results and the nodes with a failed one.
        self._worker_list: list[RankView] = []
        self._by_node: dict[str, tuple[RankView, ...]] = {}
        self._worker_states: Counter[RankState] = Counter()
        self._started = 0
        self._stepped = 0  # workers with a metric this attempt
        self._checks_of: dict[str, dict[str, CheckReported]] = {}
        self._node_states: Counter[NodeState] = Counter()
        self._failing: set[str] = set()
        # How often a rank's start (resume record, first step) changed, and the current attempt's
        # verdict as of that count: the TUI asks at every refresh, a scan of every rank.
        self._starts = 0
        self._resume_now: tuple[int, int, AttemptResume] | None = None

    # ------------------------------------------------------------ the reducer

    def apply(self, ev: Event) -> None:
        self.events += 1
        if isinstance(ev, AgentEvent):
            self._agent(ev)
        elif isinstance(ev, RunStarted):
            self.run_id, self.logs_dir, self.max_restarts = ev.run_id, ev.logs_dir, ev.max_restarts
            self.world_size = ev.world_size
            hosts = ev.hosts or ("",) * len(ev.nodes)
            self.nodes = {n: NodeView(n, h) for n, h in zip(ev.nodes, hosts, strict=False)}
            self._node_states = Counter({NodeState.PENDING: len(self.nodes)})
        elif isinstance(ev, NodeUpdate):
            self._node(ev)
        elif isinstance(ev, AttemptStarted):
            self._clock.started(ev)
            self.attempts.append(AttemptView(ev.attempt, started_ns=ev.ts_ns, warm=ev.warm))
            self.job = JobState.RUNNING
            keep = limit_for(len(ev.ranks), HISTORY_BUDGET, HISTORY)
            self.ranks = {
                r.name: RankView(r.name, r.node, r.rank, history=LossHistory(keep)) for r in ev.ranks
            }
            self._worker_list = [r for r in self.ranks.values() if not r.is_scheduler]
            by_node: dict[str, list[RankView]] = {}
            for r in self._worker_list:
                by_node.setdefault(r.node, []).append(r)
            self._by_node = {n: tuple(rs) for n, rs in by_node.items()}
            self._workers = len(self._worker_list)
            self._worker_states = Counter({RankState.PENDING: self._workers})
            self._started = 0
            self._stepped = 0
            self._ok_exits = 0
            self.flagged = {}
            self.standby, self.standby_warm = {}, False  # used, or killed: that attempt has started
        elif isinstance(ev, Stopping):
            att = self.attempt
            if att is not None and att.stop_reason is None:
                att.stop_reason = ev.reason
                self._clock.stopping(ev.ts_ns)
            self.job = JobState.STOPPING
        elif isinstance(ev, AttemptEnded):
            self._clock.ended(ev)
            att = self.attempt
            if att is not None:
                att.outcome, att.reason, att.root, att.ended_ns = (
                    ev.outcome,
                    ev.reason,
                    ev.root_cause,
                    ev.ts_ns,
                )
                att.summary = self.rank_summaries(att)
                att.resume = self.resume(att)
        elif isinstance(ev, StandbyUpdated):
            if any(u.attempt != ev.attempt for u in self.standby.values()):
                self.standby = {}
            self.standby[ev.node] = ev
            self.standby_warm = ev.warm
        elif isinstance(ev, Restarting):
            self.job = JobState.RESTARTING
        elif isinstance(ev, AwaitingOperator):
            self.job = JobState.AWAITING_OPERATOR
        elif isinstance(ev, LinesShown):
            for name, seq in ev.log_seq:
                r = self.ranks.get(name)
                if r is not None and seq > r.next_seq:
                    r.next_seq = seq
        elif isinstance(ev, ReplicaDivergence):
            self.divergent.update(ev.ranks)
        elif isinstance(ev, StragglerFlagged | StragglerCleared):
            self._straggler(ev)
        elif isinstance(ev, CheckReported):
            self.checks[(ev.node, ev.name)] = ev
            mine = self._checks_of.setdefault(ev.node, {})
            mine[ev.name] = ev
            if any(c.status is CheckStatus.FAIL for c in mine.values()):
                self._failing.add(ev.node)
            else:
                self._failing.discard(ev.node)
        elif isinstance(ev, ChecksFinished):
            self.checks_finished = ev
            self._clock.checks_done(ev.ts_ns)
        elif isinstance(ev, LogsFetched):
            self.fetched[ev.node] = FetchSummary(ev.node, ev.path, ev.bytes, ev.seconds, ev.error)
        elif isinstance(ev, RunFinished):
            self.result = ev.result
            self.job = ev.result.status

    def _straggler(self, ev: StragglerFlagged | StragglerCleared) -> None:
        key = (ev.attempt, ev.name)
        seen = self._straggled.get(key)
        if isinstance(ev, StragglerFlagged):
            self.flagged[ev.name] = ev
            times = seen.flagged + 1 if seen is not None else 1
            self._straggled[key] = StragglerSummary(
                ev.attempt, ev.name, ev.node, ev.step_time_s, ev.median_s, times, cleared=False
            )
        else:
            self.flagged.pop(ev.name, None)
            if seen is not None:
                self._straggled[key] = replace(seen, cleared=True)

    def _node(self, ev: NodeUpdate) -> None:
        view = self.nodes.get(ev.node)
        if view is None:
            view = self.nodes[ev.node] = NodeView(ev.node)
            self._node_states[view.state] += 1
        self._set_node_state(view, ev.state)
        view.detail = ev.detail
        self._clock.node(ev)
        if ev.state is not NodeState.LOST:
            return
        view.lost_ns = ev.ts_ns
        att = self.attempt
        if att is None or att.ended_ns is not None:
            return
        orphaned = [r for r in self.ranks.values() if r.node == ev.node and r.exited is None]
        for r in orphaned:
            self._set_state(r, RankState.LOST)
        if orphaned and not att.stop_reason:  # lost while it mattered, not cut off during our stop
            att.lost_nodes.append(
                Failure(
                    kind=FailureKind.NODE_LOST,
                    node=ev.node,
                    name=ev.node,
                    rank=None,
                    ts_ns=ev.ts_ns,
                    clock="console",
                    code=NODE_LOST_EXIT_CODE,
                    detail=f"lost the node {ev.node}" + (f": {ev.detail}" if ev.detail else ""),
                )
            )

    def _agent(self, ev: AgentEvent) -> None:
        msg = ev.msg
        att = self.attempt
        if isinstance(msg, LogBatch):
            r = self.ranks.get(msg.name)
            if r is None:
                return
            if msg.seq > r.next_seq and not r.summarised:
                r.lost_lines += msg.seq - r.next_seq
            r.next_seq = max(r.next_seq, msg.seq + len(msg.lines))
            r.tail.extend(msg.lines[-TAIL:])  # the deque keeps the last TAIL anyway
            self._progress(r, msg.ts_ns)
        elif isinstance(msg, MetricBatch):
            r = self.ranks.get(msg.name)
            if r is not None:
                for m in msg.metrics:
                    self._metric(r, m)
        elif isinstance(msg, NodeSummary):
            self._summary(msg)
        elif isinstance(msg, TelemetryBatch):
            ranks = self.ranks
            for t in msg.items:
                r = ranks.get(t.name)
                if r is not None:
                    _telemetry(r, t)
        elif isinstance(msg, Metric):
            r = self.ranks.get(msg.name)
            if r is not None:
                self._metric(r, msg)
        elif isinstance(msg, Telemetry):
            r = self.ranks.get(msg.name)
            if r is not None:
                _telemetry(r, msg)
        elif isinstance(msg, ProcStarted):
            self._clock.spawned(msg)
            r = self.ranks.get(msg.name)
            if r is not None:
                if r.started_ns is None and not r.is_scheduler:
                    self._started += 1
                self._set_state(r, RankState.STARTING)
                r.pid, r.started_ns = msg.pid, msg.ts_ns
                r.last_progress_ns = msg.ts_ns
            node = self.nodes.get(msg.node)
            if node is not None and node.state is NodeState.READY:
                self._set_node_state(node, NodeState.RUNNING)
        elif isinstance(msg, ProcExited):
            self._clock.exited(msg.ts_ns)
            self._exited(msg, att)
        elif isinstance(msg, ProcHung):
            r = self.ranks.get(msg.name)
            if r is None or r.exited is not None or att is None:
                return
            self._set_state(r, RankState.HUNG)
            r.hung = msg
            stopped = msg.why == "stopped"
            att.failures.append(
                Failure(
                    kind=FailureKind.STOPPED if stopped else FailureKind.HUNG,
                    node=msg.node,
                    name=msg.name,
                    rank=msg.rank,
                    ts_ns=msg.since_ns,
                    clock=f"agent on {msg.node}",
                    code=HANG_EXIT_CODE,
                    detail=(
                        f"stopped by a signal: process state {msg.state}"
                        if stopped
                        else f"{msg.why or 'no progress'}; process state {msg.state}"
                        + (f", waiting in {msg.wchan}" if msg.wchan else "")
                    ),
                    tail=msg.tail,
                    stack=msg.stack or (f"kernel wait channel: {msg.wchan}" if msg.wchan else None),
                    wchan=msg.wchan or None,
                )
            )
        elif isinstance(msg, Evidence):
            # What MindSpore says once we are stopping is about ranks we stopped: not evidence.
            if att is not None and att.stop_reason is None:
                att.evidence.append(msg)
        elif isinstance(msg, RankPhase):
            self._clock.rank_phase(msg)
            if msg.phase == Milestone.FIRST_STEP:
                r = self.ranks.get(msg.name)
                if r is not None and not r.stepped:
                    r.stepped = True
                    self._starts += 1
        elif isinstance(msg, RankResumed):
            r = self.ranks.get(msg.name)
            if r is not None and r.resumed is None:  # once per attempt: the first one counts
                r.resumed = msg
                self._starts += 1
        elif isinstance(msg, AllExited):
            node = self.nodes.get(msg.node)
            if node is not None and node.state in (NodeState.RUNNING, NodeState.READY):
                self._set_node_state(node, NodeState.DONE)
        elif isinstance(msg, AgentError):
            if att is not None and not any(
                r.started_ns for r in self.ranks.values() if r.node == msg.node
            ):  # the node could not even start its processes
                att.failures.append(
                    Failure(
                        kind=FailureKind.AGENT,
                        node=msg.node,
                        name=msg.node,
                        rank=None,
                        ts_ns=0,
                        clock=f"agent on {msg.node}",
                        code=NODE_LOST_EXIT_CODE,
                        detail=msg.message,
                    )
                )

    def _metric(self, r: RankView, msg: Metric) -> None:
        if r.first_step is None:  # its first metric of the attempt (resume.py)
            r.stepped, r.first_step = True, (msg.epoch, msg.step)
            self._starts += 1
        if r.last_step is None and not r.is_scheduler:
            self._stepped += 1
        r.last_step = msg.step
        if msg.loss is not None:
            r.last_loss = msg.loss
            r.history.append((msg.step, msg.loss))
        if msg.step_time_s is not None:
            r.step_time_s = msg.step_time_s
        if msg.samples_per_s is not None:
            r.samples_per_s = msg.samples_per_s
        if msg.device_memory_bytes is not None:
            r.device_memory_bytes = msg.device_memory_bytes
        self._progress(r, int(msg.ts * 1e9) if msg.ts else None)

    def _summary(self, msg: NodeSummary) -> None:
        """A node's word on each rank: its counts (a line read there is progress, sent or not),
        and the latest metric of each that stepped."""
        ranks = self.ranks
        ts_ns = int(msg.ts * 1e9) if msg.ts else None
        for c in msg.counts:
            r = ranks.get(c.name)
            if r is None:
                continue
            r.summarised = True
            if c.lines > r.node_lines:
                self._progress(r, ts_ns)
            r.node_lines, r.node_steps = c.lines, c.steps
        for m in msg.metrics:
            r = ranks.get(m.name)
            if r is not None:
                self._metric(r, m)

    def _set_node_state(self, view: NodeView, state: NodeState) -> None:
        """The one way a node's state changes (the counts by state follow it)."""
        self._node_states[view.state] -= 1
        self._node_states[state] += 1
        view.state = state

    def _set_state(self, r: RankView, state: RankState) -> None:
        """The one way a rank's state changes (the counts by state follow it)."""
        if not r.is_scheduler:
            self._worker_states[r.state] -= 1
            self._worker_states[state] += 1
        r.state = state

    def _progress(self, r: RankView, ts_ns: int | None) -> None:
        if ts_ns is not None and (r.last_progress_ns is None or ts_ns > r.last_progress_ns):
            r.last_progress_ns = ts_ns
        if r.state is RankState.STARTING:
            self._set_state(r, RankState.RUNNING)

    def _exited(self, msg: ProcExited, att: AttemptView | None) -> None:
        r = self.ranks.get(msg.name)
        if r is None:
            return
        if msg.ok and not r.is_scheduler and (r.exited is None or not r.exited.ok):
            self._ok_exits += 1
        r.exited = msg
        if msg.tail:
            r.tail.extend(line for line in msg.tail if not r.tail or line not in r.tail)
        if r.state is RankState.HUNG:
            return  # stays the hung rank it was, whatever stopped it
        if msg.ok:
            self._set_state(r, RankState.EXITED_OK)
        elif msg.stopped_by_agent:
            self._set_state(r, RankState.STOPPED)
        else:
            self._set_state(r, RankState.FAILED)
            if att is not None:
                att.failures.append(
                    Failure(
                        kind=FailureKind.SIGNAL if msg.signal else FailureKind.EXIT,
                        node=msg.node,
                        name=msg.name,
                        rank=msg.rank,
                        ts_ns=msg.ts_ns,
                        clock=f"agent on {msg.node}",
                        code=msg.shell_code,
                        detail=msg.describe(),
                        exitcode=msg.exitcode,
                        signal=msg.signal,
                        tail=msg.tail,
                        traceback=msg.traceback,
                    )
                )

    # ------------------------------------------------------------ what the readers ask

    @property
    def attempt(self) -> AttemptView | None:
        return self.attempts[-1] if self.attempts else None

    def restart_outlook(self) -> tuple[bool, str]:
        """Whether a restart now would start warm, and why not: the policy's word (``standby_warm``)
        with what the nodes said."""
        if self.standby_warm:
            return True, ""
        lost = [u for u in self.standby.values() if not u.ready]
        if lost:
            u = min(lost, key=lambda u: u.node)
            return False, f"the standby on {u.node} is gone: {u.why or 'a spare exited'}"
        if self.standby:
            return False, f"the standby cluster has joined on {len(self.standby)} of {len(self.nodes)} nodes"
        return False, "no standby cluster has joined"

    def workers(self) -> list[RankView]:
        """The current attempt's workers (not the scheduler), in its order; a new list each call."""
        return list(self._worker_list)

    def workers_on(self, node: str) -> tuple[RankView, ...]:
        """The current attempt's workers on ``node``, in its order."""
        return self._by_node.get(node, ())

    def worker_states(self) -> dict[RankState, int]:
        """How many of the current attempt's workers are in each state (states with none left out)."""
        return {s: n for s, n in self._worker_states.items() if n}

    def node_states(self) -> dict[NodeState, int]:
        """How many nodes are in each state (states with none left out)."""
        return {s: n for s, n in self._node_states.items() if n}

    def workers_started(self) -> int:
        """How many of the current attempt's workers have been started (ProcStarted)."""
        return self._started

    def worker_count(self) -> int:
        """How many workers the current attempt has."""
        return self._workers

    def workers_stepped(self) -> int:
        """How many of the current attempt's workers have reported a step (a metric)."""
        return self._stepped

    def checks_on(self, node: str) -> tuple[CheckReported, ...]:
        """The latest result of each preflight check on ``node`` ("*": the cluster-wide ones)."""
        return tuple(self._checks_of.get(node, {}).values())

    def checked_nodes(self) -> int:
        """Nodes (not "*") with at least one check result."""
        return len(self._checks_of) - ("*" in self._checks_of)

    def failing_nodes(self) -> frozenset[str]:
        """Nodes (not "*") whose latest result of some check is a failure."""
        return frozenset(n for n in self._failing if n != "*")

    def workers_succeeded(self) -> bool:
        if self._ok_exits < self._workers:  # not every worker has exited ok yet: no scan
            return False
        ws = self.workers()
        return bool(ws) and all(r.exited is not None and r.exited.ok for r in ws)

    def root_cause(self, att: AttemptView | None = None) -> Failure | None:
        """The one verdict: which rank (or node) made this attempt fail (root_cause.py)."""
        att = att or self.attempt
        return None if att is None else first_failure(att, self.ranks)

    def rank_summaries(self, att: AttemptView | None = None) -> tuple[RankSummary, ...]:
        att = att or self.attempt
        root = self.root_cause(att) if att is not None else None
        waiting = {f.name for f in att.failures if waits_on_peers(f)} if att is not None else set()
        rows = []
        for r in self.ranks.values():
            e = r.exited
            wall = (e.ts_ns - r.started_ns) / 1e9 if e is not None and r.started_ns is not None else None
            if r.state is RankState.HUNG:
                status = "hung" + (f", then {e.describe(short=True)}" if e is not None else "")
            elif e is None:
                status = "never started" if r.started_ns is None else r.state.value
            elif e.ok:
                status = "ok"
            elif e.stopped_by_agent:
                status = f"stopped ({e.describe(short=True)})"
            else:
                status = e.describe(short=True)
            if root is not None and root.name == r.name:
                role = "root cause"
            elif root is not None and r.state in (RankState.STOPPED, RankState.FAILED, RankState.LOST):
                role = "victim"
            elif root is not None and r.state is RankState.HUNG and r.name in waiting:
                role = "victim"  # silent because it waited on the root cause in a collective
            else:
                role = ""
            rows.append(
                RankSummary(
                    node=r.node,
                    name=r.name,
                    rank=r.rank,
                    status=status,
                    exitcode=e.exitcode if e else None,
                    signal=e.signal if e else None,
                    last_step=r.last_step,
                    last_loss=r.last_loss,
                    wall_s=wall,
                    role=role,
                )
            )
        return tuple(rows)

    def stragglers(self) -> frozenset[str]:
        """The current stragglers: flagged, not cleared, and still running (an exit ends it)."""
        ranks = self.ranks
        return frozenset(n for n in self.flagged if n in ranks and ranks[n].state.live)

    def straggler_summaries(self) -> tuple[StragglerSummary, ...]:
        """Every rank flagged during the run, by attempt and rank (RunResult.stragglers)."""
        return tuple(self._straggled[k] for k in sorted(self._straggled, key=_straggler_order))

    def phases(self, att: AttemptView | None = None) -> AttemptPhases | None:
        """Where this attempt's (default: the current one's) start-up time went, so far."""
        att = att or self.attempt
        return self._clock.phases(att.number) if att is not None else None

    def resume(self, att: AttemptView | None = None) -> AttemptResume | None:
        """Where this attempt's (default: the current one's) ranks started, so far (resume.py's
        verdict); fixed when the attempt ends. None for an attempt no longer current that ended
        before this state saw it."""
        att = att or self.attempt
        if att is None:
            return None
        if att.resume is not None or att is not self.attempt:
            return att.resume
        cached = self._resume_now
        if cached is not None and cached[:2] == (att.number, self._starts):
            return cached[2]
        first = next((a for a in self.attempts if a.number == 0), None)
        baseline = {}
        if att.number > 0 and first is not None and first.resume is not None:
            baseline = {
                s.name: (s.first_epoch, s.first_step) for s in first.resume.ranks if s.first_step is not None
            }
        earlier = [
            Reached(
                a.number,
                a.resume.verdict if a.resume is not None else None,
                tuple(r.last_step for r in a.summary),
            )
            for a in self.attempts
            if a.number < att.number and a.outcome is not None
        ]
        now = verdict(
            [
                rank_start(r.name, r.node, r.rank, r.resumed, r.stepped, r.first_step, baseline.get(r.name))
                for r in self.workers()
            ],
            frontier(att.number, earlier),
        )
        self._resume_now = (att.number, self._starts, now)
        return now

    def fetch_summaries(self) -> tuple[FetchSummary, ...]:
        """Each node's run folder copied back at the end, by node (RunResult.fetched)."""
        return tuple(self.fetched[n] for n in sorted(self.fetched))

    def attempt_summaries(self) -> tuple[AttemptSummary, ...]:
        out = []
        for att in self.attempts:
            if att.outcome is None:
                continue
            wall = ((att.ended_ns or att.started_ns) - att.started_ns) / 1e9
            out.append(
                AttemptSummary(
                    att.number,
                    att.outcome,
                    att.reason,
                    wall,
                    att.root,
                    att.summary,
                    self.phases(att),
                    att.resume,
                )
            )
        return tuple(out)


def _straggler_order(key: tuple[int, str]) -> tuple[int, tuple[int, str]]:
    attempt, name = key
    return attempt, by_rank(name)


def _telemetry(r: RankView, msg: Telemetry) -> None:
    r.cpu_percent, r.rss_bytes = msg.cpu_percent, msg.rss_bytes
    r.device_util = msg.device_util
    if msg.device_mem_bytes is not None:  # the device's own figure beats the trainer's
        r.device_memory_bytes, r.device_memory_total = msg.device_mem_bytes, msg.device_mem_total
