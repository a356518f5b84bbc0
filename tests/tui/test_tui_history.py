"""Run history in the console: a real headless run's recording opens by its run id (as ``mscon replay
RUN_ID`` opens it), and a run in the live console (``mscon up``) records itself in its run folder."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path
from typing import Any

import pytest
from conftest import local_inventory, mscon
from mscon.console.config.inventory import load_inventory
from mscon.console.engine.events import JobState, RunFinished, RunStarted
from mscon.console.engine.supervisor import RunOptions, Supervisor
from mscon.console.history.recording import read_recording, recording_file
from mscon.console.history.runs import find_recording, past_runs
from mscon.console.views.tui import launch
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.source import LiveSource, ReplaySource, Source
from tui_helpers import SIZE, settled, shows, wait_for

FAIL = ["--steps", "8", "--rate", "0", "--metrics", "--fail-rank", "1", "--fail-step", "4"]


async def test_a_headless_run_replays_by_its_run_id(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, "bench/fake_rank.py", FAIL)
    run_id = f"replay-me-{secrets.token_hex(3)}"  # a node keeps a run's folder: a fixed id runs once
    done = mscon("run", "--no-tui", "-q", inv, "--run-id", run_id, cwd=tmp_path)
    assert done.code == 3, done.err
    events = list(read_recording(find_recording(run_id, tmp_path / "mscon-runs")))
    app = MsconApp(ReplaySource(events, speed=0), toasts=False)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        text = await shows(pilot, "Root cause: r1 on local failed first (exit code 3)")
        assert run_id in text and "failed" in text
    root = app.source.state.root_cause()
    assert root is not None and root.name == "r1"


async def test_a_run_in_the_live_console_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mscon up``'s path (launch.run_live) with the app driven headless by Pilot."""

    async def headless_console(source: Source, **options: Any) -> int:
        assert isinstance(source, LiveSource)
        app = MsconApp(source, toasts=False)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: source.done.is_set(), limit_s=60)
        return await source.finish()

    monkeypatch.setattr(launch, "run_console", headless_console)
    ok = ["--steps", "5", "--rate", "0"]
    inv = load_inventory(local_inventory(tmp_path / "inv.yaml", 2, "bench/fake_rank.py", ok))
    run_id = f"tui-run-{secrets.token_hex(3)}"
    sup = Supervisor(inv, RunOptions(run_id=run_id, logs_root=tmp_path / "runs"))
    code = await launch.run_live(sup, argparse.Namespace(events=None, json=None))
    assert code == 0
    events = list(read_recording(recording_file(sup.logs_dir)))
    assert isinstance(events[0], RunStarted) and events[0].run_id == run_id
    assert isinstance(events[-1], RunFinished) and events[-1].result.status is JobState.SUCCEEDED
    [run] = past_runs(tmp_path / "runs")
    assert run.run_id == run_id and run.status is JobState.SUCCEEDED and run.recorded
