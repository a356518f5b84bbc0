"""What the console leaves on the operator's machine when it detaches: enough to attach again.

``<logs dir>/<run id>/detached.json``: the inventory the run came from (so ``mscon attach RUN_ID``
needs no inventory argument), its job, and how far each rank's log was printed (so the attach
replays exactly the lines this console did not print, none twice).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mscon.console.engine.state import ClusterState
from mscon.console.transport.private_copy import private_file, private_folder

RECORD = "detached.json"


@dataclass(frozen=True, slots=True)
class DetachRecord:
    run_id: str
    inventory: str
    script: str
    args: tuple[str, ...]
    attempt: int  # the attempt log_seq counts in
    log_seq: dict[str, int] = field(default_factory=dict)  # process name -> lines printed
    detached_at: float = 0.0


def write_record(logs_dir: Path, record: DetachRecord) -> Path:
    private_folder(logs_dir)  # the run folder: the operator's only, as everything in it
    path = logs_dir / RECORD
    with os.fdopen(private_file(path), "w", encoding="utf-8") as f:
        f.write(json.dumps(asdict(record), indent=2) + "\n")
    return path


def record_detach(
    logs_dir: Path, run_id: str, inventory: str | Path, script: str, args: Sequence[str], state: ClusterState
) -> None:
    """The record of a run this console detached from, now: where each rank's log stands in
    ``state`` (a record that cannot be written is left out)."""
    att = state.attempt
    record = DetachRecord(
        run_id=run_id,
        inventory=str(Path(inventory).resolve()),
        script=script,
        args=tuple(args),
        attempt=att.number if att is not None else 0,
        log_seq={r.name: r.next_seq for r in state.ranks.values()},
        detached_at=time.time(),
    )
    with contextlib.suppress(OSError):
        write_record(logs_dir, record)


def read_record(logs_dir: Path) -> DetachRecord | None:
    """The record in ``logs_dir``, or None when there is none (or it cannot be read)."""
    try:
        raw = json.loads((logs_dir / RECORD).read_text(encoding="utf-8"))
        return DetachRecord(
            run_id=str(raw["run_id"]),
            inventory=str(raw["inventory"]),
            script=str(raw["script"]),
            args=tuple(str(a) for a in raw["args"]),
            attempt=int(raw["attempt"]),
            log_seq={str(k): int(v) for k, v in dict(raw.get("log_seq", {})).items()},
            detached_at=float(raw.get("detached_at", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
