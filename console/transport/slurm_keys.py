"""The Slurm dial's keys, on the console: one per srun step, then one per node.

A step's key reaches its tasks on srun's stdin (``slurm_dial.boot_line``: one line the console
writes and closes, srun hands every task with ``--input=all``; never a command line or an
environment); it proves a boot connection and nothing else, and each node of the step may boot
with it once. At that boot the console hands the node a key of its own over the authenticated
connection (never an environment); the node's later connections (its agent's) prove that one.
Every relaunch step gets a fresh key, and a step's key is forgotten when its srun ends. A second
boot for a node of the step means a second party holds the step's key: it is refused, and the
caller says so.

Keys are found by an id the node sends in the clear inside TLS (``agent/dial.py``: ``key_id``),
a digest that does not reveal them.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass, field

KEY_BYTES = 32


def key_id(key: bytes) -> str:
    """The public name of a key (``agent/dial.py`` and the boot compute the same)."""
    return hashlib.sha256(b"mscon dial key id|" + key).hexdigest()[:32]


class KeyUse(enum.Enum):
    STEP = "step"  # a boot connection of the step's tasks, once per node
    NODE = "node"  # the agent connections of the one node it was made for


@dataclass
class DialKey:
    key: bytes
    use: KeyUse
    step: int  # which step made it (1, 2, ...: the launcher's count)
    hosts: frozenset[str]  # STEP: the step's nodes; NODE: its one node
    booted: set[str] = field(default_factory=set)  # STEP: the nodes that booted with it


class BootRefused(Exception):
    """A boot the console refuses: its one-line reason names the node and where it came from."""


class Keyring:
    """The keys in use now, by id."""

    def __init__(self) -> None:
        self._keys: dict[str, DialKey] = {}
        self._steps = 0

    def get(self, kid: str) -> DialKey | None:
        return self._keys.get(kid)

    def new_step(self, hosts: frozenset[str]) -> tuple[int, bytes]:
        """A fresh key for a new step on ``hosts``: the step's number and the key."""
        self._steps += 1
        key = secrets.token_bytes(KEY_BYTES)
        self._keys[key_id(key)] = DialKey(key, KeyUse.STEP, self._steps, hosts)
        return self._steps, key

    def end_step(self, step: int) -> None:
        """The step's srun ended: its key proves nothing any more (its nodes' keys stay: their
        dials may still be connected)."""
        for kid, k in list(self._keys.items()):
            if k.use is KeyUse.STEP and k.step == step:
                del self._keys[kid]

    def claim(self, step_key: DialKey, host: str, peer: str) -> bytes:
        """``host`` booted with ``step_key``: a fresh key of its own (one that an earlier step made
        for it is dropped). BootRefused for a node not in the step, or one that booted already."""
        if host not in step_key.hosts:
            raise BootRefused(f"refused a boot for {host!r} from {peer}: not a node of step {step_key.step}")
        if host in step_key.booted:
            raise BootRefused(
                f"{host}: refused a second boot for this node from {peer} in step {step_key.step}: "
                "someone else holds the step's key; the node's connections are closed"
            )
        step_key.booted.add(host)
        for kid, k in list(self._keys.items()):
            if k.use is KeyUse.NODE and k.hosts == {host}:
                del self._keys[kid]
        key = secrets.token_bytes(KEY_BYTES)
        self._keys[key_id(key)] = DialKey(key, KeyUse.NODE, step_key.step, frozenset({host}))
        return key

    def clear(self) -> None:
        self._keys.clear()
