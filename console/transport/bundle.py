"""What the console ships to nodes: the agent package and the job's workdir, both content-hashed."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO

from mscon.agent import AGENT_FILES
from mscon.agent.layout import AGENT_PREFIX, CACHE_DIR, RANK_LIBRARY_DIR
from mscon.console.transport.workdir import workdir_files

import mscon_resume

AGENT_PACKAGE = "mscon_agent"  # the agent's import name on the nodes
UPLOAD_CHUNK = 8 * 2**20  # bytes of the workdir archive read and sent at once

# How the agent starts, on every node and locally alike. The command the node's login shell parses
# is one FIXED string that holds no inventory value at all (no node name, no python path, no
# folder): every value travels on the agent's stdin, ahead of the JSON protocol, so no login
# shell (sh, bash, zsh, fish, csh/tcsh) can misparse or execute any of it. The two quoted words
# below contain no single quote, backslash, "!" or newline, the only characters fish or csh treat
# specially inside single quotes; the same command therefore means the same thing to all of them.
#
#   stdin line 1: the python to run (read by /bin/sh, byte by byte, then exec'd as one word)
#   stdin line 2: {"v": 1, "node": NAME, "dir": AGENT_DIR}, read byte by byte by AGENT_BOOT
#   then:         the JSON-lines protocol, read by the agent itself
#
# The agent's folder goes on sys.path from the boot code rather than through PYTHONPATH, so the
# ranks it starts inherit the node's environment (a user's PYTHONPATH included) unchanged. The
# boot drops the current folder ("" from ``-c``) from sys.path before importing anything, so a
# stray json.py in the node user's home cannot shadow the standard library.
BOOT_HEADER_VERSION = 1
AGENT_SH = (
    "IFS= read -r py || exit 125; "
    'command -v "$py" >/dev/null || '
    '{ echo "cannot execute the node python: No such file or directory" >&2; exit 127; }; '
    'exec "$py" -c "$0"'
)
AGENT_BOOT = (
    "import os,sys;sys.path[:]=[p for p in sys.path if p];import json,runpy;n=bytes([10]);"
    'h=json.loads(b"".join(iter(lambda:os.read(0,1) or n,n)) or b"null");'
    'h or sys.exit("mscon agent: no start header on stdin");'
    'sys.path.insert(0,h["dir"]);'
    f'runpy.run_module("{AGENT_PACKAGE}",{{"_BOOT_HEADER":h}},"__main__",True)'
)
# Characters no quoted word of the command may hold: the quote itself, backslash (fish), "!" and
# newline (csh), and anything else that is not printable ASCII.
_UNSAFE_IN_QUOTES = set("'\\!\n")


def _check_fixed_word(word: str) -> str:
    bad = sorted({c for c in word if c in _UNSAFE_IN_QUOTES or not (0x20 <= ord(c) < 0x7F)})
    if bad:  # pragma: no cover - a programming error, caught by the unit tests
        raise AssertionError(f"the fixed agent command may not contain {bad!r}")
    return word


AGENT_COMMAND = f"exec /bin/sh -c '{_check_fixed_word(AGENT_SH)}' '{_check_fixed_word(AGENT_BOOT)}'"


def agent_command() -> str:
    """The remote command that starts the agent: the same fixed string for every node."""
    return AGENT_COMMAND


def agent_argv() -> list[str]:
    """The same start, as an argv for a local subprocess (no login shell in between)."""
    return ["/bin/sh", "-c", AGENT_SH, AGENT_BOOT]


def agent_stdin_header(python: str, agent_dir: str, node: str, mode: dict | None = None) -> str:
    """What the console writes to the agent's stdin first: the python path, then one JSON line.

    Raises ``ValueError`` for a python path that cannot travel as one line or would be read as an
    option. The node name and the folder are JSON-encoded, so any string is safe there.
    """
    try:
        python.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"unusable python path {python!r}: not valid UTF-8") from None
    if not python or python.startswith("-") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in python):
        raise ValueError(
            f"unusable python path {python!r}: empty, starting with '-' or holding a control character"
        )
    header = {"v": BOOT_HEADER_VERSION, "node": node, "dir": agent_dir, **(mode or {})}
    return python + "\n" + json.dumps(header, ensure_ascii=True, separators=(",", ":")) + "\n"


# What a node whose deployed agent does not match the console is told to do.
REMOVE_OLD_AGENTS = f"remove ~/{CACHE_DIR}/{AGENT_PREFIX}* on the node and retry"


@dataclass(frozen=True, slots=True)
class AgentBundle:
    digest: str
    files: dict[str, bytes]  # path inside the package, "/"-separated ("checks/gpu.py") -> content

    @property
    def dirname(self) -> str:
        return f"{AGENT_PREFIX}{self.digest}"


def agent_bundle() -> AgentBundle:
    """The agent's files, and beside them (``rank/mscon_resume/``) the rank-side library the agent
    puts on every rank's PYTHONPATH: a script that imports it runs on a node where nothing of
    mscon is installed."""
    pkg = resources.files("mscon.agent")
    files = {name: pkg.joinpath(*name.split("/")).read_bytes() for name in AGENT_FILES}
    lib = resources.files("mscon_resume")
    for name in mscon_resume.FILES:
        files[f"{RANK_LIBRARY_DIR}/mscon_resume/{name}"] = lib.joinpath(name).read_bytes()
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    return AgentBundle(digest=h.hexdigest()[:16], files=files)


@dataclass(frozen=True, slots=True)
class WorkdirArchive:
    digest: str
    file: BinaryIO  # an unnamed temporary file (gone with the archive): never the whole tree in memory
    size: int  # bytes of the tar.gz
    files: int

    @property
    def filename(self) -> str:
        return f"work-{self.digest}.tar.gz"

    def chunks(self, size: int = UPLOAD_CHUNK) -> Iterator[bytes]:
        """The archive in pieces; several uploads may read at once (positioned reads)."""
        fd = self.file.fileno()
        for offset in range(0, self.size, size):
            yield os.pread(fd, min(size, self.size - offset), offset)

    @property
    def data(self) -> bytes:
        """The whole archive in memory (small archives and tests only)."""
        return b"".join(self.chunks())


class _Digesting:
    """A write-only file that hashes and counts what goes through it."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.hash, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.hash.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def workdir_archive(
    root: Path, extra_excludes: tuple[str, ...] = (), max_bytes: int | None = None
) -> WorkdirArchive:
    """A reproducible tar.gz of the workdir (sorted, zeroed times and owners), so equal trees hash
    equal; written to a temporary file as it is made. What goes in: ``workdir.workdir_files``
    (WorkdirRefused past ``max_bytes``)."""
    files = workdir_files(root, extra_excludes, max_bytes)
    tmp = tempfile.TemporaryFile(prefix="mscon-work-")
    sink = _Digesting(tmp)
    # mtime=0 and no file name in the gzip header: the digest depends on the content only.
    with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=sink, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                try:
                    src = open(f.path, "rb")  # noqa: SIM115 - closed below, after tar reads it
                except OSError:
                    continue  # gone since the walk
                with src:
                    info = tar.gettarinfo(fileobj=src, arcname=f.arc)
                    info.mtime = 0
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tar.addfile(info, src)
    tmp.flush()
    return WorkdirArchive(digest=sink.hash.hexdigest()[:16], file=tmp, size=sink.size, files=len(files))
