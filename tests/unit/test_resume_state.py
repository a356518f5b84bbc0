"""mscon_resume's state contract without MindSpore: what ``keep`` takes besides Cells (state
dicts, generators, a script's own objects), captured, changed, put back; what it cannot hold is a
problem said up front, never an error at the first snapshot. And the lifecycle: snapshots go only
at a successful exit of a script mscon did not start."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mscon_resume import state
from mscon_resume.state import Kept, Kind


class Counter:
    """A script's own warm-up counter: plain values, an array, and structure (a reference)."""

    def __init__(self) -> None:
        self.count = 0
        self.history = [0.5, 1.5]
        self.table = {1: "one", "two": (2, 2.0)}
        self.buffer = np.zeros(3, dtype=np.float32)
        self.owner = object()  # structure, not state


class Stateful:
    def __init__(self) -> None:
        self.best = math.inf
        self.wait = 0

    def state_dict(self) -> dict:
        return {"best": self.best, "wait": self.wait, "seen": np.arange(3)}

    def load_state_dict(self, d: dict) -> None:
        self.best, self.wait = d["best"], d["wait"]
        assert isinstance(d["seen"], np.ndarray)


def _round_trip(kept: Kept) -> tuple[dict, dict]:
    meta, arrays = kept.capture()
    json.dumps(meta)  # the snapshot's metadata is JSON
    return json.loads(json.dumps(meta)), arrays


def test_every_kind_of_piece_is_put_back_as_captured() -> None:
    counter, sd = Counter(), Stateful()
    gen, rs, pyr = np.random.default_rng(3), np.random.RandomState(4), random.Random(5)
    kept = Kept({"counter": counter, "plateau": sd, "gen": gen, "rs": rs, "pyr": pyr})
    assert [p.kind for p in kept.pieces] == [
        Kind.ATTRIBUTES, Kind.STATEFUL, Kind.NP_GENERATOR, Kind.NP_RANDOMSTATE, Kind.PY_RANDOM
    ]  # fmt: skip
    assert kept.problems == []
    meta, arrays = _round_trip(kept)
    want = (gen.random(), rs.rand(), pyr.random())
    before = kept.digests()
    counter.count, counter.history, counter.table = 7, [9.0], {}
    buffer = counter.buffer
    counter.buffer[:] = 1.0
    sd.best, sd.wait = 0.25, 3
    assert kept.digests() != before
    assert kept.restore(meta, arrays) == []
    assert (counter.count, counter.history, counter.table) == (0, [0.5, 1.5], {1: "one", "two": (2, 2.0)})
    assert counter.buffer is buffer and not counter.buffer.any()  # in place: sharers see it too
    assert (sd.best, sd.wait) == (math.inf, 0)
    assert (gen.random(), rs.rand(), pyr.random()) == want
    assert isinstance(counter.owner, object)


def test_a_value_and_what_a_snapshot_cannot_hold_are_problems_said_up_front() -> None:
    class Lambdas(Stateful):
        def state_dict(self) -> dict:
            return {"lr_lambdas": [lambda epoch: 0.9**epoch]}

    kept = Kept((3, Lambdas()))
    assert kept.pieces == []
    assert kept.problems[0].startswith("keep[0] is a int: a value cannot be put back in place")
    assert "keep[1]['lr_lambdas'][0] holds a function, which a snapshot cannot hold" in kept.problems[1]
    assert Kept(()).capture() == ({}, {})  # and nothing fails at a snapshot


def test_a_snapshot_lacking_a_piece_is_named() -> None:
    meta, arrays = Kept({"a": Counter()}).capture()
    assert Kept({"a": Counter(), "b": Stateful()}).restore(meta, arrays) == ["b"]


@pytest.mark.parametrize(
    "value", [float("nan"), float("-inf"), (1, (2, [3])), {1: {"x": None}}, np.float32(2.5)]
)
def test_values_survive_json_and_arrays(value: object) -> None:
    arrays: dict[str, np.ndarray] = {}
    got = state._decode(json.loads(json.dumps(state._encode(value, arrays, "p", "v"))), arrays)
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(got)
    else:
        assert got == value and type(got) is type(value)


_LIFECYCLE = textwrap.dedent(
    """
    import sys
    from mscon_resume import lifecycle
    lifecycle.install(lambda: print("dropped", flush=True))
    how = sys.argv[1]
    if how == "exit1":
        sys.exit(1)
    if how == "exit0":
        sys.exit(0)
    if how == "raise":
        raise RuntimeError("a fault after training")
    if how == "quit":
        quit(2)
    """
)


@pytest.mark.parametrize(
    ("how", "attempt", "dropped"),
    [
        ("end", "", True),
        ("exit0", "", True),
        ("exit1", "", False),
        ("raise", "", False),
        ("quit", "", False),
        ("end", "0", False),  # mscon's agent started it: the agent frees the run's memory at its end
    ],
)
def test_snapshots_go_only_at_a_successful_exit(tmp_path, how: str, attempt: str, dropped: bool) -> None:
    env = {"PATH": "/usr/bin:/bin", "MSCON_ATTEMPT": attempt}
    out = subprocess.run(
        [sys.executable, "-c", _LIFECYCLE, how],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert ("dropped" in out.stdout) is dropped, (out.stdout, out.stderr)
