"""Headless runs honour --straggler-*: a rank slowed 1.5x is named on stderr and in the summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import local_inventory, mscon

FAKE = "bench/fake_rank.py"


def test_a_rank_slowed_half_again_is_flagged_and_listed_in_the_summary(tmp_path: Path) -> None:
    # 3 ranks at 20 steps/s, r1 at 1.5x the step time (fake_rank's own step times, --metrics): ~2 s.
    args = ["--steps", "30", "--rate", "20", "--metrics", "--slow-rank", "1", "--slow", "1.5"]
    inv = local_inventory(tmp_path / "inv.yaml", 3, FAKE, args)
    done = mscon(
        "run",
        "--no-tui",
        "-q",
        "--no-check",
        inv,
        "--straggler-factor",
        "1.2",
        "--json",
        tmp_path / "s.json",
        "--logs-dir",
        tmp_path / "runs",
        cwd=tmp_path,
    )
    assert done.code == 0, done.err
    flags = re.findall(r"^mscon: (r\d+) on local is a straggler from step \d+: .*$", done.err, re.M)
    assert flags == ["r1"], done.err
    line = next(s for s in done.err.splitlines() if "is a straggler" in s)
    ratio = float(re.search(r"([0-9.]+)x the other ranks' median", line).group(1))  # type: ignore[union-attr]
    assert 1.2 <= ratio < 2.0 and line.endswith("(threshold 1.2x)"), line
    for path in (tmp_path / "s.json", tmp_path / "runs"):
        summary = json.loads((path if path.is_file() else next(path.glob("*/summary.json"))).read_text())
        assert [(s["attempt"], s["name"], s["node"]) for s in summary["stragglers"]] == [(0, "r1", "local")]
        (s,) = summary["stragglers"]
        assert 1.2 <= s["step_time_s"] / s["median_s"] < 2.0 and s["flagged"] >= 1
    assert "stragglers (median step time when flagged" in done.err
    assert re.search(r"^  attempt 0: r1 on local: [0-9.]+ s/step, 1\.\d\dx", done.err, re.M), done.err
