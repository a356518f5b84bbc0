"""The values a script's own loops carry from step to step (``mscon_resume.carried``): which names
the source says are carried, and that they go back into the frames that hold them."""

from __future__ import annotations

import runpy
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mscon_resume import carried


def _site(tmp_path: Path, source: str, marker: str = "# HERE") -> carried.Carried:
    """What the loops around the line holding ``marker`` carry, in a module of ``source``."""
    path = tmp_path / "script.py"
    text = textwrap.dedent(source)
    path.write_text(text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if marker in t)
    carried._SITES.clear()
    carried._TREES.clear()
    return carried.carried_names(str(path), "<module>", 1, line)


def _names(site: carried.Carried) -> set[str]:
    return {name for name, _ in site.rebound}


def test_counters_running_values_and_reads_before_writes_are_carried(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        """
        steps, total, best, t0 = 0, 0.0, None, 0.0
        for epoch in range(3):
            for i, batch in batches(epoch):  # HERE
                dt = now() - t0
                steps += 1
                total = total + batch
                if best is None or batch < best:
                    best = batch
                loss = batch * 2
                t0 = now()
        """,
    )
    assert _names(site) == {"steps", "total", "best", "t0"}  # not dt or loss (written first), nor targets


def test_a_loops_targets_and_names_written_before_read_are_not_carried(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        """
        for epoch in range(3):
            running = 0.0
            for i, (data, label) in batches(epoch):  # HERE
                out = net(data)
                running += out
            print(epoch, running)
        """,
    )
    assert _names(site) == {"running"}  # the epoch's own running sum: put back mid-epoch


def test_containers_changed_in_place_are_carried_as_mutated(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        """
        losses, counts = [], {}
        for i, b in batches(0):  # HERE
            losses.append(b)
            counts[b] = counts.get(b, 0) + 1
            scratch = []
            scratch.append(b)
        """,
    )
    assert {name for name, _ in site.mutated} == {"losses", "counts"}  # not a list made in the body
    assert _names(site) == set()


def test_attributes_updated_from_themselves_are_carried_others_are_not(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        """
        for i, b in batches(0):  # HERE
            trainer.step += 1
            stats.seen = stats.seen + 1
            args.lr = schedule(i)
        """,
    )
    assert {(o, a) for o, a, _ in site.attributes} == {("trainer", "step"), ("stats", "seen")}


def test_nested_functions_and_comprehensions_are_their_own_scopes(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        """
        for i, b in batches(0):  # HERE
            def inner():
                hidden += 1
            squares = [x * x for x in range(i)]
            f = lambda: b
        """,
    )
    assert _names(site) == set() and site.mutated == ()


def _numbers(
    carrier: carried.Carrier, n: int, out: dict, at: int, start: int = 0, back: Any = None
) -> Iterator[int]:
    """A stand-in for the library's batches: captures after step ``at`` into ``out``; resuming
    (``back``), puts the captured values back before the first batch."""
    if back is not None:
        carrier.restore(*back)
    for i in range(start, n):
        yield i
        if i == at:
            out["snap"] = carrier.capture()


def _train(carrier: carried.Carrier, out: dict, start: int = 0, back: Any = None) -> tuple:
    total, steps, losses, best = 0.0, 0, [], None
    history = losses  # another holder of the list: a restore in place is seen through it
    for i in _numbers(carrier, 6, out, at=2, start=start, back=back):
        total += i * 0.5
        steps += 1
        losses.append(i)
        if best is None or i > best:
            best = i
    return total, steps, history, best


def test_a_functions_carried_locals_go_back_into_its_frame(tmp_path: Path) -> None:
    said: list[str] = []
    carrier = carried.Carrier((), set, said.append)
    out: dict = {}
    whole = _train(carrier, out)
    assert said == []
    resumed = _train(carried.Carrier((), set, said.append), {}, start=3, back=out["snap"])
    assert resumed == whole == (7.5, 6, [0, 1, 2, 3, 4, 5], 5)


def test_module_level_values_go_back_into_the_modules_globals(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            steps_done, lrs = 0, []
            for i in numbers(carrier, 6, out, 2, start, back):
                steps_done += 1
                lrs.append(round(0.1 * min(1.0, steps_done / 4), 4))
            """
        )
    )
    out: dict = {}
    args = {"numbers": _numbers, "carrier": carried.Carrier((), set, print), "out": out}
    whole = runpy.run_path(str(script), {**args, "start": 0, "back": None})
    resumed = runpy.run_path(str(script), {**args, "out": {}, "start": 3, "back": out["snap"]})
    assert (
        (resumed["steps_done"], resumed["lrs"])
        == (whole["steps_done"], whole["lrs"])
        == (
            6,
            [0.025, 0.05, 0.075, 0.1, 0.1, 0.1],
        )
    )


def _seen_set(carrier: carried.Carrier, out: dict) -> None:
    seen = frozenset()
    for i in _numbers(carrier, 4, out, at=1):
        seen = seen | {i}


class _Trainer:
    def __init__(self) -> None:
        self.step = 0

    def fit(self, carrier: carried.Carrier, out: dict) -> None:
        for _ in _numbers(carrier, 4, out, at=1):
            self.step += 1


def test_what_a_snapshot_cannot_hold_is_said_with_its_fix() -> None:
    said: list[str] = []
    _seen_set(carried.Carrier((), set, said.append), {})
    assert len(said) == 1 and "carries 'seen'" in said[0] and "a frozenset" in said[0], said
    said.clear()
    _Trainer().fit(carried.Carrier((), set, said.append), {})
    assert len(said) == 1 and "'self.step'" in said[0] and "add 'self' to keep" in said[0], said


def test_an_object_keep_holds_is_not_said() -> None:
    said: list[str] = []
    trainer = _Trainer()
    trainer.fit(carried.Carrier((trainer,), lambda: {id(trainer)}, said.append), {})
    assert said == []


class _ProgressBar:
    def __init__(self) -> None:
        self.n = 0
        self.lock = object()  # what a snapshot cannot hold

    def update(self, k: int) -> None:
        self.n += k


def test_a_method_named_like_a_mutation_on_another_object_is_not_said() -> None:
    """``pbar.update(1)`` (tqdm) reads like ``dict.update``: only lists and dicts changed in place
    are carried; another object's method is not known state, and no refusal comes of it."""
    said: list[str] = []
    pbar = _ProgressBar()
    for _ in _numbers(carried.Carrier((), set, said.append), 4, {}, at=1):
        pbar.update(1)
    assert said == [] and pbar.n == 4
