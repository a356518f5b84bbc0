"""mscon_resume/snapfile.py: the snapshot file's format (raw arrays, one MAC over every byte)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mscon_resume import snapfile

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "conv.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "step": np.array(7, dtype=np.int64),  # 0-d
        "empty": np.zeros((0, 5), dtype=np.float32),
        "mask": rng.integers(0, 2, 13).astype(bool),  # 13 bytes: the next array is padded to 64
        "half": rng.standard_normal(9).astype(np.float16),
        "big_endian": np.arange(5, dtype=">f8"),
        "transposed": rng.standard_normal((3, 7)).astype(np.float32).T,  # not C-contiguous
        "rng_state": np.arange(624, dtype=np.uint32),
    }


def _dump(arrays: dict[str, np.ndarray], info: dict, key: bytes = KEY) -> bytearray:
    buf = io.BytesIO()
    snapfile.dump(buf, arrays, info, key)
    return bytearray(buf.getvalue())


def test_round_trip_of_every_dtype_and_shape_each_array_aligned() -> None:
    arrays = _arrays()
    info = {"step": 3, "epoch": 1, "rng": {"numpy": ["MT19937", 5]}, "carried": {"total": 1.5}}
    data = _dump(arrays, info)
    assert data.startswith(snapfile.MAGIC)
    got_info, got = snapfile.load(data, KEY)
    assert got_info == info and list(got) == list(arrays)
    base = np.frombuffer(data, np.uint8).ctypes.data
    for name, want in arrays.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want)
        if got[name].size:
            assert (got[name].ctypes.data - base) % snapfile.ALIGN == 0, name


def test_arrays_of_python_objects_are_refused() -> None:
    with pytest.raises(TypeError, match="'o' holds Python objects"):
        _dump({"o": np.array([{}, 1], dtype=object)}, {})


@pytest.mark.parametrize(
    "damage",
    ["header", "array", "padding", "mac", "cut", "cut_to_the_mac", "appended", "other_key"],
)
def test_any_byte_changed_or_missing_fails_the_mac(damage: str) -> None:
    data = _dump(_arrays(), {"step": 3})
    key = KEY
    if damage == "header":
        data[data.index(b'"step": 3') + 8] = ord("4")  # a later step claimed
    elif damage == "array":
        data[snapfile.ALIGN] ^= 0x01  # the first array's first byte
    elif damage == "padding":  # the zeros between the 13-byte mask and the next array
        data[data.index(np.frombuffer(_arrays()["mask"], np.uint8).tobytes()) + 14] = 1
    elif damage == "mac":
        data[-1] ^= 0x80
    elif damage == "cut":
        data = data[:-100]
    elif damage == "cut_to_the_mac":
        data = data[: -snapfile.MAC_BYTES]
    elif damage == "appended":
        data += b"\0" * 64
    else:
        key = OTHER_KEY
    with pytest.raises(snapfile.MacMismatch):
        snapfile.load(data, key)


@pytest.mark.parametrize("data", [b"", b"MSCSNAP1", b"PK\x03\x04" + bytes(100), b"MSCSNAP0" + bytes(100)])
def test_what_is_not_this_format_is_unreadable(data: bytes) -> None:
    with pytest.raises(snapfile.Unreadable):
        snapfile.load(bytearray(data), KEY)


def test_arrays_already_in_the_file_are_maced_not_written_again() -> None:
    """What the training thread copied into a file's mapped pages (``placed``) is where
    :func:`snapfile.place` puts it; ``dump`` writes the rest around it and MACs all of it."""
    arrays = _arrays()
    index, _ = snapfile.place(arrays)
    f = io.BytesIO()
    first = index[0]
    f.seek(first[3])
    f.write(arrays[first[0]].tobytes())  # the copy into the file, before dump
    placed = frozenset([first[0]])
    snapfile.dump(f, arrays, {"step": 1}, KEY, placed=placed)
    assert bytearray(f.getvalue()) == _dump(arrays, {"step": 1})
    # Not in the file after all: the MAC, taken over the array, does not match what the file holds.
    g = io.BytesIO()
    snapfile.dump(g, arrays, {"step": 1}, KEY, placed=placed)
    with pytest.raises(snapfile.MacMismatch):
        snapfile.load(bytearray(g.getvalue()), KEY)


def test_dump_over_a_longer_file_cuts_its_tail() -> None:
    """A dropped snapshot's file, written over from its start: what it held beyond goes."""
    f = io.BytesIO()
    snapfile.dump(f, {"w": np.ones(1000, np.float32)}, {"step": 1}, KEY)
    longer = len(f.getvalue())
    f.seek(0)
    costs = snapfile.dump(f, {"w": np.zeros(10, np.float32)}, {"step": 2}, KEY)
    data = bytearray(f.getvalue())
    assert len(data) < longer
    info, arrays = snapfile.load(data, KEY)
    assert info == {"step": 2}
    np.testing.assert_array_equal(arrays["w"], np.zeros(10, np.float32))
    assert costs.mac_s >= 0 and costs.io_s >= 0
