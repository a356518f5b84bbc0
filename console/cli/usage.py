"""The one form of a command-line usage error: ``mscon: error: ...`` on stderr, exit 2."""

from __future__ import annotations

import sys

from mscon.console.engine import exit_codes


def usage_error(message: str, command: str = "mscon") -> int:
    print(f"{command}: error: {message}", file=sys.stderr)
    return exit_codes.USAGE
