"""What the console ships to nodes: the agent package and the job's workdir, both content-hashed."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from mscon.agent import AGENT_FILES

AGENT_PACKAGE = "mscon_agent"  # the agent's import name on the nodes

# The agent's folder goes on sys.path from the command line rather than through PYTHONPATH, so the
# ranks it starts inherit the node's environment (a user's PYTHONPATH included) unchanged.
AGENT_BOOT = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
    f"runpy.run_module({AGENT_PACKAGE!r}, run_name='__main__', alter_sys=True)"
)


def agent_argv(python: str, agent_dir: str, node: str) -> list[str]:
    """The node-side command that starts the agent (``python -c BOOT AGENT_DIR --node NAME``)."""
    return [python, "-c", AGENT_BOOT, agent_dir, "--node", node]


# Never synced: VCS data, virtual environments, caches, and mscon's own outputs.
DEFAULT_EXCLUDES = (
    ".git",
    ".hg",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "mscon-runs",
    "*.egg-info",
    "node_modules",
)


@dataclass(frozen=True, slots=True)
class AgentBundle:
    digest: str
    files: dict[str, bytes]  # file name -> content

    @property
    def dirname(self) -> str:
        return f"agent-{self.digest}"


def agent_bundle() -> AgentBundle:
    pkg = resources.files("mscon.agent")
    files = {name: pkg.joinpath(name).read_bytes() for name in AGENT_FILES}
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    return AgentBundle(digest=h.hexdigest()[:16], files=files)


@dataclass(frozen=True, slots=True)
class WorkdirArchive:
    digest: str
    data: bytes
    files: int

    @property
    def filename(self) -> str:
        return f"work-{self.digest}.tar.gz"


def workdir_archive(root: Path, extra_excludes: tuple[str, ...] = ()) -> WorkdirArchive:
    """A reproducible tar.gz of the workdir (sorted, zeroed times), so equal trees hash equal."""
    patterns = DEFAULT_EXCLUDES + extra_excludes
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames if not _excluded(d, rel_dir, patterns))
            for name in sorted(filenames):
                if _excluded(name, rel_dir, patterns):
                    continue
                full = os.path.join(dirpath, name)
                if os.path.islink(full) or not os.path.isfile(full):
                    continue  # links could point outside the workdir: never follow them
                arc = os.path.normpath(os.path.join(rel_dir, name))
                info = tar.gettarinfo(full, arcname=arc)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(full, "rb") as f:
                    tar.addfile(info, f)
                count += 1
    data = _strip_gzip_time(buf.getvalue())
    return WorkdirArchive(digest=hashlib.sha256(data).hexdigest()[:16], data=data, files=count)


def _excluded(name: str, rel_dir: str, patterns: tuple[str, ...]) -> bool:
    rel = os.path.normpath(os.path.join(rel_dir, name))
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in patterns)


def _strip_gzip_time(data: bytes) -> bytes:
    # Bytes 4..8 of a gzip header hold the mtime; zero them so the digest depends on content only.
    return data[:4] + b"\0\0\0\0" + data[8:] if len(data) > 8 else data
