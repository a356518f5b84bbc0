"""MindSpore's INFO/DEBUG chatter against the lines that say something, over real logs.

``data/mindspore_chatter.log``: real MindSpore 2.10.0 (CPU) output, one INFO and one DEBUG line per
module that printed one (``GLOG_v=1`` / ``GLOG_v=0 python -c "import mindspore as ms; ...
ms.Tensor(np.ones(2)) + 1"``), and the two ``Event base dispatch success!`` lines that end every
rank of ``mscon run inventory/local.yaml``. ``mindspore_rank0.log``, ``scheduler.log`` and
``mindformers_rank0.log``: the logs the agent's parsers are tested on.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

from mscon.console.views.log_lines import is_chatter, last_meaningful

DATA = Path(__file__).resolve().parent / "data"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def test_every_mindspore_info_and_debug_line_is_chatter() -> None:
    chatter = lines("mindspore_chatter.log")
    assert len(chatter) >= 15
    assert {line.split("(")[0] for line in chatter} >= {"[INFO] ME", "[INFO] DISTRIBUTED", "[DEBUG] CORE"}
    assert all(is_chatter(line) for line in chatter)
    assert is_chatter("  " + chatter[0])  # indented by a wrapper


def test_warnings_errors_and_other_loggers_info_are_not_chatter() -> None:
    rank0 = lines("mindspore_rank0.log")
    kept = [line for line in rank0 + lines("scheduler.log") if line.startswith(("[WARNING]", "[ERROR]"))]
    assert len(kept) >= 5 and not any(is_chatter(line) for line in kept)
    # MindFormers logs its training progress at INFO: that is the rank's news, not chatter
    assert not any(is_chatter(line) for line in lines("mindformers_rank0.log"))
    for line in (
        "epoch: 2 step: 20, loss is 1.028222",
        "training finished: 40 steps, 0 overflow(s)",
        "[INFO] a message of the user's own",
        "INFO ME(1,2,python):2026-11-25-18:08:11.093.347 no brackets",
        "Traceback (most recent call last):",
        "",
    ):
        assert not is_chatter(line), line


def test_the_last_meaningful_line_skips_chatter_and_blanks() -> None:
    chatter = lines("mindspore_chatter.log")
    tail = deque(["epoch: 2 step: 20, loss is 1.028222", "training finished: 40 steps", *chatter[-2:], ""])
    assert last_meaningful(tail) == "training finished: 40 steps"
    warning = next(line for line in lines("mindspore_rank0.log") if line.startswith("[WARNING]"))
    assert last_meaningful([*chatter[:3], warning, *chatter[3:]]) == warning
    assert last_meaningful(chatter[:3]) == chatter[2]  # nothing else yet: the newest line, not a blank
    assert last_meaningful([]) == ""
