"""Node files are private (issue 33): a real run on the local transport in a home that is 0755 (as
on many clusters) under a umask that opens files to everyone; while it is live and after it ended,
every folder mscon made under ``~/.cache/mscon`` is 0700, every file 0600, and a second local user
reads none of them (logs, metrics, journal, state, the snapshot key, checkpoints, the agent)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import local_inventory
from mscon.agent import layout
from node_files import listing, loose
from second_user import intruder_uid, run_as

# A rank as small as the fake one (no MindSpore): its metrics through mscon's own writer (the
# rank library the agent puts on PYTHONPATH), a checkpoint as a trainer writes one (under the
# umask), then it waits for the test's word so the checks run while the run is live.
JOB = """\
import os, sys, time
if os.environ.get("MS_ROLE") == "MS_SCHED":
    print("scheduler: nothing to coordinate", flush=True)
    sys.exit(0)
from mscon_resume.metrics import MetricsWriter
metrics = MetricsWriter()
rank = os.environ.get("RANK_ID", "0")
folder = os.path.join(os.environ["MSCON_STATE_DIR"], "rank_" + rank)
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "step_3.ckpt"), "w") as f:
    f.write("the weights")
for step in range(1, 4):
    metrics.write({"step": step, "loss": 1.0 / step})
    print("epoch: 1 step: %d, loss is %.6f" % (step, 1.0 / step), flush=True)
print("live", flush=True)
deadline = time.time() + 60
while not os.path.exists("go") and time.time() < deadline:
    time.sleep(0.05)
print("done", flush=True)
"""


def _unreadable(uid: int, cache: Path, run_dir: Path) -> list[str]:
    """What the second user could read or list (nothing, when all is well)."""
    files = [
        layout.log_path(run_dir, 0, "r0"),
        layout.metrics_path(run_dir, 0, "r0"),
        layout.log_path(run_dir, 0, "sched"),
        layout.journal_file(run_dir),
        layout.resume_key_file(run_dir),
        os.path.join(layout.checkpoint_folder(run_dir), "rank_0", "step_3.ckpt"),
        *map(str, cache.glob(f"{layout.AGENT_PREFIX}*/mscon_agent/main.py")),
    ]
    folders = [cache, cache / layout.RUNS_DIR, run_dir, Path(layout.attempt_folder(run_dir, 0))]
    folders.append(Path(layout.checkpoint_folder(run_dir)))
    seen = []
    for path in files:
        assert os.path.isfile(path), path  # there: the check below means something
        got = run_as(uid, "cat", str(path))
        if got.returncode == 0 or got.stdout:
            seen.append(f"cat {path}: {got.stdout[:80]!r}")
    for path in folders:
        got = run_as(uid, "ls", "-a", str(path))
        if got.returncode == 0 or got.stdout:
            seen.append(f"ls {path}: {got.stdout[:80]!r}")
    return seen


def _check(uid: int, home: Path, run_id: str, when: str) -> None:
    cache = Path(layout.cache_folder(str(home)))
    run_dir = Path(layout.run_folder(str(cache), run_id, "local"))
    bad = loose(cache)
    assert not bad, f"{when}: not private (want folders 0700, files 0600):\n" + "\n".join(bad)
    # The second user does reach the home and ~/.cache (both 0755): only mscon's modes stop it.
    assert run_as(uid, "ls", str(home / ".cache")).returncode == 0
    seen = _unreadable(uid, cache, run_dir)
    assert not seen, f"{when}: another user read:\n" + "\n".join(seen) + "\n" + listing(cache)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_second_user_reads_nothing_of_a_run(
    tmp_path: Path, umask: int, request: pytest.FixtureRequest
) -> None:
    uid = intruder_uid()
    if uid is None:
        pytest.skip("no second local user (useradd failed and there is no nobody)")
    home = Path(tempfile.mkdtemp(prefix="mscon-home-", dir="/tmp"))  # tmp_path's parents are 0700
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    home.chmod(0o755)
    (home / ".cache").mkdir()
    (home / ".cache").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    inv = local_inventory(tmp_path / "inv.yaml", 1, "job.py", [], workdir=work)
    run_id = f"private-{secrets.token_hex(3)}"
    argv = [sys.executable, "-m", "mscon.console.cli", "run", "--no-tui", str(inv), "--run-id", run_id]
    argv += ["--logs-dir", str(tmp_path / "runs")]
    old = os.umask(umask)  # the console's, and with it its agent's and the ranks'
    try:
        proc = subprocess.Popen(
            argv,
            cwd=tmp_path,
            # Bytecode written as on a node (its __pycache__ folders and files are mscon's too).
            env={
                **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                "HOME": str(home),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.umask(old)
    request.addfinalizer(proc.kill)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if line.startswith("[local r0] live"):
            break
    else:
        pytest.fail(f"the run ended before its rank was live: {proc.stderr.read()[-3000:]}")
    _check(uid, home, run_id, "while the run is live")
    (work / "go").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    _check(uid, home, run_id, "after the run")
