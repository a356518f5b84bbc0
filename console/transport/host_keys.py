"""Host keys looked up where OpenSSH looks for them, and first-seen keys recorded as ``accept-new`` does.

Where: the ``UserKnownHostsFile`` list of the host's ssh config (default ``~/.ssh/known_hosts
~/.ssh/known_hosts2``) and its ``GlobalKnownHostsFile`` list (default ``/etc/ssh/ssh_known_hosts
/etc/ssh/ssh_known_hosts2``), read from ``~/.ssh/config`` then ``/etc/ssh/ssh_config`` (only from
the inventory's ``ssh.config`` when it names one, as ``ssh -F`` does). The inventory's
``ssh.known_hosts`` replaces both lists with that one file. Missing files are skipped, as ssh does.

Unlike ssh, no setting turns checking off (``UserKnownHostsFile none`` or ``/dev/null``,
``StrictHostKeyChecking no``): asyncssh always gets a lookup from here, never ``None``.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

DEFAULT_USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
USER_CONFIG = "~/.ssh/config"
_TOKEN = re.compile(r"%(.)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CHECKING_OFF = re.compile(r"^\s*StrictHostKeyChecking(\s*=\s*|\s+)[\"']?(no|off)\b", re.I | re.M)
_MAX_NAMED = 3  # matching lines named in a mismatch message


@dataclass(frozen=True)
class HostKeyFiles:
    """Every known-hosts file OpenSSH would read for one host, in its order (paths expanded)."""

    user: tuple[str, ...]  # UserKnownHostsFile: read, and the first one is written by accept-new
    system: tuple[str, ...]  # GlobalKnownHostsFile: read only
    checking_off_in_config: bool = False  # the config would make ssh skip the check; mscon does not

    @property
    def all(self) -> tuple[str, ...]:
        return self.user + self.system

    def existing(self) -> tuple[str, ...]:
        return tuple(p for p in self.all if os.path.exists(p) and not os.path.isdir(p))

    @property
    def record_to(self) -> str | None:
        return self.user[0] if self.user else None


@dataclass(frozen=True)
class Target:
    """The host as the ssh config resolves it: what the files' ``%`` tokens and entries refer to."""

    alias: str  # the name given (``node-a``)
    hostname: str  # after HostName
    port: int
    user: str
    host_key_alias: str | None = None

    @property
    def key_name(self) -> str:
        """What known_hosts entries are keyed by (asyncssh's rule: HostKeyAlias, else HostName)."""
        return self.host_key_alias or self.hostname

    @property
    def entry(self) -> str:
        return self.key_name if self.port == 22 else f"[{self.key_name}]:{self.port}"


def config_paths(inventory_config: str | None, system_config: str = SYSTEM_CONFIG) -> list[str]:
    """The ssh config files ssh reads, in its order: ``-F FILE`` alone, else the user's then the system's."""
    if inventory_config:
        return [inventory_config]
    candidates = (os.path.expanduser(USER_CONFIG), system_config)
    return [p for p in candidates if os.path.isfile(p) and os.access(p, os.R_OK)]


def host_key_files(
    target: Target,
    configs: Sequence[str],
    override: str | None = None,
) -> HostKeyFiles:
    """Where the keys of ``target`` are looked up. ``override``: the inventory's ``ssh.known_hosts``.

    Raises ``ValueError`` for a config that cannot be read or a path with an unknown ``%`` token."""
    if override:
        return HostKeyFiles(user=(os.path.expanduser(override),), system=())
    user_list, global_list = _known_hosts_settings(target, configs)
    tokens = _tokens(target)
    user = tuple(_expand(p, tokens) for p in (DEFAULT_USER_FILES if user_list is None else user_list))
    system = tuple(_expand(p, tokens) for p in (DEFAULT_GLOBAL_FILES if global_list is None else global_list))
    off = user_list == [] or os.devnull in user or any(_says_checking_off(c) for c in configs)
    return HostKeyFiles(user=user, system=system, checking_off_in_config=off)


def _known_hosts_settings(
    target: Target, configs: Sequence[str]
) -> tuple[list[str] | None, list[str] | None]:
    """(UserKnownHostsFile, GlobalKnownHostsFile) as the configs set them for this host: None when
    unset, [] for ``none``. asyncssh reads the files (Host and Match blocks, Include) exactly as it
    does for the connection itself."""
    # No keys are loaded here (client_keys None): only the config is wanted.
    kw: dict = {"host": target.alias, "port": target.port, "username": target.user, "client_keys": None}
    try:
        opts = asyncssh.SSHClientConnectionOptions(config=list(configs), **kw)
    except (OSError, ValueError, asyncssh.Error) as exc:
        raise ValueError(f"cannot read the ssh config ({', '.join(configs)}): {exc}") from None
    config = opts.config

    def listed(option: str) -> list[str] | None:
        value = config.get(option)
        return None if value is None else [str(v) for v in value]  # type: ignore[union-attr]

    return listed("UserKnownHostsFile"), listed("GlobalKnownHostsFile")


def _says_checking_off(path: str) -> bool:
    """Whether the file sets StrictHostKeyChecking no in any block (asyncssh does not read that
    option): used only to say, in a refusal, that mscon checks anyway."""
    try:
        return bool(_CHECKING_OFF.search(Path(path).read_text(errors="replace")))
    except OSError:
        return False


def _tokens(target: Target) -> dict[str, str]:
    local = socket.gethostname()
    try:
        local_user = getpass.getuser()
    except (KeyError, OSError):
        local_user = str(os.getuid())
    conn = hashlib.sha1(f"{local}{target.hostname}{target.port}{target.user}".encode()).hexdigest()
    return {
        "%": "%",
        "C": conn,
        "d": os.path.expanduser("~"),
        "h": target.hostname,
        "i": str(os.getuid()),
        "k": target.host_key_alias or target.alias,
        "L": local.split(".")[0],
        "l": local,
        "n": target.alias,
        "p": str(target.port),
        "r": target.user,
        "u": local_user,
    }


def _expand(path: str, tokens: dict[str, str]) -> str:
    """``~``, ``%`` tokens and ``${VAR}`` as OpenSSH expands them in UserKnownHostsFile."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            if m.group(1) not in tokens:
                raise ValueError(f"unknown token %{m.group(1)} in known-hosts file {path!r} (ssh config)")
            return tokens[m.group(1)]
        if m.group(2) not in os.environ:
            raise ValueError(f"${{{m.group(2)}}} in known-hosts file {path!r} (ssh config) is not set")
        return os.environ[m.group(2)]

    return _TOKEN.sub(one, os.path.expanduser(path))


# ---------------------------------------------------------------------------- reading the files

_Stamp = tuple[int, int, int, int]
_parsed: dict[str, tuple[_Stamp, asyncssh.SSHKnownHosts]] = {}


def _read(path: str) -> asyncssh.SSHKnownHosts | None:
    """One file's entries (None when it cannot be read), parsed once per version of the file: a
    site-wide file can hold thousands of hosts and every node's connection reads it."""
    try:
        st = os.stat(path)
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cached = _parsed.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None  # unreadable: skipped, as ssh does
    try:
        known = asyncssh.import_known_hosts(text)
    except ValueError:  # a malformed line: ssh skips that line only, so do the same
        known = asyncssh.import_known_hosts("\n".join(line for line in text.splitlines() if _parses(line)))
    _parsed[path] = (stamp, known)
    return known


def _parses(line: str) -> bool:
    try:
        asyncssh.import_known_hosts(line)
    except ValueError:
        return False
    return True


def _match(known: asyncssh.SSHKnownHosts, host: str, addr: str, port: int | None) -> tuple[list, list, list]:
    """(host keys, CA keys, revoked keys) for the host. asyncssh's match() retries without the port
    when nothing but ``@revoked`` lines match ``[host]:port``, and so forgets those: ask for them."""
    keys, cas, revoked, *_ = known.match(host, addr, port)
    revoked = list(revoked)
    if port:
        revoked += known.match(f"[{host}]:{port}", "", None)[2]
    return list(keys), list(cas), revoked


class KnownHostsLookup:
    """The ``known_hosts`` argument given to asyncssh: a function of (host, addr, port) that matches
    every existing file and remembers what it was asked and whether anything matched."""

    def __init__(self, files: HostKeyFiles) -> None:
        self.files = files
        self.asked: tuple[str, str, int | None] | None = None
        self.known = False
        self.revoked = False

    def __call__(self, host: str, addr: str, port: int | None) -> tuple[list, list, list]:
        self.asked = (host, addr, port)
        host_keys: list = []
        ca_keys: list = []
        revoked: list = []
        for path in self.files.existing():
            known = _read(path)
            if known is not None:
                keys, cas, bad = _match(known, host, addr, port)
                host_keys += keys
                ca_keys += cas
                revoked += bad
        self.known = bool(host_keys or ca_keys)
        self.revoked = bool(revoked)
        return host_keys, ca_keys, revoked

    def entries(self) -> list[str]:
        """``file:line`` of each entry that matched, ``@revoked`` ones included (for the refusal;
        reads the files again, line by line, only on that path)."""
        if self.asked is None:
            return []
        found = []
        for path in self.files.existing():
            try:
                lines = Path(path).read_text(errors="replace").splitlines()
            except OSError:
                continue
            for number, line in enumerate(lines, 1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                try:
                    keys, cas, revoked = _match(asyncssh.import_known_hosts(line), *self.asked)
                except ValueError:
                    continue
                if keys or cas or revoked:
                    found.append(f"{path}:{number}")
        return found


# ---------------------------------------------------------------------------- recording a new key


def record_host_key(path: str, entry: str, key: asyncssh.SSHKey) -> None:
    """Append ``entry key`` to ``path`` as ``accept-new`` does: the file is created with mode 0600 (its
    folder 0700) when missing; an existing file keeps its mode. Raises ``OSError``."""
    line = f"{entry} {key.export_public_key().decode().strip()}\n"
    file = Path(path)
    if not file.parent.is_dir():
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(file.parent, 0o700)
    fd = os.open(file, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line  # never glue the new entry onto an unterminated last line
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class HostKeyCheck:
    """One connection's host key check: the lookup and the client that asyncssh asks about a key no
    file vouches for. That key is recorded (and trusted) only when learning is on and no file holds
    any key for the host: a changed key is never replaced."""

    def __init__(self, files: HostKeyFiles, accept_new: bool) -> None:
        self.files = files
        self.lookup = KnownHostsLookup(files)
        self.accept_new = accept_new
        self.offered_unknown = False  # asyncssh asked about a key no file trusts (nor revokes)
        self.record_error: str | None = None

    def client_factory(self) -> Callable[[], asyncssh.SSHClient]:
        check = self

        class _Client(asyncssh.SSHClient):
            def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
                return check._first_seen(host, port, key)

        return _Client

    def _first_seen(self, host: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered_unknown = True
        path = self.files.record_to
        if not self.accept_new or self.lookup.known or path is None:
            return False
        # Another connection of this console (a second node behind the same jump host) may have
        # recorded this host since the lookup: read again; this callback runs whole on the loop.
        if self.lookup.asked is None:
            return False
        keys, cas, _ = KnownHostsLookup(self.files)(*self.lookup.asked)
        if keys or cas:
            return key in keys
        entry = host if port == 22 else f"[{host}]:{port}"
        try:
            record_host_key(path, entry, key)
        except OSError as exc:
            self.record_error = f"cannot record the host key in {path}: {exc}"
            return False
        return True

    # ------------------------------------------------------------------ what to tell the user

    def missing_files(self, target: Target, direct: bool) -> str | None:
        """Why no key can be trusted (no file exists and nothing may be learned), or None. Said once
        the server showed its key (``refused``) for a direct connection, as ssh does, after its name
        resolved and it answered as an SSH server; before opening any hop for one through a jump."""
        if self.files.existing():
            return None
        if self.accept_new and self.files.record_to is not None:
            return None  # the first key seen creates the first UserKnownHostsFile
        looked = self.files.all
        if len(looked) == 1:
            why = f"{looked[0]} does not exist"
        elif looked:
            why = f"none of {', '.join(looked)} exists"
        else:
            why = "the ssh config names no known-hosts file"
        if self.accept_new:
            return f"no known host keys yet ({why}), and nowhere to record one: {self._off_note()}"
        how = self._how_to_add(target, direct, "the host key")
        return f"no known host keys yet ({why}): {how}{self._note()}"

    def refused(self, target: Target, direct: bool) -> str:
        """The one line for a key the files do not vouch for."""
        if self.record_error:
            return self.record_error
        nothing = self.missing_files(target, direct)  # no file at all: say that, not "no entry in"
        if nothing is not None:
            return nothing
        if self.lookup.revoked and not self.lookup.known and not self.offered_unknown:
            named = ", ".join(self.lookup.entries()[:_MAX_NAMED])
            return f"the server's host key is marked @revoked in {named}; refusing to connect"
        if self.lookup.known:
            where = self.lookup.entries()[:_MAX_NAMED]
            named = ", ".join(where) if where else " or ".join(self.files.existing())
            first = where[0].rsplit(":", 1)[0] if where else self.files.existing()[0]
            return (
                f"HOST KEY MISMATCH: the server's key differs from the one recorded in {named}; refusing "
                "to connect (possible man-in-the-middle). If the host was reinstalled, remove its old "
                f"entry (ssh-keygen -R '{target.entry}' -f {first})"
            )
        if self.accept_new and self.files.record_to is None:
            return f"unknown host key, and nowhere to record it: {self._off_note()}"
        looked = " or ".join(self.files.existing()) or ", ".join(self.files.all)
        how = self._how_to_add(target, direct, "it")
        return f"unknown host key (no entry in {looked}); {how}{self._note()}"

    def _how_to_add(self, target: Target, direct: bool, what: str) -> str:
        path = self.files.record_to or (self.files.all[0] if self.files.all else "~/.ssh/known_hosts")
        if direct:
            how = f"ssh-keyscan -p {target.port} {target.key_name} >> {path}"
        else:  # ssh-keyscan cannot go through a jump host; ssh itself asks
            how = f"ssh {target.alias} records it in {path}"
        return f"verify {what} and add it ({how}), or pass --accept-new-host-keys"

    def _note(self) -> str:
        if not self.files.checking_off_in_config:
            return ""
        return (
            " (the ssh config turns host key checking off, with StrictHostKeyChecking no or "
            "UserKnownHostsFile none or /dev/null; mscon checks host keys all the same)"
        )

    @staticmethod
    def _off_note() -> str:
        return (
            "the ssh config sets UserKnownHostsFile none, and mscon checks host keys all the same; "
            "name a file there or in the inventory (ssh.known_hosts)"
        )
