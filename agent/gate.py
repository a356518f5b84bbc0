"""What a connection that has not authenticated yet may cost a listener of mscon's TCP links: the
detached run's coordinator (``detached/coord.py``) and the console's Slurm port
(``console/transport/slurm_launcher.py``) keep the same limits, counted by :class:`Pending`.

Stdlib only, Python 3.8 syntax.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import socket
import time

# The whole handshake (TLS's, then the secret's), however the peer paces its bytes: a connection
# that sends one byte every few seconds is cut off all the same (a per-read timeout would keep it
# for ever). A genuine peer needs a few round trips.
HANDSHAKE_S = 10.0
# Handshakes in progress at once, each one socket: well below the 1,024 descriptors an agent often
# has (its ranks' logs and pipes need theirs), well above the nodes that dial at once.
PENDING_MAX = 64
# Of those, from one address: a flood from one host (or from a node's own address: another user
# on it) holds at most this many, so the other addresses keep theirs.
PER_HOST_MAX = 16
# A genuine peer finishes TLS within a few round trips of connecting: a connection younger than
# this is given the time to; an older one that has not is what a flood looks like.
YOUNG_S = 1.0
HELLO_MAX = 4096  # bytes in a line before the peer has authenticated (a hello is about 200)

# Over a cap one connection is closed at once. Never one whose peer has shown the run's
# certificate (trusted: TLS done; the run is waiting for it). Among the rest, first those that have
# sent nothing valid (silent, garbled or a partial hello): from the address that holds the most
# (of equal ones, the address that came last: the one flooding now), its oldest (it had the longest
# to speak; a node's newcomer, its hello not read yet, gets the time a flood takes to go round).
# Then those that began a valid handshake (a whole TLS ClientHello came, and was answered): the
# stalled ones (older than YOUNG_S) before the young, the newest of the busiest address first.
# So a node's connection that began its handshake is closed only when every other untrusted one
# began one too; a flood of connections that never begin one closes only its own. The one closed
# may be the one arriving: the caller refuses it, and the node dials again (tls.dial,
# coord.dial_within).


class _Entry:
    __slots__ = ("host", "born", "valid", "trusted")

    def __init__(self, host: str, born: float, valid: bool) -> None:
        self.host = host
        self.born = born
        self.valid = valid  # it began a TLS handshake: a whole, valid ClientHello came
        self.trusted = False  # its peer holds the run's certificate


class Pending:
    """The connections whose handshake is in progress (any hashable key), oldest first, with the
    address each came from."""

    def __init__(self, per_host: int = 0, young_s: float = -1.0, clock=time.monotonic) -> None:  # noqa: ANN001
        self._entries: dict = {}  # key -> _Entry, in arrival order
        self.per_host = per_host or PER_HOST_MAX  # 0, -1: the module's (a test may set those)
        self.young_s = young_s if young_s >= 0 else YOUNG_S
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> list:
        return list(self._entries)

    def add(self, key: object, host: str, cap: int = PENDING_MAX, valid: bool = False) -> list:
        """Count ``key`` in (``valid``: it is known to have begun a TLS handshake already); the
        keys pushed out to keep at most ``cap`` in all and ``per_host`` untrusted from one address
        (no longer counted: the caller closes them). ``key`` may be among them: it is refused."""
        host = _group(host)
        self._entries[key] = _Entry(host, self._clock(), valid)
        victims = []
        while self._untrusted(host) > self.per_host:
            victims.append(self._shed(host))
        while len(self._entries) > cap:
            victim = self._shed(None)
            if victim is None:  # every other one is trusted: the newcomer is refused
                victim = key
                del self._entries[key]
            victims.append(victim)
        return victims

    def began(self, key: object) -> None:
        """``key``'s peer began a TLS handshake: a whole, valid ClientHello came (and was answered)."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.valid = True

    def trust(self, key: object) -> bool:
        """``key``'s peer showed the run's certificate: still counted until it authenticates, never
        pushed out. False: it was pushed out already."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        entry.trusted = True
        return True

    def discard(self, key: object) -> bool:
        """Count ``key`` out (it authenticated, failed or ended); False: it was not counted."""
        return self._entries.pop(key, None) is not None

    def _untrusted(self, host: str) -> int:
        return sum(1 for e in self._entries.values() if e.host == host and not e.trusted)

    def _shed(self, host: object) -> object:
        """Remove and return the victim (see the comment above), of ``host`` only when given;
        None: every one is trusted."""
        now = self._clock()
        counts: dict = collections.Counter()
        last: dict = {}  # host -> the arrival index of its newest untrusted
        for i, e in enumerate(self._entries.values()):
            if not e.trusted:
                counts[e.host] += 1
                last[e.host] = i
        best, best_rank = None, None
        for i, (key, e) in enumerate(self._entries.items()):
            if e.trusted or (host is not None and e.host != host):
                continue
            if not e.valid:
                rank = (0, -counts[e.host], -last[e.host], i)  # the smallest goes first
            else:
                rank = (2 if now - e.born < self.young_s else 1, -counts[e.host], -last[e.host], -i)
            if best_rank is None or rank < best_rank:
                best, best_rank = key, rank
        if best_rank is None:
            return None
        del self._entries[best]
        return best


def _group(host: str) -> str:
    """The address as the caps count it: an IPv6 address by its /64 (one host may hold all of
    one), an IPv4 address alone."""
    if ":" not in host:
        return host
    try:
        return str(ipaddress.ip_network(host.split("%", 1)[0] + "/64", strict=False))
    except ValueError:
        return host


def hello_waiting(sock) -> bool:  # noqa: ANN001 - a socket, or anything with fileno() (asyncio's)
    """Whether a whole TLS ClientHello waits unread on connected ``sock`` (peeked at, nothing
    consumed): what a listener that cannot watch its handshake step by step (asyncio's start_tls)
    passes to :meth:`Pending.add` as ``valid``."""
    try:
        peek = socket.socket(fileno=os.dup(sock.fileno()))
    except (OSError, ValueError):
        return False
    try:
        flags = socket.MSG_PEEK | socket.MSG_DONTWAIT  # the socket's own mode untouched
        head = peek.recv(_RECORD_HEAD, flags)
        if len(head) < _RECORD_HEAD or head[0] != 0x16 or head[1] != 0x03:
            return False
        length = int.from_bytes(head[3:5], "big")
        whole = peek.recv(_RECORD_HEAD + length, flags)
        return len(whole) == _RECORD_HEAD + length and whole[_RECORD_HEAD] == 0x01  # a ClientHello
    except OSError:
        return False
    finally:
        peek.close()


_RECORD_HEAD = 5  # a TLS record's header: type, version (2 bytes), length (2 bytes)
