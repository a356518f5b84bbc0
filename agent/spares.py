"""Spare processes: the next attempt's ranks, started ahead with Python up and MindSpore imported,
and (``join``) already joined to the next attempt's own MindSpore cluster: the standby cluster.

A restart is a cold launch of every process unless something is ready: while a restart may come
(``Start.spares``), the agent starts one spare per process of its node (``spare_boot.py``) with the
next attempt's environment, as a cold attempt starts (a warm one: once its ranks have stepped;
``ranks._prepare_spares`` says why).

- Imported spares: when that attempt's Start comes, each process whose interpreter, script,
  working folder and environment match its spare's is handed to the spare (``take``: an order file
  and one line on its stdin) instead of being launched; the rest start cold.
- Joined spares (``Start.join_standby``): they also run MindSpore's ``init()`` against a scheduler
  port of their own (``protocol.standby_port``), the standby scheduler being node 0's spare, so the
  next attempt skips the cluster join, most of a restart's time. All or nothing: the standby is of
  use only when every process of every node is in it, so the agent says when its node's spares are
  joining, have all joined, or one is gone (``poll`` -> ``StandbyState``) and the policy starts the
  attempt warm
  (``Start.warm``: take the spares, on the standby port) only when every node's are ready; a cold
  attempt kills them first and launches on the inventory's port.

- Kept spares (``adopt``): the standby a run of the job left on the node as it ended
  (``kept.py``, ``keeper.py``) becomes attempt 0's, by the same all-or-nothing rule; their keeper
  is their parent, so their exits come from it (``kept.KeptPopen``).

Unused spares are killed. Spares die with the agent (parent-death signal, own session); kept ones
with their keeper, which ends them when the agent that took them goes.
Stdlib only, Python 3.8 syntax (runs on the nodes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

from . import kept, layout
from . import procs as procmod
from .protocol import ProcSpec, StandbyPhase, on_standby

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spare_boot.py")


class Spare:
    def __init__(
        self, spec: ProcSpec, popen: subprocess.Popen, cwd: str, env: dict, log: str = "", marker: str = ""
    ) -> None:
        self.spec = spec
        self.popen = popen
        self.cwd = cwd
        self.env = env
        self.log = log
        self.marker = marker  # there once it has joined its standby cluster (a joined spare's)
        self.keeper: kept.Keeper | None = None  # a kept spare: the keeper is its parent (kept.py)

    def fits(self, spec: ProcSpec, cwd: str, env: dict) -> bool:
        """It can become ``spec``: alive, same interpreter and script, same folder and environment
        (what MindSpore may read at import time is what the rank would have had). A kept spare
        came from another run: its folder is the order's, its environment the same but for the
        run's own keys (``kept.same_job_env``)."""
        if self.popen.poll() is not None or spec.argv[:2] != self.spec.argv[:2]:
            return False
        if self.keeper is not None:
            return kept.same_job_env(self.env, env) is None
        return cwd == self.cwd and env == self.env

    def give(self, order: str) -> bool:
        """Tell it what to become (the path of its order file); "": nothing, it goes on as it is
        and exits once its ``init()`` returns (a standby scheduler, serving its cluster)."""
        if self.keeper is not None:
            reply = self.keeper.ask({"op": "order", "name": self.spec.name, "path": order})
            return bool(reply and reply.get("ok"))
        assert self.popen.stdin is not None
        if order:
            self.popen.stdin.write((order + "\n").encode("utf-8"))
        self.popen.stdin.close()  # one short line into an empty pipe: never blocks
        return True

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=2.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - D state: the agent's exit reaps it
            pass


class Spares:
    """The node's spares for one coming attempt."""

    def __init__(self) -> None:
        self.attempt = -1  # the attempt they are for (-1: none started)
        self.joined = False  # they join a standby cluster (Start.join_standby)
        self._by_name: dict[str, Spare] = {}
        self._run_dir = ""
        self._said: StandbyPhase | None = None  # the standby state last reported (poll)
        self._keeper: kept.Keeper | None = None  # the adopted kept standby, until a take or a drop

    def prepare(self, run_dir: str, attempt: int, cwd: str, specs: tuple, join: bool = False) -> list:
        """Start a spare per eligible process for ``attempt``; the one-line errors of those that
        could not start (the attempt then starts them cold). ``join``: a standby cluster, so every
        process must have its spare, or none is started."""
        self.discard()
        self.attempt, self.joined, self._run_dir, self._said = attempt, join, run_dir, None
        if join:
            odd = [s.name for s in specs if not kept.eligible(s)]
            if odd:  # self.attempt is set: not tried again this attempt
                return ["no standby cluster: %s is not run as `python SCRIPT.py`" % ", ".join(odd)]
            specs = tuple(on_standby(s, attempt) for s in specs)
        log_dir = layout.attempt_folder(run_dir, attempt)
        base_env = procmod.attempt_env(attempt)
        errors = []
        folder = layout.spares_folder(run_dir)
        try:
            layout.private_dirs(folder)
        except OSError as exc:
            return ["cannot make %s: %s" % (folder, exc)]
        for spec in specs:
            if not kept.eligible(spec):
                continue
            env = procmod.process_env(spec, log_dir, base_env)
            log = layout.spare_log(run_dir, spec.name, attempt)
            argv = [spec.argv[0], BOOT]
            marker = layout.spare_joined(run_dir, spec.name, attempt)
            if join:
                try:
                    os.unlink(marker)
                except OSError:
                    pass
                argv += ["--join", marker]
            try:
                popen = procmod.spawn(argv, cwd, env, log, stdin=subprocess.PIPE)
            except OSError as exc:
                errors.append("spare for %s: %s" % (spec.name, exc))
                continue
            self._by_name[spec.name] = Spare(spec, popen, cwd, env, log, marker)
        if join and errors:
            self.discard()
        return errors

    def adopt(self, folder: str, run_dir: str, cwd: str, specs: tuple) -> str | None:
        """Take the standby a run of this job kept on the node (``keeper.py``) as attempt 0's
        (``specs`` on its standby port); why not (then it is dropped), or None."""
        self.discard()
        keeper = kept.connect(folder)
        if keeper is None:
            return "no standby kept on this node"
        state = keeper.ask({"op": "state"})
        why = "its keeper does not answer" if state is None else kept.fit(state, specs, run_dir)
        if why is None and keeper.ask({"op": "adopt"}) is None:
            why = "its keeper does not answer"
        if why is not None:
            keeper.drop()
            return why
        assert state is not None
        # Ready now, or once its spares have joined (a run that came while they join): poll says.
        self.attempt, self.joined, self._run_dir, self._said = 0, True, run_dir, None
        self._keeper = keeper
        for spec in specs:
            held = state["procs"][spec.name]
            popen = kept.KeptPopen(keeper, spec.name, int(held["pid"]))
            spare = Spare(spec, popen, cwd, held["env"], held["log"], held["marker"])
            spare.keeper = keeper
            self._by_name[spec.name] = spare
        return None

    def poll(self) -> tuple[StandbyPhase, str] | None:
        """The standby's state when it changed since the last call: (JOINING, "") once its spares
        run, (READY, "") once every one has joined (the scheduler's is alive), (LOST, why) once one
        is gone; None otherwise. A restart due while every node's is joining may wait for it."""
        if not self.joined or self.attempt < 0 or self._said is StandbyPhase.LOST:
            return None
        state = None
        for name, spare in sorted(self._by_name.items()):
            code = spare.popen.poll()
            if code is not None:
                exitcode, sig, _ = procmod.describe_exit(code)
                how = sig or "exit code %s" % exitcode
                state = (StandbyPhase.LOST, "the spare for %s exited (%s)" % (name, how))
                break
        if state is None:
            if len(self._by_name) == 0 or self._said is StandbyPhase.READY:
                return None
            joined = all(
                spare.spec.is_scheduler or os.path.exists(spare.marker) for spare in self._by_name.values()
            )
            state = (StandbyPhase.READY if joined else StandbyPhase.JOINING, "")
            if state[0] is self._said:
                return None
        self._said = state[0]
        return state

    def _fits(self, spare: Spare | None, spec: ProcSpec, run_dir: str, attempt: int, cwd: str) -> bool:
        """``spare`` can become ``spec``'s process of ``attempt``: the one test both a warm
        attempt's check and each take make (the environment a cold launch would give it)."""
        if spare is None or attempt != self.attempt:
            return False
        env = procmod.process_env(spec, layout.attempt_folder(run_dir, attempt), procmod.attempt_env(attempt))
        return spare.fits(spec, cwd, env)

    def missing(self, specs: tuple, run_dir: str, attempt: int, cwd: str) -> str | None:
        """Why the standby cannot be ``attempt`` (a spare gone since it said ready), or None. A warm
        attempt asks first: a cold rank would try to join a cluster already formed without it."""
        for spec in specs:
            if not self._fits(self._by_name.get(spec.name), spec, run_dir, attempt, cwd):
                return "the standby's process for %s is gone" % spec.name
        return None

    def take(self, spec: ProcSpec, run_dir: str, attempt: int, cwd: str) -> procmod.Proc | None:
        """``spec``'s process of ``attempt`` from its spare, or None (start it cold)."""
        spare = self._by_name.pop(spec.name, None)
        if spare is None:
            return None
        if not self._fits(spare, spec, run_dir, attempt, cwd):
            spare.kill()
            return None
        self._keeper = None  # taken: its ranks hold the connection (the keeper reaps them)
        log_dir = layout.attempt_folder(run_dir, attempt)
        metrics = layout.metrics_file(log_dir, spec.name)
        log_path = layout.log_file(log_dir, spec.name)
        if self.joined and spec.is_scheduler:
            # It has served the standby cluster since it started and reads no order (init() holds
            # the GIL): its spare log becomes the attempt's scheduler log too (a hard link, so both
            # names grow together and the layout holds for fetch and attach).
            spare_log = spare.log
            try:
                os.link(spare_log, log_path)
            except OSError:
                log_path = spare_log
            try:
                # Its input ends: once the cluster is over and init() returns, it exits (0) at once,
                # as a cold scheduler does, not at the linger's stop.
                if not spare.give(""):
                    raise OSError("its keeper took no order")
            except (OSError, ValueError):
                spare.kill()
                return None
            return procmod.Proc(spec, spare.popen, log_path, metrics)
        order = layout.spare_order(run_dir, spec.name)
        env = procmod.process_env(spec, log_dir, procmod.attempt_env(attempt))  # fits: as the spare's
        try:
            layout.private_dirs(layout.spares_folder(run_dir))
            layout.private_open(log_path, "ab").close()  # there before ProcStarted, as a cold rank's log
            with layout.private_open(order + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"argv": list(spec.argv), "env": env, "cwd": cwd, "log": log_path}, f)
            os.replace(order + ".tmp", order)
            if not spare.give(order):
                raise OSError("its keeper took no order")
        except (OSError, ValueError):
            spare.kill()
            return None
        return procmod.Proc(spec, spare.popen, log_path, metrics)

    def discard(self) -> None:
        """Kill every spare not taken (the attempt started, or the run is over); a kept standby
        none of whose spares was taken goes with its keeper."""
        for spare in self._by_name.values():
            spare.kill()
        self._by_name.clear()
        if self._keeper is not None:
            self._keeper.drop()
            self._keeper = None

    def __len__(self) -> int:
        return len(self._by_name)
