"""The environment variables the library reads: set by mscon's agent for every rank, or by hand.

Under mscon nothing needs setting. Under plain ``python``/``msrun`` set ``MSCON_RESUME=1`` on the
relaunch after a failure (and, if the default folder does not suit, ``MSCON_STATE_DIR``).
"""

from __future__ import annotations

import os

ATTEMPT = "MSCON_ATTEMPT"  # the agent: this attempt's number (0 first); > 0 resumes
RESUME = "MSCON_RESUME"  # by hand: 1 resumes at the newest step every rank has (plain python/msrun)
STATE_DIR = "MSCON_STATE_DIR"  # where snapshots may go if /dev/shm has no room (the agent: the run folder's)
SNAPSHOT_KEY = "MSCON_SNAPSHOT_KEY"  # the agent: the run's secret (hex); a snapshot must carry its MAC
METRICS = "MSCON_METRICS"  # the agent: the rank's metrics file (JSON lines)
CHECK_KILL_AT = "MSCON_CHECK_KILL_AT"  # the resume check: rank 0 of attempt 0 dies once step N is kept
DEFAULT_STATE_DIR = ".mscon-state"  # under the current folder, when neither argument nor variable says


REFUSED_EXIT = 65  # a relaunch that cannot resume exactly stops with this code (EX_DATAERR), said


def attempt_given() -> bool:
    """Whether mscon's agent started this rank (it then decides when snapshots go)."""
    return bool(os.environ.get(ATTEMPT, "").strip())


def attempt() -> int:
    try:
        return max(0, int(os.environ.get(ATTEMPT, "0")))
    except ValueError:
        return 0


def resuming() -> bool:
    """Whether this launch continues an earlier one: a restarted attempt under mscon, or
    ``MSCON_RESUME=1`` by hand."""
    return attempt() > 0 or os.environ.get(RESUME, "").strip().lower() in ("1", "true", "yes")


def state_dir(given: str | None) -> str:
    return os.path.abspath(given or os.environ.get(STATE_DIR) or DEFAULT_STATE_DIR)


KEY_BYTES = 32  # HMAC-SHA256: a key shorter than its digest weakens the MAC (RFC 2104)


class BadKey(SystemExit):
    """``MSCON_SNAPSHOT_KEY`` is set but is no key: the process ends at once, in one line (a
    weak or garbled key must not quietly give way to another one)."""


def snapshot_key() -> bytes | None:
    """The run's key from ``MSCON_SNAPSHOT_KEY`` (None: unset, the library keys its own private
    folder). :class:`BadKey` if it is not hex or shorter than ``KEY_BYTES`` bytes; the message
    never holds the value, a secret."""
    text = os.environ.get(SNAPSHOT_KEY, "").strip()
    if not text:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise BadKey(f"mscon_resume: {SNAPSHOT_KEY} is not hex ({len(text)} characters)") from None
    if len(key) < KEY_BYTES:
        raise BadKey(
            f"mscon_resume: {SNAPSHOT_KEY} holds {len(key)} bytes; a key is at least {KEY_BYTES} "
            f"({2 * KEY_BYTES} hex digits)"
        )
    return key


def check_kill_at() -> int | None:
    """The step after which the resume check's first attempt is killed (None: not a check).
    Only the first attempt: the restarted one must run to its end."""
    text = os.environ.get(CHECK_KILL_AT, "").strip()
    if not text or resuming():
        return None
    try:
        return max(1, int(text))
    except ValueError:
        return None
