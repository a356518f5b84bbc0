"""Agent bundle and workdir archive (content-hashed, reproducible), and the fixed agent start command."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import mscon.agent
import pytest
from mscon.agent.layout import LOGS_DIR, RANK_LIBRARY_DIR
from mscon.agent.protocol import Hello
from mscon.console.config.inventory import NodeSpec
from mscon.console.transport.base import printable
from mscon.console.transport.bundle import (
    AGENT_BOOT,
    AGENT_COMMAND,
    AGENT_PACKAGE,
    AGENT_SH,
    agent_argv,
    agent_bundle,
    agent_command,
    agent_stdin_header,
    workdir_archive,
)
from mscon.console.transport.local import LocalTransport

import mscon_resume


def test_agent_bundle_is_complete_and_stable() -> None:
    a, b = agent_bundle(), agent_bundle()
    assert a.digest == b.digest and len(a.digest) == 16
    assert {"__main__.py", "protocol.py", "main.py"} <= set(a.files)


def test_the_bundle_holds_every_agent_source_file() -> None:
    """A module added to agent/ (or to a sub-package of it) but not to AGENT_FILES would be missing
    on the nodes, and the agent would fail there only when it first imports it."""
    src = Path(mscon.agent.__file__).parent
    on_disk = {p.relative_to(src).as_posix() for p in src.rglob("*.py") if "__pycache__" not in p.parts}
    # dial.py is not part of the package: the Slurm transport sends it as source (slurm_dial.dial_source).
    agent_files = {n for n in agent_bundle().files if not n.startswith(f"{RANK_LIBRARY_DIR}/")}
    assert agent_files == on_disk - {"dial.py"}
    assert any("/" in name for name in on_disk)  # the sub-package case below is exercised


def test_the_bundle_ships_every_file_of_the_rank_side_library() -> None:
    """mscon_resume goes beside the agent (rank/mscon_resume/): a module missing from its FILES
    would fail a user's script on a node where nothing of mscon is installed."""
    src = Path(mscon_resume.__file__).parent
    on_disk = {p.name for p in src.glob("*.py")}
    prefix = f"{RANK_LIBRARY_DIR}/mscon_resume/"
    shipped = {n.split("/")[-1] for n in agent_bundle().files if n.startswith(prefix)}
    assert shipped == on_disk == set(mscon_resume.FILES)


def test_a_deployed_agent_imports_its_sub_packages_under_its_node_name(tmp_path: Path) -> None:
    t = LocalTransport(NodeSpec(name="n1", host="localhost", devices=1, transport="local"))
    t.home = str(tmp_path / "home")
    bundle = agent_bundle()
    pkg = Path(asyncio.run(t.ensure_agent(bundle))) / AGENT_PACKAGE
    assert {p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")} == set(bundle.files)
    code = (
        f"import json, sys; sys.path.insert(0, {str(pkg.parent)!r}); import {AGENT_PACKAGE}.main; "
        f"from {AGENT_PACKAGE}.checks import run_node_checks; from {AGENT_PACKAGE}.devices import sample; "
        "names = [r['name'] for r in run_node_checks(['clock', 'limits'])]; "
        "print(json.dumps([names, sample('GPU', 1.0) == {} or 'sampled', 'mscon' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names, _, console_loaded = json.loads(done.stdout)
    assert names == ["clock", "limits.memlock", "limits.nofile"]
    assert not console_loaded  # relative imports only: the node has no mscon package


def test_workdir_archive_excludes_and_is_reproducible(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("y = 2\n")
    for junk in (".git", ".venv", "__pycache__", LOGS_DIR):
        (tmp_path / junk).mkdir()
        (tmp_path / junk / "f").write_text("junk")
    (tmp_path / "big.ckpt").write_text("weights")
    (tmp_path / "link.py").symlink_to("/etc/passwd")
    one = workdir_archive(tmp_path, ("*.ckpt",))
    two = workdir_archive(tmp_path, ("*.ckpt",))
    assert one.digest == two.digest and one.data == two.data
    names = tarfile.open(fileobj=io.BytesIO(one.data)).getnames()
    assert sorted(names) == ["pkg/m.py", "train.py"]
    (tmp_path / "train.py").write_text("x = 2\n")
    assert workdir_archive(tmp_path, ("*.ckpt",)).digest != one.digest


# ---------------------------------------------------------------- how the agent starts

# Ways a login shell could be talked into running something if a value reached its command line:
# quotes of both kinds, ;, $( ), backquotes, fish's ( ), csh's "!" and newline, and backslashes
# before a quote (what broke fish with shlex.quote'd words). {m}: a folder the test watches.
HOSTILE_NODES = [
    "n1'\"; touch {m}/p1; echo $(touch {m}/p2) `touch {m}/p3` (touch {m}/p4) !! ;",
    "a\\'\\';touch {m}/p5;#",
    "x\n;touch {m}/p6",
    "x\\",
]
# File names cannot hold "/": these touch files in the working folder.
HOSTILE_PY_NAMES = ["py'\"; touch p7; $(touch p8) `touch p9` (touch p10) !! ;", "py\\'\\';touch p11;#"]
SHELLS = ["sh", "dash", "bash", "zsh", "fish", "tcsh", "csh"]


def test_the_remote_command_is_fixed_and_quotes_only_safe_characters() -> None:
    assert agent_command() == AGENT_COMMAND  # one string for every node: no argument at all
    assert shlex.split(AGENT_COMMAND) == ["exec", "/bin/sh", "-c", AGENT_SH, AGENT_BOOT]
    assert AGENT_COMMAND == f"exec /bin/sh -c '{AGENT_SH}' '{AGENT_BOOT}'"
    for word in (AGENT_SH, AGENT_BOOT):
        # Inside single quotes fish treats \ specially, csh ! and newlines: none may appear.
        assert not set(word) & set("'\\!\n"), word
        assert all(0x20 <= ord(c) < 0x7F for c in word)
    assert agent_argv() == ["/bin/sh", "-c", AGENT_SH, AGENT_BOOT]


def test_the_stdin_header_carries_every_value() -> None:
    text = agent_stdin_header("/opt/my env/bin/python3", "/home/u/.cache/mscon/agent-x", 'a"b\nc')
    py, header, rest = text.split("\n")
    assert py == "/opt/my env/bin/python3" and rest == ""
    assert json.loads(header) == {"v": 1, "node": 'a"b\nc', "dir": "/home/u/.cache/mscon/agent-x"}
    for bad in ("", "-c", "/usr/bin/python3\ntouch x", "/usr/bin/python3\r", "py\0"):
        with pytest.raises(ValueError, match="unusable python path"):
            agent_stdin_header(bad, "/d", "n")


def _fake_agent(root: Path) -> Path:
    """A stand-in agent package that reports what the boot gave it and what is left on stdin."""
    pkg = root / "agentdir" / "mscon_agent"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import json, os, sys\n"
        "rest = sys.stdin.read()\n"
        "print(json.dumps({'header': _BOOT_HEADER, 'rest': rest, 'path0': sys.path[0],\n"
        "                  'cwd_on_path': '' in sys.path, 'pythonpath': os.environ.get('PYTHONPATH'),\n"
        "                  'argv': sys.argv[1:]}))\n"
    )
    return root / "agentdir"


@pytest.mark.parametrize("shell", SHELLS)
def test_every_login_shell_runs_the_fixed_command_the_same_way(tmp_path: Path, shell: str) -> None:
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} is not installed here (apt-get install -y {shell})")
    marks = tmp_path / "marks"
    marks.mkdir()
    home = tmp_path / "home"  # the login shell's working folder
    home.mkdir()
    (home / "json.py").write_text("raise SystemExit('the home folder shadowed the standard library')\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    agent_dir = _fake_agent(tmp_path)
    protocol = '{"type": "shutdown"}\n{"type": "more"}\n'
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": "/user/lib"}
    for i, template in enumerate(HOSTILE_NODES):
        python = bindir / HOSTILE_PY_NAMES[i % len(HOSTILE_PY_NAMES)]
        if not python.exists():
            python.symlink_to(os.path.realpath(sys.executable))
        node = template.format(m=marks)
        done = subprocess.run(
            [exe, "-c", AGENT_COMMAND],
            input=agent_stdin_header(str(python), str(agent_dir), node) + protocol,
            cwd=home,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["header"] == {"v": 1, "node": node, "dir": str(agent_dir)}  # intact, quotes and all
        assert seen["rest"] == protocol  # the boot read its line and not a byte more
        assert seen["path0"] == str(agent_dir) and not seen["cwd_on_path"]
        assert seen["pythonpath"] == "/user/lib"  # the ranks' environment is left alone
        assert seen["argv"] == []  # no value on the command line
    assert list(marks.iterdir()) == []
    assert not [p.name for p in home.iterdir() if p.name.startswith("p")]  # the python names' touches


async def _start_local(tmp_path: Path, node: str, python: str):  # noqa: ANN202
    t = LocalTransport(NodeSpec(name=node, host="localhost", devices=1, transport="local"))
    t.home = str(tmp_path / "home")  # not the real home folder
    agent_dir = await t.ensure_agent(agent_bundle())
    return await t.start_agent(agent_dir, python)


async def test_the_real_agent_gets_its_node_name_from_stdin(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    node = "".join(HOSTILE_NODES).format(m=marks)
    python = tmp_path / HOSTILE_PY_NAMES[1]
    python.symlink_to(sys.executable)
    channel = await _start_local(tmp_path, node, str(python))
    try:
        hello = await channel.recv()
        assert isinstance(hello, Hello), channel.stderr_tail()
        assert hello.node == node
        cmdline = open(f"/proc/{hello.pid}/cmdline", "rb").read().split(b"\0")
        assert node.encode() not in cmdline and b"n1'" not in b" ".join(cmdline)
    finally:
        await channel.close(wait_s=10)
    assert list(marks.iterdir()) == []


async def test_a_missing_python_is_named_and_stderr_is_escaped(tmp_path: Path) -> None:
    channel = await _start_local(tmp_path, "n1", "/no/such/python3")
    assert await channel.recv() is None
    await channel.close()
    assert "No such file or directory" in channel.stderr_tail()
    noisy = tmp_path / "noisy-python"  # writes terminal control sequences, then fails
    noisy.write_text("#!/bin/sh\nprintf '\\033]0;owned\\007\\033[2Jgone\\r\\n' >&2\nexit 3\n")
    noisy.chmod(0o755)
    channel = await _start_local(tmp_path, "n1", str(noisy))
    assert await channel.recv() is None
    await channel.close()
    assert channel.stderr_tail() == "\\x1b]0;owned\\x07\\x1b[2Jgone\\x0d\n"
    assert printable("a\tb\n\x9b\u202ec é") == "a\tb\n\\x9b\\u202ec é"
