"""The snapshot file's format: every array's raw bytes, a header, and one MAC over all of it.

    "MSCSNAP1" | the header's offset (u64, little-endian) | zeros to 64
    | each array's bytes, each from a multiple of 64 | the header (JSON)
    | HMAC-SHA256 of every byte before it (32)

The header holds the metadata (step, epoch, position, random state, ...) and each array's name,
dtype, shape and offset. An array's offset depends only on the arrays before it (:func:`place`),
so the training thread can copy the parameters straight into a file's pages before the rest is
known (``store.Writer``), and ``dump`` then only MACs them (``placed``). No checksum of its own:
the MAC authenticates every byte, so a damaged, truncated or rewritten file fails it (np.savez's
zip, the format before, spent a CRC-32 pass over every member on top of the MAC: 25 ms of
ResNet-18's 89 MiB). ``dump`` writes from the file's start over whatever it held (a dropped
snapshot's pages: node memory already allocated, 18 ms against 48 ms for a new file of that
size) and cuts the rest.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
import time
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

MAGIC = b"MSCSNAP1"
SUFFIX = ".msnap"  # a snapshot file's name: snap_<step>.msnap
ALIGN = 64  # each array starts here: a multiple of any dtype's size, and of a cache line
MAC_BYTES = 32
_LEN = struct.Struct("<Q")
_ZEROS = bytes(ALIGN)


class Unreadable(ValueError):
    """Not a snapshot file this format can read (too short, another format, a bad header)."""


class MacMismatch(ValueError):
    """Its MAC does not match under the key: damaged, truncated, or not written under this key."""


@dataclass(frozen=True)
class Costs:
    """One dump's CPU time (the writing thread's own), by part."""

    mac_s: float  # HMAC-SHA256 over every byte
    io_s: float  # the bytes into the file (a copy into node memory's pages)


def _pad(n: int) -> int:
    return -n % ALIGN


def place(arrays: dict[str, np.ndarray]) -> tuple[list[list], int]:
    """Each array's ``[name, dtype, shape, offset]`` in the file, in order, and where they end."""
    index, at = [], ALIGN
    for name, a in arrays.items():
        if a.dtype.hasobject:
            raise TypeError(f"array {name!r} holds Python objects: a snapshot holds numbers only")
        at += _pad(at)
        index.append([name, a.dtype.str, list(a.shape), at])
        at += a.nbytes
    return index, at


def _raw(a: np.ndarray) -> memoryview:
    """An array's bytes, in C order, without a copy where it already is contiguous."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def dump(
    f: BinaryIO, arrays: dict[str, np.ndarray], info: dict, key: bytes, placed: frozenset = frozenset()
) -> Costs:
    """Write ``arrays`` and ``info`` to ``f`` (from its start) with their MAC under ``key``.
    ``placed``: names of arrays whose bytes the file already holds where :func:`place` puts them
    (copied into its mapped pages): MACed, not written again."""
    index, end = place(arrays)
    header = json.dumps({"info": info, "arrays": index}).encode()
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac_s = io_s = 0.0

    def put(data: bytes | memoryview, write: bool = True) -> None:
        nonlocal mac_s, io_s
        c0 = time.thread_time()
        mac.update(data)
        c1 = time.thread_time()
        if write:
            f.write(data)
        mac_s, io_s = mac_s + c1 - c0, io_s + time.thread_time() - c1

    f.seek(0)
    head = MAGIC + _LEN.pack(end)
    put(head + _ZEROS[: ALIGN - len(head)])
    at = ALIGN
    for (name, _, _, offset), a in zip(index, arrays.values()):
        if offset > at:
            f.seek(at)
            put(_ZEROS[: offset - at])
        if name in placed:
            put(_raw(a), write=False)
        else:
            f.seek(offset)
            put(_raw(a))
        at = offset + a.nbytes
    f.seek(end)
    put(header)
    f.write(mac.digest())
    f.truncate()  # a reused file's tail, beyond what this snapshot holds
    return Costs(mac_s, io_s)


def load(data: bytearray, key: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """(info, arrays) of a whole file's bytes, once its MAC matches under ``key``. The arrays are
    views of ``data`` (no copy). Raises :class:`Unreadable` or :class:`MacMismatch`."""
    if len(data) < ALIGN + MAC_BYTES or bytes(data[: len(MAGIC)]) != MAGIC:
        raise Unreadable("not a snapshot file of this format")
    body = memoryview(data)[:-MAC_BYTES]
    want = hmac.new(key, body, hashlib.sha256).digest()
    if not hmac.compare_digest(want, bytes(data[-MAC_BYTES:])):
        raise MacMismatch("its MAC does not match")
    # Authenticated from here: what follows guards against this module's own mistakes only.
    try:
        (end,) = _LEN.unpack_from(data, len(MAGIC))
        header = json.loads(bytes(body[end:]).decode())
        info, index = header["info"], header["arrays"]
        arrays = {}
        for name, dtype_str, shape, offset in index:
            dtype = np.dtype(dtype_str)
            count = math.prod(shape)
            if dtype.hasobject or offset < ALIGN or offset + count * dtype.itemsize > end:
                raise Unreadable(f"array {name!r} out of the file")
            arrays[name] = np.frombuffer(data, dtype, count, offset).reshape(shape)
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, Unreadable):
            raise
        raise Unreadable(f"bad header ({type(exc).__name__})") from None
    return info, arrays
