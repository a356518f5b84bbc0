"""Preflight: every check on every node at once, before any rank starts (``mscon check``, and the
quick ones before ``mscon run``).

It runs inside the Supervisor, over its ClusterSession (``RunOptions.preflight``): after the agents
are up and the scheduler's address is known, before the first attempt. The nodes run their own
checks (``agent/checks/``) on request; the console adds what only it can see (``checks_console``):
one MindSpore version and driver everywhere, the clocks' skew, a TCP mesh between the nodes that
includes the scheduler's address, the agents' protocol, the job's arguments through the trainer's
own checks, and (``mscon check``) a real AllReduce over every rank, launched like a job. Each result
is a ``CheckReported`` event as soon as it is known, and ``ChecksFinished`` ends them.

While it runs, the session's inbox is swapped for a router that takes the nodes' answers to the
checks and passes everything else on to the supervisor, which keeps serving Ctrl-C meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from mscon.agent import checks as node_checks
from mscon.agent.layout import LOGS_DIR
from mscon.agent.protocol import (
    PROTOCOL_VERSION,
    CheckResult,
    ChecksDone,
    LogBatch,
    MeshClose,
    MeshListen,
    MeshListening,
    MeshProbe,
    MeshResult,
    Message,
    RunChecks,
)
from mscon.console.config.inventory import HangSpec, Inventory, RestartSpec
from mscon.console.engine import exit_codes
from mscon.console.engine.bus import EventBus
from mscon.console.engine.commands import Command, StopJob
from mscon.console.engine.events import (
    AgentEvent,
    CheckReported,
    ChecksFinished,
    CheckStatus,
    Event,
    JobState,
    RunResult,
)
from mscon.console.engine.plan import NodePlan
from mscon.console.engine.session import ClusterSession, Inbox, NodeLink
from mscon.console.preflight import checks as cc


@dataclass(frozen=True, slots=True)
class JobView:
    """What preflight needs to know of the run it checks."""

    inv: Inventory
    plans: tuple[NodePlan, ...]
    script: str
    args: tuple[str, ...]
    args_given: bool  # the arguments came after -- (else they are the inventory's job.args)
    run_id: str
    accept_new_host_keys: bool


class NestedRun(Protocol):
    """A run of its own (the collective smoke test), launched exactly like a job."""

    async def run(self) -> RunResult: ...

    def submit(self, cmd: Command) -> None: ...


class RunHost(Protocol):
    """The run preflight serves (the supervisor): its job, its events, and a way to launch the
    smoke test. Preflight never reaches into the supervisor itself."""

    @property
    def job(self) -> JobView: ...

    @property
    def attempt_no(self) -> int: ...

    def emit(self, ev: Event) -> None: ...

    def nested_run(self, inv: Inventory, run_id: str, logs_root: Path, bus: EventBus) -> NestedRun: ...


_CLOCK_PROBES = 3  # readings per node; the one with the shortest round trip is kept
_LISTEN_WAIT_S = 10.0
_PROBE_TIMEOUT_S = 3.0  # per connection in the mesh test
_LINT_TIMEOUT_S = 30.0
_NODE_TIMEOUT_S = 20.0  # each subprocess of a node check
_QUICK_WAIT_S = 45.0  # for all of a node's answers
_FULL_WAIT_S = 120.0  # importing MindSpore on a busy node can take a minute (its own limit is 60 s)
_DEVICE_SWEEP_MAX_BYTES = 256 * 2**20  # NCCL/HCCL reach their bus bandwidth in the hundreds of MiB
_CPU_SWEEP_MAX_BYTES = 2**20
# The keys the launcher sets per rank: not part of the environment the checks should look at.
_LAUNCHER_KEYS = frozenset(
    {
        "MS_ROLE",
        "MS_NODE_ID",
        "RANK_ID",
        "DEVICE_ID",
        "LOCAL_RANK",
        "MS_SCHED_HOST",
        "MS_SCHED_PORT",
        "MS_WORKER_NUM",
        "RANK_SIZE",
    }
)
# A failure of one of these makes the smoke test pointless: it could only hang or repeat it.
_BLOCKS_COLLECTIVE = ("python", "mindspore", "port", "mesh", "sched")

# Runs the trainer's own argument checks (trainer/config.py) in a subprocess: they report by
# printing and exiting, and the job's trainer should not be imported into the console.
_LINT_PROGRAM = """
import contextlib, io, json, sys
root, mode, argv, size = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, root)
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        from trainer import config
        if mode == "trainer":
            config.parse_args(argv, config.Cluster(in_cluster=True, is_scheduler=False, size=size))
        else:
            config.normalise_mode(argv[0])
except SystemExit as exc:
    print(json.dumps({"ok": False, "code": exc.code, "error": err.getvalue()}))
except Exception as exc:
    print(json.dumps({"ok": False, "why": "cannot load %s/trainer/config.py: %s" % (root, exc)}))
else:
    print(json.dumps({"ok": True}))
"""


@dataclass(frozen=True, slots=True)
class PreflightOptions:
    quick: bool = False  # the cheap subset (before mscon run), or every check (mscon check)
    collective: bool = False  # the AllReduce smoke test over every rank
    sweep: bool | None = None  # its bandwidth sweep; None: on GPU/Ascend, off on CPU
    skip: tuple[str, ...] = ()  # --skip-check: not run, not counted, recorded
    checks_only: bool = False  # mscon check: the run ends after the checks
    shm_path: str | None = None  # MSCON_SHM_PATH: where shared memory is checked (a node's env wins)
    smoke_timeout_s: float = 300.0
    smoke_logs_root: Path = Path(LOGS_DIR)  # a failed smoke test keeps its logs here


@dataclass(frozen=True, slots=True)
class Verdict:
    proceed: bool  # go on to the first attempt
    status: JobState = JobState.SUCCEEDED
    exit_code: int = exit_codes.OK
    reason: str = ""


def known_check(name: str) -> bool:
    """A name --skip-check accepts: a check, a group (gpu, npu, limits) or one of their results."""
    top = name.split(".", 1)[0]
    return top in node_checks.NODE_CHECKS or top in cc.CONSOLE_CHECKS or top in ("gpu", "npu")


def all_check_names() -> tuple[str, ...]:
    return tuple(node_checks.NODE_CHECKS) + cc.CONSOLE_CHECKS


class _Router:
    """Stands in for the session's inbox during preflight: the nodes' answers go to the queue of
    their conversation, everything else (and lost channels, too) on to the supervisor."""

    _STREAMS: dict[type[Message], str] = {
        CheckResult: "checks",
        ChecksDone: "checks",
        MeshListening: "listen",
        MeshResult: "probe",
    }

    def __init__(self, downstream: Inbox) -> None:
        self.downstream = downstream
        self.queues: dict[tuple[str, str], asyncio.Queue[tuple[int, Message | None]]] = {}

    def queue(self, node: str, stream: str) -> asyncio.Queue[tuple[int, Message | None]]:
        return self.queues.setdefault((node, stream), asyncio.Queue())

    def put_nowait(self, item: tuple[str, Message | None]) -> None:
        node, msg = item
        now = time.time_ns()  # the clock test's receive time: stamped on arrival, not when read
        if msg is None:
            for (n, _), q in self.queues.items():
                if n == node:
                    q.put_nowait((now, None))
            self.downstream.put_nowait(item)
            return
        stream = self._STREAMS.get(type(msg))
        if stream is None:
            self.downstream.put_nowait(item)
        else:
            self.queue(node, stream).put_nowait((now, msg))

    async def put(self, item: tuple[str, Message | None]) -> None:
        self.put_nowait(item)


class _Lost(Exception):
    """The node's channel ended, or it did not answer in time."""


@dataclass(slots=True)
class _Run:
    """One preflight's working state (the Preflight object itself only keeps the outcome)."""

    sup: RunHost
    session: ClusterSession
    router: _Router
    sched: str
    deadline: float
    by_node: dict[str, dict[str, CheckReported]] = field(default_factory=dict)
    clocks: dict[str, cc.ClockSample] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)


class Preflight:
    def __init__(self, options: PreflightOptions) -> None:
        self.options = options
        self.results: list[CheckReported] = []
        self.finished: ChecksFinished | None = None
        self.wall_s = 0.0

    # ------------------------------------------------------------ what the supervisor calls

    def unreachable(self, sup: RunHost, session: ClusterSession) -> None:
        """The session could not open every node: each one's reach error (or protocol mismatch) as
        a result, so the table shows what the one-line errors say."""
        results = []
        for link in session.links.values():
            if link.hello is not None:
                results.append(cc.protocol_result(link.name, link.hello.protocol, PROTOCOL_VERSION))
            elif link.error:
                results.append(cc.reach_result(link.name, link.error))
        for r in results:
            self._emit(sup, r)
        self._finish(sup)

    async def run(self, sup: RunHost, session: ClusterSession, sched: str) -> Verdict:
        t0 = time.monotonic()
        router = _Router(session.inbox)
        wait = _QUICK_WAIT_S if self.options.quick else _FULL_WAIT_S
        run = _Run(sup, session, router, sched, time.monotonic() + wait)
        with session.diverted(router):
            await self._checks(run)
        if self.options.collective and not self._skipped("collective"):
            blocked = [
                r for r in self.results if r.status is CheckStatus.FAIL and r.name in _BLOCKS_COLLECTIVE
            ]
            if blocked:
                why = ", ".join(f"{r.node}: {r.name}" for r in blocked)
                self._emit(
                    sup,
                    cc.result(
                        cc.ALL, "collective", CheckStatus.NA, "not run: fix the failures first", "", why
                    ),
                )
            else:
                for r in await self._collective(sup):
                    self._emit(sup, r)
        self.wall_s = time.monotonic() - t0
        self._finish(sup)
        return self._verdict(run)

    # ------------------------------------------------------------ the checks

    async def _checks(self, run: _Run) -> None:
        links = [link for link in run.session.links.values() if link.open]
        for link in links:
            assert link.hello is not None
            self._emit(run.sup, cc.protocol_result(link.name, link.hello.protocol, PROTOCOL_VERSION))
        targets = self._targets(run)
        work = [self._node(run, i, link) for i, link in enumerate(links)]
        mesh = self._mesh(run, [link.name for link in links], targets)
        lint = self._lint(run.sup)
        *_, probes, config = await asyncio.gather(*work, mesh, lint)
        if config is not None:
            self._emit(run.sup, config)
        for name, status in (
            ("mindspore", CheckStatus.FAIL),
            ("gpu.driver", CheckStatus.WARN),
            ("npu.driver", CheckStatus.WARN),
        ):
            per_node = {n: found[name] for n, found in run.by_node.items() if name in found}
            if per_node and len(run.session.links) > 1:
                self._emit(run.sup, cc.same_version(name, per_node, status))
        for r in cc.clock_results(run.clocks):
            self._emit(run.sup, r)
        if probes is not None:
            names = [link.name for link in links]
            self._emit(run.sup, cc.mesh_result(names, targets, probes))
            first = run.sup.job.plans[0].node.name
            port = run.by_node.get(first, {}).get("port")
            self._emit(
                run.sup, cc.sched_result(run.sched, run.sup.job.inv.scheduler.port, first, probes, port)
            )
        for node, why in run.lost.items():
            self._emit(
                run.sup, cc.result(node, "checks", CheckStatus.FAIL, why, "see the node's error above")
            )

    def _names(self) -> tuple[str, ...]:
        names = node_checks.QUICK_CHECKS if self.options.quick else node_checks.NODE_CHECKS
        # "clock" has its own round trips (_clock): mixed with slow checks its reading would be late.
        return tuple(n for n in names if n != "clock" and not self._skipped(n))

    def _params(self, run: _Run, index: int, link: NodeLink) -> dict[str, Any]:
        inv, plan = run.sup.job.inv, link.plan
        worker = plan.procs[-1]  # every node runs at least one rank
        env = {k: v for k, v in worker.env.items() if k not in _LAUNCHER_KEYS}
        return {
            "device_target": inv.device_target,
            "devices": plan.node.devices,
            "python": plan.python,
            "env": env,
            "shm_path": plan.node.env.get("MSCON_SHM_PATH") or self.options.shm_path or "/dev/shm",
            "shm_min_gib": inv.checks.shm_min_gib,
            # Where the workdir is unpacked and the run's logs go: under the node's cache folder.
            "workdir": link.transport.cache_root if link.transport.syncs_workdir else str(inv.job.workdir),
            "checkpoint_dir": _arg_value(run.sup.job.args, "--checkpoint-dir"),
            "sched_port": inv.scheduler.port,
            "sched_host": run.sched,
            "is_first": index == 0,
            "timeout_s": _NODE_TIMEOUT_S,
            "nodes": len(run.session.links),
            "world_size": inv.world_size,
        }

    async def _node(self, run: _Run, index: int, link: NodeLink) -> None:
        params = self._params(run, index, link)
        try:
            if not self._skipped("clock"):
                await self._clock(run, link.name, params)
            names = self._names()
            if names:
                for r in await self._ask(run, link.name, RunChecks(names=names, params=params)):
                    run.by_node.setdefault(link.name, {})[r.name] = r
                    self._emit(run.sup, r)
        except _Lost as exc:
            run.lost[link.name] = str(exc)

    async def _ask(self, run: _Run, node: str, msg: RunChecks) -> list[CheckReported]:
        """One RunChecks round: its results, up to ChecksDone."""
        q = run.router.queue(node, "checks")
        if not await run.session.send(node, msg):
            raise _Lost("the node's agent is not connected")
        out = []
        while True:
            _, answer = await self._get(run, q)
            if isinstance(answer, ChecksDone):
                return out
            if isinstance(answer, CheckResult):
                out.append(
                    CheckReported(
                        0,
                        node,
                        answer.name,
                        cc.status_of(answer.status),
                        answer.value,
                        answer.remedy,
                        answer.detail,
                    )
                )

    async def _get(self, run: _Run, q: asyncio.Queue[tuple[int, Message | None]]) -> tuple[int, Message]:
        left = run.deadline - time.monotonic()
        try:
            ts, msg = await asyncio.wait_for(q.get(), max(left, 0.01))
        except TimeoutError:
            raise _Lost("no answer from the agent in time") from None
        if msg is None:
            raise _Lost("lost the node during the checks")
        return ts, msg

    async def _clock(self, run: _Run, node: str, params: dict[str, Any]) -> None:
        samples = []
        q = run.router.queue(node, "checks")
        for _ in range(_CLOCK_PROBES):
            sent = time.time_ns()
            if not await run.session.send(
                node, RunChecks(names=("clock",), params={**params, "console_time_ns": sent})
            ):
                raise _Lost("the node's agent is not connected")
            received, value = 0, None
            while True:
                ts, answer = await self._get(run, q)
                if isinstance(answer, CheckResult) and answer.name == "clock":
                    received, value = ts, answer.value
                elif isinstance(answer, ChecksDone):
                    break
            if value is not None and value.strip().isdigit():
                samples.append(cc.ClockSample(int(value), sent, received))
        if samples:
            run.clocks[node] = cc.best_sample(samples)

    # ------------------------------------------------------------ the mesh

    def _targets(self, run: _Run) -> dict[str, tuple[str, int]]:
        """The address each node is reached at by the others: the first node at MS_SCHED_HOST (what
        the ranks will dial), the others at their address, the address SSH reached them at, or
        their host name. The port is filled in when each node listens."""
        out = {}
        for i, link in enumerate(run.session.links.values()):
            node = link.plan.node
            if i == 0:
                host = run.sched
            elif node.address:
                host = node.address
            elif node.transport == "local":
                host = "127.0.0.1"
            elif link.hello is not None and link.hello.ssh_addr:
                host = link.hello.ssh_addr
            else:
                host = link.transport.resolved_host()
            out[link.name] = (host, 0)
        return out

    async def _mesh(
        self, run: _Run, nodes: list[str], targets: dict[str, tuple[str, int]]
    ) -> dict[str, list[dict] | None] | None:
        if self._skipped("mesh") and self._skipped("sched"):
            return None
        token = secrets.token_hex(8)
        session = run.session
        listen_msg = MeshListen(
            token=token, timeout_s=_FULL_WAIT_S, avoid_port=run.sup.job.inv.scheduler.port
        )

        async def listen(node: str) -> tuple[str, int | str]:
            if not await session.send(node, listen_msg):
                return node, "not connected"
            try:
                _, answer = await asyncio.wait_for(
                    self._get(run, run.router.queue(node, "listen")), _LISTEN_WAIT_S
                )
            except (_Lost, TimeoutError) as exc:
                return node, str(exc) or "no answer"
            assert isinstance(answer, MeshListening)
            return node, answer.port if answer.port else (answer.error or "cannot listen")

        listening = dict(await asyncio.gather(*(listen(n) for n in nodes)))
        for node, got in listening.items():
            if isinstance(got, int):
                targets[node] = (targets[node][0], got)
        peers = tuple(
            {"name": n, "host": targets[n][0], "port": got}
            for n, got in listening.items()
            if isinstance(got, int)
        )

        async def probe(node: str) -> tuple[str, list[dict] | None]:
            if not await session.send(node, MeshProbe(peers=peers, token=token, timeout_s=_PROBE_TIMEOUT_S)):
                return node, None
            try:
                _, answer = await asyncio.wait_for(
                    self._get(run, run.router.queue(node, "probe")), _PROBE_TIMEOUT_S + 10
                )
            except (_Lost, TimeoutError):
                return node, None
            assert isinstance(answer, MeshResult)
            found = [dict(r) for r in answer.results]
            # A node that could not listen was never dialled: say why in every row.
            found += [
                {"name": n, "ok": False, "error": f"{n} could not listen: {got}"}
                for n, got in listening.items()
                if not isinstance(got, int)
            ]
            return node, found

        try:
            return dict(await asyncio.gather(*(probe(n) for n in nodes)))
        finally:
            await session.broadcast(MeshClose(), [n for n in nodes if session.links[n].open])

    # ------------------------------------------------------------ the job's arguments

    async def _lint(self, sup: RunHost) -> CheckReported | None:
        """The trainer's own argument checks with the inventory's world size; for other scripts,
        only whether a parallel mode they are given is one of MindSpore's."""
        if self._skipped("config"):
            return None
        where = "the arguments after --" if sup.job.args_given else f"job.args of {sup.job.inv.path}"
        script = PurePosixPath(sup.job.script.replace("\\", "/"))
        if script.parts[-2:] == ("trainer", "train.py"):
            root = str((sup.job.inv.job.workdir / script).parent.parent)
            size = sup.job.inv.world_size
            mode, argv, subject = "trainer", list(sup.job.args), f"{script} for {size} rank(s)"
        else:
            value = cc.parallel_mode_arg(sup.job.args)
            if value is None:
                return cc.result(cc.ALL, "config", CheckStatus.NA, "no parallel mode given", "", str(script))
            # The product's own copy of the trainer's config: its mode names and hints.
            root = str(Path(str(resources.files("mscon.trainer"))).parent)
            mode, argv, subject = "mode", [value], f"parallel mode {value!r}"
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _LINT_PROGRAM,
                root,
                mode,
                json.dumps(argv),
                str(sup.job.inv.world_size),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), _LINT_TIMEOUT_S)
            lines = out.decode("utf-8", "replace").strip().splitlines()
            answer = json.loads(lines[-1]) if lines else {"why": err.decode("utf-8", "replace")[-300:]}
        except (OSError, ValueError, TimeoutError) as exc:
            answer = {"why": f"{type(exc).__name__}: {exc}"}
        return cc.config_result(answer, subject, where)

    # ------------------------------------------------------------ the collective smoke test

    async def _collective(self, sup: RunHost) -> list[CheckReported]:
        """A real AllReduce over every rank, launched by a Supervisor of its own exactly like a job
        (own connections, the inventory's nodes, scheduler and port), with the smoke script as its
        only file in the synced workdir."""
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix="mscon-smoke-"))
        try:
            source = resources.files("mscon.console.preflight").joinpath("smoke.py")
            (tmp / "smoke_allreduce.py").write_bytes(source.read_bytes())
            inv = sup.job.inv
            job = dataclasses.replace(
                inv.job,
                workdir=tmp,
                script="smoke_allreduce.py",
                args=("--sweep-max-bytes", str(self._sweep_max_bytes(inv.device_target))),
                exclude=(),
                resume_args=(),
                metrics_pattern=None,
            )
            hang = HangSpec(timeout_s=max(inv.hang.timeout_s or 0.0, self.options.smoke_timeout_s + 60))
            smoke_inv = dataclasses.replace(inv, job=job, restart=RestartSpec(max_restarts=0), hang=hang)
            lines: list[str] = []

            def collect(ev: Event) -> None:
                if isinstance(ev, AgentEvent) and isinstance(ev.msg, LogBatch):
                    lines.extend(line for line in ev.msg.lines if line.startswith(cc.SMOKE_TAG))

            bus = EventBus()
            bus.add_sink("smoke", collect)
            nested = sup.nested_run(smoke_inv, f"{sup.job.run_id}-smoke", self.options.smoke_logs_root, bus)
            task = asyncio.ensure_future(nested.run())
            try:
                result = await asyncio.wait_for(asyncio.shield(task), self.options.smoke_timeout_s)
            except TimeoutError:
                nested.submit(StopJob(f"the smoke test took longer than {self.options.smoke_timeout_s:g} s"))
                result = await task
            except asyncio.CancelledError:  # Ctrl-C: stop its ranks in order before going
                nested.submit(StopJob("preflight interrupted"))
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)
                raise
            outcome = cc.SmokeOutcome(
                ok=result.status is JobState.SUCCEEDED,
                reason=result.reason,
                records=tuple(cc.smoke_records(lines)),
                wall_s=time.monotonic() - t0,
                logs_dir=result.logs_dir,
                target=inv.device_target,
                world=inv.world_size,
            )
            found = cc.collective_results(outcome)
            if all(r.status is not CheckStatus.FAIL for r in found):
                shutil.rmtree(result.logs_dir, ignore_errors=True)  # kept only to explain a failure
            return found
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _sweep_max_bytes(self, target: str) -> int:
        """The largest message of the bandwidth sweep: 0 (none), 1 MiB on CPU (MCCL over TCP, one
        graph compile per size), 256 MiB on devices."""
        on_device = target != "CPU"
        wanted = on_device if self.options.sweep is None else self.options.sweep
        if not wanted or self._skipped("collective.busbw"):
            return 0
        return _DEVICE_SWEEP_MAX_BYTES if on_device else _CPU_SWEEP_MAX_BYTES

    # ------------------------------------------------------------ results

    def _skipped(self, name: str) -> bool:
        return cc.skipped(name, self.options.skip)

    def _emit(self, sup: RunHost, r: CheckReported) -> None:
        if self._skipped(r.name):
            return
        r = dataclasses.replace(r, attempt=sup.attempt_no)
        self.results.append(r)
        sup.emit(r)

    def _finish(self, sup: RunHost) -> None:
        failed = tuple(f"{r.node}: {r.name}" for r in self.results if r.status is CheckStatus.FAIL)
        self.finished = ChecksFinished(
            sup.attempt_no, failed=failed, skipped=self.options.skip, ts_ns=time.time_ns()
        )
        sup.emit(self.finished)

    def _verdict(self, run: _Run) -> Verdict:
        fails = [r for r in self.results if r.status is CheckStatus.FAIL]
        warns = [r for r in self.results if r.status is CheckStatus.WARN]
        if run.lost:
            node, why = next(iter(run.lost.items()))
            return Verdict(False, JobState.UNREACHABLE, exit_codes.UNREACHABLE, f"{node}: {why}")
        if fails:
            shown = "; ".join(
                f"{r.node}: {r.name} ({r.value})" if r.value else f"{r.node}: {r.name}" for r in fails
            )
            return Verdict(False, JobState.FAILED, exit_codes.PREFLIGHT, f"preflight failed: {shown}")
        if not self.options.checks_only:
            return Verdict(True)
        n = len(self.results)
        said = f"{n} checks passed" + (f", {len(warns)} with a warning" if warns else "")
        return Verdict(False, JobState.SUCCEEDED, exit_codes.OK, said)


def _arg_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
