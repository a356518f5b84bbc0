"""The Overview's cluster series: loss (mean over ranks) and throughput, per training step.

Keyed by step, not by second of wall clock: a 10-second run whose 40 steps all fall within one
second still draws 40 points, and a point is drawn as soon as one rank has reported its step (no
"complete second" to wait for, none lost when the run ends). A step's loss is the mean over the ranks
that reported it; its throughput is the ranks' mean samples/s times the number of ranks reporting
samples/s (the cluster's samples/s), or, where no rank reports samples/s, steps/s from the step
times. Steps numbered within each epoch (MindSpore's LossMonitor prints ``epoch: 2 step: 1``) are
laid end to end. Past ``keep`` buckets, neighbouring steps are merged in pairs: the whole run stays
on the plot at a coarser grain, in bounded memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mscon.agent.protocol import Metric

SAMPLES_UNIT = "samples/s"
STEPS_UNIT = "steps/s"


@dataclass(slots=True)
class _Bucket:
    gen: int  # the attempt generation that filled it: a restart's steps replace the earlier ones
    loss_sum: float = 0.0
    loss_n: int = 0
    samples_sum: float = 0.0
    samples_n: int = 0
    samples_ranks: int = 0  # ranks reporting samples/s when this step came in
    time_sum: float = 0.0
    time_n: int = 0

    def merge(self, other: _Bucket) -> None:
        self.gen = max(self.gen, other.gen)
        self.loss_sum += other.loss_sum
        self.loss_n += other.loss_n
        self.samples_sum += other.samples_sum
        self.samples_n += other.samples_n
        self.samples_ranks = max(self.samples_ranks, other.samples_ranks)
        self.time_sum += other.time_sum
        self.time_n += other.time_n


@dataclass(frozen=True, slots=True)
class SeriesPoints:
    """What the plots draw: x is the training step (laid end to end across epochs)."""

    loss_steps: list[float]
    loss: list[float]
    throughput_steps: list[float]
    throughput: list[float]
    unit: str  # SAMPLES_UNIT or STEPS_UNIT


class ClusterSeries:
    # 512: more points than a plot's braille dots across (2 a column), and plotext draws 512 in
    # ~30 ms where 2,048 take ~75 ms, on every flush that brings metrics while the Overview shows
    def __init__(self, keep: int = 512) -> None:
        self.keep = keep
        self.stride = 1  # steps per bucket; doubles whenever more than ``keep`` buckets are held
        self._gen = 0
        self._buckets: dict[tuple[int, int], _Bucket] = {}  # (epoch, step // stride) -> bucket
        self._epochs: dict[int, tuple[int, int]] = {}  # epoch -> (lowest, highest) step seen
        self._last: dict[str, tuple[int, int]] = {}  # rank -> (epoch, step) last counted
        self._samplers: set[str] = set()  # ranks reporting samples/s in this attempt

    def new_attempt(self) -> None:
        self._gen += 1
        self._last.clear()
        self._samplers.clear()

    def observe(self, msg: Metric, step_time_s: float | None = None) -> None:
        """One rank's metric; ``step_time_s`` is its step time where the caller knows one (reported
        or derived by StepTimes, the one place that derives them)."""
        epoch = msg.epoch or 0
        if self._last.get(msg.name, (-1, -1)) >= (epoch, msg.step):
            return  # the same step reported twice (parsed line and metrics file)
        self._last[msg.name] = (epoch, msg.step)
        lo, hi = self._epochs.get(epoch, (msg.step, msg.step))
        self._epochs[epoch] = (min(lo, msg.step), max(hi, msg.step))
        key = (epoch, msg.step // self.stride)
        b = self._buckets.get(key)
        if b is None or b.gen != self._gen:
            b = self._buckets[key] = _Bucket(self._gen)
        if msg.loss is not None and math.isfinite(msg.loss):  # a NaN has no place on a plot's axis
            b.loss_sum += msg.loss
            b.loss_n += 1
        if msg.samples_per_s is not None and math.isfinite(msg.samples_per_s):
            self._samplers.add(msg.name)
            b.samples_sum += msg.samples_per_s
            b.samples_n += 1
            b.samples_ranks = max(b.samples_ranks, len(self._samplers))
        if step_time_s is not None and step_time_s > 0:
            b.time_sum += step_time_s
            b.time_n += 1
        if len(self._buckets) > self.keep:
            self._coarsen()

    def _coarsen(self) -> None:
        self.stride *= 2
        merged: dict[tuple[int, int], _Bucket] = {}
        for (epoch, index), b in self._buckets.items():
            key = (epoch, index // 2)
            into = merged.get(key)
            if into is None:
                merged[key] = b
            else:
                into.merge(b)
        self._buckets = merged

    def _offsets(self) -> dict[int, int]:
        """Per epoch, what to add to its step numbers: steps numbered within the epoch (the
        lowest step of an epoch not above the previous epoch's highest) go after the previous
        epoch's; steps numbered through the run stay as they are."""
        offsets: dict[int, int] = {}
        offset, prev_hi, prev_end = 0, None, 0
        for epoch in sorted(self._epochs):
            lo, hi = self._epochs[epoch]
            if prev_hi is not None and lo <= prev_hi:
                offset = prev_end
            offsets[epoch] = offset
            prev_hi, prev_end = hi, offset + hi
        return offsets

    def points(self) -> SeriesPoints:
        offsets = self._offsets()
        stride = self.stride
        placed = sorted(
            ((offsets[epoch] + index * stride, b) for (epoch, index), b in self._buckets.items()),
            key=lambda p: p[0],
        )
        samples = any(b.samples_n for _, b in placed)
        loss_xs: list[float] = []
        loss: list[float] = []
        thr_xs: list[float] = []
        thr: list[float] = []
        for x, b in placed:
            if b.loss_n:
                loss_xs.append(float(x))
                loss.append(b.loss_sum / b.loss_n)
            if samples and b.samples_n:
                thr_xs.append(float(x))
                thr.append(b.samples_sum / b.samples_n * b.samples_ranks)
            elif not samples and b.time_n and b.time_sum > 0:
                thr_xs.append(float(x))
                thr.append(b.time_n / b.time_sum)
        return SeriesPoints(loss_xs, loss, thr_xs, thr, SAMPLES_UNIT if samples else STEPS_UNIT)
