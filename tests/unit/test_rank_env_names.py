"""The agent's names for a rank's environment (agent/rank_env.py) and the rank side's
(mscon_resume, which ships without the agent's package) are one contract: the same strings."""

from __future__ import annotations

from mscon.agent import rank_env

from mscon_resume import compile_cache
from mscon_resume import env as resume_env


def test_the_rank_side_reads_the_names_the_agent_sets() -> None:
    assert (rank_env.ATTEMPT, rank_env.METRICS, rank_env.STATE_DIR, rank_env.SNAPSHOT_KEY) == (
        resume_env.ATTEMPT,
        resume_env.METRICS,
        resume_env.STATE_DIR,
        resume_env.SNAPSHOT_KEY,
    )
    assert rank_env.COMPILE_CACHE == compile_cache.ROOT


def test_a_kept_standby_ignores_exactly_the_per_run_names() -> None:
    from mscon.agent import kept

    base = {"PATH": "/bin", "MS_WORKER_NUM": "4"}
    for name in rank_env.PER_RUN:
        assert kept.same_job_env({**base, name: "a"}, {**base, name: "b"}) is None, name
    attempt = rank_env.ATTEMPT  # what MindSpore's processes saw at start: never ignored
    assert kept.same_job_env({**base, attempt: "0"}, {**base, attempt: "1"}) == attempt
