"""The exit codes in words: one table, from which ``mscon --help`` is written and against which
the README's "Exit codes" section is tested (tests/unit/test_cli_edges.py)."""

from __future__ import annotations

from mscon.console.engine import exit_codes

# (code, meaning), in the README's order; None: the codes a failed run passes on from its ranks.
EXIT_CODES: tuple[tuple[int | None, str], ...] = (
    (exit_codes.OK, "success"),
    (exit_codes.INTERNAL, "a bug in mscon, or ranks that ended without a verdict"),
    (exit_codes.USAGE, "usage or inventory error"),
    (exit_codes.PREFLIGHT, "a preflight check failed"),
    (exit_codes.UNREACHABLE, "a node could not be reached, prepared, or was lost"),
    (exit_codes.HUNG, "the root cause is a hung or stopped rank"),
    (None, "the root-cause rank's exit code (or 128 + signal, e.g. 137 for SIGKILL) for a failed run"),
    (exit_codes.INTERRUPTED, "interrupted"),
    (exit_codes.OUTPUT_CLOSED, "stdout closed"),
)
AFTERWORD = "mscon run --detach and leaving an attached run exit 0."


def exit_codes_text() -> str:
    """The list as the help's epilog prints it (argparse wraps it; ASCII, for any locale)."""
    items = (f"{code} {meaning}" if code is not None else meaning for code, meaning in EXIT_CODES)
    return "Exit codes: " + "; ".join(items) + ". " + AFTERWORD


# ``mscon check --resume`` passes on the codes of the check it runs (``mscon_resume.check``, whose
# ``check_compare.Kind`` holds the same: tests/unit/test_resume_check.py): (code, kind, meaning).
RESUME_CHECK_CODES: tuple[tuple[int, str, str], ...] = (
    (0, "EXACT", "the relaunch resumed and wrote and printed what the uninterrupted run did"),
    (1, "DIFFERS", "the relaunch differs (the first difference is said)"),
    (2, "USAGE", "usage error"),
    (3, "REFUSED", "the relaunch refused to resume (the library says why, and the fix)"),
    (4, "FAILS", "the script fails uninterrupted"),
    (5, "STARTS_OVER", "the relaunch started over: exact, but no resume"),
)


def resume_check_codes_text() -> str:
    return "; ".join(f"{code} {meaning}" for code, _, meaning in RESUME_CHECK_CODES)
