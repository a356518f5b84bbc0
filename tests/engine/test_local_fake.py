"""The whole engine on the local transport with fast fake ranks: streaming, failure policy, scale."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import time
from pathlib import Path

import pytest
import yaml
from conftest import agent_processes, local_inventory, mscon, mscon_popen, run_processes, wait_gone
from mscon.agent import layout

FAKE = "bench/fake_rank.py"


def _summary(path: Path) -> dict:
    return json.loads(path.read_text())


def test_success_streams_every_line_and_keeps_logs(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 4, FAKE, ["--steps", "30", "--rate", "0", "--metrics"])
    done = mscon(
        "run", "--no-tui", inv, "--json", tmp_path / "s.json", "--logs-dir", tmp_path / "runs", cwd=tmp_path
    )
    assert done.code == 0, done.err
    for r in range(4):
        steps = re.findall(rf"^\[local r{r}\] epoch: 1 step: (\d+), loss is", done.out, re.M)
        assert [int(s) for s in steps] == list(range(1, 31))
    s = _summary(tmp_path / "s.json")
    assert s["status"] == "succeeded" and s["exit_code"] == 0 and s["root_cause"] is None
    workers = [r for r in s["ranks"] if r["rank"] >= 0]
    assert len(workers) == 4 and all(r["status"] == "ok" and r["last_step"] == 30 for r in workers)
    # Logs are fetched into ./<logs-dir>/<run id>/<node>/, laid out as on the node
    log = Path(layout.log_path(Path(s["logs_dir"]) / "local", 0, "r3"))
    assert log.read_text().count("loss is") == 30
    assert (Path(s["logs_dir"]) / "summary.json").is_file()


def test_failure_names_root_cause_and_stops_everyone(tmp_path: Path) -> None:
    args = ["--steps", "400", "--rate", "20", "--fail-rank", "2", "--fail-step", "8", "--fail-code", "7"]
    inv = local_inventory(tmp_path / "inv.yaml", 4, FAKE, args)
    t0 = time.monotonic()
    done = mscon("run", "--no-tui", inv, "--json", tmp_path / "s.json", cwd=tmp_path)
    wall = time.monotonic() - t0
    assert done.code == 7, done.err
    assert wall < 15  # 400 steps at 20/s would take 20 s: everyone was stopped early
    s = _summary(tmp_path / "s.json")
    assert s["root_cause"]["name"] == "r2" and s["root_cause"]["exitcode"] == 7
    assert "fake failure on rank 2" in s["root_cause"]["traceback"]
    roles = {r["name"]: r["role"] for r in s["ranks"]}
    assert roles["r2"] == "root cause" and roles["r0"] == roles["r1"] == roles["r3"] == "victim"
    assert "Root cause (first failure" in done.err and "r2 on local failed first (exit code 7)" in done.err
    assert run_processes(s["run_id"]) == []


def test_lines_are_never_interleaved(tmp_path: Path) -> None:
    args = ["--steps", "40", "--rate", "0", "--lines-per-step", "20"]
    inv = local_inventory(tmp_path / "inv.yaml", 4, FAKE, args)
    done = mscon("run", "--no-tui", "-q", inv, cwd=tmp_path)
    assert done.code == 0, done.err
    pat = re.compile(
        r"^\[local (?:r(\d+)|sched)\] "
        r"(?:epoch: 1 step: \d+, loss is [0-9.]+|rank (\d+) step \d+ line \d+ x{60}|.*)$"
    )
    count = 0
    for line in done.out.splitlines():
        m = pat.match(line)
        assert m, line
        if m.group(2) is not None:
            assert m.group(1) == m.group(2), line
            count += 1
    assert count == 4 * 40 * 20


def test_hundreds_of_fake_ranks(tmp_path: Path) -> None:
    n = 200
    inv = local_inventory(tmp_path / "inv.yaml", n, FAKE, ["--steps", "5", "--rate", "5"])
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path, timeout=300)
    assert done.code == 0, done.err[-2000:]
    s = _summary(tmp_path / "s.json")
    assert sum(1 for r in s["ranks"] if r["status"] == "ok" and r["rank"] >= 0) == n
    # Over 64 ranks, --no-tui prints rank 0's lines only (issue 44); every rank's are on its node
    # and fetched at the end.
    assert re.findall(r"^\[local (r\d+)\] training finished$", done.out, re.M) == ["r0"]
    logs = list((tmp_path / "mscon-runs").glob("*/local/attempt_0/r*.log"))
    assert len(logs) == n
    assert all(log.read_text().rstrip().endswith("training finished") for log in logs)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_everything(
    tmp_path: Path, sig: signal.Signals, request: pytest.FixtureRequest
) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 3, FAKE, ["--steps", "100000", "--rate", "10"])
    run_id = f"intr-{sig.value}-{secrets.token_hex(3)}"
    proc = mscon_popen("run", "--no-tui", inv, "--run-id", run_id, cwd=tmp_path)
    request.addfinalizer(proc.kill)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "[local r2] epoch: 1 step: 3," in line:
            break
    ranks = run_processes(run_id)
    agents = agent_processes(["local"], [proc.pid])
    assert len(ranks) >= 3 and agents  # 3 ranks (the fake scheduler exits at once)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err or "terminated" in err
    assert wait_gone(ranks + agents, 5) == []


def test_console_killed_leaves_no_orphans(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "100000", "--rate", "10"])
    run_id = f"crash-{secrets.token_hex(3)}"
    proc = mscon_popen("run", "--no-tui", inv, "--run-id", run_id, cwd=tmp_path)
    request.addfinalizer(proc.kill)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "[local r1] epoch: 1 step: 2," in line:
            break
    ranks = run_processes(run_id)
    assert len(ranks) >= 2
    proc.kill()  # no chance to clean up: the agent must notice its closed stdin
    proc.wait()
    assert wait_gone(ranks, 10) == []


def test_unmodified_script_after_double_dash(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_job.py").write_text(
        "import os, sys\n"
        "if os.environ['MS_ROLE'] == 'MS_SCHED':\n"  # what mindspore's init() does in the scheduler
        "    sys.exit(0)\n"
        "print('args', sys.argv[1:], 'rank', os.environ['RANK_ID'], flush=True)\n"
        "for s in range(1, 4):\n"
        "    print(f'epoch: 1 step: {s}, loss is {1.0 / s:.4f}', flush=True)\n"
    )
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, [])
    done = mscon(
        "run",
        "--no-tui",
        "-q",
        inv,
        "--workdir",
        work,
        "--json",
        tmp_path / "s.json",
        "--",
        "my_job.py",
        "--arg",
        "x",
        cwd=tmp_path,
    )
    assert done.code == 0, done.err
    assert "[local r1] args ['--arg', 'x'] rank 1" in done.out
    ranks = {r["name"]: r for r in _summary(tmp_path / "s.json")["ranks"]}
    assert ranks["r0"]["last_step"] == 3 and ranks["r0"]["last_loss"] == pytest.approx(0.3333)


def test_ranks_inherit_the_environment_pythonpath_included(tmp_path: Path) -> None:
    # The agent must not leave its own folder on the ranks' PYTHONPATH nor drop the user's: a
    # user's modules (or a MindSpore installed with --target) are found through it. Only the
    # rank-side library's folder goes in front (it holds mscon_resume and nothing of the agent).
    work = tmp_path / "work"
    (work / "mylib").mkdir(parents=True)
    (work / "mylib" / "helper.py").write_text("NAME = 'from the user PYTHONPATH'\n")
    (work / "job.py").write_text(
        "import os, sys\n"
        "if os.environ['MS_ROLE'] == 'MS_SCHED':\n"
        "    sys.exit(0)\n"
        "import helper, importlib.util as u, mscon_resume\n"
        "print('pp', os.environ.get('PYTHONPATH'), helper.NAME, os.environ.get('MY_VAR'), flush=True)\n"
        "print('agent importable:', u.find_spec('mscon_agent') is not None, mscon_resume.__file__)\n"
    )
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, [])
    env = {**os.environ, "PYTHONPATH": str(work / "mylib"), "MY_VAR": "kept"}
    done = mscon("run", "--no-tui", "-q", inv, "--workdir", work, "--", "job.py", cwd=tmp_path, env=env)
    assert done.code == 0, done.err
    lib = re.search(r"\[local r0\] pp (\S+)/mscon_agent/rank:(\S+) from the user PYTHONPATH kept", done.out)
    assert lib and lib.group(2) == str(work / "mylib"), done.out
    assert f"agent importable: False {lib.group(1)}/mscon_agent/rank/mscon_resume/__init__.py" in done.out


def test_script_outside_workdir_is_a_usage_error(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, [])
    (tmp_path / "elsewhere.py").write_text("print(1)\n")
    done = mscon("run", "--no-tui", inv, "--", str(tmp_path / "elsewhere.py"), cwd=tmp_path)
    assert done.code == 2 and "not a file inside the job workdir" in done.err
    assert "Traceback" not in done.err


def test_a_diverging_replica_is_flagged(tmp_path: Path) -> None:
    args = ["--steps", "12", "--rate", "0", "--metrics", "--diverge-rank", "1"]
    inv = local_inventory(tmp_path / "inv.yaml", 3, FAKE, args)
    done = mscon("run", "--no-tui", "-q", inv, "--json", tmp_path / "s.json", cwd=tmp_path)
    assert done.code == 0, done.err
    assert "replicas diverged at step 5: r1 differ" in done.err
    assert _summary(tmp_path / "s.json")["divergent_ranks"] == ["r1"]


def test_missing_python_is_a_clear_error(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, [])
    inv.write_text(
        inv.read_text().replace("transport: local", "transport: local\n  python: /no/such/python3")
    )
    done = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert done.code == 4, done.err
    assert "local: the agent did not start with /no/such/python3" in done.err and "Traceback" not in done.err


_FORMATS = {
    # rank -> the lines an unmodified script of that flavour prints; the last one gives step 3, loss 0.5
    0: ["epoch: 1 step: 1, loss is 0.9", "epoch: 1 step: 3, loss is 0.5"],  # LossMonitor
    1: ["epoch: 0, step: 2, loss is 0.7", "epoch: 0, step: 3, loss is 0.5"],  # the tutorials
    2: [
        "{ Epoch:[  1/  2], step:[    2/  125], loss: 0.700, per_step_time: 1234ms, lr: 1e-05}",
        "{ Epoch:[  1/  2], step:[    3/  125], loss: 0.500, per_step_time: 1200ms, lr: 1e-05}",
    ],  # MindFormers
    3: ["Epoch [1/10], Step [2/600], Loss: 0.7000", "Epoch [1/10], Step [3/600], Loss: 0.5000"],
}


def _run_user_job(tmp_path: Path, ranks: int, body: str, metrics_pattern: str | None = None) -> dict:
    """Run an unmodified script (``body`` after the scheduler's early exit) and return its ranks."""
    work = tmp_path / "work"
    work.mkdir()
    preamble = "import os, sys\nif os.environ['MS_ROLE'] == 'MS_SCHED':\n    sys.exit(0)\n"
    (work / "job.py").write_text(preamble + body)
    inv = local_inventory(tmp_path / "inv.yaml", ranks, FAKE, [])
    if metrics_pattern is not None:
        doc = yaml.safe_load(inv.read_text())
        doc["job"]["metrics"] = {"pattern": metrics_pattern}
        inv.write_text(yaml.safe_dump(doc))
    summary = tmp_path / "s.json"
    done = mscon(
        "run", "--no-tui", "-q", inv, "--workdir", work, "--json", summary, "--", "job.py", cwd=tmp_path
    )
    assert done.code == 0, done.err
    return {r["name"]: r for r in _summary(summary)["ranks"]}


def test_metrics_of_unmodified_scripts_in_every_common_format(tmp_path: Path) -> None:
    body = f"lines = {_FORMATS!r}[int(os.environ['RANK_ID'])]\nprint('\\n'.join(lines), flush=True)\n"
    ranks = _run_user_job(tmp_path, 4, body)
    for r in range(4):
        assert (ranks[f"r{r}"]["last_step"], ranks[f"r{r}"]["last_loss"]) == (3, pytest.approx(0.5)), r


def test_a_user_metrics_pattern_from_the_inventory(tmp_path: Path) -> None:
    body = "for i in range(1, 6):\n    print(f'iter {i} objective={1.0 / i:.3f}', flush=True)\n"
    ranks = _run_user_job(tmp_path, 1, body, r"iter (?P<step>\d+) objective=(?P<loss>[0-9.]+)")
    assert ranks["r0"]["last_step"] == 5 and ranks["r0"]["last_loss"] == pytest.approx(0.2)
