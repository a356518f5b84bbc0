"""When the snapshots may go: only once the whole run has succeeded.

Under mscon the agent frees the run's node memory when the run ends (the console knows whether
it succeeded, and a later attempt may still need a finished stage's state). Without mscon the
script's own exit decides: a zero exit drops this rank's snapshots; an uncaught exception, a
``sys.exit(1)`` (or ``exit``/``quit``) or a refusal keeps them for the relaunch, as a kill does.
The exit code itself is not visible at exit time, so the ways out are watched as they are taken.
"""

from __future__ import annotations

import atexit
import builtins
import sys
from typing import Any, Callable

from . import env

_failed = False
_installed = False
_on_success: list[Callable[[], None]] = []


def failed() -> None:
    """This process will not end as a success (a refusal, a fault the library saw)."""
    global _failed
    _failed = True


def has_failed() -> bool:
    return _failed


def _nonzero(code: Any) -> bool:
    return code is not None and code != 0


def install(on_success: Callable[[], None]) -> None:
    """Run ``on_success`` at a successful exit of a script not run by mscon's agent."""
    global _installed
    _on_success.append(on_success)
    if _installed:
        return
    _installed = True
    previous_hook = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        failed()
        previous_hook(kind, value, tb)

    sys.excepthook = hook
    sys.exit = _watching(sys.exit)
    for name in ("exit", "quit"):  # the site module's, which a script may call
        if callable(getattr(builtins, name, None)):
            setattr(builtins, name, _watching(getattr(builtins, name)))
    atexit.register(_at_exit)


def _watching(leave: Callable[..., Any]) -> Callable[..., Any]:
    def watched(code: Any = None) -> Any:
        if _nonzero(code):
            failed()
        return leave(code)

    return watched


def _at_exit() -> None:
    if _failed or env.attempt_given():
        return
    for action in _on_success:
        action()
