"""Why a node could not be reached, in short, and what to do about it: per transport, from the
one-line error the transport raised. Shared by the run's own line for an unreachable node and by
preflight's result for it, so both give the same cause and remedy.

SSH failures are told apart in the order ``ssh`` meets them: the name does not resolve, the
connection is refused or times out, the port answers but is not an SSH server, the host key is
unknown or changed, authentication is refused. ``resolve`` and ``BannerWatch`` are how the SSH
transport tells the first and the third apart from the rest."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

from mscon.console.transport.base import NodeUnreachable, TransportKind

_SAID_MAX = 80  # characters of a non-SSH server's first line quoted


@dataclass(frozen=True, slots=True)
class Problem:
    value: str  # the cause in a word or two ("refused", "auth failed")
    remedy: str  # what to do, "" when nothing specific is known


def problem(kind: TransportKind, error: str) -> Problem:
    """The cause and remedy of ``error``, raised by a transport of ``kind``."""
    found = _entry(kind, error)
    return Problem("unreachable", "") if found is None else Problem(found[1], found[2])


def line(kind: TransportKind, error: str) -> str:
    """The one line that tells an unreachable node: the error, the transport it failed on, the remedy
    (once: not where the error already gives its own, more precise one)."""
    found = _entry(kind, error)
    remedy = ""
    if found is not None:
        told = found[3]
        remedy = "" if told is not None and told in error else found[2]
    return f"{error} (via {kind.value})" + (f" -> {remedy}" if remedy else "")


def _entry(kind: TransportKind, error: str) -> tuple[str, str, str, str | None] | None:
    for entry in _BY_KIND[kind]:
        if entry[0].lower() in error.lower():
            return entry
    return None


# ---------------------------------------------------------------------------- telling them apart


async def resolve(who: str, host: str, port: int, timeout_s: float) -> None:
    """Raise the one-line error for a host name that does not resolve here (ssh's first step)."""
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout_s)
    except TimeoutError:
        raise NodeUnreachable(f"{who}: {CANNOT_RESOLVE} {host}: no answer within {timeout_s:g} s") from None
    except socket.gaierror as exc:
        raise NodeUnreachable(f"{who}: {CANNOT_RESOLVE} {host}: {exc.strerror or exc}") from None
    except UnicodeError as exc:  # a label too long for IDNA
        raise NodeUnreachable(f"{who}: {CANNOT_RESOLVE} {host}: {exc}") from None


class BannerWatch:
    """How far one SSH connection got: whether TCP connected, and what the server sent first.
    ``client(base)`` is the ``client_factory`` to pass; ``failed`` the error once it did not."""

    def __init__(self) -> None:
        self.connected = False
        self.conn: object | None = None
        self.first = b""

    def client(self, base: type) -> type:
        watch = self

        class _Watched(base):  # type: ignore[valid-type,misc]
            def connection_made(self, conn: object) -> None:
                watch.connected, watch.conn = True, conn
                received = conn.data_received  # type: ignore[attr-defined]

                def first(data: bytes, datatype: object = None) -> None:
                    watch.first = bytes(data[:512])
                    del conn.data_received  # type: ignore[attr-defined]  # once: not on the data path
                    received(data, datatype)

                conn.data_received = first  # type: ignore[attr-defined]
                super().connection_made(conn)

        return _Watched

    def banner_error(self, who: str, exc: BaseException, timeout_s: float) -> NodeUnreachable | None:
        """The one-line error when the server connected but never sent an SSH version line, else None."""
        if not self.connected or self.conn is None:
            return None  # refused, timed out, or no route: before any server answered
        if self.conn.get_extra_info("server_version"):  # type: ignore[attr-defined]
            return None  # an SSH server: what failed came later (host key, auth)
        said = self.first.split(b"\n", 1)[0].rstrip(b"\r").decode("ascii", "replace")
        said = "".join(c if c.isprintable() else "?" for c in said)[:_SAID_MAX]
        if said.startswith("SSH-"):
            return None  # an SSH server after all (an SSH version asyncssh does not speak)
        if said:
            return NodeUnreachable(f"{who}: {NOT_SSH}: it answered {said!r} instead of an SSH banner")
        if isinstance(exc, TimeoutError):  # ssh: "Connection timed out during banner exchange"
            return NodeUnreachable(f"{who}: connect timed out after {timeout_s:g} s {DURING_BANNER}")
        return NodeUnreachable(f"{who}: {NO_BANNER} ({exc})")


# The keys asyncssh (as ssh) offers when no IdentityFile is named, where they exist.
_DEFAULT_KEYS = ("id_ed25519_sk", "id_ecdsa_sk", "id_ed448", "id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")


def auth_refused(user: str, host: str, port: int, named: list[str], reason: str) -> str:
    """Authentication refused: as whom, which keys were offered, how to put the right one there.
    ``named``: the key files the inventory or the ssh config names (none: ssh's defaults)."""
    keys = [os.path.expanduser(k) for k in named]
    if not keys:
        ssh_dir = os.path.expanduser("~/.ssh")
        keys = [f"{ssh_dir}/{n}" for n in _DEFAULT_KEYS if os.path.isfile(f"{ssh_dir}/{n}")]
    offered = ", ".join(keys)
    if os.environ.get("SSH_AUTH_SOCK"):
        offered = f"{offered} and the ssh agent's keys" if offered else "the ssh agent's keys"
    where = f"-p {port} {user}@{host}" if port != 22 else f"{user}@{host}"
    return (
        f"authentication failed as {user} ({reason}; offered: {offered or 'no key'}): add the key to "
        f"{user}'s ~/.ssh/authorized_keys there (ssh-copy-id -i {keys[0] if keys else 'KEY'} {where}), "
        "or name the right one (the node's identity_file, or IdentityFile in your ssh config)"
    )


CANNOT_RESOLVE = "cannot resolve"
NOT_SSH = "not an SSH server"
DURING_BANNER = "during the banner exchange (it accepted the connection but sent no SSH banner)"
NO_BANNER = "the server closed the connection before its SSH banner"

# (text in the one-line error, the cause in short, remedy, told): ``told`` is what shows the error
# already carries its own remedy (None: it never does; "": it always does), so it is said once.
# In ssh's order, then what follows the connection.
_SSH: tuple[tuple[str, str, str, str | None], ...] = (
    (
        CANNOT_RESOLVE,
        "name does not resolve",
        "check the host name, or its HostName in your ssh config (ssh -G HOST shows it)",
        None,
    ),
    (
        DURING_BANNER,
        "timed out",
        "sshd hung or overloaded on that host, or not an SSH server (wrong port?): try ssh -v",
        None,
    ),
    (
        "timed out",
        "timed out",
        "is the host up and its SSH port open (firewall)? ssh.connect_timeout_s",
        None,
    ),
    ("refused", "refused", "is sshd running on that host and port?", None),
    (
        NOT_SSH,
        "not SSH",
        "wrong port? the node's port (Port in your ssh config) must be sshd's",
        None,
    ),
    (
        NO_BANNER,
        "no SSH banner",
        "wrong port, or sshd turning connections away (MaxStartups, tcp wrappers)? try ssh -v",
        None,
    ),
    (
        "HOST KEY MISMATCH",
        "host key changed",
        "if the host was reinstalled: ssh-keygen -R HOST, verify the new key, add it",
        "",
    ),
    (
        "unknown host key",
        "unknown host key",
        "verify the key and add it to known_hosts, or --accept-new-host-keys",
        "",
    ),
    (
        "no known host keys",
        "no known_hosts",
        "create known_hosts with the node's key, or --accept-new-host-keys",
        "",
    ),
    (
        "authentication failed",
        "auth failed",
        "check user and identity_file: does ssh -i KEY USER@HOST work? (ssh-copy-id -i KEY USER@HOST)",
        "ssh-copy-id",
    ),
    (
        "no SFTP subsystem",
        "no SFTP",
        "add 'Subsystem sftp internal-sftp' to the node's sshd_config; reload sshd",
        None,
    ),
    (
        "the agent did not start",
        "no agent",
        "check the node's python: in the inventory (it must exist there)",
        None,
    ),
)
# srun's step: the shell's 127 is a command it could not find (the node's python, mostly).
_SRUN: tuple[tuple[str, str, str, str | None], ...] = (
    (
        "exited with 127",
        "python not found",
        "check the node's python: in the inventory (it must exist on every node of the allocation)",
        None,
    ),
    (
        "the agent did not start",
        "no agent",
        "check the node's python: in the inventory (it must exist there)",
        None,
    ),
    (
        "did not connect back",
        "no agent",
        "can the nodes reach this console's address (MSCON_CONSOLE_ADDRESS)?",
        None,
    ),
)
_LOCAL: tuple[tuple[str, str, str, str | None], ...] = (
    (
        "the agent did not start",
        "no agent",
        "check python: in the inventory (it must exist on this machine)",
        None,
    ),
)
_BY_KIND = {
    TransportKind.SSH: _SSH,
    TransportKind.SRUN: _SRUN,
    TransportKind.LOCAL: _LOCAL,
}
