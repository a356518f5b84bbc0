"""What a connection that has not authenticated yet may cost a listener of mscon's TCP links: the
detached run's coordinator (``detached/coord.py``) and the console's Slurm port
(``console/transport/slurm_launcher.py``) keep the same limits, counted by :class:`Pending`.

Stdlib only, Python 3.8 syntax.
"""

from __future__ import annotations

import collections

# The whole handshake (TLS's, then the secret's), however the peer paces its bytes: a connection
# that sends one byte every few seconds is cut off all the same (a per-read timeout would keep it
# for ever). A genuine peer needs a few round trips.
HANDSHAKE_S = 10.0
# Handshakes in progress at once, each one socket: well below the 1,024 descriptors an agent often
# has (its ranks' logs and pipes need theirs), well above the nodes that dial at once. Over the cap
# one is closed at once: the oldest of the address that holds the most, so a flood of connections
# that never authenticate cannot hold the port or the descriptors, and pushes out its own
# connections rather than a node's (one handshake from its address). A connection whose peer has
# shown the run's certificate (TLS done) is pushed out by none: a flood from a node's own address
# (another user on it) can only close a node's connection before that, and the node dials again
# (tls.dial).
PENDING_MAX = 64
HELLO_MAX = 4096  # bytes in a line before the peer has authenticated (a hello is about 200)


class Pending:
    """The connections whose handshake is in progress (any hashable key), oldest first, with the
    address each came from."""

    def __init__(self) -> None:
        self._hosts: dict = {}  # key -> host, in arrival order
        self._trusted: set = set()  # keys whose peer holds the run's certificate

    def __len__(self) -> int:
        return len(self._hosts)

    def __contains__(self, key: object) -> bool:
        return key in self._hosts

    def keys(self) -> list:
        return list(self._hosts)

    def add(self, key: object, host: str, cap: int = PENDING_MAX) -> list:
        """Count ``key`` in; the keys pushed out to keep at most ``cap`` (no longer counted: the
        caller closes them). ``key`` itself when every counted one is trusted: it is refused."""
        victims = []
        while self._hosts and len(self._hosts) >= cap:
            victim = self._victim()
            if victim is None:
                return victims + [key]
            del self._hosts[victim]
            victims.append(victim)
        self._hosts[key] = host
        return victims

    def trust(self, key: object) -> bool:
        """``key``'s peer showed the run's certificate: still counted until it authenticates, never
        pushed out. False: it was pushed out already."""
        if key not in self._hosts:
            return False
        self._trusted.add(key)
        return True

    def discard(self, key: object) -> bool:
        """Count ``key`` out (it authenticated, failed or ended); False: it was not counted."""
        self._trusted.discard(key)
        return self._hosts.pop(key, None) is not None

    def _victim(self) -> object:
        """The oldest untrusted handshake of the address that holds the most untrusted; None: all
        are trusted."""
        counts = collections.Counter(h for k, h in self._hosts.items() if k not in self._trusted)
        if not counts:
            return None
        most = max(counts.values())
        return next(k for k, host in self._hosts.items() if k not in self._trusted and counts[host] == most)
