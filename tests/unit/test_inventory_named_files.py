"""Files an inventory names (SSH keys, known-hosts files, ssh configs, the job's script, a
--hostfile) are checked to be regular files of bounded size before anything reads them: /dev/zero
as identity_file was read until memory ran out (exit 1, a traceback). Each refusal is one line
naming the inventory file, line and field, exit 2 (issue 45)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from mscon.console.cli import main as cli
from mscon.console.config import named_files
from mscon.console.config.inventory import InventoryError, load_inventory
from mscon.console.config.limits import MAX_FILE_BYTES, MAX_KEY_FILE_BYTES, MAX_KNOWN_HOSTS_BYTES
from mscon.console.transport.base import NodeUnreachable
from mscon.console.transport.ssh import SshOptions, SshTransport


def _dev_zero(tmp_path: Path, size: int) -> str:
    return "/dev/zero"


def _fifo(tmp_path: Path, size: int) -> str:
    path = tmp_path / "a-fifo"
    os.mkfifo(path)
    return str(path)


def _directory(tmp_path: Path, size: int) -> str:
    path = tmp_path / "a-folder"
    path.mkdir()
    return str(path)


def _too_large(tmp_path: Path, size: int) -> str:
    path = tmp_path / "too-large"
    with open(path, "wb") as f:
        f.truncate(size + 1)  # sparse: one byte over the bound costs no disk
    return str(path)


BAD: dict[str, tuple[Callable[[Path, int], str], str]] = {
    "dev-zero": (_dev_zero, "is not a regular file (a character device)"),
    "fifo": (_fifo, "is not a regular file (a FIFO)"),
    "directory": (_directory, "is not a regular file (a directory)"),
    "too-large": (_too_large, "is too large: "),
}

INVENTORY = """\
name: t
device_target: CPU
defaults: {{user: train{defaults}}}
nodes:
  - {{host: a, devices: 1}}
  - {{host: b, devices: 1{node}}}
job: {{workdir: {workdir}, script: train.py}}
ssh: {{connect_timeout_s: 5{ssh}}}
"""

# field -> (where it goes, the line it is on, its bound)
FIELDS = {
    "defaults.identity_file": ("defaults", 3, MAX_KEY_FILE_BYTES),
    "nodes[1].identity_file": ("node", 6, MAX_KEY_FILE_BYTES),
    "ssh.known_hosts": ("ssh", 8, MAX_KNOWN_HOSTS_BYTES),
    "ssh.config": ("ssh", 8, MAX_KEY_FILE_BYTES),
}


def _inventory(tmp_path: Path, field: str, value: str) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text("print('hi')\n")
    parts = {"defaults": "", "node": "", "ssh": "", "workdir": str(work)}
    where, _, _ = FIELDS[field]
    parts[where] = f", {field.rsplit('.', 1)[1]}: {value}"
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY.format(**parts))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    return folder


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", BAD)
def test_a_named_file_that_is_not_a_small_regular_file_is_refused_at_load(
    tmp_path: Path, home: Path, field: str, bad: str
) -> None:
    make, said = BAD[bad]
    _, line, bound = FIELDS[field]
    value = make(tmp_path, bound)
    inv = _inventory(tmp_path, field, value)
    with pytest.raises(InventoryError) as caught:
        load_inventory(inv)
    text = str(caught.value)
    assert text.startswith(f"{inv}:{line}:") and f": {field}: {value} {said}" in text, text
    if bad == "too-large":
        assert f"(at most {bound})" in text


@pytest.mark.parametrize("command", ["validate", "run"])
def test_identity_file_dev_zero_is_one_line_and_exit_2(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The review's case, as a user meets it: no read of /dev/zero, no traceback."""
    inv = _inventory(tmp_path, "nodes[1].identity_file", "/dev/zero")
    argv = ["validate", str(inv)] if command == "validate" else ["run", "--no-tui", str(inv)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{inv}:6:" in err and "nodes[1].identity_file: /dev/zero is not a regular file" in err


def test_a_regular_small_file_and_a_missing_one_are_accepted(tmp_path: Path, home: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("not read at load\n")
    inv = load_inventory(_inventory(tmp_path, "nodes[1].identity_file", str(key)))
    assert inv.nodes[1].identity_file == str(key)
    # Missing: left to its reader (ssh skips a missing known_hosts; accept-new makes it).
    missing = str(tmp_path / "not-yet")
    assert load_inventory(_inventory(tmp_path, "ssh.known_hosts", missing)).ssh.known_hosts == missing


def test_a_script_that_is_a_fifo_is_said_to_be_one(tmp_path: Path, home: Path) -> None:
    inv = _inventory(tmp_path, "ssh.config", str(tmp_path / "none"))
    (tmp_path / "work" / "train.py").unlink()
    os.mkfifo(tmp_path / "work" / "train.py")
    with pytest.raises(InventoryError, match=r":7:.*job\.script: not a regular file \(a FIFO\): "):
        load_inventory(inv)


@pytest.mark.parametrize("bad", BAD)
def test_a_hostfile_that_is_not_a_small_regular_file_is_one_line(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    make, said = BAD[bad]
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(work)
    value = make(tmp_path, MAX_FILE_BYTES)
    assert cli.main(["run", "--no-tui", "--hostfile", value, "--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--hostfile: {value} {said}" in err, err


@pytest.mark.parametrize("option", ["IdentityFile", "UserKnownHostsFile"])
@pytest.mark.parametrize("bad", ["fifo", "dev-zero"])
async def test_files_an_ssh_config_names_are_checked_before_connecting(
    tmp_path: Path, home: Path, option: str, bad: str
) -> None:
    """The inventory's ssh.config names the key or known-hosts file: checked before asyncssh reads
    it (a FIFO would block the console, /dev/zero fill its memory)."""
    make, said = BAD[bad]
    value = make(tmp_path, MAX_KEY_FILE_BYTES)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  {option} {value}\n")
    inv = load_inventory(_inventory(tmp_path, "ssh.config", str(config)))
    transport = SshTransport(inv.nodes[0], inv, SshOptions())
    with pytest.raises(NodeUnreachable) as caught:
        await asyncio.wait_for(transport.connect(), 30)
    assert str(caught.value).endswith(f"{value} {said}") and "\n" not in str(caught.value)


def test_a_workdir_gitignore_too_large_is_refused_not_read(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workdir's entries: a .gitignore is read whole, so one past the bound is refused in one
    line (exit 2) before the walk reads it."""
    inv = _inventory(tmp_path, "ssh.config", str(tmp_path / "none"))
    with open(tmp_path / "work" / ".gitignore", "wb") as f:
        f.truncate(MAX_KEY_FILE_BYTES + 1)
    assert cli.main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f".gitignore is too large: {MAX_KEY_FILE_BYTES + 1} bytes (at most {MAX_KEY_FILE_BYTES})" in err


def test_dev_null_reads_as_an_empty_file() -> None:
    """``UserKnownHostsFile /dev/null`` is how ssh configs say "no known hosts": a device, but one
    that reads empty at once, so it passes as an empty file (and /dev/zero still does not)."""
    assert named_files.problem("/dev/null", 1) is None
    assert named_files.read_bounded("/dev/null", 1) == b""
    assert "character device" in (named_files.problem("/dev/zero", 1) or "")
