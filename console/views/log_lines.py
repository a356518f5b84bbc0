"""Which of a rank's log lines say something: MindSpore's INFO/DEBUG chatter does not.

MindSpore's own logger (glog from C++, and the Python ``ME`` logger) writes
``[LEVEL] MODULE(pid,tid,proc):YYYY-MM-DD-HH:MM:SS.mmm.uuu [file:line] Func] text``; at INFO and
DEBUG that is chatter ("Event base dispatch success!", pass timings) that would push the rank's
last meaningful line (a loss, a print, a WARNING or an error) off a one-line summary. Chatter stays
in the log and on the rank screen; only the one-line summaries (the Devices panes and table) skip it.
Other loggers' INFO lines (MindFormers prints its training progress at INFO) are not chatter.
"""

from __future__ import annotations

import re
from collections.abc import Reversible

# Level, module (upper case: CORE, DISTRIBUTED, RUNTIME_FRAMEWORK, ME), "(pid,tid,proc)" from C++ or
# "(pid:tid,Process)" from Python, then the timestamp: what only MindSpore's logger writes.
_CHATTER = re.compile(r"\s*\[(?:INFO|DEBUG)\] [A-Z][A-Z0-9_]*\(\d+[,:][^)]*\):\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d")


def is_chatter(line: str) -> bool:
    """True for a MindSpore INFO or DEBUG log line (kept in the log, never a rank's summary)."""
    return _CHATTER.match(line) is not None


def last_meaningful(lines: Reversible[str]) -> str:
    """The newest line that is not chatter; the newest line if all are (better than nothing)."""
    newest: str | None = None
    for line in reversed(lines):
        if newest is None:
            newest = line
        if line.strip() and not is_chatter(line):
            return line
    return newest or ""
