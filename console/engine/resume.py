"""Where each attempt's ranks started: resumed from a snapshot or checkpoint at step N, started
fresh, started over because the script does not resume, or refused to resume. Pure functions of
what ClusterState kept per rank (its resume record, RankResumed, and its first step) and per
earlier attempt (its verdict and its ranks' last steps); ``verdict`` is the one place that turns
the ranks' starts into the attempt's verdict (and the steps computed again), ``frontier`` the one
that says which step the attempts before it reached, and ``describe_resume`` the one place that
says it in words (the headless summary and the TUI both print it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mscon.agent.protocol import RankResumed, ResumeSource
from mscon.console.engine.events import AttemptResume, RankStart, ResumeVerdict, StartSource

# What a script that does not resume is told (docs/usage.md, "Resume your own script").
FIX = 'one line fixes it: wrap the loop in mscon_resume, see docs/usage.md "Resume your own script"'

_RESUMED = {StartSource.SNAPSHOT, StartSource.CHECKPOINT}
_SAME = {  # every known rank started this way: the attempt's verdict
    StartSource.FRESH: ResumeVerdict.FRESH,
    StartSource.STARTED_OVER: ResumeVerdict.STARTED_OVER,
    StartSource.UNRECORDED: ResumeVerdict.UNRECORDED,
}
_NAMES_SHOWN = 4  # ranks named per group in words; the rest are counted
# An attempt with this verdict and no step reported computed nothing: the one before it counts.
_NO_STEP = {ResumeVerdict.REFUSED, ResumeVerdict.UNKNOWN}


@dataclass(frozen=True, slots=True)
class Reached:
    """An earlier attempt as ``frontier`` reads it: its number, its verdict (None: not known) and
    the last step each of its ranks reported (None: none)."""

    attempt: int
    verdict: ResumeVerdict | None
    last_steps: tuple[int | None, ...]


def rank_start(
    name: str,
    node: str,
    rank: int,
    resumed: RankResumed | None,
    stepped: bool,
    first: tuple[int | None, int] | None,
    baseline: tuple[int | None, int] | None,
) -> RankStart:
    """One rank's start. ``resumed``: its resume record this attempt; ``stepped``: it reported a
    first step or a metric; ``first``: its first metric's (epoch, step) as reported; ``baseline``:
    the same for its first metric in the run's first attempt (None: not known). A rank that stepped
    without a record started over, unless its first step came after the baseline's (without one:
    after epoch 1, step 1), where the script resumed by itself (UNRECORDED)."""
    first_epoch, first_step = first if first is not None else (None, None)
    if resumed is not None:
        source = StartSource(resumed.source) if resumed.source in ResumeSource.ALL else StartSource.UNKNOWN
        if source is StartSource.REFUSED:  # it resumed at no step: it stopped before its first
            return RankStart(name, node, rank, source, None, None, first_step, first_epoch, resumed.reason)
        return RankStart(name, node, rank, source, resumed.step, resumed.epoch, first_step, first_epoch)
    if not stepped:
        source = StartSource.UNKNOWN
    elif first is not None and _order(first) > _order(baseline if baseline is not None else (1, 1)):
        source = StartSource.UNRECORDED
    else:
        source = StartSource.STARTED_OVER
    return RankStart(name, node, rank, source, None, None, first_step, first_epoch)


def _order(point: tuple[int | None, int]) -> tuple[int, int]:
    epoch, step = point
    return (epoch or 0, step)


def frontier(attempt: int, earlier: Sequence[Reached]) -> int | None:
    """The step the attempts before ``attempt`` reached: the largest step any rank of the previous
    attempt reported. A previous attempt that stopped before any step (REFUSED or UNKNOWN, no step
    reported) computed nothing, so the one before it counts. None: not known (no attempt before,
    one missing from ``earlier``, or one that stepped without reporting a step)."""
    by_number = {e.attempt: e for e in earlier}
    for number in range(attempt - 1, -1, -1):
        e = by_number.get(number)
        if e is None:
            return None
        steps = [s for s in e.last_steps if s is not None]
        if steps:
            return max(steps)
        if e.verdict not in _NO_STEP:
            return None
    return None


def verdict(starts: Sequence[RankStart], reached: int | None = None) -> AttemptResume:
    """The attempt's verdict from its workers' starts (ranks not known yet are left out of it):
    REFUSED when any rank refused to resume, RESUMED when every known rank resumed from a snapshot
    or checkpoint at the same step, FRESH, STARTED_OVER or UNRECORDED when every known rank started
    that way, MIXED otherwise, UNKNOWN when no rank has said. ``reached``: the step the attempts
    before it reached (``frontier``); a RESUMED attempt computes ``reached`` less its step again
    (None: not known, or ``reached`` is below its step, which the reports then do not explain)."""
    ranks = tuple(sorted(starts, key=lambda s: s.rank))
    known = [s for s in ranks if s.source is not StartSource.UNKNOWN]
    if not known:
        return AttemptResume(ResumeVerdict.UNKNOWN, None, ranks)
    sources = {s.source for s in known}
    steps = {s.step for s in known}
    if StartSource.REFUSED in sources:
        return AttemptResume(ResumeVerdict.REFUSED, None, ranks)
    if sources <= _RESUMED and len(steps) == 1:
        step = known[0].step
        again = reached - step if reached is not None and step is not None and reached >= step else None
        return AttemptResume(ResumeVerdict.RESUMED, step, ranks, again)
    if len(sources) == 1 and known[0].source in _SAME:
        same = _SAME[known[0].source]
        return AttemptResume(same, known[0].step if same is ResumeVerdict.FRESH else None, ranks)
    return AttemptResume(ResumeVerdict.MIXED, None, ranks)


def describe_resume(res: AttemptResume) -> str:
    """The verdict in one line, without the attempt: "every rank resumed at step 150 (snapshot)",
    "the script started over: it does not resume (one line fixes it: ...)", ..."""
    known = [s for s in res.ranks if s.source is not StartSource.UNKNOWN]
    unknown = [s.name for s in res.ranks if s.source is StartSource.UNKNOWN]
    who = "every rank" if not unknown else _names([s.name for s in known])
    v = res.verdict
    if v is ResumeVerdict.UNKNOWN:
        return "no rank said where it started (none reached its first step)"
    if v is ResumeVerdict.REFUSED:
        text = _refused(known)
    elif v is ResumeVerdict.RESUMED:
        sources = sorted({s.source.value for s in known})
        text = f"{who} resumed at step {res.step} ({' and '.join(sources)})"
        if res.recomputed is not None:
            text += f"; {_again(res.recomputed)}"
    elif v is ResumeVerdict.FRESH:
        text = f"{who} started at step 0: there was no state every rank had to resume from"
    elif v is ResumeVerdict.STARTED_OVER:
        text = f"the script started over: it does not resume ({FIX})"
        if unknown:
            text = f"the script started over ({who}): it does not resume ({FIX})"
    elif v is ResumeVerdict.UNRECORDED:
        first = min(known, key=lambda s: _order((s.first_epoch, s.first_step or 0)))
        text = (
            f"{who} went on from a later step than the first attempt's ({first.name} first reported "
            f"{_point(first)}) with no resume record: the script resumes by itself"
        )
    else:
        text = "the ranks did not start from the same step: " + "; ".join(_groups(known))
    if unknown:
        text += f"; not known for {_names(unknown)} (no first step)"
    return text


def _refused(known: Sequence[RankStart]) -> str:
    """A refused attempt in words: the first rank that refused, its reason, the others counted;
    the ranks that did not refuse, grouped, or (none did) that the relaunch stopped."""
    refused = [s for s in known if s.source is StartSource.REFUSED]
    first, more = refused[0], len(refused) - 1
    who = f"rank {first.name}" + (f" and {more} other rank{'s' if more > 1 else ''}" if more else "")
    why = f": {first.reason}" if first.reason else ", giving no reason"
    rest = [s for s in known if s.source is not StartSource.REFUSED]
    after = "; ".join(_groups(rest)) if rest else "(the relaunch stopped before its first step)"
    return f"{who} refused to resume{why}" + ("; " if rest else " ") + after


def _again(steps: int) -> str:
    """How many steps a resumed attempt computes again, in words."""
    if steps == 0:
        return "none computed again"
    return f"{steps} step{'s' if steps > 1 else ''} computed again"


def _groups(known: Sequence[RankStart]) -> list[str]:
    """The ranks grouped by how they started, in rank order of each group's first rank."""
    groups: dict[tuple[StartSource, int | None], list[str]] = {}
    for s in known:
        groups.setdefault((s.source, s.step), []).append(s.name)
    out = []
    for (source, step), names in groups.items():
        if source in _RESUMED:
            how = f"resumed at step {step} ({source.value})"
        elif source is StartSource.FRESH:
            how = "started at step 0 (nothing to resume from)"
        elif source is StartSource.UNRECORDED:
            how = "went on with no resume record"
        else:
            how = "started over (no resume record)"
        out.append(f"{_names(names)} {how}")
    return out


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_NAMES_SHOWN])
    more = len(names) - _NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def _point(s: RankStart) -> str:
    step = f"step {s.first_step}"
    return f"epoch {s.first_epoch}, {step}" if s.first_epoch is not None else step
