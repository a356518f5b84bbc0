"""The run-folder layout (agent/layout.py): the one place that names where a run's files are.

These are the only literal paths in the tests: every other test builds its paths with the layout,
so a change of layout is a change here and in the README, and nowhere else."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mscon.agent import layout
from mscon.agent.journal import Journal, write_state
from mscon.console.transport import slurm_dial


def test_the_layout_as_the_readme_describes_it() -> None:
    cache = layout.cache_folder("/home/u")
    assert cache == "/home/u/.cache/mscon"
    run = layout.run_folder(cache, "run-1", "node1")
    assert run == "/home/u/.cache/mscon/runs/run-1/node1"
    assert layout.attempt_folder(run, 2) == f"{run}/attempt_2"
    assert layout.log_path(run, 2, "r3") == f"{run}/attempt_2/r3.log"
    assert layout.log_path(run, 0, "sched") == f"{run}/attempt_0/sched.log"
    assert layout.metrics_path(run, 0, "r3") == f"{run}/attempt_0/r3.metrics.jsonl"
    assert layout.work_folder(run) == f"{run}/work"
    assert layout.checkpoint_folder(run) == f"{run}/checkpoints"
    files = (layout.journal_file, layout.state_file, layout.socket_file, layout.errors_file)
    assert [f(run) for f in files] == [
        f"{run}/{n}" for n in ("journal.jsonl", "state.json", "agent.sock", "agent.err")
    ]
    assert layout.LOGS_DIR == "mscon-runs"
    # Path objects work too (tests and the console's fetched copies), and give the same string.
    assert (
        layout.log_path(Path("/l/mscon-runs/run-1/node1"), 0, "r0")
        == "/l/mscon-runs/run-1/node1/attempt_0/r0.log"
    )


def test_without_a_cache_folder_the_agent_uses_its_own_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert layout.runs_root(None) == f"{tmp_path}/.cache/mscon/runs"
    assert layout.runs_root("/else/.cache/mscon") == "/else/.cache/mscon/runs"  # the console's word wins


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "x\0y", "x\ny", "\x7f", None, 5])
def test_run_and_node_names_must_be_plain(bad: object) -> None:
    assert not layout.plain(bad)
    with pytest.raises(ValueError, match="not a plain name"):
        layout.run_folder("/c", bad, "n")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a plain name"):
        layout.run_parts("r", bad)  # type: ignore[arg-type]


def test_the_agent_writes_where_the_layout_says(tmp_path: Path) -> None:
    run = str(tmp_path)
    Journal(run).close()
    write_state(run, {"attempt": 0})
    assert sorted(os.listdir(run)) == sorted(
        os.path.basename(f(run)) for f in (layout.journal_file, layout.state_file)
    )


def test_the_layout_runs_on_the_nodes_python_and_inside_the_slurm_dial() -> None:
    tree = ast.parse(Path(layout.__file__).read_text(), feature_version=(3, 8))  # the nodes' oldest Python
    relative = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == [], "the Slurm dial runs layout.py from source, with no package to import from"
    # The dial runs as one source (layout.py's, then dial.py's), exec'd with no package around it.
    code = (
        "import sys;src=sys.stdin.buffer.read();g={'__name__':'mscon_dial'};"
        "exec(compile(src,'mscon_dial','exec'),g);d=g['Dial'](None,None,b'');print(d.root)"
    )
    env = dict(os.environ, HOME="/nowhere/home")
    out = subprocess.run(
        [sys.executable, "-I", "-c", code],
        input=slurm_dial.dial_source(),
        capture_output=True,
        env=env,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == layout.cache_folder("/nowhere/home")


def test_private_folders_and_files_whatever_the_umask(tmp_path: Path) -> None:
    """Issue 33: each level private_dirs makes is 0700, and a level of the mscon folder made
    open (an older mscon, another umask) is made 0700 too, never one above it; private_open's
    file is 0600, one appended to as well."""
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True, mode=0o755)
    (home / ".cache").chmod(0o755)
    old_runs = home / layout.CACHE_DIR / layout.RUNS_DIR
    old_runs.mkdir(parents=True)
    for p in (home / layout.CACHE_DIR, old_runs):
        p.chmod(0o755)
    log = Path(layout.log_path(layout.run_folder(layout.cache_folder(str(home)), "r1", "n"), 0, "r0"))
    old = os.umask(0)
    try:
        layout.private_dirs(str(log.parent))
        with layout.private_open(str(log), "ab") as f:
            f.write(b"x\n")
        log.chmod(0o644)
        with layout.private_open(str(log), "a", encoding="utf-8") as f:
            f.write("y\n")
        outside = layout.private_dirs(str(tmp_path / "a" / "b"))
    finally:
        os.umask(old)

    def mode(p: Path | str) -> str:
        return oct(os.stat(p).st_mode & 0o777)

    assert mode(home / ".cache") == "0o755"  # not mscon's: left as it is
    made = [home / layout.CACHE_DIR, old_runs, old_runs / "r1", old_runs / "r1" / "n", log.parent]
    assert [mode(p) for p in made] == ["0o700"] * 5
    assert mode(log) == "0o600" and log.read_text() == "x\ny\n"
    assert [mode(outside), mode(tmp_path / "a")] == ["0o700", "0o700"]
