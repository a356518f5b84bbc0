"""mscon_resume: any MindSpore training script resumes at its last step.

Under mscon each rank keeps a copy of its training state in node memory at every step boundary
(written in the background, within a budget of the step time); a restarted attempt's ranks agree
on the newest step all have and continue from it: parameters, optimizer state, the epoch, the
position in the data and the random state. The same script runs under plain ``python`` or
``msrun``: relaunch it with ``MSCON_RESUME=1`` after a failure.

Two shapes, one mechanism (:mod:`mscon_resume.core`):

- hand-written loops: :func:`batches` (with :func:`epochs` when code around the batch loop
  changes state, and :func:`track_loss` for the loss in the metrics), or :class:`Loop` per stage;
- ``Model.train``: :class:`ResumeCallback`.

What is kept is ``keep``'s contract (:mod:`mscon_resume.state`). A relaunch either computes what
the uninterrupted run would have, or refuses in one line before its first step (exit code
``REFUSED_EXIT``); ``python -m mscon_resume.check`` tries a script both ways.

Pure Python over numpy and MindSpore; mscon's agent ships it with itself and puts it on every
rank's ``PYTHONPATH``, and it is in mscon's wheel (``pip install mscon`` on a node works too).
"""

from __future__ import annotations

from typing import Any

from .core import Resumed, Resumer
from .env import REFUSED_EXIT
from .loop import Loop, batches, epochs, track_loss

__all__ = ["REFUSED_EXIT", "Loop", "Resumed", "Resumer", "ResumeCallback", "batches", "epochs", "track_loss"]

# Every file of the package: what the console ships to the nodes beside its agent.
FILES = (
    "__init__.py",
    "env.py",
    "store.py",
    "snapfile.py",
    "collective.py",
    "interval.py",
    "metrics.py",
    "rng.py",
    "state.py",
    "probe.py",
    "carried.py",
    "lifecycle.py",
    "core.py",
    "loop.py",
    "callback.py",
    "resumable.py",
    "compile_cache.py",
    "check.py",
    "check_compare.py",
    "check_run.py",
)


def __getattr__(name: str) -> Any:
    if name == "ResumeCallback":  # imports mindspore.train: only when asked for
        from .callback import ResumeCallback

        return ResumeCallback
    raise AttributeError(name)
