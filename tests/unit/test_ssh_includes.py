"""Files an ssh config pulls in through ``Include`` are bounded as the config itself (issue 45): a
100 MB file was read whole by asyncssh (one line of NULs, split by shlex for minutes), and a config
that includes itself ended in a RecursionError traceback. Refused in one line naming the file and
the Include that names it: at load for the inventory's ``ssh.config`` (exit 2), before connecting
for ``~/.ssh/config``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mscon.console.cli import main as cli
from mscon.console.config import ssh_includes
from mscon.console.config.inventory import InventoryError, load_inventory
from mscon.console.config.limits import MAX_KEY_FILE_BYTES, MAX_SSH_CONFIG_FILES, MAX_SSH_INCLUDE_DEPTH
from mscon.console.transport.base import NodeUnreachable
from mscon.console.transport.ssh import SshOptions, SshTransport

BIG = 100 * 1000 * 1000

INVENTORY = """\
name: t
device_target: CPU
nodes:
  - {{host: a, devices: 1}}
job: {{workdir: {workdir}, script: train.py}}
ssh: {{connect_timeout_s: 5{ssh}}}
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    (folder / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(folder))
    return folder


def _sparse(path: Path, size: int = BIG) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: no disk
    return path


def _inventory(tmp_path: Path, config: Path | None) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text("print('hi')\n")
    ssh = f", config: {config}" if config is not None else ""
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY.format(workdir=work, ssh=ssh))
    return path


def test_a_100_mb_include_of_the_inventorys_ssh_config_is_one_line_and_exit_2(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = _sparse(tmp_path / "conf.d" / "big.conf")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host a\n  HostName 127.0.0.1\n  Include {tmp_path}/conf.d/*.conf\n")
    inv = _inventory(tmp_path, config)
    with pytest.raises(InventoryError) as caught:
        load_inventory(inv)
    text = str(caught.value)
    assert text.startswith(f"{inv}:6:") and "ssh.config:" in text, text
    said = f"{big} is too large: {BIG} bytes (at most {MAX_KEY_FILE_BYTES}) (Include in {config} line 3)"
    assert said in text, text
    assert cli.main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(big) in err, err


async def test_a_100_mb_include_of_the_users_ssh_config_is_refused_before_connecting(
    tmp_path: Path, home: Path
) -> None:
    """~/.ssh/config (no ssh.config in the inventory): a relative Include is found under ~/.ssh,
    as asyncssh finds it, and the node is unreachable in one line naming the file."""
    big = _sparse(home / ".ssh" / "config.d" / "big")
    (home / ".ssh" / "config").write_text("Include=config.d/*\n")
    inv = load_inventory(_inventory(tmp_path, None))
    transport = SshTransport(inv.nodes[0], inv, SshOptions())
    assert transport.resolved_host() == "a"  # the config is not read: the name as given
    with pytest.raises(NodeUnreachable) as caught:
        await asyncio.wait_for(transport.connect(), 30)
    text = str(caught.value)
    assert "\n" not in text and f"{big} is too large: {BIG} bytes" in text, text
    assert f"(Include in {home}/.ssh/config line 1)" in text, text


def test_an_include_loop_and_a_chain_too_deep_are_refused(tmp_path: Path, home: Path) -> None:
    loop = tmp_path / "loop.conf"
    loop.write_text(f"# itself\nHost *\n  Include {loop}\n")
    why = ssh_includes.problem([loop], MAX_KEY_FILE_BYTES)
    assert why is not None and f"Include nested more than {MAX_SSH_INCLUDE_DEPTH} deep (a loop?)" in why, why
    inv = _inventory(tmp_path, loop)
    with pytest.raises(InventoryError, match=r"nested more than 16 deep"):
        load_inventory(inv)
    # A chain exactly as deep as OpenSSH allows is read; one level more is not.
    chain = [tmp_path / f"c{i}.conf" for i in range(MAX_SSH_INCLUDE_DEPTH + 2)]
    for i, path in enumerate(chain):
        path.write_text(f"Include {chain[i + 1]}\n" if i + 1 < len(chain) else "User x\n")
    assert ssh_includes.problem([chain[1]], MAX_KEY_FILE_BYTES) is None
    why = ssh_includes.problem([chain[0]], MAX_KEY_FILE_BYTES)
    assert why is not None and why.startswith(f"{chain[-1]}: Include nested more than"), why


def test_includes_that_double_on_every_level_are_bounded_in_number(tmp_path: Path, home: Path) -> None:
    levels = [tmp_path / f"l{i}.conf" for i in range(12)]
    for i, path in enumerate(levels):
        nxt = levels[i + 1] if i + 1 < len(levels) else None
        path.write_text(f"Include {nxt}\nInclude {nxt}\n" if nxt else "User x\n")
    why = ssh_includes.problem([levels[0]], MAX_KEY_FILE_BYTES)
    assert why is not None and f"more than {MAX_SSH_CONFIG_FILES} ssh config files through Include" in why


def test_small_includes_missing_ones_and_other_lines_pass(tmp_path: Path, home: Path) -> None:
    (home / ".ssh" / "extra").write_text("Host b\n  User y\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        "# Include /nowhere/big\n"
        'Host a\n  Include "~/.ssh/extra" /no/such/*.conf\n'
        "Match host b\n  Include = extra\n"
        "IdentityFile /not/an/include\n"
    )
    _sparse(tmp_path / "not-included", MAX_KEY_FILE_BYTES + 1)
    assert ssh_includes.problem([config, tmp_path / "missing"], MAX_KEY_FILE_BYTES) is None
    assert load_inventory(_inventory(tmp_path, config)).ssh.config == str(config)
    # The bound is the config's own: one byte over it in an included file is refused.
    (home / ".ssh" / "extra").write_bytes(b"#" * (MAX_KEY_FILE_BYTES + 1))
    why = ssh_includes.problem([config], MAX_KEY_FILE_BYTES)
    assert why is not None and why.startswith(f"{home}/.ssh/extra is too large"), why
