"""The end of a large run: writing its summary.json.

    .venv/bin/python bench/summary_write.py [--ranks 8000 80000]

A ClusterState of N ranks (8 a node, one failed, the rest stopped; one metric each) is built as the
supervisor builds it, then its summary is written twice: by ``summary.write_summary`` (the console's
writer), and as ``json.dump(indent=2)`` writes the same document (the writer before it wrote big
lists a compact member a line). Printed: CPU seconds of each and the file sizes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from mscon.agent.protocol import Metric, ProcExited, ProcStarted
from mscon.console.engine import summary
from mscon.console.engine.bus import EventBus
from mscon.console.engine.events import (
    AgentEvent,
    AttemptEnded,
    AttemptOutcome,
    AttemptStarted,
    Event,
    JobState,
    RankRef,
    RunStarted,
    json_default,
)
from mscon.console.engine.state import ClusterState


def state_of(ranks: int) -> ClusterState:
    nodes = tuple(f"n{i}" for i in range((ranks + 7) // 8))
    refs = tuple(RankRef(f"r{i}", nodes[i // 8], i) for i in range(ranks))
    evs: list[Event] = [
        RunStarted(0, "run", "inv.yaml", nodes, ranks, "/tmp/x"),
        AttemptStarted(0, refs, "h", 1, 1),
    ]
    for r in refs:
        evs.append(AgentEvent(0, ProcStarted(r.node, r.name, r.rank, 100 + r.rank, 2, "/tmp/l")))
        evs.append(AgentEvent(0, Metric(r.node, r.name, r.rank, step=1, loss=0.5, epoch=1)))
        failed = r.rank == 3
        exited = ProcExited(
            r.node,
            r.name,
            r.rank,
            100 + r.rank,
            1 if failed else None,
            None if failed else "SIGTERM",
            9,
            5,
            not failed,
        )
        evs.append(AgentEvent(0, exited))
    evs.append(AttemptEnded(0, AttemptOutcome.FAILED, "r3 failed", None, 9))
    st = ClusterState()
    for ev in evs:
        st.apply(ev)
    return st


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8000, 80000])
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        new, old = Path(tmp) / "summary.json", Path(tmp) / "indented.json"
        for n in a.ranks:
            res = summary.run_result(
                state_of(n), "run", Path(tmp), JobState.FAILED, 1, "r3 failed", 1.0, EventBus()
            )
            t = time.process_time()
            summary.write_summary(new, res)
            cpu_new = time.process_time() - t
            t = time.process_time()
            with old.open("w") as f:
                json.dump(json_default(res), f, indent=2, default=json_default)
            cpu_old = time.process_time() - t
            assert json.loads(new.read_text()) == json.loads(old.read_text())
            print(
                f"{n:>7} ranks: write_summary {cpu_new:.2f} s CPU, {new.stat().st_size / 2**20:.1f} MiB; "
                f"json.dump(indent=2) {cpu_old:.2f} s CPU, {old.stat().st_size / 2**20:.1f} MiB"
            )


if __name__ == "__main__":
    main()
