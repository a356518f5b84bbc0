"""The command line: help, version, and one-line errors with exit 2 (never a traceback)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from conftest import local_inventory, mscon


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
def test_bad_inventory_is_one_line_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    inv = tmp_path / "bad.yaml"
    inv.write_text(text)
    done = mscon("run", "--no-tui", inv, cwd=tmp_path)
    assert done.code == 2
    assert needle in done.err and str(inv) in done.err
    assert len(done.err.strip().splitlines()) == 1 and "Traceback" not in done.err


def test_missing_inventory_file(tmp_path: Path) -> None:
    done = mscon("run", "--no-tui", tmp_path / "nope.yaml", cwd=tmp_path)
    assert done.code == 2 and "cannot read" in done.err and "Traceback" not in done.err


def test_reused_run_id_is_refused(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml", 1, "bench/fake_rank.py", ["--steps", "1", "--rate", "0"])
    run_id = f"same-{secrets.token_hex(3)}"
    assert mscon("run", "--no-tui", "-q", inv, "--run-id", run_id, cwd=tmp_path).code == 0
    again = mscon("run", "--no-tui", "-q", inv, "--run-id", run_id, cwd=tmp_path)
    assert again.code == 2 and "already used" in again.err


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
