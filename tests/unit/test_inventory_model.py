"""The inventory model's derived facts cost nothing to ask again: the console asks them per node."""

from __future__ import annotations

from pathlib import Path

from mscon.console.config.model import Inventory, JobSpec, NodeSpec


class _CountingNodes(tuple):
    """The inventory's nodes, counting the passes over them."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).passes += 1
        return super().__iter__()


def test_the_world_size_is_counted_once_however_often_it_is_asked() -> None:
    """Asked once per node (each node's subscription), a sum over the nodes each time was
    O(nodes^2): a third of the console's CPU at 3,000 nodes in bench/scale.py's profile."""
    nodes = _CountingNodes(NodeSpec(f"n{i}", f"h{i}", 8) for i in range(1000))
    inv = Inventory(Path("inv.yaml"), "x", "CPU", nodes, JobSpec(Path("/w"), "train.py"))
    _CountingNodes.passes = 0
    assert all(inv.world_size == 8000 for _ in nodes)
    assert _CountingNodes.passes == 2  # the loop above, and one sum
