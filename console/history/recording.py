"""Every run records its console events in its run folder: ``<logs dir>/<run id>/events.jsonl.gz``.

The records are those of ``--events`` (one ``events.to_json`` a line), gzip-compressed. The stream
is flushed (``Z_SYNC_FLUSH``) about once a second, so a console that dies mid-run leaves a file whose
every complete line can be read back (:func:`read_recording`). Compression runs in one writer thread
of the recorder's own (in order), never on the event loop; while a run goes on, the recorder holds
an exclusive ``flock`` on the file, so ``mscon ls`` can tell a run still being recorded from one
whose console died (the kernel drops the lock with the process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import gzip
import json
import os
import struct
import sys
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from mscon.agent import layout
from mscon.console.engine.bus import EventBus
from mscon.console.engine.events import Event, RunFinished, from_json, json_default
from mscon.console.transport.private_copy import private_file, private_folder

RECORDING = "events.jsonl.gz"  # in the run folder, beside summary.json
_GZIP_MAGIC = b"\x1f\x8b"
_FLUSH_S = 1.0  # how much a console that dies may take with it
_CHUNK = 256 * 1024  # bytes of JSON lines handed to the writer at once, at most


def recording_file(logs_dir: Path) -> Path:
    """Where a run folder keeps its recording."""
    return logs_dir / RECORDING


class CompressedRecorder:
    """A bus sink writing every event as gzip JSON lines (the run folder's recording)."""

    def __init__(self, path: Path, flush_s: float = _FLUSH_S) -> None:
        # The run folder and its recording (every log line of the run) are the operator's only:
        # 0700 and 0600 whatever the umask, as the copies fetched beside it.
        private_folder(path.parent)
        self._raw = os.fdopen(private_file(path), "wb")
        with contextlib.suppress(OSError):  # a file system without locks: ls only reads it as unknown
            fcntl.flock(self._raw.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The gzip header's mtime is when the run started (``mscon ls`` reads it back).
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6, mtime=int(time.time()))
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mscon-recorder")
        self._lock = threading.Lock()  # the writer thread and close()
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._last_flush = time.monotonic()
        self._flush_s = flush_s
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: concurrent.futures.Future[None] | None = None
        self._closed = False

    def handle(self, event: Event) -> Awaitable[None] | None:
        line = json.dumps(event, separators=(",", ":"), default=json_default) + "\n"
        self._pending.append(line)
        self._pending_bytes += len(line)
        due = time.monotonic() - self._last_flush >= self._flush_s
        if isinstance(event, RunFinished) or due or self._pending_bytes >= _CHUNK:
            # Awaited by the bus: a writer that falls behind holds this sink's queue, not the run.
            return asyncio.wrap_future(self._submit())
        if self._timer is None:  # a quiet spell: what is buffered still reaches the disk soon
            self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._submit)
        return None

    def busy(self) -> bool:
        """A write in flight (the bus's close waits for it rather than taking the sink for stuck)."""
        return self._in_flight is not None and not self._in_flight.done()

    def _submit(self) -> concurrent.futures.Future[None]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        data = "".join(self._pending).encode("utf-8")
        self._pending.clear()
        self._pending_bytes = 0
        self._last_flush = time.monotonic()
        self._in_flight = self._writer.submit(self._write, data)
        return self._in_flight

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            if data:
                self._gz.write(data)
            self._gz.flush(zlib.Z_SYNC_FLUSH)  # every complete line readable, whatever happens next

    def close(self) -> None:
        """Write what is buffered and end the gzip stream; never raises (a full disk loses the tail)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(Exception):
            if self._pending:
                self._submit()
            self._writer.shutdown(wait=True)
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError, ValueError):
                self._gz.close()
            with contextlib.suppress(OSError):
                self._raw.close()


class EventRecorder:
    """The plain JSON lines of ``--events PATH``: one ``events.to_json`` a line, uncompressed."""

    def __init__(self, path: Path) -> None:
        layout.private_dirs(str(path.parent))  # the missing folders 0700, those there left alone
        self._f = layout.private_open(str(path), "w", encoding="utf-8")  # 0600: it holds log lines

    def handle(self, event: Event) -> None:
        self._f.write(json.dumps(event, separators=(",", ":"), default=json_default) + "\n")

    def close(self) -> None:
        self._f.close()


class RunRecorders:
    """The sinks that record a run: its recording in the run folder (``history``: every run this
    console starts) and the plain JSON lines of ``--events PATH``. Close after the run."""

    def __init__(self, bus: EventBus, history: Path | None, events: Path | None) -> None:
        self._closers: list[Callable[[], None]] = []
        if events is not None:
            plain = EventRecorder(events)
            bus.add_sink("recorder", plain.handle, lag_limit=10**9, hard_limit=10**9)
            self._closers.append(plain.close)
        if history is not None:
            try:
                gz = CompressedRecorder(recording_file(history))
            except OSError as exc:  # the run matters more than its history
                print(f"mscon: warning: the run is not recorded: {exc.strerror or exc}", file=sys.stderr)
            else:
                bus.add_sink("history", gz.handle, lag_limit=10**9, hard_limit=10**9, busy=gz.busy)
                self._closers.append(gz.close)

    def close(self) -> None:
        for close in self._closers:
            close()


# ------------------------------------------------------------------ reading


def read_recording(path: Path) -> Iterator[Event]:
    """The events of a recording, gzip (the run folder's) or plain (``--events``). A recording cut
    short (a console that died) yields every complete line; ValueError for what is no recording."""
    for line in _lines(path):
        try:
            raw = json.loads(line)
        except ValueError:
            if not line.endswith(b"\n"):
                return  # the last line, cut short
            raise
        if not isinstance(raw, dict):
            raise ValueError(f"not an event: {line[:60]!r}")
        yield from_json(raw)


def _lines(path: Path) -> Iterator[bytes]:
    """Every line, the last one without its newline if it has none; OSError, ValueError."""
    with path.open("rb") as f:
        gzipped = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        rest = b""
        for chunk in _gunzip(f) if gzipped else iter(lambda: f.read(1 << 16), b""):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.strip():
                    yield line + b"\n"
        if rest.strip():
            yield rest


def _gunzip(f: object) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file, as far as they go (several members, as appending
    makes, included); a stream that ends early is not an error: it is what was flushed."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    while True:
        data = f.read(1 << 16)  # type: ignore[attr-defined]
        if not data:
            return
        while data:
            try:
                out = d.decompress(data)
            except zlib.error as exc:
                raise ValueError(f"corrupt gzip data ({exc})") from None
            if out:
                yield out
            if not d.eof:
                break
            data = d.unused_data
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)


def recording_started(path: Path) -> float | None:
    """When a run folder's recording began (its gzip header's mtime), or None."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:
        return None
    if len(head) < 8 or head[:2] != _GZIP_MAGIC:
        return None
    mtime = struct.unpack("<I", head[4:8])[0]
    return float(mtime) if mtime else None


def being_recorded(path: Path) -> bool:
    """A console is recording this file now (it holds the lock; a dead console's lock is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False
