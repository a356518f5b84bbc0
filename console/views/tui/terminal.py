"""A terminal driver whose writes never block the event loop the engine shares with the view.

Textual's Linux driver hands each frame to a writer thread through a queue of 30; once a terminal
stops reading (a frozen terminal, XOFF, a stalled ssh session) that queue fills and the next write
blocks the whole loop, supervisor included. Here a full queue drops the frame instead and asks for
one full repaint once the terminal reads again: a stuck terminal costs frames, never a stop.
"""

from __future__ import annotations

import queue
import sys
from typing import Any

from mscon.console.views.tui.textual_compat import writer_queue
from textual.driver import Driver

if sys.platform != "win32":
    from textual.drivers.linux_driver import LinuxDriver

    class NonBlockingDriver(LinuxDriver):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.dropped_frames = 0
            self.needs_repaint = False
            self._closing = False

        def write(self, data: str) -> None:
            frames = writer_queue(self)
            if frames is None or self._closing:
                super().write(data)
                return
            try:
                frames.put_nowait(data)
            except queue.Full:
                self.dropped_frames += 1
                self.needs_repaint = True

        def backlog(self) -> int:
            frames = writer_queue(self)
            return frames.qsize() if frames is not None else 0

        def stop_application_mode(self) -> None:
            self._closing = True  # restoring the terminal must not lose a byte
            super().stop_application_mode()

    DRIVER: type[Driver] | None = NonBlockingDriver
else:  # pragma: no cover
    DRIVER = None
