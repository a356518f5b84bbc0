"""The collective smoke test (``mscon check``): a real AllReduce over every rank, launched as a run of
its own exactly like a job, with the smoke script (``smoke.py``, shipped to the nodes) as its only
file in the synced workdir. Its tagged log lines become the collective results."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Protocol

from mscon.agent.protocol import LogBatch
from mscon.console.config.inventory import HangSpec, Inventory, RestartSpec
from mscon.console.engine.bus import EventBus
from mscon.console.engine.commands import Command, StopJob
from mscon.console.engine.events import AgentEvent, CheckReported, CheckStatus, Event, JobState, RunResult
from mscon.console.preflight import checks as cc

DEVICE_SWEEP_MAX_BYTES = 256 * 2**20  # NCCL/HCCL reach their bus bandwidth in the hundreds of MiB
CPU_SWEEP_MAX_BYTES = 2**20


class NestedRun(Protocol):
    """A run of its own (the collective smoke test), launched exactly like a job."""

    async def run(self) -> RunResult: ...

    def submit(self, cmd: Command) -> None: ...


# How the smoke test is launched (RunHost.nested_run): its inventory, run id, logs root and bus.
Launch = Callable[[Inventory, str, Path, EventBus], NestedRun]


async def smoke_test(
    inv: Inventory,
    run_id: str,
    launch: Launch,
    sweep_max_bytes: int,
    timeout_s: float,
    logs_root: Path,
) -> list[CheckReported]:
    """A real AllReduce over every rank, launched by a Supervisor of its own exactly like a job
    (own connections, the inventory's nodes, scheduler and port), with the smoke script as its
    only file in the synced workdir. ``run_id`` is the checked run's; a failed test keeps its logs
    under ``logs_root``."""
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="mscon-smoke-"))
    try:
        source = resources.files("mscon.console.preflight").joinpath("smoke.py")
        (tmp / "smoke_allreduce.py").write_bytes(source.read_bytes())
        job = dataclasses.replace(
            inv.job,
            workdir=tmp,
            script="smoke_allreduce.py",
            args=("--sweep-max-bytes", str(sweep_max_bytes)),
            exclude=(),
            resume_args=(),
            metrics_pattern=None,
        )
        hang = HangSpec(timeout_s=max(inv.hang.timeout_s or 0.0, timeout_s + 60))
        smoke_inv = dataclasses.replace(inv, job=job, restart=RestartSpec(max_restarts=0), hang=hang)
        lines: list[str] = []

        def collect(ev: Event) -> None:
            if isinstance(ev, AgentEvent) and isinstance(ev.msg, LogBatch):
                lines.extend(line for line in ev.msg.lines if line.startswith(cc.SMOKE_TAG))

        bus = EventBus()
        bus.add_sink("smoke", collect)
        nested = launch(smoke_inv, f"{run_id}-smoke", logs_root, bus)
        task = asyncio.ensure_future(nested.run())
        try:
            result = await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            nested.submit(StopJob(f"the smoke test took longer than {timeout_s:g} s"))
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
