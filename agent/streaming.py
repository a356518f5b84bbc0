"""Streaming a node's processes to the console: their logs as sequence-numbered LogBatch
messages, their metrics (written to MSCON_METRICS, else parsed from the log), MindSpore's own
blame lines, and device telemetry. Lines wait in the files while the console is behind, never
dropped. A mixin of ``main.Agent``.

Once the console subscribes (``Subscribe``), only the lines of the ranks it names go to it, and
the metrics go as one NodeSummary per node every ``tick_s`` (each rank's latest metric and its
counts): the console's cost is per node and tick, not per line. Every line is still read here
(metrics, blame, hangs, the exit's tail) and stays in its log file, fetched at the end.
"""

from __future__ import annotations

import collections
import os
import stat
import time

from . import layout
from . import procs as procmod
from . import protocol as P
from .evidence import blame
from .metrics import LineParser, record_from_line
from .metrics import from_record as metric_from_record
from .tail import FileTail, LineMetrics, parse_metrics_line

_TAIL_KEEP = 200  # lines kept per process for the exit report
_BATCH_MAX = 500  # lines per LogBatch message


class Watched:
    """Per-process streaming state."""

    def __init__(self, proc: procmod.Proc) -> None:
        self.proc = proc
        # Each attempt has its own folder, so both files are read from their start.
        self.log = FileTail(proc.log_path)
        self.metrics = FileTail(proc.metrics_path)
        self.seq = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=_TAIL_KEEP)
        self.has_metrics_file = False
        self.progress_ns = time.time_ns()  # last log line or metric read (start counts as progress)
        self.stopped_since: float | None = None  # monotonic time state T was first seen
        self.hung_reported = False
        # A ProcHung waiting for its py-spy stack (taken by a thread): its exit is reported after it.
        self.hung_pending: P.ProcHung | None = None
        self.drained = False  # its log read to the end after its exit (held back while the console is behind)
        self.first_step_said = False  # its Milestone.FIRST_STEP was sent
        self.steps = 0  # metrics read (its NodeSummary count)
        self.latest: P.Metric | None = None  # its newest metric not yet in a NodeSummary
        self.named: list[P.Metric] = []  # older ones a view names (a profiler folder), also due
        self._parser: LineParser | None = None

    def parser(self, node: str, line_metrics: LineMetrics) -> LineParser:
        """This process's parser of printed metrics (it keeps the last TimeMonitor step time)."""
        if self._parser is None or self._parser.line_metrics is not line_metrics:
            self._parser = LineParser(node, self.proc.spec.name, self.proc.spec.rank, line_metrics)
        return self._parser


def _private(path: str) -> None:
    """A rank's MSCON_METRICS file, which the rank itself creates under its umask (mscon_resume's
    writer makes it 0600, a trainer's own ``open`` 0644), made 0600 as every file mscon keeps for
    a run (issue 33). Not made ahead of the rank: the file being there says it writes metrics."""
    try:
        st = os.stat(path)
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != layout.PRIVATE_FILE:
            os.chmod(path, layout.PRIVATE_FILE)
    except OSError:
        pass  # gone again, or not this user's: the 0700 attempt folder still keeps others out


class Streaming:
    """Logs, metrics, evidence and telemetry of the watched processes (``main.Agent``'s state)."""

    def _flush(self, w: Watched, final: bool = False) -> bool:
        """Send the process's new lines (LogBatch) and metrics (MetricBatch); False when they are
        held back: the console is behind, and they stay in the files until it has caught up."""
        if not self.outbox.has_room():
            return False
        # Structured metrics win over parsing the log: look for the file before parsing lines.
        if not w.has_metrics_file and os.path.exists(w.proc.metrics_path):
            w.has_metrics_file = True
            _private(w.proc.metrics_path)
        lines = w.log.read_lines(final=final)
        read_ts = time.time()  # every line of this read was read now: its metrics' stamp
        if lines:
            w.progress_ns = time.time_ns()
        parsed: list[P.Metric] = []
        spec = w.proc.spec
        sub = self.subscription
        wanted = sub is None or sub.wants(spec.rank)
        for start in range(0, len(lines), _BATCH_MAX):
            chunk = lines[start : start + _BATCH_MAX]
            w.recent.extend(chunk)
            self.send(
                P.LogBatch(
                    node=self.node,
                    name=spec.name,
                    rank=spec.rank,
                    seq=w.seq,
                    lines=tuple(chunk),
                    ts_ns=time.time_ns(),
                ),
                to_console=wanted,
            )
            w.seq += len(chunk)
            # One substring test of the whole chunk spares the per-line tests of most chunks:
            # these are blame()'s own first tests (agent/evidence.py).
            text = "\n".join(chunk)
            if "imed out" in text or "emote" in text or "eer rank" in text:
                for line in chunk:
                    self._evidence(w, line)
            if not w.has_metrics_file:
                parser = w.parser(self.node, self.line_metrics)
                parser.read_ts = read_ts
                for line in self.line_metrics.candidates(chunk, text):
                    metric = parser.parse(line)
                    if metric is not None:
                        parsed.append(metric)
        self._flush_metrics(w, final, parsed)
        if final and self.subscription is not None:
            self._summary_tick(force=True)  # its last step, before the node's AllExited
        return True

    def _evidence(self, w: Watched, line: str) -> None:
        found = blame(line)
        if found is None:
            return
        spec = w.proc.spec
        self.send(
            P.Evidence(
                node=self.node,
                name=spec.name,
                rank=spec.rank,
                ranks=tuple(found.ranks),
                kind=found.kind,
                text=found.text,
                ts_ns=time.time_ns(),
            )
        )

    def _flush_metrics(self, w: Watched, final: bool, parsed: list[P.Metric] | None = None) -> None:
        """Every metric of this flush (parsed from the log, or read from MSCON_METRICS) in one
        MetricBatch: one message per rank and flush, not one per step."""
        spec = w.proc.spec
        batch = parsed or []
        if w.has_metrics_file:
            lines = w.metrics.read_lines(final=final)
            read_ts = time.time()  # the stamp of the records without their own ts
            for line in lines:
                obj = parse_metrics_line(line)
                if obj is None:  # a phase or resume record: before the metrics that follow it
                    record = record_from_line(self.node, spec.name, spec.rank, line)
                    if record is not None:
                        w.progress_ns = time.time_ns()
                        self.send(record)
                    continue
                w.progress_ns = time.time_ns()
                batch.append(metric_from_record(self.node, spec.name, spec.rank, obj, read_ts))
        for m in batch:
            self.hang.stepped(spec.name, m.ts or time.time())
        if batch and not w.first_step_said:
            w.first_step_said = True
            first = batch[0].ts
            ts_ns = int(first * 1e9) if first else time.time_ns()
            self.send(P.RankPhase(self.node, spec.name, spec.rank, P.Milestone.FIRST_STEP, ts_ns))
        if not batch:
            return
        w.steps += len(batch)
        msg = P.MetricBatch(node=self.node, name=spec.name, rank=spec.rank, metrics=tuple(batch))
        if self.subscription is None or self.subscription.every_metric:
            self.send(msg)
            return
        # Subscribed: the console hears of them in the next NodeSummary (a detached run's
        # coordinator and attached clients still see each batch).
        if w.latest is not None and (w.latest.profile_dir or w.latest.checksum is not None):
            w.named.append(w.latest)
        # Older ones a view or check names: a profiler folder, a replica checksum (compared step
        # by step across ranks, so none may be skipped).
        w.named.extend(m for m in batch[:-1] if m.profile_dir or m.checksum is not None)
        w.latest = batch[-1]
        self.send(msg, to_console=False)

    # ------------------------------------------------------------ subscription

    def subscribe(self, msg: P.Subscribe) -> None:
        """The console's views changed what they show. A rank newly in sight gets its recent lines
        (the last ``_TAIL_KEEP``) at once; what came before them is in its log file."""
        old, self.subscription = self.subscription, msg
        if old is None:
            self._last_summary = 0.0  # the first summary at the next tick
        for w in self.watched:
            spec = w.proc.spec
            if not msg.wants(spec.rank) or old is None or old.wants(spec.rank) or not w.recent:
                continue
            self.send(
                P.LogBatch(
                    node=self.node,
                    name=spec.name,
                    rank=spec.rank,
                    seq=w.seq - len(w.recent),
                    lines=tuple(w.recent),
                    ts_ns=time.time_ns(),
                )
            )

    def _summary_tick(self, force: bool = False) -> None:
        """A NodeSummary every ``tick_s`` when something changed, and at once when a process of
        the node has exited (``force``: its log read to the end; its last step and count before
        the console stops waiting)."""
        sub = self.subscription
        if sub is None or not self.watched:
            return
        now = time.monotonic()
        exits = sum(1 for w in self.watched if w.proc.reported)
        if not force and exits == self._summary_exits and now - self._last_summary < sub.tick_s:
            return
        self._last_summary, self._summary_exits = now, exits
        counts = tuple(P.RankCount(w.proc.spec.name, w.proc.spec.rank, w.seq, w.steps) for w in self.watched)
        metrics: list[P.Metric] = []
        for w in self.watched:
            metrics.extend(w.named)
            w.named = []
            if w.latest is not None:
                metrics.append(w.latest)
                w.latest = None
        if counts == self._summary_counts and not metrics:
            return  # nothing new: an idle node costs the console nothing
        self._summary_counts = counts
        self.send(P.NodeSummary(node=self.node, ts=time.time(), counts=counts, metrics=tuple(metrics)))

    def _telemetry(self) -> None:
        sub = self.subscription
        if sub is not None:  # subscribed: with the summaries, once a tick, not once a second
            now = time.monotonic()
            if now - self._last_telemetry_sent < sub.tick_s:
                return
            self._last_telemetry_sent = now
        items = []
        for w in self.watched:
            if not w.proc.alive:
                continue
            cpu, rss = w.proc.sample()
            local = w.proc.spec.local_rank
            dev = self.devices.latest.get(local) if self.devices is not None and local >= 0 else None
            items.append(
                P.Telemetry(
                    node=self.node,
                    name=w.proc.spec.name,
                    rank=w.proc.spec.rank,
                    cpu_percent=cpu,
                    rss_bytes=rss,
                    ts=time.time(),
                    device_util=dev.util if dev else None,
                    device_mem_bytes=dev.used if dev else None,
                    device_mem_total=dev.total if dev else None,
                )
            )
        if items:  # the node's processes in one message a second, not one each
            self.send(P.TelemetryBatch(node=self.node, items=tuple(items)))
