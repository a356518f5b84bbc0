"""A detached run, node side: the socket consoles attach to, and the run's policy with no console.

Node 0's agent is the coordinator: it hears every node's lifecycle messages (its own, and the
followers' over ``coord.py`` links) and drives the run's policy (``policy.py``, the same machine
the console's supervisor drives) with them, carrying out what it decides: stop every node,
restart the group, stop a lingering scheduler, wait for an operator, end the run. Followers report
to the coordinator (``Message.reported``, without log tails or stacks) and obey its typed orders
(``LinkStop``, ``LinkStart``, ``LinkEnd``, ``Inspect``); each got its own next Start with its
Detach, so argv and env never cross the link. The hang rule is the policy's, as on a console: each
agent tells the coordinator how its ranks progress (``LinkProgress``, its own agent's read alike),
and the coordinator has the ranks it decides to inspect inspected by their agents. A follower
whose link ends dials again, and one that hears nothing from its coordinator for the watchdog
period stops its ranks (the coordinator's node holds the scheduler: without it the collective
cannot go on); the coordinator loses a follower it has not heard from for that long. Both rules
are the policy's (``liveness.py``).

What still needs a console: reconnecting a lost node (SSH is the console's), preflight, fetching
logs to the operator's machine, and the replica checksums comparison.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from .. import exit_codes
from .. import policy as pol
from .. import protocol as P
from ..journal import RunStatus
from ..liveness import Liveness
from .coord import CoordServer, PeerLink, dial_within
from .daemon import Client, SocketServer, daemonize
from .relay import hello, replay

_PING_S = 1.0
_COORDINATOR = "coordinator"  # a follower's one peer, as its Liveness names it
_PROGRESS_S = 0.5  # a follower's progress report (also its sign of life): silence is seen this late
_END_FLUSH_S = 3.0  # at the run's end, attached consoles get this long to take the last lines


def for_link(msg: P.Message) -> dict:
    """A reported message as a follower sends it: without what the policy never reads."""
    blank = {f.name: f.default for f in dataclasses.fields(msg) if f.name in msg.off_link}
    return (dataclasses.replace(msg, **blank) if blank else msg).to_dict()


def from_link(raw: dict) -> P.Message:
    body = dict(raw)
    return P.from_dict(P.message_class(str(body.pop("type", ""))), body)


class DetachedRun:
    def __init__(self, agent, msg: P.Detach) -> None:  # noqa: ANN001 - main.Agent (no import cycle)
        self.agent = agent
        self.msg = msg
        self.role = msg.role
        self.watchdog_s = max(pol.WATCHDOG_FLOOR_S, agent.start_cmd.watchdog_s if agent.start_cmd else 0.0)
        self.server = SocketServer(agent.run_dir, agent.inbox, node=agent.node)
        self.socket_path = self.server.path
        self.clients: list = []
        self.controller: Client | None = None
        self.coord_server: CoordServer | None = None
        self.coordinator_port = 0
        self.link: PeerLink | None = None  # a follower's link to the coordinator
        self.peers: dict = {}  # the coordinator's links, by follower name
        self.liveness: Liveness | None = None  # a follower's watch on its coordinator
        self.backlog: list = []  # a follower's reports while its link is down, sent once it is back
        self.dialling = False  # a follower's dial again is under way (a thread)
        self.stamps: dict = {}  # rank -> its last progress stamp heard of (a new one: progress)
        self.lost: set = set()
        self.end_status = ""  # how the run ended here (RunStatus), once it has
        self.last_ping = 0.0
        self.ended = False  # the run is over: exit once our processes are
        self.end_at: float | None = None
        self.nodes = list(msg.nodes) or [agent.node]
        self.policy: pol.RunPolicy | None = None
        try:
            if self.role == P.Role.COORDINATOR:
                self.policy = pol.RunPolicy(
                    pol.PolicyConfig(
                        nodes=tuple(self.nodes),
                        workers=dict(msg.workers),
                        max_restarts=msg.restarts_left,
                        backoff_s=msg.backoff_s,
                        grace_s=agent.grace(),
                        hang_timeout_s=msg.hang_timeout_s or None,  # None: from each rank's pace
                        can_reconnect=False,  # SSH is the console's
                        operator_wait_s=msg.operator_wait_s or None,
                        watched=tuple(self.nodes[1:]),  # each follower, heard from over its link
                        watchdog_s=self.watchdog_s,
                    )
                )
                self.policy.step(
                    pol.Resume(agent.start_cmd.attempt, time.monotonic(), tuple(msg.standby_ready))
                )
                # On the scheduler's address only (node 0's, where the followers reach it): none
                # given is an error (CoordServer), never every address.
                self.coord_server = CoordServer(
                    msg.secret,
                    self.nodes[1:],
                    agent.inbox,
                    host=msg.coordinator_host,
                    cert=msg.tls_cert,
                    key=msg.tls_key,
                )
                self.coordinator_port = self.coord_server.port
            else:
                # Tried again till the watchdog's time is up: a flood at the coordinator's port
                # may refuse a try or two (agent/gate.py).
                self.link = dial_within(
                    msg.coordinator_host,
                    msg.coordinator_port,
                    msg.secret,
                    agent.node,
                    agent.inbox,
                    time.monotonic() + self.watchdog_s,
                    cert=msg.tls_cert,
                    key=msg.tls_key,
                )
                self.liveness = Liveness((_COORDINATOR,), self.watchdog_s, time.monotonic(), redials=True)
                # What the coordinator cannot have seen: how this node's attempt stands already.
                self.link.send(self._status().to_dict())
        except Exception:
            self.server.close()
            raise
        if self.policy is not None:  # what happened before the Detach (the console saw it)
            self._seed(self.agent.node, self._status())

    def _status(self) -> P.LinkStatus:
        watched = self.agent.watched
        return P.LinkStatus(
            started=tuple(w.proc.spec.name for w in watched),
            ok=tuple(
                w.proc.spec.name for w in watched if w.proc.returncode == 0 and not w.proc.spec.is_scheduler
            ),
            all_exited=bool(self.agent.all_exited_sent),
        )

    def _seed(self, node: str, status: P.LinkStatus) -> None:
        now = time.monotonic()
        events: list = [pol.RankStarted(node, name, now) for name in status.started]
        events += [pol.RankExited(node, name, True, True, False, "", now) for name in status.ok]
        if status.all_exited:
            events.append(pol.NodeDone(node, now))
        for ev in events:
            self._decide(ev)

    @property
    def coordinator(self) -> bool:
        return self.role == P.Role.COORDINATOR

    # ------------------------------------------------------------ outputs

    def broadcast(self, line: str) -> None:
        for c in self.clients:
            if c.attached:
                c.send_line(line)

    def observe(self, msg: P.Message) -> None:
        """Every message this agent sends passes here: the coordinator applies it to its view, a
        follower reports what the coordinator needs."""
        if not msg.reported:
            return
        if self.coordinator:
            self._apply(self.agent.node, msg)
        elif not self._to_coordinator(for_link(msg)):
            self.backlog.append(for_link(msg))  # the link is down: once it is back, in order

    def console_left(self) -> None:
        """The console closed its channel after our Detached: from now on we are a daemon."""
        self.agent.outbox.close(1.0)  # what is still queued for the console, before stdout goes
        daemonize(self.agent.run_dir)

    # ------------------------------------------------------------ inputs

    def handle(self, source: str, obj, line) -> None:  # noqa: ANN001
        if source == "client_up":
            self.clients.append(obj)
            obj.send_line(P.encode(hello(self.agent.node)))
        elif source == "client":
            self._client_line(obj, line)
        elif source == "peer_up":
            if obj.node in self.lost:  # back too late: the run went on without it
                obj.close()
                return
            old = self.peers.get(obj.node)
            if old is not None:
                old.close()
            self.peers[obj.node] = obj
            self._decide(pol.Heard(obj.node, time.monotonic()))
        elif source == "peer":
            self._peer_msg(obj, line)
        elif source == "dialled":
            self._dialled(obj)

    def _client_line(self, client: Client, line: str | None) -> None:
        if line is None:
            client.end()  # after whatever its Attach queued: then its writer closes and ends
            if client in self.clients:
                self.clients.remove(client)
            if self.controller is client:
                self.controller = None
            return
        # Whatever a client sends is answered, never raised: bad JSON, a list as type, Infinity for
        # a line number, nesting deep enough to exhaust the recursion limit.
        malformed = (ValueError, TypeError, AttributeError, KeyError, OverflowError, RecursionError)

        def refuse(what: str) -> None:
            client.send_line(P.encode(P.AgentError(node=self.agent.node, message=what)))

        try:
            msg = P.decode(line)
        except malformed as exc:
            refuse("bad message: %.200s" % exc)
            return
        if isinstance(msg, P.Attach):
            counts = [msg.journal_from, msg.log_attempt]
            counts += list(msg.log_from.values()) if isinstance(msg.log_from, dict) else [None]
            if not all(type(n) is int for n in counts):  # not bool, not float (Infinity, NaN)
                refuse("bad attach: journal_from, log_attempt and the log_from counts are integers")
                client.end()
                return
            try:
                self._attach(client, msg)
            except malformed as exc:
                refuse("bad attach: %.200s" % exc)
                client.end()
        elif isinstance(msg, P.RunCommand):
            if msg.action not in ("stop", "restart") or not isinstance(msg.reason, str):
                refuse("bad run_command: the action is stop or restart, the reason a string")
            elif client is not self.controller:
                refuse("read-only: command refused")
            elif not self.coordinator:
                refuse("commands go to node 0")
            else:
                self._command(msg)

    def _attach(self, client: Client, msg: P.Attach) -> None:
        node = self.agent.node
        if not msg.read_only and self.controller is not None and not self.controller.closed:
            who = self.controller.console or "another console"
            client.send_line(
                P.encode(
                    P.AgentError(
                        node=node,
                        message="already attached by %s: one console steers a run at a time "
                        "(mscon logs -f follows it read-only)" % who,
                    )
                )
            )
            client.end()
            return
        client.read_only = msg.read_only
        client.console = msg.console
        if msg.follow:  # the replay stops where the live stream takes over
            stops = {w.proc.spec.name: w.seq for w in self.agent.watched}
            metric_ends = {w.proc.spec.name: w.metrics.consumed for w in self.agent.watched}
        else:  # mscon logs: everything the files hold now, streamed by this agent yet or not
            stops, metric_ends = None, None
        attempt = self.agent.start_cmd.attempt

        def send(m: P.Message) -> None:
            client.send_line(P.encode(m))

        replay(
            node,
            self.agent.run_dir,
            msg,
            send,
            live=True,
            attempt=attempt,
            stops=stops,
            metric_ends=metric_ends,
            line_metrics=self.agent.line_metrics,
        )
        send(P.ReplayDone(node=node))
        if not msg.follow or self.ended:
            client.end()
            return
        client.attached = True
        if not msg.read_only:
            self.controller = client
            self.agent._save_state(console=msg.console, attached=True)

    # ------------------------------------------------------------ the links

    def _peer_msg(self, link: PeerLink, raw: dict | None) -> None:
        now = time.monotonic()
        if raw is None:  # not lost yet: the follower dials again, within the watchdog
            if self.coordinator:
                if self.peers.get(link.node) is link:
                    del self.peers[link.node]
                    self._decide(pol.LinkLost(link.node, now))
            elif link is self.link and not self.ended:
                self.link = None
                self._live(pol.LinkLost(_COORDINATOR, now))
            return
        if self.coordinator:
            self._decide(pol.Heard(link.node, now))
        else:
            self._live(pol.Heard(_COORDINATOR, now))
        try:
            msg = from_link(raw)
        except (P.ProtocolError, TypeError, ValueError) as exc:
            self.agent.send(P.AgentError(node=self.agent.node, message="bad link message: %.200s" % exc))
            return
        if self.coordinator:
            if isinstance(msg, P.LinkStatus):
                self._seed(link.node, msg)
            elif isinstance(msg, P.LinkProgress):
                self._ranks_heard(msg.attempt, msg.ranks, time.monotonic())
            elif msg.reported:
                self._apply(link.node, msg)
            return
        # a follower: orders from the coordinator
        if isinstance(msg, P.LinkStop):
            self.agent.stop(msg.reason, msg.grace_s)
        elif isinstance(msg, P.LinkStart):
            self._start_own(msg.attempt, msg.warm)
        elif isinstance(msg, P.LinkEnd):
            self._end_here(msg.status, msg.reason)
        elif isinstance(msg, P.Inspect):
            self.agent.inspect(msg)

    def _start_own(self, attempt: int, warm: bool) -> None:
        start = P.from_dict(
            P.Start, dict(self.msg.next_start, attempt=attempt, workdir_archive=None, warm=warm)
        )
        assert isinstance(start, P.Start)
        self.agent.start(start)
        self.agent._save_state(reason="")

    def _send_peers(self, msg: P.Message) -> None:
        for link in list(self.peers.values()):
            link.send(msg.to_dict())

    # ------------------------------------------------------------ the coordinator: the policy's host

    def _apply(self, node: str, msg: P.Message) -> None:
        """One lifecycle message of ``node`` (this one's or a follower's), as the coordinator."""
        ev = pol.from_message(node, msg, time.monotonic())
        if ev is not None:
            self._decide(ev)

    def _ranks_heard(self, attempt: int, ranks: dict, now: float) -> None:
        """A node's progress report (``Ranks.progress_report``) as the policy's: a rank's progress
        only when its stamp is new (a report's time on the way must not look like progress)."""
        if self.policy is None or attempt != self.policy.attempt:
            return  # a report from before a restart: those ranks are gone
        for name, (stamp, silent_s, pace) in ranks.items():
            new = self.stamps.get(name) != stamp
            self.stamps[name] = stamp
            at = now - float(silent_s) if new else None
            self._decide(pol.ProgressReport(name, at, tuple(pace) if pace else None))

    def _command(self, msg: P.RunCommand) -> None:
        now = time.monotonic()
        if msg.action == "restart":
            self._decide(pol.RestartRequested(msg.reason or "restart requested", now))
        else:
            self._decide(pol.StopRequested(msg.reason or "stop requested", exit_codes.INTERRUPTED, now))

    def _coord(self, kind: str, **fields: object) -> None:
        attempt = self.policy.attempt if self.policy is not None else self.agent.start_cmd.attempt
        self.agent.send(
            P.Coord(node=self.agent.node, kind=kind, attempt=attempt, ts_ns=time.time_ns(), **fields)
        )

    def _decide(self, ev: pol.Input) -> None:
        """Feed the policy and carry out what it decides, in order."""
        if self.policy is None or self.ended:
            return
        pending = list(self.policy.step(ev))
        while pending:
            act = pending.pop(0)
            pending.extend(self._carry_out(act))

    def _carry_out(self, act: pol.Action) -> list:
        grace = self.agent.grace()
        if isinstance(act, pol.StopAll):
            if act.announce:
                self._coord(P.CoordKind.STOPPING, reason=act.reason, trigger=act.trigger)
            self._send_peers(P.LinkStop(reason=act.reason, grace_s=grace))
            self.agent.stop(act.reason, grace)
        elif isinstance(act, pol.StopScheduler):
            self._send_peers(P.LinkStop(reason=act.reason, grace_s=grace))
            self.agent.stop(act.reason, grace)
        elif isinstance(act, pol.Force):
            self._send_peers(P.LinkStop(reason="stop forced", grace_s=0.0))
            self.agent.stop("stop forced", 0.0)
        elif isinstance(act, pol.Inspect):
            ask = P.Inspect(names=act.names, reason=act.reason, silent_s=act.silent_s)
            if act.node == self.agent.node:
                self.agent.inspect(ask)
            elif act.node in self.peers:
                self.peers[act.node].send(ask.to_dict())
        elif isinstance(act, pol.StopNode):
            link = self.peers.get(act.node)
            if link is not None:
                link.send(P.LinkStop(reason=act.reason, grace_s=grace).to_dict())
        elif isinstance(act, pol.CutOff):
            for node in act.nodes:
                link = self.peers.pop(node, None)
                if link is not None:
                    link.close()
                if node not in self.lost:
                    self.lost.add(node)
                    self._coord(P.CoordKind.NODE_LOST, reason=act.why, trigger=node)
        elif isinstance(act, pol.AttemptOver):
            self._coord(P.CoordKind.ATTEMPT_ENDED, outcome=act.outcome.value, reason=act.reason)
        elif isinstance(act, pol.Restarting):
            self._coord(
                P.CoordKind.RESTARTING,
                reason=act.why,
                backoff_s=act.backoff_s,
                restarts_left=act.restarts_left,
            )
        elif isinstance(act, pol.AwaitOperator):
            self._coord(
                P.CoordKind.AWAITING_OPERATOR,
                reason="attempt %d failed" % act.attempt,
                wait_s=act.wait_s or 0.0,
            )
            self.agent._save_state(reason="failed; waiting for an operator (mscon attach, then r)")
        elif isinstance(act, pol.StartAttempt):
            return self._start_attempt(act.attempt, act.warm)
        elif isinstance(act, pol.EndRun):
            self._finish(act.verdict.status.value, act.verdict.reason or "")
        return []

    def _start_attempt(self, attempt: int, warm: bool) -> list:
        self._coord(P.CoordKind.ATTEMPT_STARTED, warm=warm)
        self._start_own(attempt, warm)
        now, lost = time.monotonic(), []
        for node in self.nodes[1:]:
            link = self.peers.get(node)
            if link is None or not link.send(P.LinkStart(attempt=attempt, warm=warm).to_dict()):
                lost.append(pol.NodeLost(node, "not connected when the group restarted", now))
        assert self.policy is not None
        return [a for ev in lost for a in self.policy.step(ev)]

    def tick(self) -> None:
        now = time.monotonic()
        if self.ended:
            if (
                self.end_at is not None
                and now >= self.end_at
                and not any(w.proc.alive for w in self.agent.watched)
            ):
                self.agent.exit_now = True
            return
        if now - self.last_ping >= (_PING_S if self.coordinator else _PROGRESS_S):
            self.last_ping = now
            if self.coordinator:
                self._send_peers(P.LinkPing())
            else:
                attempt, ranks = self.agent.start_cmd.attempt, self.agent.progress_report()
                self._to_coordinator(P.LinkProgress(attempt=attempt, ranks=ranks).to_dict())
        if not self.coordinator:
            self._live(pol.Tick(now))
            return
        if self.policy is not None:
            self._ranks_heard(self.agent.start_cmd.attempt, self.agent.progress_report(), now)
        self._decide(pol.Tick(now))

    # ------------------------------------------------------------ a follower's link (liveness.py)

    def _live(self, ev: pol.Input) -> None:
        """Feed the follower's watch on its coordinator and carry out what it says."""
        if self.liveness is None or self.ended:
            return
        for act in self.liveness.step(ev):
            if isinstance(act, pol.PeerLost):
                self._orphaned("lost its coordinator (node 0): %s" % act.why)
            elif isinstance(act, pol.Redial) and not self.dialling:
                self.dialling = True
                threading.Thread(target=self._dial_again, name="redial", daemon=True).start()

    def _to_coordinator(self, raw: dict) -> bool:
        """Send on the follower's link; False when it is down (a failed write ends it: dial again)."""
        link = self.link
        if link is None:
            return False
        if link.send(raw):
            return True
        link.close()
        self._peer_msg(link, None)
        return False

    def _dial_again(self) -> None:
        """On a thread of its own (a dial can take seconds): the link, or None, to the loop."""
        msg, link = self.msg, None
        try:
            link = dial_within(
                msg.coordinator_host,
                msg.coordinator_port,
                msg.secret,
                self.agent.node,
                self.agent.inbox,
                time.monotonic() + self.watchdog_s,
                cert=msg.tls_cert,
                key=msg.tls_key,
            )
        except Exception:  # noqa: BLE001 - refused, reset, timed out: the watch says when to try again
            pass
        self.agent.inbox.put(("dialled", link, None))

    def _dialled(self, link: PeerLink | None) -> None:
        self.dialling = False
        if link is None:
            return
        if self.ended or self.link is not None:
            link.close()
            return
        self.link = link
        backlog, self.backlog = self.backlog, []
        for raw in backlog:  # what happened while it was down, in order
            if not link.send(raw):
                self.backlog.append(raw)
        self._live(pol.Heard(_COORDINATOR, time.monotonic()))

    def _finish(self, status: str, reason: str = "") -> None:
        self._coord(P.CoordKind.RUN_ENDED, outcome=status, reason=reason)
        self._send_peers(P.LinkEnd(status=status, reason=reason))
        self._end_here(status, reason)

    # ------------------------------------------------------------ the end

    def _orphaned(self, why: str) -> None:
        self.agent.stop(why, self.agent.grace())
        self._end_here(RunStatus.FAILED, why)

    def _end_here(self, status: str, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        self.end_status = status
        self.agent.spares.discard()  # no attempt follows
        self.end_at = time.monotonic() + (_END_FLUSH_S if self.clients else 0.0)
        self.agent._save_state(status=status, reason=reason, attached=False)
        for c in self.clients:
            c.end()

    def close(self) -> None:
        if self.end_status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            # Ended by itself, as an attached run's Shutdown.keep_warm_s says: a standby for the next.
            self.agent.keep_standby(self.msg.keep_warm_s)
        deadline = time.monotonic() + _END_FLUSH_S
        for c in self.clients:
            while not c.closed and not c.out.empty() and time.monotonic() < deadline:
                time.sleep(0.02)
            c.close()
        self.server.close()
        if self.coord_server is not None:
            self.coord_server.close()
        for link in list(self.peers.values()):
            link.close()
        if self.link is not None:
            self.link.close()
