"""The one mechanism behind every shape of the library (and the reference trainer).

A :class:`Resumer` answers, once per launch, where to start (a collective when resuming: the
newest step every rank has a snapshot of), and at each step boundary writes the rank's metrics
record and, when due, hands a copy of the kept state to the background writer.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import collective, compile_cache, env, lifecycle, rng, store
from . import metrics as metrics_module
from .carried import Carrier
from .interval import AUTO, Interval
from .metrics import MetricsWriter
from .state import PIECE_PREFIX, Kept, put_back

Source = str  # "snapshot", "checkpoint", "none", "refused": what an attempt resumed from
SNAPSHOT, CHECKPOINT, NONE, REFUSED = "snapshot", "checkpoint", "none", "refused"


class Refusal(SystemExit):
    """The relaunch cannot resume exactly: said in one line, the process ends before its first
    step with ``env.REFUSED_EXIT`` (its snapshots stay)."""

    def __init__(self, reason: str) -> None:
        super().__init__(env.REFUSED_EXIT)
        self.reason = reason


@dataclass(frozen=True)
class Resumed:
    """Where this launch starts: after ``step`` (0: the beginning), from ``source``."""

    step: int
    source: Source
    meta: dict = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The kept parameters (weights and optimizer state), by name."""
        return {k: v for k, v in rng.parameters_only(self.arrays).items() if not k.startswith(PIECE_PREFIX)}

    @property
    def done(self) -> bool:
        """The snapshot is of a stage that ran to its end (a later stage failed)."""
        return bool(self.meta.get("done"))


class Resumer:
    """Snapshots, resume and metrics for one rank.

    ``state_dir``: the folder whose node-memory twin holds the snapshots (argument, else
    ``$MSCON_STATE_DIR``, else ``./.mscon-state``); ``every``: a snapshot every N steps, or
    ``"auto"`` (every step until timed, then as often as ``budget`` of the step time allows;
    0: no snapshots).
    """

    def __init__(
        self,
        state_dir: str | None = None,
        every: int | str = AUTO,
        budget: float = 0.02,
        metrics: MetricsWriter | None = None,
        say: Callable[[str], None] | None = None,
        snapshot_dir: str | None = None,
        phases: bool = True,
        stage: str = "",
    ) -> None:
        self.rank, self.size = collective.rank_and_size()
        self.state_dir = env.state_dir(state_dir)
        # ``snapshot_dir``: this one folder, not node memory first (the trainer's --snapshot-dir)
        self.key = env.snapshot_key()
        self.roots = (
            [os.path.abspath(snapshot_dir)]
            if snapshot_dir
            else store.candidate_dirs(self.state_dir, key=self.key)  # keyed: nobody else can name it
        )
        self.interval = Interval(every, budget)
        self.metrics = metrics if metrics is not None else MetricsWriter()
        self.writer: store.Writer | None = None
        self.params: list[tuple[str, Any]] = []
        self.stage = stage  # a loop or callback of the script: its own snapshots
        self.kept: Kept | None = None  # what the loop or callback keeps beyond parameters
        self.notes: list[str] = []  # why a resume from this run could not be exact (refused then)
        self.extra: dict[str, Any] = {}  # more for each snapshot's metadata (the epoch's random state)
        self.extra_arrays: dict[str, np.ndarray] = {}
        self.carrier: Carrier | None = None  # the script's loops' own values, with each snapshot
        # Steps the stage can never resume at (a callback: an epoch's end) get no snapshot: one
        # there would push out of the KEEP newest a step every rank can resume at.
        self.resumable: Callable[[int, int, dict[str, Any]], bool] = lambda step, pos, meta: True
        self._carry_s = 0.0  # the last snapshot's capture of them, in the snapshot's cost
        self._said: set = set()
        self._phases = phases  # start-up milestones for the console (the trainer records its own)
        self._stepped = False
        self._kill_at = env.check_kill_at()
        self._say = say or (lambda text: print(f"mscon_resume: {text}", flush=True))

    # -------------------------------------------------------------- where to start

    def resume(
        self,
        resuming: bool | None = None,
        slots: np.ndarray | None = None,
        slot_step: Any = None,
        announce: bool = True,
        problems: list[str] | None = None,
        accept: Callable[[store.Snapshot], bool] | None = None,
    ) -> Resumed:
        """Where this launch starts. Resuming (``resuming``, by default: a restarted attempt under
        mscon, or ``MSCON_RESUME=1``), every rank must call it at the same point: the ranks agree
        on the newest snapshot step all have, or (``slots``, ``slot_step``: the caller's durable
        checkpoints, as :func:`collective.agree` takes them) checkpoint step, whichever is newer.
        The answer is also the attempt's resume record for the console.

        ``problems``: what this launch's ``keep`` cannot restore; with the reasons the snapshots
        carry (another rank count, state seen changing that nothing keeps) they make a resume
        refused: every rank stops, in one line each, before its first step. ``accept``: the
        snapshot steps the caller can resume at (the others are passed over)."""
        if not (env.resuming() if resuming is None else resuming):
            self.metrics.resumed(0, None, NONE)
            return Resumed(0, NONE)
        snaps = store.newest_valid(self.roots, self.rank, self.key, self.stage) if self.interval.every else []
        if accept is not None:  # steps the caller cannot resume at (a callback: an epoch's end)
            snaps = [s for s in snaps if accept(s)]
        reason = self._refusal(snaps[0].meta, problems or []) if snaps else None
        agreed = collective.agree_resume(
            self.rank, self.size, [s.step for s in snaps], store.KEEP, slots, slot_step, reason is not None
        )
        if agreed.refusing:
            self.refuse(reason or f"rank {agreed.refusing[0]} refuses (its log says why)")
        step, from_snapshot = agreed.step, agreed.from_snapshot
        if step and from_snapshot:
            snap = next(s for s in snaps if s.step == step)
            got = Resumed(step, SNAPSHOT, snap.meta, snap.arrays)
        elif step:
            got = Resumed(step, CHECKPOINT)
        else:
            got = Resumed(0, NONE)
        epoch = got.meta.get("epoch")
        self.metrics.resumed(got.step, epoch if isinstance(epoch, int) else None, got.source)
        if not announce:
            return got
        if got.step:
            saved = time.strftime("%H:%M:%S", time.localtime(got.meta.get("saved_at", time.time())))
            where = f"snapshot saved {saved}" if got.source == SNAPSHOT else got.source
            self._say(f"rank {self.rank} resumes after step {got.step} ({where})")
        else:
            self._say(f"rank {self.rank}: no state every rank has; starting from the beginning")
        return got

    def _refusal(self, meta: dict, problems: list[str]) -> str | None:
        """Why a resume from a snapshot with ``meta`` would not compute what the uninterrupted run
        would have, or None."""
        size = meta.get("size")
        if isinstance(size, int) and size != self.size:
            return (
                f"the snapshots are of a {size}-rank run and this launch has {self.size}; relaunch on "
                f"{size} ranks, or start afresh (without MSCON_RESUME)"
            )
        noted = [n for n in meta.get("unresumable", []) if isinstance(n, str)]
        return (problems + noted)[0] if problems or noted else None

    def refuse(self, reason: str) -> None:
        """Stop before the first step: one line, a resume record saying why, snapshots kept."""
        lifecycle.failed()
        self._say(f"rank {self.rank} refuses to resume: {reason}")  # once: logs hold stdout and stderr as one
        self.metrics.refused(reason)
        self.metrics.close()
        raise Refusal(reason)

    def say(self, text: str) -> None:
        """One line of the library's in the rank's output."""
        self._say(text)

    def note(self, reason: str) -> None:
        """This run holds state a resume could not restore: said once now, refused on relaunch."""
        if reason not in self.notes:
            self.notes.append(reason)
            if self.rank == 0:
                self._say(f"warning: {reason}; a relaunch would refuse to resume")

    def warn(self, text: str | None) -> None:
        """A fact about the run a user should know, said once by rank 0 (not refused)."""
        if text and self.rank == 0 and text not in self._said:
            self._said.add(text)
            self._say(f"warning: {text}")

    def restore(self, got: Resumed) -> None:
        """Every parameter and piece ``self.kept`` holds, and the random state, as the snapshot
        has them, each parameter written in place; a snapshot that does not match what this
        launch keeps (another name, another shape) is refused."""
        assert self.kept is not None
        params = got.params
        names = {key for key, _ in self.kept.params}
        lacking = sorted(names - set(params))
        extra = sorted(set(params) - names)
        if lacking or extra:
            what = f"lacks {lacking[0]}" if lacking else f"holds {extra[0]}, which keep no longer has"
            self.refuse(f"the snapshot {what}: keep changed since the run began; start afresh")
        for key, p in self.kept.params:
            saved = params[key]
            if tuple(saved.shape) != tuple(p.shape):
                self.refuse(
                    f"the snapshot's {key} has shape {tuple(saved.shape)}, the script's {tuple(p.shape)}"
                )
            put_back(p, saved)
        missing = self.kept.restore(got.meta.get("kept", {}), got.arrays)
        if missing:
            self.refuse(f"the snapshot lacks {missing[0]}: keep changed since the run began; start afresh")
        self.restore_rng(got)

    def restore_rng(self, got: Resumed) -> None:
        if got.source == SNAPSHOT:
            rng.restore(got.meta, got.arrays)

    # -------------------------------------------------------------- each step

    def keep(self, params: list[tuple[str, Any]]) -> None:
        """What every snapshot holds from now on; picks the folder (node memory when it has room)."""
        self.params = params
        if not self.interval.every or self.writer is not None:
            return
        state_bytes = sum(_nbytes(p) for _, p in params)
        root = store.choose_dir(self.roots, state_bytes, said=self._said)
        if root is None:
            self._say(f"no private folder for snapshots under {self.state_dir} or /dev/shm; none taken")
            return
        try:
            key = self.key if self.key is not None else store.folder_key(root)
        except OSError as exc:
            self._say(f"{exc}; no snapshots")
            return
        self.writer = store.Writer(root, self.rank, key, stage=self.stage)

    def ready(self) -> None:
        """Model and data built, state loaded: the first step begins (a start-up milestone)."""
        compile_cache.enable(self.rank, self.size)  # a hand-written loop's graphs: when the job says "on"
        if self._phases:
            self.metrics.phase("ready")

    def stepped(self, step: int, epoch: int, pos: int, step_s: float, record: dict | None = None) -> None:
        """Step ``step`` (global, from 1) is done: ``pos`` batches of epoch ``epoch`` (0-based)
        consumed. Writes the metrics record (``record``: its fields, e.g. the loss) and, when
        due, a snapshot."""
        if not self._stepped:
            self._stepped = True
            if self._phases:  # the first step's graphs compiled and ran once
                self.metrics.phase("compiled", graph=compile_cache.outcome())
        self.metrics.write({"step": step, "epoch": epoch + 1, "step_time_s": step_s, **(record or {})})
        if self.writer is not None and self.due(step, pos):
            self.snapshot(step, epoch, pos)
        # A collective (auto: at one step): a rank without a writer (no folder) takes part too.
        w = self.writer
        agreed = self.interval.observe(step_s, self._snapshot_cost(), self.rank, self.size)
        if agreed is not None and self.rank == 0 and w is not None:
            self._say(f"a snapshot every {agreed} step(s) (auto): {self._costs_said(w)}")
        if self._kill_at is not None and step >= self._kill_at:
            self._fault_for_the_check(step, epoch, pos)

    def due(self, step: int, pos: int) -> bool:
        """``stepped`` takes a snapshot at this step: the interval's, where the stage can resume."""
        return self.interval.due(step) and self.resumable(step, pos, self.extra)

    def _fault_for_the_check(self, step: int, epoch: int, pos: int) -> None:
        """The resume check's fault (``MSCON_CHECK_KILL_AT``): this step kept on every rank, then
        rank 0 dies as a killed rank would (SIGKILL: no exit handler runs)."""
        self._kill_at = None
        if self.writer is not None and self.resumable(step, pos, self.extra) and not self.due(step, pos):
            self.snapshot(step, epoch, pos)
        self.settle()
        if self.rank == 0:
            self._say(f"rank 0 is killed after step {step} (the resume check's fault)")
            os.kill(os.getpid(), signal.SIGKILL)

    def snapshot(self, step: int, epoch: int, pos: int, done: bool = False) -> None:
        """Hand a copy of the kept state at this step boundary to the writer (``done``: the
        stage's last state, which a relaunch restores and skips the stage with)."""
        if self.writer is None:
            return
        c0 = time.thread_time()
        carried, arrays = self.carrier.capture() if self.carrier is not None else ({}, {})
        self._carry_s = time.thread_time() - c0  # on the step, as the copy is (a growing list costs)
        meta, rng_arrays = rng.capture()
        arrays.update(rng_arrays)
        info: dict[str, Any] = {"epoch": epoch, "pos": pos, "rng": meta, "size": self.size, **self.extra}
        if carried:
            info["carried"] = carried
        if self.notes:
            info["unresumable"] = list(self.notes)
        if done:
            info["done"] = True
        if self.kept is not None:
            info["kept"], pieces = self.kept.capture()
            arrays.update(pieces)
        arrays.update(self.extra_arrays)
        self.writer.submit(step, self.params, info, arrays)

    def _costs_said(self, w: store.Writer) -> str:
        """What the auto interval was chosen by: this rank's snapshot costs, by part, and the step."""
        write = f"write {1e3 * w.typical_write_s():.1f} ms (MAC {1e3 * w.typical_mac_s():.1f} ms)"
        counted = "counted: the host computes the step" if _host_computes() else "not counted: off the host"
        return (
            f"copy {1e3 * self._on_step_s(w):.1f} ms on the step, {write} in the background ({counted}), "
            f"wait for the write before {1e3 * w.typical_wait_s():.1f} ms, "
            f"against a {1e3 * self.interval.step_s:.0f} ms step, budget {100 * self.interval.budget:g} %"
        )

    def _on_step_s(self, w: store.Writer) -> float:
        """What a snapshot costs the training thread: the capture of the carried values, the copy."""
        return self._carry_s + w.typical_copy_s()

    def _snapshot_cost(self) -> float:
        """What a snapshot costs the step: :meth:`_on_step_s`, and the longer of the wait for the
        write before (a write slower than the steps stalls them, on any device) and, where the
        host computes the step (CPU), the write's CPU time, which takes cores from the step's
        kernels (the part of it run during the wait takes none: hence not both)."""
        w = self.writer
        if w is None:
            return 0.0
        return self._on_step_s(w) + max(w.typical_wait_s(), w.typical_write_s() if _host_computes() else 0.0)

    def settle(self) -> None:
        """Every rank's snapshot of the last due step is written (a test's fault comes after it)."""
        if self.writer is not None:
            self.writer.wait()
        if self.size > 1 and self.interval.every:  # a collective: every rank, a writer or not
            collective.agree_max(0, self.rank, self.size)

    def finish(self, completed: bool = True) -> None:
        """The training is over: the last write awaited. (``completed``) the snapshots go now
        only where no stage of the script may follow; otherwise :mod:`lifecycle` drops them once
        the whole run has succeeded."""
        if self.writer is not None:
            self.writer.close()
            if completed and not self.stage:
                store.remove(self.roots, self.rank)
            self.writer = None
        if not metrics_module.is_shared(self.metrics):  # the shared one serves later stages too
            self.metrics.close()

    def drop_at_success(self) -> None:
        """Drop this rank's snapshots (every stage's) when the script exits successfully."""
        lifecycle.install(self._drop_now)

    def _drop_now(self) -> None:
        if self.writer is not None:
            self.writer.close()  # a write still going would leave a file behind the removal
        store.remove(self.roots, self.rank)


def as_parameters(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Arrays as the {name: Parameter} dict ``load_param_into_net`` takes."""
    import mindspore as ms

    return {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in arrays.items()}


def kept_parameters(*objects: Any) -> list[tuple[str, Any]]:
    """(name, Parameter) of every Cell or Optimizer given, each name once."""
    seen: dict[str, Any] = {}
    for obj in objects:
        for name, p in store.named_params(obj):
            seen.setdefault(name, p)
    return list(seen.items())


def load_into(objects: tuple, arrays: dict[str, np.ndarray]) -> None:
    """Load snapshot arrays into every kept Cell/Optimizer (each takes the names it has)."""
    import mindspore as ms

    params = as_parameters(rng.parameters_only(arrays))
    for obj in objects:
        ms.load_param_into_net(obj, params, strict_load=False)


def _host_computes() -> bool:
    try:
        import mindspore as ms

        return ms.get_context("device_target") == "CPU"
    except Exception:  # noqa: BLE001 - no MindSpore context: count the write, to be safe
        return True


def _nbytes(p: Any) -> int:
    try:
        return int(p.nbytes)
    except (AttributeError, TypeError):
        return int(np.prod(p.shape)) * 4
