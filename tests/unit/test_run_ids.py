"""Run ids never reuse an earlier run's folder: a generated id (``slurm-$SLURM_JOB_ID`` in a Slurm
job) that a node or the local logs folder already holds gets a suffix; an id the user gave is
refused with how to reuse it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import local_inventory, node_run_dir
from mscon.console.config.inventory import load_inventory
from mscon.console.engine import run_ids
from mscon.console.engine.plan import build_plan
from mscon.console.engine.session import ClusterSession


def test_the_generated_id_of_a_slurm_job() -> None:
    assert run_ids.generated_run_id({"SLURM_JOB_ID": "123"}) == "slurm-123"
    assert run_ids.generated_run_id({"SLURM_JOBID": "77"}) == "slurm-77"
    plain = run_ids.generated_run_id({})
    assert not plain.startswith("slurm-") and len(plain.split("-")) == 3


def test_first_free_takes_the_first_suffix_nobody_holds() -> None:
    held = {"slurm-5", "slurm-5.1"}

    async def taken(run_id: str) -> bool:
        return run_id in held

    assert asyncio.run(run_ids.first_free("slurm-5", taken)) == "slurm-5.2"
    assert asyncio.run(run_ids.first_free("slurm-6", taken)) == "slurm-6"


def test_first_free_gives_up_with_one_line() -> None:
    async def taken(run_id: str) -> bool:
        return True

    with pytest.raises(run_ids.RunIdTaken, match="earlier runs hold it"):
        asyncio.run(run_ids.first_free("x", taken))


def test_reuse_hint_says_how() -> None:
    hint = run_ids.reuse_hint("r1", "/runs/r1")
    assert "give another --run-id" in hint and "remove that folder" in hint and "\n" not in hint


async def _claim(inv_path: Path, run_id: str, logs_root: Path) -> str:
    inv = load_inventory(inv_path)
    plans = build_plan(inv, inv.job.script, inv.job.args)
    session = ClusterSession(inv, plans, run_id, lambda event: None, asyncio.Queue(), launches=False)
    try:
        assert await session.open() == []
        return await session.claim_free_run_id(logs_root)
    finally:
        await session.close(1.0)
        await session.disconnect()


def test_a_generated_id_a_local_node_holds_gets_a_suffix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the local node's runs live under it
    (tmp_path / "train.py").write_text("print('hi')\n")
    inv = local_inventory(tmp_path / "inv.yaml", 1, "train.py", [], workdir=tmp_path)
    logs = tmp_path / "runs"
    # a free id is kept
    assert asyncio.run(_claim(inv, "slurm-123", logs)) == "slurm-123"
    # an earlier run of the same job id on the node: the next suffix
    earlier = node_run_dir("slurm-123", "local", user=None)
    assert str(earlier).startswith(str(tmp_path / "home"))
    (earlier / "attempt_0").mkdir(parents=True)
    assert asyncio.run(_claim(inv, "slurm-123", logs)) == "slurm-123.1"
    # and one in the local logs folder too
    (logs / "slurm-123.1").mkdir(parents=True)
    assert asyncio.run(_claim(inv, "slurm-123", logs)) == "slurm-123.2"
