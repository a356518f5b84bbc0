"""An attached console rebuilds a detached run from the nodes' journals (console/detach/attach.py):
what it says of the standby cluster and of a warm attempt is what the coordinator decided, by the
same rule as a console that runs the policy itself (no network: the journals are given)."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, write_inventory
from mscon.agent.protocol import (
    Coord,
    CoordKind,
    Message,
    ProcStarted,
    StandbyPhase,
    StandbyState,
    standby_port,
)
from mscon.console.config.inventory import load_inventory
from mscon.console.detach.attach import Attacher, AttachOptions
from mscon.console.engine.events import AttemptStarted, Event, StandbyUpdated

BASE_PORT = 8118


def _attacher(tmp_path: Path) -> tuple[Attacher, list[Event]]:
    inv = write_inventory(
        tmp_path / "inv.yaml",
        {
            "name": "attach-standby",
            "device_target": "CPU",
            "nodes": [
                {"name": "a", "host": "10.0.0.1", "devices": 1},
                {"name": "b", "host": "10.0.0.2", "devices": 1},
            ],
            "scheduler": {"port": BASE_PORT},
            "job": {"workdir": str(REPO), "script": "trainer/train.py"},
        },
    )
    options = AttachOptions(run_id="attach-standby", logs_root=tmp_path / "runs")
    attacher = Attacher(load_inventory(inv), options)
    seen: list[Event] = []
    emit = attacher.emit

    def record(ev: Event) -> None:
        seen.append(ev)
        emit(ev)

    attacher.emit = record  # type: ignore[method-assign]
    return attacher, seen


def _started(node: str, name: str, rank: int, ts_ns: int) -> ProcStarted:
    return ProcStarted(node=node, name=name, rank=rank, pid=100 + rank, ts_ns=ts_ns, log_path="/l")


def test_attach_says_what_the_coordinator_made_of_the_standby_and_of_a_warm_attempt(tmp_path: Path) -> None:
    attacher, seen = _attacher(tmp_path)
    coord_started = Coord(node="a", kind=CoordKind.ATTEMPT_STARTED, attempt=1, ts_ns=2_000, warm=True)
    journals: dict[str, list[tuple[int, Message]]] = {
        "a": [
            (0, _started("a", "r0", 0, 1_000)),
            (0, StandbyState(node="a", attempt=1, state=StandbyPhase.READY)),
            (1, coord_started),
            (1, _started("a", "r0", 0, 2_100)),
        ],
        "b": [
            (0, _started("b", "r1", 1, 1_000)),
            (0, StandbyState(node="b", attempt=1, state=StandbyPhase.READY)),
            (1, _started("b", "r1", 1, 1_900)),  # b's clock is behind: its entry sorts first
        ],
    }
    attacher._merge(journals)
    said = [(u.attempt, u.node, u.warm) for u in seen if isinstance(u, StandbyUpdated)]
    assert said == [(1, "a", False), (1, "b", True)]  # warm once the last node's has joined
    starts = [e for e in seen if isinstance(e, AttemptStarted)]
    assert [(s.attempt, s.warm, s.sched_port) for s in starts] == [
        (0, False, BASE_PORT),
        (1, True, standby_port(BASE_PORT, 1)),
    ]
    assert attacher.state.attempt is not None and attacher.state.attempt.warm
    assert attacher.state.restart_outlook() == (False, "no standby cluster has joined")  # used up


def test_attach_of_a_run_whose_standby_lost_a_process_says_the_restart_is_cold(tmp_path: Path) -> None:
    attacher, _ = _attacher(tmp_path)
    why = "the spare for r1 exited (SIGKILL)"
    attacher._merge(
        {
            "a": [
                (0, _started("a", "r0", 0, 1_000)),
                (0, StandbyState(node="a", attempt=1, state=StandbyPhase.READY)),
            ],
            "b": [
                (0, _started("b", "r1", 1, 1_000)),
                (0, StandbyState(node="b", attempt=1, state=StandbyPhase.LOST, why=why)),
            ],
        }
    )
    assert attacher.state.restart_outlook() == (False, f"the standby on b is gone: {why}")
