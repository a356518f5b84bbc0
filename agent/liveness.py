"""Who is still there on a detached run's links: pure, the policy's (``policy.RunPolicy`` holds
one for a coordinator's followers; a follower holds one for its coordinator).

A peer is lost when nothing came from it for the watchdog period (``policy.watchdog_s``: a few
pings missed). A link that ends is not a lost peer yet: a reset connection (a NAT's, a firewall's,
a restarted switch port) comes back when the follower dials again, so the side that dials
(``redials``) is told to (``Redial``) at once and then every ``REDIAL_S`` until it is heard from
again or the watchdog says it is gone (``PeerLost``). Stdlib only, Python 3.8, like the policy.
"""

from __future__ import annotations

from .policy_types import Heard, LinkLost, PeerLost, Redial, Tick

REDIAL_S = 0.5  # a follower whose link ended dials again this often, within the watchdog


class Liveness:
    def __init__(self, peers: tuple, watchdog_s: float, now: float, redials: bool = False) -> None:
        self.watchdog_s = watchdog_s
        self.redials = redials
        self.heard = {p: now for p in peers}  # peer -> when it was last heard from
        self.down: dict = {}  # peer -> when its link ended, or was last dialled again
        self.lost: set = set()

    def step(self, ev: object) -> list:
        out: list = []
        if isinstance(ev, Heard):
            if ev.node in self.heard and ev.node not in self.lost:
                self.heard[ev.node] = max(self.heard[ev.node], ev.now)
                self.down.pop(ev.node, None)  # its link is back
        elif isinstance(ev, LinkLost):
            if ev.node in self.heard and ev.node not in self.lost and ev.node not in self.down:
                self.down[ev.node] = ev.now
                if self.redials:
                    out.append(Redial(ev.node))
        elif isinstance(ev, Tick):
            for peer in sorted(self.heard):
                if peer in self.lost:
                    continue
                if ev.now - self.heard[peer] > self.watchdog_s:
                    self.lost.add(peer)
                    ended = self.down.pop(peer, None) is not None
                    why = "its link ended and was not back within" if ended else "no word for"
                    out.append(PeerLost(peer, "%s %gs" % (why, self.watchdog_s)))
                elif self.redials and peer in self.down and ev.now - self.down[peer] >= REDIAL_S:
                    self.down[peer] = ev.now
                    out.append(Redial(peer))
        return out

    def is_down(self, peer: str) -> bool:
        """Its link ended and it has not been heard from since (a stop may not have reached it)."""
        return peer in self.down
