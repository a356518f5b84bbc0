"""How numbers and states read in the console (one place for units, colours and markers).

Every state has a word and a marker as well as a colour, so nothing depends on colour alone
(NO_COLOR, monochrome terminals).
"""

from __future__ import annotations

from mscon.console.engine.events import JobState, NodeState, RankState
from mscon.console.views.plain import printable, size
from rich.text import Text

# RankState.live as a set: loops over every rank test membership, not a property call per rank.
LIVE = frozenset(s for s in RankState if s.live)
FAILED = frozenset([RankState.FAILED, RankState.HUNG, RankState.LOST])

STATE_STYLE: dict[RankState, str] = {
    RankState.PENDING: "dim",
    RankState.STARTING: "cyan",
    RankState.RUNNING: "green",
    RankState.HUNG: "bold magenta",
    RankState.EXITED_OK: "blue",
    RankState.FAILED: "bold red",
    RankState.STOPPED: "dim",
    RankState.LOST: "bold red",
}
STATE_MARK: dict[RankState, str] = {
    RankState.PENDING: "·",
    RankState.STARTING: "◌",
    RankState.RUNNING: "●",
    RankState.HUNG: "⏸",
    RankState.EXITED_OK: "✓",
    RankState.FAILED: "✖",
    RankState.STOPPED: "■",
    RankState.LOST: "✖",
}
NODE_STYLE: dict[NodeState, str] = {
    NodeState.PENDING: "dim",
    NodeState.CONNECTING: "cyan",
    NodeState.DEPLOYING: "cyan",
    NodeState.READY: "green",
    NodeState.RUNNING: "green",
    NodeState.DONE: "blue",
    NodeState.UNREACHABLE: "bold red",
    NodeState.LOST: "bold red",
}
JOB_STYLE: dict[JobState, str] = {
    JobState.CONNECTING: "cyan",
    JobState.RUNNING: "green",
    JobState.STOPPING: "yellow",
    JobState.RESTARTING: "yellow",
    JobState.AWAITING_OPERATOR: "bold red",
    JobState.SUCCEEDED: "bold blue",
    JobState.FAILED: "bold red",
    JobState.INTERRUPTED: "yellow",
    JobState.UNREACHABLE: "bold red",
    JobState.ERROR: "bold red",
    JobState.DETACHED: "cyan",
}
STRAGGLER_STYLE = "bold yellow"
ROOT_STYLE = "bold red"
# A restart whose script does not resume, whose ranks disagree, or that a rank refused.
STARTED_OVER_STYLE = "bold yellow"


def rank_state(state: RankState, straggler: bool = False) -> Text:
    text = Text(f"{STATE_MARK[state]} {state.value}", style=STATE_STYLE[state])
    if straggler and state.live:
        text.append(" ▲ straggler", style=STRAGGLER_STYLE)
    return text


def node_state(state: NodeState) -> Text:
    return Text(state.value, style=NODE_STYLE[state])


def job_state(state: JobState) -> Text:
    return Text(state.value, style=JOB_STYLE[state])


def num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def step_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def line(text: str, width: int = 0) -> str:
    """A log line made safe to show (control characters escaped), optionally cut to ``width``."""
    safe = printable(text)
    return safe if not width or len(safe) <= width else safe[: max(0, width - 1)] + "…"


_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float | None, width: int = 10) -> str:
    """A bar of ``width`` cells filled to ``fraction`` (0..1), in eighths of a cell."""
    if fraction is None or fraction != fraction:
        return ""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[part] if part else "")).ljust(width)


def device_text(r: object) -> Text:
    """Device memory (used/total, with a bar) and utilisation; "n/a" where the node reports none."""
    used = getattr(r, "device_memory_bytes", None)
    total = getattr(r, "device_memory_total", None)
    util = getattr(r, "device_util", None)
    text = Text(f"device mem {size(used, 'n/a')}")
    if used is not None and total:
        text.append(f"/{size(total)} ")
        text.append(bar(used / total), style="cyan")
    if util is not None:
        text.append(f"  util {util:.0f}% ")
        text.append(bar(util / 100), style="green")
    return text
