"""The TUI at many nodes (issue 44): what a refresh computes is what is in sight, the rank filter
selects in bulk what its rules say, and the collector's slow full passes are followed by a freeze."""

from __future__ import annotations

import gc

from mscon.agent.protocol import ProcStarted, Telemetry, TelemetryBatch
from mscon.console.engine.collector import FreezeAfterSlowPasses
from mscon.console.engine.events import (
    AgentEvent,
    AttemptStarted,
    Event,
    NodeState,
    NodeUpdate,
    RankRef,
    RankState,
    RunStarted,
)
from mscon.console.engine.state_views import RankView
from mscon.console.views.log_lines import last_meaningful
from mscon.console.views.tui.app import MsconApp
from mscon.console.views.tui.feed import Changes
from mscon.console.views.tui.filtering import RankFilter
from mscon.console.views.tui.screens.overview import OverviewView
from mscon.console.views.tui.source import ReplaySource
from mscon.console.views.tui.widgets.node_table import NodeTable
from mscon.console.views.tui.widgets.rank_table import RankTable
from tui_helpers import screen_text, settled, show_tab, wait_for

NODES, PER_NODE = 2000, 8


def _big_run() -> list[Event]:
    nodes = tuple(f"n{k:04d}" for k in range(NODES))
    refs = tuple(RankRef(f"r{i}", nodes[i // PER_NODE], i) for i in range(NODES * PER_NODE))
    evs: list[Event] = [RunStarted(0, "big", "big.yaml", nodes, len(refs), "/tmp/big")]
    evs += [NodeUpdate(0, n, NodeState.READY, "", 1) for n in nodes]
    evs.append(AttemptStarted(0, refs, "127.0.0.1", 1, 1))
    evs += [AgentEvent(0, ProcStarted(r.node, r.name, r.rank, 100, 2, "/tmp/l")) for r in refs]
    for k, n in enumerate(nodes):  # the last node's ranks use the most memory
        items = tuple(
            Telemetry(n, r.name, r.rank, 50.0, (k + 1) << 20, 3.0)
            for r in refs[k * PER_NODE : (k + 1) * PER_NODE]
        )
        evs.append(AgentEvent(0, TelemetryBatch(n, items)))
    return evs


async def test_the_node_table_computes_only_the_nodes_in_sight() -> None:
    app = MsconApp(ReplaySource(_big_run(), speed=0), toasts=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await settled(pilot)
        table = app.main_screen.query_one(NodeTable)
        assert table.row_count == NODES
        in_sight = table.size.height - 1
        assert 0 < len(table._cells) <= in_sight  # not one per node
        text = screen_text(app)
        assert " n0000 " in text and "400%" in text and " n1999 " not in text  # 8 ranks at 50% CPU
        table.focus()
        await pilot.press("end")
        await wait_for(pilot, lambda: " n1999 " in screen_text(app))
        assert "15.6 GiB" in screen_text(app)  # 8 ranks of 2,000 MiB: the last node's own
        assert len(table._cells) <= 2 * in_sight


def _reference(query: str, r: RankView, straggler: bool) -> bool:
    """The filter's rules as the module's docstring gives them, rank by rank."""
    last = last_meaningful(r.tail).lower()
    for w in query.lower().split():
        if w.startswith("node:"):
            ok = w[5:] in r.node.lower()
        elif w in ("state:straggler", "straggler"):
            ok = straggler
        elif w.startswith("state:"):
            ok = r.state.value.startswith(w[6:])
        else:
            ok = w == r.name.lower() or w in r.node.lower() or w in r.state.value or w in last
        if not ok:
            return False
    return True


def test_the_filter_selects_in_bulk_what_its_rules_say() -> None:
    states = list(RankState)
    ranks = []
    for i in range(300):
        r = RankView(f"r{i}", f"Node-{i % 7}", i, state=states[i % len(states)])
        if i % 5 == 0:
            r.tail.append(f"epoch 1 step {i} loss 0.{i}")
        ranks.append(r)
    stragglers = {"r3", "r10", "r299"}
    queries = [
        "", "r3", "R3", "node:node-1", "node:-1 state:run", "state:", "state:straggler", "straggler",
        "run", "loss", "step 15", "node-2 state:exit", "nope", "0.1", "node state", "  r10  ",
    ]  # fmt: skip
    for q in queries:
        f = RankFilter(q)
        want = [r for r in ranks if _reference(q, r, r.name in stragglers)]
        assert f.select(ranks, stragglers) == want, q
        assert [r for r in ranks if f(r, r.name in stragglers)] == want, q


async def test_a_filter_keystroke_at_many_ranks_selects_a_nodes_ranks_in_order() -> None:
    app = MsconApp(ReplaySource(_big_run(), speed=0), toasts=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await settled(pilot)
        await show_tab(pilot, "2", "devices")
        table = app.main_screen.query_one(RankTable)
        await wait_for(pilot, lambda: table.row_count == NODES * PER_NODE)
        await pilot.press("slash", *"node:n1234")
        await wait_for(pilot, lambda: table.row_count == PER_NODE)
        assert [table.get_row_at(i)[0].plain for i in range(PER_NODE)] == [
            f"r{1234 * 8 + k}" for k in range(8)
        ]
        await pilot.press(*["backspace"] * 3)  # "node:n1": n1000..n1999 and every n..1.. below
        want = [r.name for r in app.model.workers() if "n1" in r.node]
        await wait_for(pilot, lambda: table.row_count == len(want))
        assert [table.get_row_at(i)[0].plain for i in (0, len(want) - 1)] == [want[0], want[-1]]


def test_a_slow_full_pass_is_followed_by_a_freeze_and_a_quick_one_is_not() -> None:
    quick = FreezeAfterSlowPasses(slow_s=3600.0)
    slow = FreezeAfterSlowPasses(slow_s=0.0)
    frozen = gc.get_freeze_count()
    automatic = gc.isenabled()
    gc.disable()  # only the passes asked for here: an automatic full one would freeze too soon
    try:
        quick.install()
        gc.collect()
        assert quick.freezes == 0 and gc.get_freeze_count() == frozen
        quick.uninstall()
        slow.install()
        slow.install()  # once only
        garbage = [[] for _ in range(1000)]
        gc.collect(1)  # not a full pass
        assert slow.freezes == 0
        gc.collect()
        assert slow.freezes == 1 and gc.get_freeze_count() >= frozen + len(garbage)
    finally:
        quick.uninstall()
        slow.uninstall()
        gc.unfreeze()  # the rest of the session as it was (the app freezes its own again)
        if automatic:
            gc.enable()


async def test_a_filter_typed_on_the_overview_is_applied_when_devices_is_shown() -> None:
    app = MsconApp(ReplaySource(_big_run(), speed=0), toasts=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await settled(pilot)
        table = app.main_screen.query_one(RankTable)
        shown = table.row_count
        overview = app.main_screen.query_one(OverviewView)
        redrawn: list[None] = []  # the Overview's whole refreshes (it shows nothing of the filter)
        show = overview.show

        def counted(ch: Changes | None) -> None:
            if ch is None:
                redrawn.append(None)
            show(ch)

        overview.show = counted  # type: ignore[method-assign]
        await pilot.press("slash", *"node:n0007")
        await wait_for(pilot, lambda: "filter: node:n0007" in screen_text(app))
        assert app.main_screen.active.value == "overview" and not redrawn
        assert table.row_count == shown  # Devices is not selected again while hidden
        await pilot.press("enter")
        await show_tab(pilot, "2", "devices")
        await wait_for(pilot, lambda: table.row_count == PER_NODE)
        assert table.get_row_at(0)[0].plain == f"r{7 * PER_NODE}"
        await pilot.press("slash", "end", "backspace")  # on Devices: each key selects again
        await wait_for(pilot, lambda: table.row_count == PER_NODE * 10)  # n0000..n0009 (n000)
        assert [table.get_row_at(i)[0].plain for i in (0, PER_NODE * 10 - 1)] == [
            "r0",
            f"r{PER_NODE * 10 - 1}",
        ]
