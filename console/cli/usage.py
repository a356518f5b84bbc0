"""The one form of a command-line usage error: ``mscon: ...`` on stderr, exit 2, whether argparse
or mscon found it; and the argument types that refuse a bad value while the line is parsed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from mscon.console.engine import exit_codes, run_ids
from mscon.console.engine.summary import is_stdout, json_target


def usage_error(message: str) -> int:
    print(f"mscon: {message}", file=sys.stderr)
    return exit_codes.USAGE


class MsconParser(argparse.ArgumentParser):
    """argparse with mscon's error form: one line, ``mscon: MESSAGE (see: mscon CMD --help)``,
    rather than the usage and ``mscon CMD: error: MESSAGE``. Subparsers inherit it."""

    def error(self, message: str) -> NoReturn:
        usage_error(f"{message} (see: {self.prog} --help)")
        sys.exit(exit_codes.USAGE)


def run_id_arg(text: str) -> str:
    """A run id (``--run-id``, ``RUN_ID``): refused unless a plain label, as it names a folder here
    and on every node (``../x`` would write outside the runs' folder)."""
    problem = run_ids.label_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def json_path_arg(text: str) -> Path:
    """``--json PATH``: into a folder that exists (a mistyped folder is an error, not a new tree)."""
    path = json_target(text)
    if not is_stdout(path) and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {path.parent}")
    return path
