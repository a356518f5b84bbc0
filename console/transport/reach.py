"""Why a node could not be reached, in short, and what to do about it: per transport, from the
one-line error the transport raised. Shared by the run's own line for an unreachable node and by
preflight's result for it, so both give the same cause and remedy."""

from __future__ import annotations

from dataclasses import dataclass

from mscon.console.transport.base import TransportKind


@dataclass(frozen=True, slots=True)
class Problem:
    value: str  # the cause in a word or two ("refused", "auth failed")
    remedy: str  # what to do, "" when nothing specific is known


def problem(kind: TransportKind, error: str) -> Problem:
    """The cause and remedy of ``error``, raised by a transport of ``kind``."""
    for needle, value, remedy in _BY_KIND[kind]:
        if needle.lower() in error.lower():
            return Problem(value, remedy)
    return Problem("unreachable", "")


def line(kind: TransportKind, error: str) -> str:
    """The one line that tells an unreachable node: the error, the transport it failed on, the remedy."""
    remedy = problem(kind, error).remedy
    return f"{error} (via {kind.value})" + (f" -> {remedy}" if remedy else "")


# (text in the one-line error, the cause in short, remedy)
_SSH = (
    (
        "HOST KEY MISMATCH",
        "host key changed",
        "if the host was reinstalled: ssh-keygen -R HOST, verify the new key, add it",
    ),
    (
        "unknown host key",
        "unknown host key",
        "verify the key and add it to known_hosts, or --accept-new-host-keys",
    ),
    (
        "no known host keys",
        "no known_hosts",
        "create known_hosts with the node's key, or --accept-new-host-keys",
    ),
    (
        "no SFTP subsystem",
        "no SFTP",
        "add 'Subsystem sftp internal-sftp' to the node's sshd_config; reload sshd",
    ),
    ("authentication failed", "auth failed", "check user and identity_file: does ssh -i KEY USER@HOST work?"),
    ("timed out", "timed out", "is the host up and its SSH port open (firewall)? ssh.connect_timeout_s"),
    ("refused", "refused", "is sshd running on that host and port?"),
    (
        "the agent did not start",
        "no agent",
        "check the node's python: in the inventory (it must exist there)",
    ),
)
# srun's step: the shell's 127 is a command it could not find (the node's python, mostly).
_SRUN = (
    (
        "exited with 127",
        "python not found",
        "check the node's python: in the inventory (it must exist on every node of the allocation)",
    ),
    (
        "the agent did not start",
        "no agent",
        "check the node's python: in the inventory (it must exist there)",
    ),
    (
        "did not connect back",
        "no agent",
        "can the nodes reach this console's address (MSCON_CONSOLE_ADDRESS)?",
    ),
)
_LOCAL = (
    (
        "the agent did not start",
        "no agent",
        "check python: in the inventory (it must exist on this machine)",
    ),
)
_BY_KIND = {
    TransportKind.SSH: _SSH,
    TransportKind.SRUN: _SRUN,
    TransportKind.LOCAL: _LOCAL,
}
