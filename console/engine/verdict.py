"""The policy's words as the console says them: how a run ended (the summary and the exit code),
and the reasons the events give for an attempt that ended, a restart and a wait for the operator."""

from __future__ import annotations

from dataclasses import dataclass

from mscon.agent.policy import ALL_FINISHED, Outcome, Status, Verdict, after_restarts
from mscon.console.engine import exit_codes
from mscon.console.engine.events import Failure, JobState
from mscon.console.engine.root_cause import describe
from mscon.console.engine.state import ClusterState


@dataclass(frozen=True, slots=True)
class RunVerdict:
    """How the run ended, as the summary and the exit code say it."""

    status: JobState
    exit_code: int
    reason: str


def final_verdict(v: Verdict, state: ClusterState) -> RunVerdict:
    """The policy's verdict in the summary's words: a failure's code and reason are its root cause's."""
    if v.status is Status.INTERRUPTED:
        return RunVerdict(JobState.INTERRUPTED, v.exit_code or exit_codes.INTERRUPTED, v.reason or "")
    if v.status is Status.SUCCEEDED:
        return RunVerdict(JobState.SUCCEEDED, exit_codes.OK, v.reason or ALL_FINISHED)
    after = after_restarts(len(state.attempts) - 1)
    root = state.root_cause()
    code = v.exit_code if v.exit_code is not None else root.code if root is not None else exit_codes.INTERNAL
    if v.reason is not None:
        return RunVerdict(JobState.FAILED, code, v.reason)
    if root is not None:
        return RunVerdict(JobState.FAILED, code, describe(root) + after)
    return RunVerdict(JobState.FAILED, code, "ranks ended without a result" + after)


def attempt_reason(outcome: Outcome, reason: str, state: ClusterState) -> tuple[str, Failure | None]:
    """An ended attempt's reason (``reason``: the operator's, for an interrupted one), and its root
    cause when it failed."""
    root = state.root_cause() if outcome is Outcome.FAILED else None
    said = {
        Outcome.SUCCEEDED: ALL_FINISHED,
        Outcome.INTERRUPTED: reason,
        Outcome.RESTART_REQUESTED: "restart requested",
    }.get(outcome) or describe(root)
    return said, root


def restart_reason(why: str, state: ClusterState) -> str:
    """The policy's why of a restart, with the root cause of the attempt when it failed."""
    last = state.attempt
    if last is not None and last.outcome is Outcome.FAILED:
        why = f"{why}: {describe(state.root_cause())}"
    return why


def awaiting_reason(attempt: int, state: ClusterState) -> str:
    """Why the run waits for the operator: the failed attempt's root cause."""
    return f"attempt {attempt} failed: {describe(state.root_cause())}"
