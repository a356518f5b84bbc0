"""The sharded modes' set-up, checked on CPU: the strategies put on the MLP's operators and the
auto-parallel context that --parallel-optimizer, --comm-fusion-mb and --strategy-ckpt-dir produce.

CPU MindSpore refuses to compile these graphs, so the training itself runs only on GPU
(bench/gpu_modes.py); what can go wrong before the compile is tested here. Each case runs in a
fresh interpreter because the auto-parallel context is process-global.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.mindspore(ranks=1)  # one probe process a test

PROBE = """
import json, sys, types
sys.path.insert(0, {repo!r})
import mindspore as ms
from trainer import models
from trainer.train import apply_strategy, configure_parallel
net = models.build_model("mlp", 10, in_channels=1, features=32)
strategy = tuple({strategy})
if strategy:
    apply_strategy(net, strategy)
args = types.SimpleNamespace(**{args!r})
configure_parallel(ms, args, {size})
keys = ("parallel_mode", "search_mode", "enable_parallel_optimizer", "gradients_mean",
        "strategy_ckpt_config", "comm_fusion")
print(json.dumps({{
    "fc1": net.fc1.matmul.attrs.get("in_strategy"), "fc2": net.fc2.matmul.attrs.get("in_strategy"),
    "fc1_bias": net.fc1.bias_add.attrs.get("in_strategy"), "relu": net.relu.relu.attrs.get("in_strategy"),
    "fc2_bias": net.fc2.bias_add.attrs.get("in_strategy"),
    "transpose_b": [net.fc1.matmul.transpose_b, net.fc2.matmul.transpose_b],
    **{{k: ms.get_auto_parallel_context(k) for k in keys}},
}}))
"""


def probe(strategy: tuple[int, ...], size: int, **args: object) -> dict:
    defaults = {
        "parallel_mode": "semi_auto_parallel",
        "search_mode": "sharding_propagation",
        "parallel_optimizer": False,
        "strategy_ckpt_dir": None,
        "comm_fusion_mb": 0,
    }
    code = PROBE.format(repo=str(REPO), strategy=list(strategy), args={**defaults, **args}, size=size)
    pytest.importorskip("mindspore", reason="MindSpore is not installed: pip install '.[train]'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_model_split_shards_fc1_outputs_and_fc2_inputs() -> None:
    # nn.Dense multiplies by its (out, in) weight with transpose_b=True: a weight's strategy is
    # written in that stored layout. fc1 splits its 64 outputs over the model axis; fc2 then splits
    # the contracted dimension, and MindSpore inserts the AllReduce of the partial sums.
    got = probe((2, 4), 8)
    assert got["transpose_b"] == [True, True]
    assert got["fc1"] == [[2, 1], [4, 1]]
    assert got["fc2"] == [[2, 4], [1, 4]]
    # The hidden layer stays split between them: its bias and the ReLU take the same (data, model).
    assert got["fc1_bias"] == [[2, 4], [4]]
    assert got["relu"] == [[2, 4]]
    assert got["fc2_bias"] == [[2, 1], [1]]
    assert got["parallel_mode"] == "semi_auto_parallel"
    assert got["gradients_mean"] is True


def test_optimizer_sharding_fusion_and_strategy_file_reach_the_context(tmp_path: Path) -> None:
    got = probe((4, 1), 4, parallel_optimizer=True, comm_fusion_mb=16, strategy_ckpt_dir=str(tmp_path))
    assert got["enable_parallel_optimizer"] is True
    assert got["comm_fusion"]["allreduce"] == {"mode": "size", "config": 16}
    # No strategy file yet: this run saves it.
    assert got["strategy_ckpt_config"]["save_file"] == str(tmp_path / "strategy.ckpt")
    assert got["strategy_ckpt_config"]["load_file"] == ""


def test_an_existing_strategy_file_is_loaded_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "strategy.ckpt").write_bytes(b"saved by an earlier run")
    got = probe((4, 1), 4, strategy_ckpt_dir=str(tmp_path))
    assert got["strategy_ckpt_config"]["load_file"] == str(tmp_path / "strategy.ckpt")
    assert got["strategy_ckpt_config"]["save_file"] == ""


def test_auto_parallel_takes_the_search_mode() -> None:
    got = probe((), 4, parallel_mode="auto_parallel", search_mode="dynamic_programming")
    assert got["parallel_mode"] == "auto_parallel"
    assert got["search_mode"] == "dynamic_programming"
    assert got["fc1"] is None  # no hand-written strategy: the search chooses
