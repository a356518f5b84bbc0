"""The wire protocol round-trips every message type, and rejects garbage with ProtocolError."""

from __future__ import annotations

import dataclasses
import json

import pytest
from mscon.agent import protocol as P


def test_roundtrip_start_with_procs() -> None:
    spec = P.ProcSpec(name="r0", rank=0, local_rank=0, argv=("python", "t.py"), env={"A": "1"})
    msg = P.Start(run_id="x", node="n", attempt=0, run_dir="/r", cwd="/w", procs=(spec,), grace_s=1.5)
    line = P.encode(msg)
    assert line.endswith("\n") and line.count("\n") == 1
    assert P.decode(line) == msg


@pytest.mark.parametrize(
    "msg",
    [
        P.LogBatch(node="n", name="r1", rank=1, seq=7, lines=("a", "b\tc", "ü"), ts_ns=5),
        P.ProcExited(
            node="n",
            name="r1",
            rank=1,
            pid=3,
            exitcode=None,
            signal="SIGKILL",
            signum=9,
            ts_ns=1,
            stopped_by_agent=False,
            tail=("x",),
            traceback=None,
        ),
        P.Metric(node="n", name="r0", rank=0, step=3, loss=0.5, epoch=1),
        P.Stop(reason="why", grace_s=2.0),
        P.Shutdown(),
        P.Hello(node="n", protocol=1, pid=1, hostname="h", python="3.11", platform="linux"),
    ],
)
def test_roundtrip(msg: P.Message) -> None:
    assert P.decode(P.encode(msg)) == msg


def test_shell_code() -> None:
    killed = P.ProcExited(
        node="n",
        name="r",
        rank=0,
        pid=1,
        exitcode=None,
        signal="SIGKILL",
        signum=9,
        ts_ns=0,
        stopped_by_agent=False,
    )
    assert killed.shell_code == 137 and not killed.ok


@pytest.mark.parametrize(
    "line", ["not json", "[1]", '{"no": "type"}', '{"type": "nope"}', '{"type": "log", "node": "n"}']
)
def test_garbage(line: str) -> None:
    with pytest.raises(P.ProtocolError):
        P.decode(line)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    assert P.decode('{"type": "stop", "reason": "r", "grace_s": 1.0, "added_later": 1}') == P.Stop("r", 1.0)


def test_a_message_encodes_as_asdict_makes_it() -> None:
    """The encoder's own walk (no deep copy) writes what ``dataclasses.asdict`` would: nested
    specs with their environments, plain fields."""
    env = {f"K{k}": str(k) for k in range(30)}
    specs = tuple(P.ProcSpec(f"r{i}", i, i, ("python", "t.py", "--x"), env) for i in range(8))
    start = P.Start(run_id="x", node="n", attempt=2, run_dir="/r", cwd="/w", procs=specs, grace_s=1.5)
    for msg in (start, P.Stop(reason="why", grace_s=2.0)):
        reference = {"type": msg.type}
        for f in dataclasses.fields(msg):
            v = getattr(msg, f.name)
            if isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
                v = [dataclasses.asdict(x) for x in v]
            reference[f.name] = v
        assert json.loads(P.encode(msg)) == json.loads(json.dumps(reference))
        assert P.decode(P.encode(msg)) == msg
