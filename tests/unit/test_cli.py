"""The command line: help, version, and one-line errors with exit 2 (never a traceback)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from conftest import kill_run, local_inventory, mscon, run_processes, wait_gone


def test_help_and_version(tmp_path: Path) -> None:
    top = mscon("--help", cwd=tmp_path)
    assert top.code == 0 and "run" in top.out
    run = mscon("run", "--help", cwd=tmp_path)
    assert run.code == 0 and "--no-tui" in run.out and "--json" in run.out
    version = mscon("--version", cwd=tmp_path)
    assert version.code == 0 and version.out.startswith("mscon 0.")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "name: x\ndevice_target: CPU\nnodes: []\njob: {script: a.py}\n",
            ":3:8: nodes: expected a non-empty list",
        ),
        ("name: x\n  bad: [\n", "invalid YAML"),
        ("", "the file is empty"),
    ],
)
def test_bad_inventory_is_one_line_per_error_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    inv = tmp_path / "bad.yaml"
    inv.write_text(text)
    done = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert done.code == 2
    assert needle in done.err and "Traceback" not in done.err
    # One line per error (every error of the file at once), each naming the file and line.
    assert all(line.startswith(f"{inv}:") for line in done.err.strip().splitlines()), done.err


def test_missing_inventory_file(tmp_path: Path) -> None:
    done = mscon("run", "--no-tui", tmp_path / "nope.yaml", cwd=tmp_path)
    assert done.code == 2 and "cannot read" in done.err and "Traceback" not in done.err


def test_reused_run_id_is_refused(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, "bench/fake_rank.py", ["--steps", "1", "--rate", "0"])
    run_id = f"same-{secrets.token_hex(3)}"
    assert mscon("run", "--no-tui", "-q", inv, "--run-id", run_id, cwd=tmp_path).code == 0
    again = mscon("run", "--no-tui", "-q", inv, "--run-id", run_id, cwd=tmp_path)
    assert again.code == 2 and "holds an earlier run with this id" in again.err
    assert "give another --run-id, or remove that folder" in again.err and len(again.err.splitlines()) == 1


def test_node_side_run_dir_is_never_reused(tmp_path: Path) -> None:
    """Even with fresh local logs, a run id whose logs exist on a node is refused by the agent."""
    inv = local_inventory(tmp_path / "inv.yaml", 1, "bench/fake_rank.py", ["--steps", "1", "--rate", "0"])
    run_id = f"twice-{secrets.token_hex(3)}"
    assert (
        mscon(
            "run", "--no-tui", "-q", inv, "--run-id", run_id, "--logs-dir", tmp_path / "a", cwd=tmp_path
        ).code
        == 0
    )
    again = mscon(
        "run", "--no-tui", "-q", inv, "--run-id", run_id, "--logs-dir", tmp_path / "b", cwd=tmp_path
    )
    assert again.code == 4 and "already holds logs" in again.err, again.err
    assert "give another --run-id, or remove that run's folder" in again.err, again.err


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags(tmp_path: Path, flag: str) -> None:
    done = mscon(flag, cwd=tmp_path)
    assert done.code == 0 and done.out == f"mscon {metadata.version('mscon')}\n" and done.err == ""


FAKE = "bench/fake_rank.py"


def test_json_dash_writes_the_summary_to_stdout_and_the_ranks_to_stderr(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "3", "--rate", "0"])
    done = mscon("run", "--no-tui", "-q", inv, "--json", "-", cwd=tmp_path)
    assert done.code == 0, done.err
    summary = json.loads(done.out)  # stdout is the JSON and nothing else
    assert summary["status"] == "succeeded" and {r["name"] for r in summary["ranks"]} == {"sched", "r0", "r1"}
    assert summary["preflight"]["fail"] == 0  # the sections added after the run are in it too
    assert "[local r0] epoch: 1 step: 3, loss is" in done.err and "[local r1] training finished" in done.err
    assert not (tmp_path / "-").exists()
    logs = Path(summary["logs_dir"])
    assert json.loads((logs / "summary.json").read_text())["run_id"] == summary["run_id"]
    for command in ("run", "check", "attach", "stop"):
        assert "- writes it to stdout" in " ".join(mscon(command, "--help", cwd=tmp_path).out.split())


def test_json_to_a_file_named_dash_is_still_possible(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, ["--steps", "1", "--rate", "0"])
    done = mscon("run", "--no-tui", "-q", "--no-check", inv, "--json", "./-", cwd=tmp_path)
    assert done.code == 0, done.err
    assert json.loads((tmp_path / "-").read_text())["status"] == "succeeded"
    assert "[local r0] training finished" in done.out


def test_check_json_dash_writes_the_results_to_stdout(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, FAKE, [])
    done = mscon("check", "--quick", inv, "--json", "-", cwd=tmp_path)
    assert done.code == 0, done.err
    doc = json.loads(done.out)
    assert doc["status"] == "succeeded" and doc["nodes"] == ["local"] and doc["results"]
    assert "protocol" in done.err  # the table went to stderr
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("command", ["attach", "stop"])
def test_attach_or_stop_of_an_unknown_run_is_one_line(tmp_path: Path, command: str) -> None:
    done = mscon(command, "nonexistent", cwd=tmp_path)
    assert done.code == 2
    assert done.err == (
        "mscon: no run nonexistent: not in ./mscon-runs and no node holds it (mscon ls lists runs)\n"
    )
    assert done.out == ""
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.fixture
def run_id() -> Iterator[str]:
    rid = f"cli-json-{secrets.token_hex(3)}"
    yield rid
    kill_run(rid)


def test_attach_json_dash_of_a_detached_run(tmp_path: Path, run_id: str) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "20", "--rate", "20"])
    first = mscon("run", "--no-tui", "--detach", "--no-check", inv, "--run-id", run_id, cwd=tmp_path)
    assert first.code == 0, first.err
    done = mscon("attach", run_id, "--no-tui", "--json", "-", cwd=tmp_path, timeout=60)
    assert done.code == 0, done.err
    summary = json.loads(done.out)
    assert summary["run_id"] == run_id and summary["status"] == "succeeded"
    assert "[local r1] training finished" in done.err
    assert not (tmp_path / "-").exists()


def test_stop_json_dash_of_a_run_only_a_node_holds(tmp_path: Path, run_id: str) -> None:
    """No folder for the run here (another --logs-dir): the node still holds it, so stop goes ahead."""
    inv = local_inventory(tmp_path / "inv.yaml", 2, FAKE, ["--steps", "3000", "--rate", "20"])
    started = mscon(
        "run",
        "--no-tui",
        "--detach",
        "--no-check",
        inv,
        "--run-id",
        run_id,
        "--logs-dir",
        tmp_path / "a",
        cwd=tmp_path,
    )
    assert started.code == 0, started.err
    assert run_processes(run_id)
    stopped = mscon(
        "stop", run_id, inv, "--logs-dir", tmp_path / "b", "--json", "-", cwd=tmp_path, timeout=60
    )
    assert stopped.code == 130, stopped.err
    summary = json.loads(stopped.out)
    assert summary["run_id"] == run_id and summary["status"] == "interrupted"
    assert summary["logs_dir"] == str((tmp_path / "b" / run_id).resolve())
    assert wait_gone(run_processes(run_id), 5) == []
