"""The standby's bookkeeping in agent/spares.py, with stand-in processes (``sleep``) for the spares:
when a node's standby is ready, when it is lost and why, and what a warm start finds missing.
The real spares, joined to a real MindSpore cluster over sshd nodes: tests/e2e/test_standby.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

from mscon.agent import layout
from mscon.agent import procs as procmod
from mscon.agent.protocol import ProcSpec, StandbyPhase, on_standby
from mscon.agent.ranks import Ranks
from mscon.agent.spares import Spare, Spares

PY = ("python3", "train.py")
SPECS = (
    ProcSpec("sched", -1, -1, PY, {"MS_SCHED_PORT": "20000", "MS_ROLE": "MS_SCHED"}),
    ProcSpec("r0", 0, 0, PY, {"MS_SCHED_PORT": "20000", "MS_ROLE": "MS_WORKER"}),
)


def _standby(tmp_path: Path, attempt: int) -> tuple[Spares, tuple[ProcSpec, ...], list[subprocess.Popen]]:
    """Spares for ``attempt`` as ``prepare(join=True)`` leaves them, each a live ``sleep``."""
    spares = Spares()
    spares.attempt, spares.joined, spares._run_dir = attempt, True, str(tmp_path)
    (tmp_path / layout.SPARES_DIR).mkdir(exist_ok=True)
    specs = tuple(on_standby(s, attempt) for s in SPECS)
    log_dir = layout.attempt_folder(str(tmp_path), attempt)
    popens = []
    for spec in specs:
        popen = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE, start_new_session=True)  # as spares
        popens.append(popen)
        env = procmod.process_env(spec, log_dir, procmod.attempt_env(attempt))
        log = layout.spare_log(str(tmp_path), spec.name, attempt)
        marker = layout.spare_joined(str(tmp_path), spec.name, attempt)
        spares._by_name[spec.name] = Spare(spec, popen, str(tmp_path), env, log, marker)
    return spares, specs, popens


def test_joining_then_ready_once_every_worker_joined_then_lost_once_one_is_gone(tmp_path: Path) -> None:
    spares, specs, popens = _standby(tmp_path, 1)
    try:
        # Started, r0 not joined yet (the scheduler needs no marker): joining, said once. A restart
        # due now may wait for it (issue 43: a fault soon after a warm restart).
        assert spares.poll() == (StandbyPhase.JOINING, "")
        assert spares.poll() is None
        Path(layout.spare_joined(str(tmp_path), "r0", 1)).touch()
        assert spares.poll() == (StandbyPhase.READY, "")
        assert spares.poll() is None  # said once
        assert spares.missing(specs, str(tmp_path), 1, str(tmp_path)) is None
        assert spares.missing(specs, str(tmp_path), 2, str(tmp_path)) is not None  # another attempt's
        popens[1].kill()
        popens[1].wait()
        assert spares.poll() == (StandbyPhase.LOST, "the spare for r0 exited (SIGKILL)")
        assert spares.poll() is None  # lost stays lost: said once
        assert (
            spares.missing(specs, str(tmp_path), 1, str(tmp_path)) == "the standby's process for r0 is gone"
        )
    finally:
        spares.discard()
    assert all(p.poll() is not None for p in popens) and len(spares) == 0


def test_imported_spares_say_nothing_of_a_standby(tmp_path: Path) -> None:
    spares, _, _ = _standby(tmp_path, 1)
    spares.joined = False
    try:
        assert spares.poll() is None
    finally:
        spares.discard()


def test_a_warm_scheduler_is_taken_without_an_order_and_its_log_linked(tmp_path: Path) -> None:
    spares, specs, _ = _standby(tmp_path, 1)
    spare_log = Path(layout.spare_log(str(tmp_path), "sched", 1))
    spare_log.write_text("joined\n")
    Path(layout.attempt_folder(str(tmp_path), 1)).mkdir()
    try:
        proc = spares.take(specs[0], str(tmp_path), 1, str(tmp_path))
        assert proc is not None and proc.log_path == layout.log_file(
            layout.attempt_folder(str(tmp_path), 1), "sched"
        )
        assert Path(proc.log_path).read_text() == "joined\n" and Path(proc.log_path).samefile(spare_log)
        assert not Path(layout.spare_order(str(tmp_path), "sched")).exists()  # it reads none
        proc.popen.kill()
        proc.popen.wait()
    finally:
        spares.discard()


class _Node:
    """What ``Ranks._prepare_spares`` reads of an agent: its Start, its watched processes, and
    spares that record what they were asked to prepare."""

    def __init__(self, warm: bool) -> None:
        self.start_cmd = SimpleNamespace(
            spares=True, warm=warm, attempt=1, run_dir="/run", cwd="/work", procs=SPECS, join_standby=True
        )
        self.spares = SimpleNamespace(attempt=-1, asked=[])
        self.spares.prepare = lambda run_dir, attempt, cwd, specs, join: self._prepare(attempt)
        self.watched = [SimpleNamespace(proc=SimpleNamespace(spec=s), first_step_said=False) for s in SPECS]
        self.failed = False
        self.notes: list[str] = []
        self.said: list[int] = []  # the spares' attempt at each standby word (StandbyState)

    def _prepare(self, attempt: int) -> list:
        self.spares.attempt = attempt
        self.spares.asked.append(attempt)
        return []

    def _note_once(self, text: str) -> None:
        self.notes.append(text)

    def _standby_state(self) -> None:
        self.said.append(self.spares.attempt)


def test_a_cold_attempt_starts_its_spares_with_it_a_warm_one_once_its_workers_stepped() -> None:
    # Cold: the standby joins during the attempt's own start-up, ready for a fault 1 s into training
    # (issue 43: started at the first step, they were starved and a fault in the first 15-20 s of
    # training restarted cold).
    cold = _Node(warm=False)
    Ranks._prepare_spares(cold)
    assert cold.spares.asked == [2]
    assert cold.said == [2]  # joining, said at once: a fault before they joined may wait for them
    Ranks._prepare_spares(cold)
    assert cold.spares.asked == [2]  # once an attempt
    # Warm: its start-up is the first step's compile, which the spares' import would lengthen.
    warm = _Node(warm=True)
    Ranks._prepare_spares(warm)
    assert warm.spares.asked == []
    warm.watched[1].first_step_said = True  # r0, its one worker (the scheduler never steps)
    Ranks._prepare_spares(warm)
    assert warm.spares.asked == [2]
