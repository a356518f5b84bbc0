"""Sinks cannot hurt the run: a sink that raises leaves its traceback in console.err while the
others keep receiving, and the headless reporter's end never holds up the event loop."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

from conftest import until
from mscon.agent import protocol as P
from mscon.console.engine.bus import CONSOLE_ERR, EventBus
from mscon.console.engine.events import AgentEvent, Event, JobState, Notice, RunFinished, RunResult
from mscon.console.views.headless.reporter import HeadlessReporter

NODE = "n1"


def _log(i: int) -> AgentEvent:
    return AgentEvent(0, P.LogBatch(NODE, "r0", 0, i, (f"line {i}",), i))


def _result(logs_dir: Path) -> RunResult:
    return RunResult("run-1", JobState.SUCCEEDED, 0, "every rank succeeded", None, (), 1.0, str(logs_dir))


def _explode_on_third(ev: Event) -> None:
    if isinstance(ev, AgentEvent) and ev.msg.seq == 2:  # type: ignore[attr-defined]
        raise ZeroDivisionError("view bug in a helper")


async def test_a_raising_sink_leaves_its_traceback_in_console_err_and_the_others_receive_all(
    tmp_path: Path,
) -> None:
    bus = EventBus(tmp_path / "run")
    seen: list[Event] = []
    bus.add_sink("good", seen.append)
    broken = bus.add_sink("broken", _explode_on_third)
    for i in range(5):
        bus.publish(_log(i))
    await until(lambda: broken.detached is not None, 5, "the raising sink detached")
    for i in range(5, 8):
        bus.publish(_log(i))
    await bus.close()

    logs = [e for e in seen if isinstance(e, AgentEvent)]
    assert [e.msg.seq for e in logs] == list(range(8))  # type: ignore[attr-defined]
    err = (tmp_path / "run" / CONSOLE_ERR).read_text(encoding="utf-8")
    assert "the broken view raised on a AgentEvent event (attempt 0)" in err
    assert "Traceback (most recent call last):" in err
    assert "in _explode_on_third" in err  # the full stack, not only the last line
    assert "ZeroDivisionError: view bug in a helper" in err
    (notice,) = [e for e in seen if isinstance(e, Notice)]
    assert "the broken view was detached: its handler raised ZeroDivisionError: view bug in a helper" in (
        notice.text
    )
    assert f"(traceback in {tmp_path / 'run' / CONSOLE_ERR})" in notice.text


async def test_without_a_run_folder_a_raising_sink_is_still_detached(tmp_path: Path) -> None:
    bus = EventBus()
    seen: list[Event] = []
    bus.add_sink("good", seen.append)
    broken = bus.add_sink("broken", _explode_on_third)
    for i in range(4):
        bus.publish(_log(i))
    await bus.close()
    assert broken.detached is not None and "traceback in" not in broken.detached
    assert len([e for e in seen if isinstance(e, AgentEvent)]) == 4
    assert not list(tmp_path.iterdir())


async def test_the_reporter_finishes_without_holding_up_the_event_loop(tmp_path: Path) -> None:
    """The summary waits until stdout has taken the rank output; meanwhile the loop runs on: the
    reader here is only let go by the loop once the drain is under way (a drain that blocked the
    loop would give up after 0.5 s and say stdout is not being read). The bus's close, told that
    the sink is busy, does not cancel a drain that takes longer than its stall limit."""
    rfd, wfd = os.pipe()
    lines = tuple(f"line {i:06d} " + "x" * 80 for i in range(8000))  # far beyond a pipe's buffer
    want = sum(len(f"[{NODE} r0] {line}\n") for line in lines)
    go = threading.Event()
    got = bytearray()

    def slow_reader() -> None:
        go.wait(30)
        while len(got) < want:
            chunk = os.read(rfd, 4096)
            if not chunk:
                return
            got.extend(chunk)
            time.sleep(0.0005)  # a slow terminal: the drain takes longer than the bus's stall_s

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    err = io.StringIO()
    with os.fdopen(wfd, "w") as out:
        rep = HeadlessReporter(out=out, err=err)
        bus = EventBus()
        bus.add_sink("headless", rep.handle, busy=rep.busy)
        bus.publish(AgentEvent(0, P.LogBatch(NODE, "r0", 0, 0, lines, 1)))
        bus.publish(RunFinished(0, _result(tmp_path)))
        await until(rep.busy, 5, "the reporter busy")  # the loop runs while the sink waits for stdout
        assert "mscon: run run-1" not in err.getvalue()
        go.set()
        await bus.close(stall_s=0.05)
    reader.join(30)
    os.close(rfd)
    text = err.getvalue()
    assert len(got) == want
    assert "stdout is not being read" not in text
    assert "mscon: run run-1 succeeded in 1.0 s: every rank succeeded" in text
