"""The compile cache (issue 43) with fake inputs: the graph key (mscon_resume/compile_cache.py) never
lets a changed script, MindSpore version, rank layout or argument load a stale graph; the folders
are 0700 and the graphs owner-only whatever the umask; loaded or compiled is read from the files;
the node's bound (agent/compile_cache.py) and the removal of ended runs' graphs (retention); the
agent passes the folder and the spare reads as a cold rank would; the summary says it per attempt."""

from __future__ import annotations

import json
import os
import runpy
import stat
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from mscon.agent import compile_cache as node_cache
from mscon.agent import kept, layout, procs, retention
from mscon.agent import metrics as agent_metrics
from mscon.agent.journal import RunStatus
from mscon.agent.protocol import GraphSource, Milestone, RankPhase
from mscon.console.engine.events import AttemptOutcome, AttemptStarted, GraphLoad, JobState, RunResult
from mscon.console.engine.phases import describe_phases, graph_load, phases_from_json, steps
from mscon.console.views.headless.reporter import format_summary
from test_phases import REFS, agent, at, end, fail_at, feed, launch, up_to_first_step

from mscon_resume import compile_cache as cc
from mscon_resume.metrics import MetricsWriter

KEY_ARGS = dict(args=("--lr", "0.1"), mindspore_version="2.10.0", rank_count=4, rank=1, settings={})


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test its own process state and environment (enable() sets MindSpore's variables)."""
    cc.reset()
    for name in (cc.ROOT, cc.MODE, cc.MS_ENABLE, cc.MS_PATH):
        monkeypatch.delenv(name, raising=False)
    yield
    cc.reset()
    for name in (cc.MS_ENABLE, cc.MS_PATH):  # enable() wrote them to os.environ itself
        os.environ.pop(name, None)


def _script(folder: Path, body: str = "print('train')\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(body)
    return folder / "train.py"


# ------------------------------------------------------------------ the key


def test_the_same_inputs_give_the_same_key_and_each_change_another(tmp_path: Path) -> None:
    digest = cc.script_digest(str(_script(tmp_path / "w")))
    base = cc.graph_key(digest, **KEY_ARGS)
    assert cc.graph_key(digest, **KEY_ARGS) == base
    changed = {
        "mindspore": cc.graph_key(digest, **{**KEY_ARGS, "mindspore_version": "2.10.1"}),
        "rank count": cc.graph_key(digest, **{**KEY_ARGS, "rank_count": 2}),
        "rank": cc.graph_key(digest, **{**KEY_ARGS, "rank": 0}),
        "args": cc.graph_key(digest, **{**KEY_ARGS, "args": ("--lr", "0.2")}),
        "setting": cc.graph_key(digest, **{**KEY_ARGS, "settings": {"MS_DEV_JIT_SYNTAX_LEVEL": "0"}}),
        "python": cc.graph_key(digest, **KEY_ARGS, python="3.8"),
    }
    assert base not in changed.values() and len(set(changed.values())) == len(changed), changed


def test_a_changed_script_or_a_file_beside_it_changes_the_digest(tmp_path: Path) -> None:
    script = _script(tmp_path / "w")
    (tmp_path / "w" / "model.py").write_text("WIDTH = 64\n")
    before = cc.script_digest(str(script))
    (tmp_path / "w" / "__pycache__").mkdir()
    (tmp_path / "w" / "__pycache__" / "x.py").write_text("ignored")
    (tmp_path / "w" / ".venv").mkdir()
    (tmp_path / "w" / ".venv" / "y.py").write_text("ignored")
    (tmp_path / "w" / "notes.txt").write_text("not python")
    assert cc.script_digest(str(script)) == before  # bytecode, hidden folders, other files: no part
    (tmp_path / "w" / "model.py").write_text("WIDTH = 128\n")
    assert cc.script_digest(str(script)) != before
    (tmp_path / "w" / "model.py").write_text("WIDTH = 64\n")
    assert cc.script_digest(str(script)) == before
    script.write_text("print('train more')\n")
    assert cc.script_digest(str(script)) != before


def test_settings_are_the_graph_changing_variables_only() -> None:
    env = {
        "MS_DEV_X": "1",
        "MS_JIT_LEVEL": "O1",
        "DEVICE_TARGET": "GPU",
        "MS_SCHED_PORT": "8118",
        "RANK_ID": "3",
    }
    assert cc.graph_settings(env) == {"MS_DEV_X": "1", "MS_JIT_LEVEL": "O1", "DEVICE_TARGET": "GPU"}


# ------------------------------------------------------------------ enable: which folder, which modes


def _enable_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str = "2.10.0", ranks: int = 2, rank: int = 0
) -> str | None:
    cc.reset()
    os.environ.pop(cc.MS_ENABLE, None)
    os.environ.pop(cc.MS_PATH, None)
    monkeypatch.setattr(cc, "mindspore_version", lambda: version)
    return cc.enable(rank, ranks, trains_cells=True, script=str(tmp_path / "w" / "train.py"), args=())


def test_a_changed_version_or_rank_layout_finds_another_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path / "w")
    monkeypatch.setenv(cc.ROOT, str(tmp_path / "cache"))
    first = _enable_in(tmp_path, monkeypatch)
    assert first is not None and Path(first).parent == tmp_path / "cache"
    assert os.environ[cc.MS_ENABLE] == "1" and os.environ[cc.MS_PATH] == first
    assert _enable_in(tmp_path, monkeypatch) == first  # a later attempt: the same graphs
    others = {
        _enable_in(tmp_path, monkeypatch, version="2.11.0"),
        _enable_in(tmp_path, monkeypatch, ranks=1),
        _enable_in(tmp_path, monkeypatch, rank=1),
    }
    assert first not in others and len(others) == 3
    (tmp_path / "w" / "train.py").write_text("print('changed')\n")
    assert _enable_in(tmp_path, monkeypatch) not in {first, *others}


def test_the_folders_are_0700_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _script(tmp_path / "w")
    monkeypatch.setenv(cc.ROOT, str(tmp_path / "cache"))
    old = os.umask(0)
    try:
        folder = _enable_in(tmp_path, monkeypatch)
    finally:
        os.umask(old)
    assert folder is not None
    for path in (tmp_path / "cache", Path(folder)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_a_root_that_is_a_link_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _script(tmp_path / "w")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv(cc.ROOT, str(tmp_path / "cache"))
    assert _enable_in(tmp_path, monkeypatch) is None
    assert cc.MS_PATH not in os.environ


@pytest.mark.parametrize(
    ("mode", "trains_cells", "kept_here"),
    [
        ("", True, True),  # auto: Model.train scripts
        ("", False, False),  # auto: a hand-written loop (its loaded graphs were wrong: docs/resume.md)
        ("on", False, True),
        ("1", False, True),
        ("off", True, False),
        ("0", True, False),
    ],
)
def test_the_jobs_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, trains_cells: bool, kept_here: bool
) -> None:
    _script(tmp_path / "w")
    monkeypatch.setenv(cc.ROOT, str(tmp_path / "cache"))
    monkeypatch.setenv(cc.MODE, mode)
    got = cc.enable(0, 1, trains_cells=trains_cells, script=str(tmp_path / "w" / "train.py"), args=())
    assert (got is not None) is kept_here
    assert (cc.MS_PATH in os.environ) is kept_here


def test_no_folder_from_mscon_or_the_scripts_own_choice_leaves_mindspore_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path / "w")
    assert _enable_in(tmp_path, monkeypatch) is None  # not under mscon: no $MSCON_COMPILE_CACHE
    monkeypatch.setenv(cc.ROOT, str(tmp_path / "cache"))
    monkeypatch.setenv(cc.MS_PATH, "/their/own")
    cc.reset()
    assert cc.enable(0, 1, trains_cells=True, script=str(tmp_path / "w" / "train.py"), args=()) is None
    assert os.environ[cc.MS_PATH] == "/their/own" and cc.MS_ENABLE not in os.environ


# ------------------------------------------------------------------ loaded or compiled


def _write(path: Path, body: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.chmod(0o600)
    path.write_bytes(body)
    path.chmod(mode)


def test_loaded_when_the_graphs_were_there_and_none_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path / "w")
    monkeypatch.setenv(cc.ROOT, str(tmp_path / "cache"))
    folder = Path(_enable_in(tmp_path, monkeypatch) or "")
    assert cc.outcome() is None  # MindSpore kept nothing (a device or script it cannot cache)
    graph = folder / "rank_0" / "graph_cache" / "compile_cache_0.mindir"
    _write(graph, b"graph", 0o644)  # as MindSpore writes it, under the umask
    assert cc.outcome() == cc.COMPILED
    assert stat.S_IMODE(graph.stat().st_mode) == 0o600  # made the user's only
    assert _enable_in(tmp_path, monkeypatch) == str(folder)  # the next attempt
    assert cc.outcome() == cc.LOADED
    _enable_in(tmp_path, monkeypatch)
    st = graph.stat()
    _write(graph, b"graph, compiled again", 0o400)
    os.utime(graph, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert cc.outcome() == cc.COMPILED


def test_judge() -> None:
    a, b = {"x": (1, 2, 3)}, {"x": (1, 2, 3), "y": (4, 5, 6)}
    assert cc.judge({}, {}) is None
    assert cc.judge({}, a) == cc.COMPILED
    assert cc.judge(a, a) == cc.LOADED
    assert cc.judge(a, b) == cc.COMPILED  # a new graph file
    assert cc.judge(a, {"x": (1, 9, 3)}) == cc.COMPILED  # one rewritten


def test_the_compiled_record_carries_the_graph(tmp_path: Path) -> None:
    out = MetricsWriter(str(tmp_path / "m.jsonl"))
    out.phase("compiled", graph=cc.LOADED)
    out.phase("ready")
    out.close()
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    msg = agent_metrics.phase_from_line("n", "r0", 0, lines[0])
    assert isinstance(msg, RankPhase) and (msg.phase, msg.graph) == ("compiled", GraphSource.LOADED)
    assert "graph" not in json.loads(lines[1])
    odd = json.dumps({"phase": "compiled", "graph": "guessed", "ts": 1.0})
    assert agent_metrics.phase_from_line("n", "r0", 0, odd).graph is None  # type: ignore[union-attr]
    other = json.dumps({"phase": "ready", "graph": "loaded", "ts": 1.0})
    assert agent_metrics.phase_from_line("n", "r0", 0, other).graph is None  # type: ignore[union-attr]


# ------------------------------------------------------------------ the node: layout, bound, retention


def _key_folder(cache: Path, name: str, size: int, mtime: float) -> None:
    folder = cache / name / "rank_0" / "graph_cache"
    folder.mkdir(parents=True)
    (folder / "compile_cache_0.mindir").write_bytes(b"\0" * size)
    for path in [folder / "compile_cache_0.mindir", folder, folder.parent, cache / name]:
        os.utime(path, (mtime, mtime))


def test_the_bound_removes_the_oldest_keys_never_the_newest(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cache = Path(layout.compile_cache_folder(str(run)))
    _key_folder(cache, "old", 400, 1000.0)
    _key_folder(cache, "mid", 400, 2000.0)
    _key_folder(cache, "new", 400, 3000.0)
    (cache / "link").symlink_to(tmp_path)  # never a key folder, never followed
    assert node_cache.bound(str(run), 1200) == []  # within the bound: nothing goes
    gone = node_cache.bound(str(run), 800)
    assert [e.name for e in gone] == ["old"] and gone[0].bytes == 400
    assert sorted(p.name for p in cache.iterdir()) == ["link", "mid", "new"]
    assert [e.name for e in node_cache.bound(str(run), 10)] == ["mid"]
    assert sorted(p.name for p in cache.iterdir()) == ["link", "new"]  # the newest stays, whatever its size


def test_the_run_folder_is_0700_and_never_fetched(tmp_path: Path) -> None:
    run = tmp_path / "cache" / ".cache" / "mscon" / "runs" / "id" / "node"
    old = os.umask(0)
    try:
        folder = node_cache.prepare(str(run))
    finally:
        os.umask(old)
    assert folder == layout.compile_cache_folder(str(run)) == str(run / layout.COMPILE_CACHE_DIR)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert layout.COMPILE_CACHE_DIR in layout.not_fetched(("checkpoints",))


def _run(root: Path, run_id: str, status: str, pid: int | None = None) -> Path:
    folder = root / run_id / "node1"
    folder.mkdir(parents=True)
    state = {"run_id": run_id, "node": "node1", "status": status, "started": 1.0}
    if pid is not None:
        state["pid"] = pid
    (folder / layout.STATE).write_text(json.dumps(state))
    _key_folder(Path(layout.compile_cache_folder(str(folder))), "k", 1000, 1000.0)
    return folder


def test_the_graphs_of_runs_that_are_over_go(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    done = _run(root, "done", RunStatus.SUCCEEDED)
    failed = _run(root, "failed", RunStatus.FAILED)
    running = _run(root, "running", RunStatus.RUNNING, pid=os.getpid())
    starting = _run(root, "starting", RunStatus.SUCCEEDED)
    freed = retention.release_graphs(str(root), "node1", skip=("starting",))
    assert freed == 2000
    for folder, there in ((done, False), (failed, False), (running, True), (starting, True)):
        assert Path(layout.compile_cache_folder(str(folder))).exists() is there, folder
    assert (done / layout.STATE).exists()  # only the graphs: the run's logs stay for retention's count


def test_every_rank_is_told_the_folder_and_a_standby_of_another_run_still_fits(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    procs.library_env(env, str(tmp_path / "run"))
    assert env["MSCON_COMPILE_CACHE"] == layout.compile_cache_folder(str(tmp_path / "run"))
    other = dict(env, MSCON_COMPILE_CACHE="/another/run/compile_cache")
    assert kept.same_job_env(env, other) is None


def test_a_spare_notes_the_scripts_path_as_mindspore_would_for_a_cold_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = runpy.run_path(str(Path(layout.__file__).parent / "spare_boot.py"), run_name="spare_boot")
    api = types.SimpleNamespace(entry_script_path="/agent/spare_boot.py", sys_path=["", "/site"])
    monkeypatch.setitem(sys.modules, "mindspore.graph.api", api)
    script = _script(tmp_path / "w")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "w"), "", "/site"])
    boot["_as_entry_script"](str(script))
    assert api.entry_script_path == os.path.realpath(script)
    assert api.sys_path == ["/site"]  # neither the script's folder nor "" (which prefixes every path)


# ------------------------------------------------------------------ the summary


def _compiled(attempt: int, name: str, s: float, graph: str | None) -> object:
    ref = next(r for r in REFS if r.name == name)
    return agent(attempt, RankPhase(ref.node, name, ref.rank, Milestone.COMPILED, at(s), graph=graph))


def test_the_summary_says_per_attempt_whether_the_graph_was_loaded_or_compiled() -> None:
    evs = [e for e in launch() if not (getattr(getattr(e, "msg", None), "phase", None) == "compiled")]
    state = feed([*evs, _compiled(0, "r0", 5.0, "compiled")])
    assert state.phases().graph is None  # type: ignore[union-attr]  # not every worker said yet
    state.apply(_compiled(0, "r1", 6.0, "compiled"))
    state.apply(_compiled(0, "r1", 6.1, "loaded"))  # said twice (a replay): the first counts
    assert state.phases().graph is GraphLoad.COMPILED  # type: ignore[union-attr]
    for ev in fail_at(20.0):
        state.apply(ev)
    state.apply(end(state, 20.3))
    state.apply(AttemptStarted(1, REFS, "10.0.0.1", 8118, at(22.5)))
    for ev in up_to_first_step(1, 22.5):
        if getattr(getattr(ev, "msg", None), "phase", None) != "compiled":
            state.apply(ev)
    state.apply(_compiled(1, "r0", 26.5, "loaded"))
    state.apply(_compiled(1, "r1", 27.0, "loaded"))
    state.apply(end(state, 40.0, AttemptOutcome.SUCCEEDED))
    a0, a1 = state.attempt_summaries()
    assert (a0.phases.graph, a1.phases.graph) == (GraphLoad.COMPILED, GraphLoad.LOADED)  # type: ignore[union-attr]
    labels = [label for label, _ in steps(a1.phases)]  # type: ignore[arg-type]
    assert "graph loaded (compile cache)" in labels and "compiled" not in labels
    assert "compiled +" in describe_phases(a0.phases)  # type: ignore[arg-type]
    result = RunResult("run", JobState.SUCCEEDED, 0, "done", None, (), 40.0, "/logs", (a0, a1))
    doc = json.loads(json.dumps(result.to_json()))
    assert [a["phases"]["graph"] for a in doc["attempts"]] == ["compiled", "loaded"]
    assert phases_from_json(doc["attempts"][1]["phases"]) == a1.phases
    text = format_summary(result)
    assert "  1: from the fault" in text and "graph loaded (compile cache) +" in text


def test_graph_load_of_an_attempt() -> None:
    loaded, compiled = GraphSource.LOADED, GraphSource.COMPILED
    assert graph_load({"r0": loaded, "r1": loaded}, 2) is GraphLoad.LOADED
    assert graph_load({"r0": loaded, "r1": compiled}, 2) is GraphLoad.MIXED
    assert graph_load({"r0": loaded}, 2) is None
    assert graph_load({}, 0) is None


def test_the_tui_overview_and_the_words_say_it_with_the_seconds() -> None:
    from types import SimpleNamespace

    from mscon.console.engine.phases import describe_graph
    from mscon.console.views.tui.model import ViewModel
    from mscon.console.views.tui.screens.overview import summary_text

    evs = [e for e in launch() if getattr(getattr(e, "msg", None), "phase", None) != "compiled"]
    state = feed(evs)
    model = SimpleNamespace(
        state=state,
        elapsed_s=lambda: 1.0,
        restarts_used=lambda: 0,
        workers=lambda: [],
        feed=SimpleNamespace(notices=[]),
    )
    model.rank_counts = lambda: ViewModel.rank_counts(model)  # type: ignore[arg-type]  # the real count
    assert "graph" not in summary_text(model).plain  # type: ignore[arg-type]  # not said yet
    state.apply(_compiled(0, "r0", 8.0, "loaded"))
    state.apply(_compiled(0, "r1", 8.5, "loaded"))
    p = state.phases()
    assert (
        p is not None
        and describe_graph(p) == f"graph loaded from the compile cache ({p.compiled - p.ready:.2f} s)"
    )
    assert "attempt 0: graph loaded from the compile cache (" in summary_text(model).plain  # type: ignore[arg-type]
