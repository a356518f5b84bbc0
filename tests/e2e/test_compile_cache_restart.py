"""The compile cache with real MindSpore (issue 43): examples/lenet_model_train.py (Model.train with
ResumeCallback: the cache's default use) on 2 local ranks under ``mscon run --max-restarts 1``, rank 0
killed after step 13 of attempt 0 (the resume check's fault, ``MSCON_CHECK_KILL_AT``). Attempt 0
compiles its graphs and keeps them in the run's 0700 cache folder on the node; attempt 1 loads them,
and the summary says so per attempt (JSON and headless text). The same run with the cache off
computes the same losses after the restart: a loaded graph computes what a compiled one does (a
slow twin: bench/graph_cache.py measures it too)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_port, mscon, needs_mindspore, slow_twin, write_inventory
from mscon.agent import layout

sys.path.insert(0, str(REPO / "bench"))
from fake_mnist import write_fake_mnist  # noqa: E402

SCRIPT = "lenet_model_train.py"
SAMPLES_A_RANK = 96  # batch 32: 3 steps an epoch
EPOCHS = 6  # 18 steps
KILL_AT = 8
LOSS = re.compile(r"^\[local (r\d)\] epoch: (\d+) step: (\d+), loss is (\S+)$", re.M)


def _run(tmp_path: Path, work: Path, data: Path, tag: str, graph_cache: str) -> tuple[dict, str, str, str]:
    """One run with the fault: (its summary, its stdout, its stderr, its run id)."""
    inv = write_inventory(
        tmp_path / f"{tag}.yaml",
        {
            "name": "compile-cache",
            "device_target": "CPU",
            "nodes": [{"host": "localhost", "name": "local", "transport": "local", "devices": 2}],
            "scheduler": {"port": free_port()},
            "job": {
                "workdir": str(work),
                "script": SCRIPT,
                "args": [],
                "env": {
                    "DATA_PATH": str(data),
                    "EPOCHS": str(EPOCHS),
                    "CKPT_DIR": str(tmp_path / f"ckpt-{tag}"),
                    "MSCON_CHECK_KILL_AT": str(KILL_AT),
                    "MSCON_GRAPH_CACHE": graph_cache,
                },
            },
            "stop": {"grace_s": 2},
            "restart": {"backoff_s": 0.2},
        },
    )
    run_id = f"cc-{tag}-{secrets.token_hex(3)}"
    # A HOME of its own: a run that starts beside it in the suite's HOME would release the graphs
    # of this one once it ended (retention), before the test looks at them.
    env = dict(os.environ, HOME=str(_home(tmp_path)))
    done = mscon(
        "run", "--no-tui", "--no-check", inv, "--run-id", run_id, "--max-restarts", "1",
        "--json", tmp_path / f"{tag}.json", "--logs-dir", tmp_path / "runs", cwd=tmp_path, timeout=300,
        env=env,
    )  # fmt: skip
    assert done.code == 0, done.err[-4000:]
    return json.loads((tmp_path / f"{tag}.json").read_text()), done.out, done.err, run_id


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    return home


def _after_restart(out: str) -> dict:
    """Each rank's loss lines of the restarted attempt (those after the fault's step)."""
    return {(r, int(e), int(s)): v for r, e, s, v in LOSS.findall(out) if (int(e) - 1) * 3 + int(s) > KILL_AT}


def _job(tmp_path: Path) -> tuple[Path, Path]:
    """(the work folder holding the example, its data: 2 ranks' share)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "examples" / SCRIPT, work / SCRIPT)
    return work, write_fake_mnist(tmp_path / "mnist", SAMPLES_A_RANK * 2)


@pytest.mark.mindspore
@needs_mindspore
def test_a_restart_loads_the_graphs_the_first_attempt_compiled(tmp_path: Path) -> None:
    work, data = _job(tmp_path)

    doc, out, err, run_id = _run(tmp_path, work, data, "kept", "auto")
    a0, a1 = doc["attempts"]
    assert (a0["outcome"], a1["outcome"]) == ("failed", "succeeded")
    assert a0["phases"]["graph"] == "compiled", a0["phases"]
    assert a1["phases"]["graph"] == "loaded", a1["phases"]
    assert "graph loaded (compile cache) +" in err, err[-3000:]  # the headless breakdown
    node = layout.run_folder(layout.cache_folder(str(_home(tmp_path))), run_id, "local")
    cache = Path(layout.compile_cache_folder(node))
    keys = sorted(cache.iterdir())
    assert len(keys) == 2, keys  # one key a rank: both attempts' ranks used the same two
    for path in [cache, *cache.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, (path, oct(mode))
        else:
            assert mode & 0o077 == 0, (path, oct(mode))  # MindSpore writes 0400; never group/other
    assert any(p.name.endswith(".mindir") for p in cache.rglob("*"))
    assert not (tmp_path / "runs" / run_id / "local" / layout.COMPILE_CACHE_DIR).exists()  # never fetched
    losses = _after_restart(out)
    assert len(losses) == 2 * (EPOCHS * 3 - KILL_AT), sorted(losses)


@pytest.mark.mindspore
@needs_mindspore
@slow_twin(
    "a loaded graph computing what a compiled one does: bench/graph_cache.py compares the losses "
    "of ResNet-18 and net.py with the cache off, written and loaded"
)
def test_a_loaded_graph_computes_the_losses_a_compiled_one_does(tmp_path: Path) -> None:
    work, data = _job(tmp_path)
    _, out, _, _ = _run(tmp_path, work, data, "kept", "auto")
    off, out_off, _, _ = _run(tmp_path, work, data, "off", "off")
    assert [a["phases"].get("graph") for a in off["attempts"]] == [None, None]  # no cache: nothing said
    losses = _after_restart(out)
    assert len(losses) == 2 * (EPOCHS * 3 - KILL_AT), sorted(losses)
    assert losses == _after_restart(out_off)
