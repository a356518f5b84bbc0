"""The JSONL recorder sink (``mscon run --events PATH``): one console event a line, replayable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from mscon.console.engine.events import Event, to_json


class EventRecorder:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("w", encoding="utf-8")

    def handle(self, event: Event) -> None:
        self._f.write(json.dumps(to_json(event), separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._f.close()


def read_events(path: Path) -> Iterator[Event]:
    """The events of a recording, plain or gzip (console/history/recording.py reads both)."""
    from mscon.console.history.recording import read_recording

    return read_recording(path)
