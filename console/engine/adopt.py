"""Before attempt 0, the kept standby (restart.keep_warm_s): each node is asked to take the
attempt-0 processes an earlier run of the job kept there (agent/keeper.py), if they fit; the
policy starts the attempt warm only when every node's did (its StandbyChanged for attempt 0).
The Supervisor calls this with its own ways to read, translate and step inputs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from mscon.agent import policy as policy_mod
from mscon.agent.protocol import Adopt, Start
from mscon.console.engine.clock import Clock, MonotonicClock
from mscon.console.engine.inputs import Input, Inputs
from mscon.console.engine.plan import NodePlan
from mscon.console.engine.session import ClusterSession

# For every node's word on its kept standby: at once, or once its spares have joined (a run that
# came while they join waits for them: seconds, never more than a cold launch would take).
ADOPT_WAIT_S = 30.0


async def adopt_kept(
    session: ClusterSession,
    plans: tuple[NodePlan, ...],
    start_of: Callable[[int], Start],
    inputs: Inputs,
    take: Callable[[Input], Awaitable[list[policy_mod.Input]]],
    step: Callable[[policy_mod.Input], list[policy_mod.Action]],
    stopped: Callable[[], bool],
    clock: Clock | None = None,
) -> list[policy_mod.Action]:
    """Send each node ``Adopt`` with its attempt-0 processes (``start_of``: plan index -> its Start),
    then wait up to ``ADOPT_WAIT_S`` (on ``clock``) for every node's word, handing each input to
    ``take`` and what it makes to ``step`` (the policy), until ``stopped``. What the policy decided
    on the way (a stop) comes back."""
    waiting: set[str] = set()
    for index, plan in enumerate(plans):
        start = start_of(index)
        if await session.send(plan.node.name, Adopt(run_dir=start.run_dir, cwd=start.cwd, procs=start.procs)):
            waiting.add(plan.node.name)
    out: list[policy_mod.Action] = []
    clock = clock or MonotonicClock()
    deadline = clock.now() + ADOPT_WAIT_S
    while waiting and not stopped():
        try:
            item = await clock.wait_for(inputs.get(), max(deadline - clock.now(), 0.0))
        except TimeoutError:
            break  # a node that did not answer: the attempt starts cold (its adopted standby dropped)
        for ev in await take(item):
            if isinstance(ev, policy_mod.NodeLost) or (
                isinstance(ev, policy_mod.StandbyChanged) and ev.attempt == 0 and not ev.ready
            ):
                return [*out, *step(ev)]  # all or nothing: the attempt starts cold
            if isinstance(ev, policy_mod.StandbyChanged) and ev.attempt == 0:
                waiting.discard(ev.node)
            out.extend(step(ev))
    return out
