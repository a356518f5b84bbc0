"""The trainer for real on CPU: data parallel through mscon, gradient accumulation, resume after a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TRAINER, local_inventory, mscon, needs_mindspore, slow_twin
from mscon.agent import layout

pytestmark = [pytest.mark.mindspore, needs_mindspore]
TRAIN = "trainer/train.py"


def _metrics(logs: Path, rank: int) -> list[dict]:
    path = Path(layout.metrics_path(logs / "local", 0, f"r{rank}"))
    return _steps(path)


def _steps(path: Path) -> list[dict]:
    """The step records of a metrics file (not the trainer's start-up phase records)."""
    return [r for r in map(json.loads, path.read_text().splitlines()) if "step" in r]


def _run_alone(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Stand-alone (no cluster env), in a scratch folder: MindSpore writes compile dumps to the cwd."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "RANK_", "MSCON_"))}
    return subprocess.run(
        [sys.executable, str(TRAINER), *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )


@pytest.mark.parametrize(
    ("ranks", "runner"),
    [
        pytest.param(2, "functional", marks=slow_twin("functional, data parallel: its 4-rank case")),
        pytest.param(4, "functional", marks=pytest.mark.mindspore(ranks=4)),
        (2, "cell"),
    ],
)
def test_data_parallel_learns_and_replicas_agree(tmp_path: Path, ranks: int, runner: str) -> None:
    args = [
        "--runner",
        runner,
        "--epochs",
        "2",
        "--steps-per-epoch",
        "10",
        "--batch-size",
        "32",
        "--checksum-every",
        "5",
        "--lr",
        "0.2",
    ]
    inv = local_inventory(tmp_path / "inv.yaml", ranks, TRAIN, args)
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path, timeout=400)
    assert done.code == 0, done.err[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["divergent_ranks"] == []
    logs = Path(summary["logs_dir"])
    per_rank = [_metrics(logs, r) for r in range(ranks)]
    for records in per_rank:
        assert [r["step"] for r in records] == list(range(1, 21))
        losses = [r["loss"] for r in records]
        assert np.mean(losses[-5:]) < np.mean(losses[:5]) * 0.8, losses  # it learns
        assert all(r["samples_per_s"] > 0 for r in records)
    sums = [
        {r["step"]: r["param_checksum"] for r in records if "param_checksum" in r} for records in per_rank
    ]
    assert sorted(sums[0]) == [5, 10, 15, 20]
    assert all(s == sums[0] for s in sums)  # every replica holds the same parameters


def _params(ckpt: Path, moments: bool = False) -> dict[str, np.ndarray]:
    import mindspore as ms

    loaded = ms.load_checkpoint(str(ckpt)).items()
    return {k: v.asnumpy() for k, v in loaded if moments or not k.startswith("moment")}


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
def test_gradient_accumulation_equals_the_larger_batch(tmp_path: Path) -> None:
    common = [
        "--epochs",
        "1",
        "--steps-per-epoch",
        "3",
        "--batch-size",
        "32",
        "--lr",
        "0.1",
        "--checkpoint-every",
        "3",
    ]
    for accum in (1, 4):
        out = _run_alone(
            [*common, "--grad-accum", str(accum), "--checkpoint-dir", str(tmp_path / f"a{accum}")], tmp_path
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"accum {accum}" in out.stdout
    one = _params(tmp_path / "a1" / "rank_0" / "step_3.ckpt")
    four = _params(tmp_path / "a4" / "rank_0" / "step_3.ckpt")
    # accum 1 takes the default cell runner, accum 4 the functional one: the same weights either way.
    assert four.keys() <= one.keys() and {"fc1.weight", "fc2.bias"} <= four.keys()
    start = _params_at_init(tmp_path)
    for name in four:
        assert not np.allclose(one[name], start[name])  # the updates did something
        np.testing.assert_allclose(four[name], one[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
@pytest.mark.parametrize("scale", [["--loss-scale", "none"], ["--loss-scale", "dynamic"]])
def test_cell_runner_takes_the_same_steps_as_the_functional_one(tmp_path: Path, scale: list[str]) -> None:
    """The cell runner is the one semi/auto/hybrid parallel use (GPU/Ascend); on CPU it must update
    the parameters exactly as the tested functional runner does."""
    common = ["--epochs", "1", "--steps-per-epoch", "6", "--checkpoint-every", "3", "--lr", "0.2", *scale]
    for runner in ("functional", "cell"):
        out = _run_alone([*common, "--runner", runner, "--checkpoint-dir", str(tmp_path / runner)], tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"runner {runner}" in out.stdout
    functional = _params(tmp_path / "functional" / "rank_0" / "step_6.ckpt", moments=True)
    cell = _params(tmp_path / "cell" / "rank_0" / "step_6.ckpt", moments=True)
    assert {"fc1.weight", "fc2.bias", "moments.fc1.weight"} <= set(cell)
    for name in functional:
        np.testing.assert_allclose(cell[name], functional[name], rtol=1e-5, atol=1e-7, err_msg=name)


def _params_at_init(tmp_path: Path) -> dict[str, np.ndarray]:
    out = _run_alone(
        [
            "--epochs",
            "1",
            "--steps-per-epoch",
            "1",
            "--lr",
            "0",
            "--momentum",
            "0",
            "--checkpoint-every",
            "1",
            "--checkpoint-dir",
            str(tmp_path / "init"),
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return _params(tmp_path / "init" / "rank_0" / "step_1.ckpt")


_UNINTERRUPTED: dict[str, dict] = {}


def _uninterrupted_last_step(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The last step record of r0 in an uninterrupted 16-step run, made once for both runners:
    they take the same steps (test_cell_runner_takes_the_same_steps_as_the_functional_one). Made in
    the test that needs it first, so it runs with that test's rank slots."""
    if "r0" not in _UNINTERRUPTED:
        tmp = tmp_path_factory.mktemp("uninterrupted")
        args = ["--runner", "functional", "--epochs", "2", "--steps-per-epoch", "8"]
        inv = local_inventory(tmp / "straight.yaml", 2, TRAIN, args)
        done = mscon("run", "--no-tui", "-q", inv, "--json", tmp / "s.json", cwd=tmp, timeout=300)
        assert done.code == 0, done.err[-3000:]
        _UNINTERRUPTED["r0"] = _metrics(Path(json.loads((tmp / "s.json").read_text())["logs_dir"]), 0)[-1]
    return _UNINTERRUPTED["r0"]


@pytest.mark.parametrize(
    "runner",
    [
        "functional",
        pytest.param(
            "cell",
            marks=slow_twin(
                "the cell runner's resume from a checkpoint: test_snapshot's (the trainer's default runner "
                "is the cell one) and this test's functional case"
            ),
        ),
    ],
)
def test_killed_rank_then_rerun_resumes_from_the_last_checkpoint(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, runner: str
) -> None:
    ckpt = tmp_path / "ckpt"
    args = [
        "--runner",
        runner,
        "--epochs",
        "2",
        "--steps-per-epoch",
        "8",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "4",
    ]
    killed = local_inventory(
        tmp_path / "killed.yaml", 2, TRAIN, [*args, "--die-at-step", "10", "--die-rank", "1"]
    )
    first = mscon(
        "run", "--no-tui", "-q", killed, "--json", tmp_path / "first.json", cwd=tmp_path, timeout=300
    )
    assert first.code == 137, first.err[-3000:]
    assert json.loads((tmp_path / "first.json").read_text())["root_cause"]["name"] == "r1"
    rerun = local_inventory(tmp_path / "rerun.yaml", 2, TRAIN, [*args, "--resume"])
    second = mscon(
        "run", "--no-tui", "-q", rerun, "--json", tmp_path / "second.json", cwd=tmp_path, timeout=300
    )
    assert second.code == 0, second.err[-3000:]
    assert "[local r0] mscon-trainer: resumed from step 8" in second.out
    r0_steps = [line for line in second.out.splitlines() if line.startswith("[local r0] epoch:")]
    assert r0_steps[0].startswith("[local r0] epoch: 2 step: 1, loss is")  # step 9, not step 1
    assert len(r0_steps) == 8
    # The resumed run ends where an uninterrupted one does: same parameters at step 16.
    resumed = _metrics(Path(json.loads((tmp_path / "second.json").read_text())["logs_dir"]), 0)[-1]
    fresh = _uninterrupted_last_step(tmp_path_factory)
    assert resumed["step"] == fresh["step"] == 16
    assert resumed["loss"] == pytest.approx(fresh["loss"], rel=1e-4)


_ = REPO


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
@pytest.mark.parametrize("runner", ["functional", "cell"])
def test_amp_o3_dynamic_loss_scale_counts_overflows_and_backs_off(tmp_path: Path, runner: str) -> None:
    metrics = tmp_path / "m.jsonl"
    env_args = ["--epochs", "1", "--steps-per-epoch", "4", "--amp-level", "O3", "--runner", runner]
    out = subprocess.run(
        [sys.executable, str(TRAINER), *env_args, "--loss-scale", "dynamic", "--loss-scale-value", "1e30"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("MS_", "RANK_"))},
            "MSCON_METRICS": str(metrics),
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = _steps(metrics)
    # fp16 gradients scaled by 1e30 overflow: every update is skipped and the scale halves each time.
    assert [r["overflow"] for r in records] == [True] * 4
    scales = [r["loss_scale"] for r in records]
    assert all(b == pytest.approx(a / 2) for a, b in zip(scales, scales[1:], strict=False))
    assert "4 overflow(s)" in out.stdout


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
@pytest.mark.parametrize("model", ["lenet", "mlp"])
def test_mnist_idx_files_train(tmp_path: Path, model: str) -> None:
    from test_models_data import write_idx

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 256).astype(np.uint8)
    images = (rng.random((256, 28, 28)) * 60 + labels[:, None, None] * 19).astype(np.uint8)  # learnable
    write_idx(tmp_path / "train-images-idx3-ubyte", images, True)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels, True)
    args = [
        "--dataset",
        "mnist",
        "--data-path",
        str(tmp_path),
        "--model",
        model,
        "--epochs",
        "2",
        "--steps-per-epoch",
        "4",
        "--batch-size",
        "32",
        "--sampler",
        "stratified",
    ]
    out = _run_alone(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"model {model}" in out.stdout and "training finished: 8 steps" in out.stdout


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
def test_wrong_data_path_is_one_line(tmp_path: Path) -> None:
    out = _run_alone(["--dataset", "mnist", "--data-path", str(tmp_path / "nope")], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("train.py: error: mnist data path") and "Traceback" not in out.stderr


@pytest.mark.mindspore(ranks=1)  # one MindSpore process at a time
def test_profiler_window_is_reported_to_the_console(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    args = ["--epochs", "1", "--steps-per-epoch", "4", "--profile-steps", "2:3", "--profile-dir", str(prof)]
    inv = local_inventory(tmp_path / "inv.yaml", 1, TRAIN, args)
    done = mscon("run", "--no-tui", "-q", inv, cwd=tmp_path, timeout=300)
    assert done.code == 0, done.err[-3000:]
    assert f"r0 on local: profiler output in {prof / 'rank_0'}" in done.err
    assert any((prof / "rank_0").iterdir())
