"""MSCON_SNAPSHOT_KEY (mscon_resume/env.py): a value that is not a key ends the rank at once with one
line, never a silent fall back to another key, and the line never holds the secret."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mscon_resume import env

GOOD = "ab" * env.KEY_BYTES


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("zz" * env.KEY_BYTES, "is not hex"),
        (GOOD[:-1], "is not hex"),  # an odd count of digits
        ("ab" * (env.KEY_BYTES - 1), f"holds {env.KEY_BYTES - 1} bytes"),
        ("00", "holds 1 bytes"),
    ],
)
def test_a_bad_key_is_one_line_at_once(monkeypatch: pytest.MonkeyPatch, value: str, said: str) -> None:
    monkeypatch.setenv(env.SNAPSHOT_KEY, value)
    with pytest.raises(env.BadKey) as caught:
        env.snapshot_key()
    message = str(caught.value.code)
    assert said in message and env.SNAPSHOT_KEY in message and "\n" not in message
    assert value not in message  # a secret, even a bad one


def test_a_good_key_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.SNAPSHOT_KEY, f" {GOOD}\n")
    assert env.snapshot_key() == bytes.fromhex(GOOD)
    monkeypatch.setenv(env.SNAPSHOT_KEY, GOOD + "cd")  # longer than the digest is a key too
    assert env.snapshot_key() == bytes.fromhex(GOOD + "cd")
    monkeypatch.delenv(env.SNAPSHOT_KEY)
    assert env.snapshot_key() is None  # unset: the library keys its own private folder


def test_a_rank_with_a_bad_key_stops_with_one_line() -> None:
    """As a rank sees it: exit 1, one line on stderr, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", "from mscon_resume import env; env.snapshot_key(); print('went on')"],
        env={**os.environ, env.SNAPSHOT_KEY: "not-a-key"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "went on" not in proc.stdout
    assert proc.stderr.strip().splitlines() == [f"mscon_resume: {env.SNAPSHOT_KEY} is not hex (9 characters)"]
