"""The trainer's up-front checks: the seeds' pitfalls give one clear line and exit 2, before MindSpore."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))
from trainer.config import Cluster, parse_args, ranks_are_replicas  # noqa: E402


def _fails(argv: list[str], size: int, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(argv, Cluster(in_cluster=size > 1, is_scheduler=False, size=size))
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train.py: error: ") and "\n" not in err
    return err


@pytest.mark.parametrize(
    ("mode", "hint"),
    [
        ("DATA_PARALLEL", "did you mean 'data_parallel'"),
        ("data-parallel", "did you mean 'data_parallel'"),
        ("dp", "did you mean 'data_parallel'"),
        ("ParallelMode.AUTO_PARALLEL", "did you mean 'auto_parallel'"),
        ("semi_auto", "did you mean 'semi_auto_parallel'"),
        ("standalone", "did you mean 'stand_alone'"),
        ("data_paralel", "did you mean 'data_parallel'"),
    ],
)
def test_wrong_mode_names_get_a_hint(mode: str, hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(["--parallel-mode", mode], 2, capsys)
    assert hint in err and "valid: stand_alone, data_parallel" in err


@pytest.mark.parametrize("mode", ["semi_auto_parallel", "auto_parallel", "hybrid_parallel"])
def test_cpu_refuses_sharded_modes_clearly(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(["--parallel-mode", mode], 2, capsys)
    assert "the CPU backend refuses it" in err and "GPU or Ascend" in err


@pytest.mark.parametrize(
    ("argv", "size", "words"),
    [
        (
            ["--parallel-mode", "auto_parallel", "--device-target", "GPU", "--exec-mode", "pynative"],
            8,
            "needs graph mode",
        ),
        (
            ["--parallel-mode", "semi_auto_parallel", "--device-target", "GPU", "--strategy", "3,2"],
            6,
            "power of 2",
        ),
        (
            ["--parallel-mode", "semi_auto_parallel", "--device-target", "GPU", "--strategy", "2,2"],
            8,
            "multiply to the 8",
        ),
        (["--device-num", "8"], 4, "--device-num 8 does not match the 4 rank(s)"),
        (["--batch-size", "30", "--grad-accum", "4"], 2, "must divide evenly into 2 rank(s) x 4 micro-batch"),
        (["--keep-checkpoints", "1"], 1, "--keep-checkpoints must be >= 2"),
        (["--resume"], 1, "--resume needs --checkpoint-dir"),
        (["--dataset", "mnist"], 1, "needs --data-path"),
        (["--profile-steps", "9:3"], 1, "need 1 <= A < B"),
        (
            ["--parallel-mode", "auto_parallel", "--device-target", "GPU", "--runner", "functional"],
            2,
            "auto_parallel needs --runner cell",
        ),
        (["--runner", "cell", "--grad-accum", "2"], 2, "--grad-accum needs --runner functional"),
        (["--parallel-optimizer"], 2, "needs semi_auto_parallel or auto_parallel, not data_parallel"),
        (
            ["--parallel-mode", "hybrid_parallel", "--device-target", "GPU", "--grad-accum", "2"],
            2,
            "hybrid_parallel cannot use it",
        ),
    ],
)
def test_pitfalls(argv: list[str], size: int, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert words in _fails(argv, size, capsys)


def test_good_configs() -> None:
    gpu = parse_args(
        ["--parallel-mode", "semi_auto_parallel", "--device-target", "GPU", "--strategy", "4,2"],
        Cluster(True, False, 8),
    )
    assert gpu.strategy == (4, 2)
    one = parse_args(["--parallel-mode", "data_parallel"], Cluster(False, False, 1))
    assert one.parallel_mode == "stand_alone"  # one rank: nothing to average
    fp16 = parse_args(["--amp-level", "O2"], Cluster(False, False, 1))
    assert fp16.loss_scale == "dynamic"  # fp16 gradients need loss scaling


def test_runner_follows_the_mode_unless_chosen() -> None:
    def runner(argv: list[str], size: int = 2) -> str:
        return parse_args(argv, Cluster(size > 1, False, size)).runner

    assert runner([]) == "cell"
    assert runner(["--grad-accum", "2"]) == "functional"
    assert runner(["--runner", "functional"]) == "functional"
    for mode in ("semi_auto_parallel", "auto_parallel", "hybrid_parallel"):
        assert runner(["--parallel-mode", mode, "--device-target", "GPU"]) == "cell"


@pytest.mark.parametrize(
    ("argv", "replicas"),
    [
        ([], True),
        (["--parallel-mode", "semi_auto_parallel", "--strategy", "2,1"], True),
        (["--parallel-mode", "semi_auto_parallel", "--strategy", "1,2"], False),  # model split
        (["--parallel-mode", "semi_auto_parallel", "--strategy", "2,1", "--parallel-optimizer"], False),
        (["--parallel-mode", "auto_parallel"], False),
        (["--parallel-mode", "hybrid_parallel"], True),
    ],
)
def test_which_modes_keep_replicas_for_checksums(argv: list[str], replicas: bool) -> None:
    args = parse_args([*argv, "--device-target", "GPU"], Cluster(True, False, 2))
    assert ranks_are_replicas(args) is replicas


def test_help_is_fast_and_lists_the_knobs() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "trainer" / "train.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    for flag in (
        "--parallel-mode",
        "--grad-accum",
        "--amp-level",
        "--loss-scale",
        "--recompute",
        "--checkpoint-dir",
        "--resume",
        "--sampler",
        "--profile-steps",
        "--log-rank0-only",
    ):
        assert flag in out.stdout
