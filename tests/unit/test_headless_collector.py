"""``mscon run --no-tui`` keeps the collector's full passes short as the TUI does (issue 44): at
3,000 nodes they were a tenth of a core of the headless console's streaming (bench/scale.py)."""

from __future__ import annotations

import argparse
import asyncio
import gc
from types import SimpleNamespace
from typing import Any

import pytest
from mscon.console.cli import main
from mscon.console.engine.bus import EventBus
from mscon.console.engine.collector import FreezeAfterSlowPasses


def _installed() -> bool:
    return any(isinstance(getattr(cb, "__self__", None), FreezeAfterSlowPasses) for cb in gc.callbacks)


class _Sup:
    def __init__(self, inv: Any, options: Any) -> None:
        self.bus = EventBus()
        self.logs_dir = "/nonexistent"

    def want_lines(self, sink: str, ranks: Any) -> None:
        pass


def test_the_headless_run_freezes_after_slow_full_passes_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bool] = []

    async def supervise(sup: Any, events: Any, loop: Any, history: bool = False) -> Any:
        seen.append(_installed())
        return SimpleNamespace(exit_code=0)

    monkeypatch.setattr(main, "Supervisor", _Sup)
    monkeypatch.setattr(main, "supervise", supervise)
    args = argparse.Namespace(tui=False, json=None, quiet=True, lines=None, events=None)
    inv = SimpleNamespace(world_size=8)
    assert not _installed()
    code = asyncio.run(main._run_engine(inv, SimpleNamespace(preflight=None), args))  # type: ignore[arg-type]
    assert code == 0 and seen == [True]
    assert not _installed()  # and taken off again
