"""A detached run, node side: the socket consoles attach to, and the policy with no console.

Node 0's agent is the coordinator: it hears every node's lifecycle messages (its own, and the
followers' over ``coord.py`` links) and applies the run's policy as the console would:

- a rank fails, hangs, or a node is lost: stop every node;
- every node has stopped: restart the group (the next attempt's Start of each node came with the
  Detach) while restarts remain and no node was lost, after the backoff; else the run ends;
- every worker succeeded: the scheduler gets 5 s to exit, then it is stopped;
- an attached console's ``RunCommand``: stop the run, or restart the group.

What still needs a console: reconnecting a lost node (SSH is the console's), preflight, operator
commands, fetching logs to the operator's machine, and the replica checksums comparison.
Followers report to the coordinator and obey its Stop, Start and end; one that loses its
coordinator for the watchdog period stops its ranks (the coordinator's node holds the scheduler:
without it the collective cannot go on anyway).
"""

from __future__ import annotations

import time

from . import protocol as P
from .coord import CoordServer, PeerLink, dial
from .daemon import Client, SocketServer, daemonize
from .journal import RunStatus
from .relay import hello, replay

_PING_S = 1.0
_SCHEDULER_LINGER_S = 5.0
_END_FLUSH_S = 3.0  # at the run's end, attached consoles get this long to take the last lines

# What a follower tells its coordinator: enough to apply the policy.
_REPORTED = frozenset(["proc_exited", "proc_hung", "all_exited", "agent_error", "proc_started"])


class DetachedRun:
    def __init__(self, agent, msg: P.Detach) -> None:  # noqa: ANN001 - main.Agent (no import cycle)
        self.agent = agent
        self.msg = msg
        self.role = msg.role
        self.hang_timeout_s = msg.hang_timeout_s
        self.watchdog_s = max(5.0, agent.start_cmd.watchdog_s if agent.start_cmd else 5.0)
        self.server = SocketServer(agent.run_dir, agent.inbox)
        self.socket_path = self.server.path
        self.clients: list = []
        self.controller: Client | None = None
        self.coord_server: CoordServer | None = None
        self.coordinator_port = 0
        self.link: PeerLink | None = None  # a follower's link to the coordinator
        self.peers: dict = {}  # the coordinator's links, by follower name
        self.heard: dict = {}  # node -> monotonic time of its last line
        self.last_ping = 0.0
        self.ended = False  # the run is over: exit once our processes are
        self.end_at: float | None = None
        # The coordinator's view of the current attempt.
        self.attempt = agent.start_cmd.attempt
        self.nodes = list(msg.nodes) or [agent.node]
        self.done: set = set()
        self.lost: set = set()
        self.stopping = False
        self.stop_requested = ""
        self.restart_requested = False
        self.failed = False
        self.ok_workers: set = set()
        self.workers = sum(
            1
            for st in msg.next_starts
            if st.get("node") in self.nodes
            for p in st.get("procs", ())
            if p.get("rank", -1) >= 0
        )
        self.workers_done_at: float | None = None
        self.sched_stopped = False
        self.restarts_left = msg.restarts_left
        self.restart_at: float | None = None
        try:
            if self.role == P.Role.COORDINATOR:
                self.coord_server = CoordServer(msg.secret, self.nodes[1:], agent.inbox)
                self.coordinator_port = self.coord_server.port
            else:
                self.link = dial(
                    msg.coordinator_host, msg.coordinator_port, msg.secret, agent.node, agent.inbox
                )
                self.heard["coordinator"] = time.monotonic()
                # What the coordinator cannot have seen: how this node's attempt stands already.
                ok = [
                    w.proc.spec.name
                    for w in agent.watched
                    if w.proc.returncode == 0 and not w.proc.spec.is_scheduler
                ]
                self.link.send({"type": "status", "ok": ok, "all_exited": agent.all_exited_sent})
        except Exception:
            self.server.close()
            raise
        # What happened before the Detach (the console saw it): seed the view from the journal.
        self._seed()

    def _seed(self) -> None:
        for w in self.agent.watched:
            rc = w.proc.returncode
            if rc is not None and rc == 0 and not w.proc.spec.is_scheduler:
                self.ok_workers.add(w.proc.spec.name)
        if self.agent.all_exited_sent:
            self.done.add(self.agent.node)

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
        follower forwards what the coordinator needs."""
        if msg.type not in _REPORTED:
            return
        if self.coordinator:
            self._apply(self.agent.node, msg.to_dict())
        elif self.link is not None:
            self.link.send(msg.to_dict())

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
            old = self.peers.get(obj.node)
            if old is not None:
                old.close()
            self.peers[obj.node] = obj
            self.heard[obj.node] = time.monotonic()
        elif source == "peer":
            self._peer_msg(obj, line)

    def _client_line(self, client: Client, line: str | None) -> None:
        if line is None:
            if client in self.clients:
                self.clients.remove(client)
            if self.controller is client:
                self.controller = None
            return
        try:
            msg = P.decode(line)
        except P.ProtocolError:
            return
        if isinstance(msg, P.Attach):
            try:
                self._attach(client, msg)
            except (ValueError, TypeError, AttributeError) as exc:  # a malformed Attach
                client.send_line(P.encode(P.AgentError(node=self.agent.node, message="bad attach: %s" % exc)))
                client.end()
        elif isinstance(msg, P.RunCommand):
            if client is not self.controller:
                client.send_line(
                    P.encode(P.AgentError(node=self.agent.node, message="read-only: command refused"))
                )
            elif not self.coordinator:
                client.send_line(
                    P.encode(P.AgentError(node=self.agent.node, message="commands go to node 0"))
                )
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
        stops = {w.proc.spec.name: w.seq for w in self.agent.watched}
        metric_ends = {w.proc.spec.name: w.metrics.consumed for w in self.agent.watched}
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

    # ------------------------------------------------------------ the coordinator's policy

    def _peer_msg(self, link: PeerLink, raw: dict | None) -> None:
        if self.coordinator:
            if raw is None:
                if self.peers.get(link.node) is link:
                    del self.peers[link.node]
                    self._lost(link.node, "lost the link to its agent")
                return
            self.heard[link.node] = time.monotonic()
            if raw.get("type") != "ping":
                self._apply(link.node, raw)
            return
        # a follower: orders from the coordinator
        if raw is None:
            if not self.ended:
                self._orphaned("lost its coordinator (node 0)")
            return
        self.heard["coordinator"] = time.monotonic()
        kind = raw.get("type")
        if kind == "stop":
            self.agent.stop(
                str(raw.get("reason", "stopped by the coordinator")), float(raw.get("grace_s", 3.0))
            )
        elif kind == "start":
            try:
                start = P.from_dict(P.Start, {k: v for k, v in raw.items() if k != "type"})
            except P.ProtocolError as exc:
                self.agent.send(
                    P.AgentError(node=self.agent.node, message="bad start from the coordinator: %s" % exc)
                )
                return
            assert isinstance(start, P.Start)
            self.agent.start(start)
        elif kind == "end":
            self._end_here(str(raw.get("status", RunStatus.STOPPED)), str(raw.get("reason", "")))

    def _apply(self, node: str, raw: dict) -> None:
        """One lifecycle message of ``node`` (this one's or a follower's), as the coordinator."""
        kind = raw.get("type")
        name = raw.get("name")
        if kind == "proc_exited":
            ok = raw.get("exitcode") == 0
            if ok and raw.get("rank", -1) >= 0:
                self.ok_workers.add(name)
                if self.workers and len(self.ok_workers) >= self.workers and self.workers_done_at is None:
                    self.workers_done_at = time.monotonic()
            elif not ok and not raw.get("stopped_by_agent"):
                self.failed = True
                what = raw.get("signal") or "exit code %s" % raw.get("exitcode")
                self._group_stop("%s on %s failed (%s)" % (name, node, what), name)
        elif kind == "proc_hung":
            self.failed = True
            self._group_stop("%s on %s is hung (%s)" % (name, node, raw.get("why", "")), name)
        elif kind == "agent_error":
            if not self.stopping:
                self.failed = True
                self._group_stop("%s: %s" % (node, raw.get("message", "")), node)
        elif kind == "all_exited":
            self.done.add(node)
        elif kind == "status":  # a follower's standing as it detached
            for ok_name in raw.get("ok", ()):
                self._apply(node, {"type": "proc_exited", "name": ok_name, "exitcode": 0, "rank": 0})
            if raw.get("all_exited"):
                self.done.add(node)

    def _lost(self, node: str, why: str) -> None:
        self.lost.add(node)
        self.done.add(node)
        if not self.ended:
            self._coord(P.CoordKind.NODE_LOST, reason=why, trigger=node)
            self.failed = True
            self._group_stop("lost the node %s: %s" % (node, why), node)

    def _command(self, msg: P.RunCommand) -> None:
        if msg.action == "restart":
            if not self.stopping:
                self.restart_requested = True
                self._group_stop(
                    "%s: the whole group restarts (a rank cannot rejoin a running collective)"
                    % (msg.reason or "restart requested"),
                    None,
                )
            elif self.restart_at is not None:
                self.restart_at = time.monotonic()  # cut the backoff short
        elif not self.ended:
            self.stop_requested = msg.reason or "stop requested"
            if self.restart_at is not None:  # between attempts: nothing runs, the run just ends
                self.restart_at = None
                self._finish(RunStatus.STOPPED, self.stop_requested)
            else:
                self._group_stop(self.stop_requested, None)

    def _coord(self, kind: str, **fields: object) -> None:
        self.agent.send(
            P.Coord(node=self.agent.node, kind=kind, attempt=self.attempt, ts_ns=time.time_ns(), **fields)
        )

    def _group_stop(self, reason: str, trigger: str | None) -> None:
        if self.stopping:
            return
        self.stopping = True
        self._coord(P.CoordKind.STOPPING, reason=reason, trigger=trigger)
        grace = self.agent._grace()
        for link in list(self.peers.values()):
            link.send({"type": "stop", "reason": reason, "grace_s": grace})
        self.agent.stop(reason, grace)

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
        if now - self.last_ping >= _PING_S:
            self.last_ping = now
            if self.coordinator:
                for link in list(self.peers.values()):
                    link.send({"type": "ping"})
            elif self.link is not None:
                self.link.send({"type": "ping"})
        if self.coordinator:
            self._coordinate(now)
        elif now - self.heard.get("coordinator", now) > self.watchdog_s:
            self._orphaned("no word from its coordinator (node 0) for %gs" % self.watchdog_s)

    def _coordinate(self, now: float) -> None:
        # A follower that never dialled in, or went silent: lost.
        for node in self.nodes[1:]:
            if node in self.lost:
                continue
            last = self.heard.get(node)
            if last is None:
                self.heard[node] = now  # counts from the Detach
            elif now - last > self.watchdog_s:
                link = self.peers.pop(node, None)
                if link is not None:
                    link.close()
                self._lost(node, "no word from its agent for %gs" % self.watchdog_s)
        if (
            self.workers_done_at is not None
            and not self.sched_stopped
            and now - self.workers_done_at > _SCHEDULER_LINGER_S
        ):
            self.sched_stopped = True
            for link in list(self.peers.values()):
                link.send(
                    {
                        "type": "stop",
                        "reason": "scheduler outlived the workers",
                        "grace_s": self.agent._grace(),
                    }
                )
            self.agent.stop("scheduler outlived the workers", self.agent._grace())
        if self.restart_at is not None:
            if now >= self.restart_at:
                self._next_attempt()
            return
        if len(self.done) >= len(self.nodes):
            self._attempt_ended()

    def _attempt_ended(self) -> None:
        succeeded = self.workers > 0 and len(self.ok_workers) >= self.workers and not self.failed
        if self.stop_requested:
            outcome = "interrupted"
        elif succeeded:
            outcome = "succeeded"
        elif self.restart_requested:
            outcome = "restart"
        else:
            outcome = "failed"
        self._coord(P.CoordKind.ATTEMPT_ENDED, outcome=outcome)
        if outcome == "restart" or (outcome == "failed" and self.restarts_left > 0 and not self.lost):
            if outcome == "failed":
                self.restarts_left -= 1
            backoff = self.msg.backoff_s
            why = "restart requested" if outcome == "restart" else "attempt %d failed" % self.attempt
            self._coord(
                P.CoordKind.RESTARTING, reason=why, backoff_s=backoff, restarts_left=self.restarts_left
            )
            self.restart_at = time.monotonic() + backoff
            return
        if outcome == "failed" and self.lost:
            reason = "lost %s: reconnecting a node needs the console (mscon attach)" % ", ".join(
                sorted(self.lost)
            )
        else:
            reason = {"interrupted": self.stop_requested, "succeeded": "all ranks finished"}.get(outcome, "")
        status = {"succeeded": RunStatus.SUCCEEDED, "interrupted": RunStatus.STOPPED}.get(
            outcome, RunStatus.FAILED
        )
        self._finish(status, reason)

    def _finish(self, status: str = RunStatus.STOPPED, reason: str = "") -> None:
        self._coord(P.CoordKind.RUN_ENDED, outcome=status, reason=reason)
        for link in list(self.peers.values()):
            link.send({"type": "end", "status": status, "reason": reason})
        self._end_here(status, reason)

    def _next_attempt(self) -> None:
        self.restart_at = None
        self.attempt += 1
        self.done, self.ok_workers = set(), set()
        self.stopping = self.failed = self.restart_requested = False
        self.workers_done_at, self.sched_stopped = None, False
        self._coord(P.CoordKind.ATTEMPT_STARTED)
        for st in self.msg.next_starts:
            st = dict(st, attempt=self.attempt, workdir_archive=None)
            if st.get("node") == self.agent.node:
                start = P.from_dict(P.Start, {k: v for k, v in st.items() if k != "type"})
                assert isinstance(start, P.Start)
                self.agent.start(start)
                self.agent._save_state()
            else:
                link = self.peers.get(st.get("node"))
                if link is None or not link.send(dict(st, type="start")):
                    self._lost(str(st.get("node")), "not connected when the group restarted")

    # ------------------------------------------------------------ the end

    def _orphaned(self, why: str) -> None:
        self.agent.stop(why, self.agent._grace())
        self._end_here(RunStatus.FAILED, why)

    def _end_here(self, status: str, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        self.end_at = time.monotonic() + (_END_FLUSH_S if self.clients else 0.0)
        self.agent._save_state(status=status, reason=reason, attached=False)
        for c in self.clients:
            c.end()

    def close(self) -> None:
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
