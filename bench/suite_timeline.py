"""A pytest plugin that writes when each test ran, on which worker, its set-up and call seconds and
the rank slots it holds (and how many there are) as tests/conftest.py's turnstile reports them, one
JSON line a test, for ``bench/suite_split.py``.

    PYTHONPATH=bench SUITE_TIMELINE=/tmp/timeline.jsonl .venv/bin/python -m pytest -p suite_timeline

Set-up seconds of a MindSpore test are mostly its wait for rank slots (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import time

import pytest

_OUT = os.environ.get("SUITE_TIMELINE", "suite-timeline.jsonl")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_started: dict[str, float] = {}
_phases: dict[str, dict[str, float]] = {}
_slots: dict[str, dict[str, int]] = {}
_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _config.append(config)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _started[nodeid] = time.time()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _phases.setdefault(report.nodeid, {})[report.when] = report.duration
    props = dict(report.user_properties)
    if "rank_slots" in props:
        _slots[report.nodeid] = {"slots": props["rank_slots"], "slot_limit": props["rank_slot_limit"]}


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    if not _config[0].pluginmanager.has_plugin("dsession"):  # xdist's controller: its workers write
        record = {
            "id": nodeid,
            "worker": _WORKER,
            "start": _started.pop(nodeid, time.time()),
            "end": time.time(),
            **_slots.pop(nodeid, {"slots": 0}),
            **_phases.pop(nodeid, {}),
        }
        with open(_OUT, "a") as f:
            f.write(json.dumps(record) + "\n")
