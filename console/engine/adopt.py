"""Before attempt 0, the kept standby (restart.keep_warm_s): each node is asked to take the
attempt-0 processes an earlier run of the job kept there (agent/keeper.py), if they fit. How long
attempt 0 waits for their word, and whether it starts warm (only when every node's did), is the
policy's (``AwaitAdoption``, ``policy.ADOPT_WAIT_S``).
"""

from __future__ import annotations

from collections.abc import Callable

from mscon.agent.protocol import Adopt, Start
from mscon.console.engine.plan import NodePlan
from mscon.console.engine.session import ClusterSession


async def ask_to_adopt(
    session: ClusterSession, plans: tuple[NodePlan, ...], start_of: Callable[[int], Start]
) -> tuple[str, ...]:
    """Send each node ``Adopt`` with its attempt-0 processes (``start_of``: plan index -> its
    Start); the nodes asked (a node whose link is down is not)."""
    asked = []
    for index, plan in enumerate(plans):
        start = start_of(index)
        if await session.send(plan.node.name, Adopt(run_dir=start.run_dir, cwd=start.cwd, procs=start.procs)):
            asked.append(plan.node.name)
    return tuple(asked)
