"""``mscon completion SHELL``: a completion script for bash, zsh or tcsh, generated from the
command line's own parser (shtab), so it never lags behind a new flag."""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "tcsh")


def add_completion_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, tcsh)",
        description='Print a completion script for SHELL. bash: eval "$(mscon completion bash)" in '
        "~/.bashrc; zsh: mscon completion zsh > a folder on $fpath as _mscon.",
    )
    p.add_argument("shell", choices=SHELLS)


def completion_main(parser: argparse.ArgumentParser, shell: str) -> int:
    import shtab

    print(shtab.complete(parser, shell=shell))
    return 0
