"""The one writer of a run's summary JSON (console/engine/summary.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mscon.console.engine.events import JobState, RunResult
from mscon.console.engine.summary import SUMMARY_JSON, add_to_summary, summary_file, write_summary


def _result() -> RunResult:
    return RunResult("run-1", JobState.FAILED, 7, "r2 on a failed first (exit code 7)", None, (), 2.5, "/x")


def test_the_summary_is_the_result_as_json_and_sections_can_be_added(tmp_path: Path) -> None:
    path = summary_file(tmp_path / "runs" / "run-1")
    assert path == tmp_path / "runs" / "run-1" / SUMMARY_JSON
    write_summary(path, _result())
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert json.loads(text) == _result().to_json()
    assert add_to_summary(path, preflight={"ok": True})
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["preflight"] == {"ok": True} and doc["exit_code"] == 7
    write_summary(path, _result(), preflight={"ok": False})
    assert json.loads(path.read_text(encoding="utf-8"))["preflight"] == {"ok": False}


def test_nothing_is_added_where_no_summary_was_written(tmp_path: Path) -> None:
    assert not add_to_summary(tmp_path / "none.json", preflight={})
    (tmp_path / "bad.json").write_text("[1, 2]", encoding="utf-8")
    assert not add_to_summary(tmp_path / "bad.json", preflight={})
    assert not (tmp_path / "none.json").exists()
