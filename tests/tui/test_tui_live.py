"""The console over a live run (local transport, fake ranks): start-up, a killed rank and its root
cause, an operator's restart, and quit = stop with no process left."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

from conftest import REPO, free_port, run_processes, wait_gone, write_inventory
from mscon.console.config.inventory import load_inventory
from mscon.console.engine.events import JobState, RankState
from mscon.console.engine.supervisor import RunOptions, Supervisor
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.screens.modals import ConfirmScreen, QuitScreen
from mscon.console.views.tui.source import LiveSource
from mscon.console.views.tui.widgets.rank_pane import RankPane
from tui_helpers import SIZE, screen_text, show_devices, shows, wait_for


def live_app(tmp_path: Path, ranks: int = 3) -> tuple[MsconApp, LiveSource, str]:
    inv = write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "tui-live",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": ranks}],
            "scheduler": {"port": free_port()},
            "job": {
                "workdir": str(REPO),
                "script": "tests/tui/tui_rank.py",
                "args": ["--steps", "100000", "--rate", "5"],
            },
            "restart": {"max_restarts": 1, "backoff_s": 0.5},
            "stop": {"grace_s": 2},
        },
    )
    run_id = f"tui-live-{secrets.token_hex(3)}"
    sup = Supervisor(load_inventory(inv), RunOptions(run_id=run_id, logs_root=tmp_path / "runs"))
    source = LiveSource(sup)
    return MsconApp(source, toasts=False), source, run_id


def all_running(source: LiveSource, attempt: int) -> bool:
    st = source.state
    att = st.attempt
    workers = st.workers()
    return (
        att is not None
        and att.number == attempt
        and bool(workers)
        and all(r.state is RankState.RUNNING and r.last_step for r in workers)
    )


async def test_live_kill_root_cause_restart_and_quit(tmp_path: Path) -> None:
    app, source, run_id = live_app(tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: all_running(source, 0), limit_s=60)
            text = await shows(pilot, "ranks 3/3 up")
            assert "live" in text and "running" in text
            await show_devices(pilot, 3)
            await shows(pilot, "r2 · local  ● running")
            victim = source.state.ranks["r1"].pid
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            # the root cause is named, then the restart budget (1) starts attempt 1 by itself, at
            # once (the ranks had stepped: no backoff), so the failed panes may never be drawn
            await wait_for(pilot, lambda: all_running(source, 1), limit_s=60)
            root = source.state.root_cause(source.state.attempts[0])
            assert root is not None and root.name == "r1" and root.signal == "SIGKILL"
            # the operator's restart: confirm, a new attempt, every pane running again
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            text = await shows(pilot, "It starts ")
            # warm or cold by when the spares of the fake ranks joined (test_tui_units: which one)
            assert "It starts warm: " in text or "It starts cold: " in text, text
            await pilot.press("y")
            await wait_for(pilot, lambda: all_running(source, 2), limit_s=60)
            await show_devices(pilot, 3)
            await wait_for(pilot, lambda: "attempt 2" in screen_text(app), limit_s=10)
            await wait_for(
                pilot,
                lambda: all(p.has_class("-failed") is False for p in app.main_screen.query(RankPane)),
            )
            await shows(pilot, "r1 · local  ● running")
            assert len(run_processes(run_id)) >= 3
            # quit asks; "stop" stops every rank and the app ends with the run
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
            text = await shows(pilot, "Detach (d)")
            assert "Detach: the run goes on without the console" in text
            await pilot.press("s")
            await wait_for(pilot, lambda: source.done.is_set(), limit_s=30)
            await wait_for(pilot, lambda: not app.is_running, limit_s=10)
    finally:
        code = await source.finish()
    assert source.result is not None and source.result.status is JobState.INTERRUPTED
    assert code == 130 and app.return_value == 130
    assert wait_gone(run_processes(run_id), 5) == []


async def test_closing_the_console_stops_the_run(tmp_path: Path) -> None:
    """An app that ends however it ends (here: exit without asking) never leaves the run behind."""
    app, source, run_id = live_app(tmp_path, ranks=2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all_running(source, 0), limit_s=60)
        app.exit(0)
    code = await source.finish()
    assert code == 130
    assert wait_gone(run_processes(run_id), 5) == []
