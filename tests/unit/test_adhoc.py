"""A job without an inventory file: ``--hosts``/``--hostfile`` and the flags around them build the
same Inventory a file does (console/config/adhoc.py); ``mscon init`` writes one to keep."""

from __future__ import annotations

import dataclasses
import os
from importlib import resources
from pathlib import Path

import pytest
from mscon.console.cli import main as cli
from mscon.console.cli.engine_run import job_of
from mscon.console.cli.init import SAMPLES
from mscon.console.config.adhoc import AdhocError, AdhocFlags, build_inventory, parse_env, read_hostfile
from mscon.console.config.inventory import load_inventory
from mscon.console.config.model import JobSpec, NodeSpec, SchedulerSpec


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding only train.py, the current folder, with HOME an empty folder."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(work)
    return work


def _job(argv: list[str], user_cmd: list[str] | None) -> object:
    """What ``mscon ...`` resolves its job to before connecting: (inventory, script, args) or an exit code."""
    return job_of(cli.build_parser().parse_args(argv), user_cmd)


def _one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ------------------------------------------------------------------ flags -> inventory


def test_hosts_flags_build_the_inventory(project: Path) -> None:
    argv = ["run", "--hosts", "node-a, node-b", "--nproc-per-node", "2", "--device-target", "gpu"]
    argv += ["--python", "/opt/ms/bin/python3", "--env", "DATA_PATH=/data/x=1", "--env", "EMPTY="]
    job = _job(argv, ["train.py", "--epochs", "1"])
    assert not isinstance(job, int)
    inv, script, args = job
    assert (script, args) == ("train.py", ("--epochs", "1"))
    assert inv.device_target == "GPU" and inv.world_size == 4 and inv.slurm is None
    assert inv.nodes == (
        NodeSpec(name="node-a", host="node-a", devices=2, python="/opt/ms/bin/python3"),
        NodeSpec(name="node-b", host="node-b", devices=2, python="/opt/ms/bin/python3"),
    )
    assert inv.job == JobSpec(workdir=project, script="train.py", args=("--epochs", "1"), env=inv.job.env)
    assert inv.job.env == {"DATA_PATH": "/data/x=1", "EMPTY": ""}
    assert inv.scheduler == SchedulerSpec()  # the model's defaults, not a copy of them
    assert all(n.transport == "ssh" for n in inv.nodes)  # localhost too is reached over SSH


def test_defaults_and_names(project: Path) -> None:
    inv = build_inventory(AdhocFlags(hosts="localhost,::1,10.0.0.5", nproc_per_node=1), project, "train.py")
    assert inv.device_target == "CPU"
    assert [(n.name, n.host, n.transport, n.python) for n in inv.nodes] == [
        ("localhost", "localhost", "ssh", None),
        ("node1", "::1", "ssh", None),  # an IPv6 literal cannot name a folder
        ("10.0.0.5", "10.0.0.5", "ssh", None),
    ]


def test_workdir_flag_and_master_port(project: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "go.py").write_text("")
    argv = [
        "check",
        "--hosts",
        "a",
        "--nproc-per-node",
        "3",
        "--workdir",
        str(other),
        "--master-port",
        "9000",
    ]
    inv, script, _ = _job(argv, ["go.py"])  # type: ignore[misc]
    assert inv.job.workdir == other and script == "go.py" and inv.scheduler.port == 9000
    assert inv.world_size == 3


def test_env_python_and_target_also_apply_over_an_inventory(project: Path) -> None:
    inv_file = project / "inv.yaml"
    inv_file.write_text(
        "name: x\ndevice_target: CPU\nnodes: [{host: h1, devices: 1}, {host: h2, devices: 2}]\n"
        "job: {script: train.py, env: {A: '1', B: '2'}}\n"
    )
    argv = ["run", str(inv_file), "--env", "B=3", "--python", "python3.11", "--device-target", "ascend"]
    inv, _, _ = _job(argv, None)  # type: ignore[misc]
    assert inv.job.env == {"A": "1", "B": "3"} and inv.device_target == "Ascend"
    assert {n.python for n in inv.nodes} == {"python3.11"}
    # Nothing else changed.
    assert inv == dataclasses.replace(
        load_inventory(inv_file), job=inv.job, device_target="Ascend", nodes=inv.nodes
    )


def test_hostfile(project: Path) -> None:
    hf = project / "hostfile"
    hf.write_text("# the cluster\n\nworker-1 slots=4   # first\n  worker-2\tslots=2\nworker-3\n")
    assert read_hostfile(hf, 1) == [("worker-1", 4), ("worker-2", 2), ("worker-3", 1)]
    inv, _, _ = _job(["run", "--hostfile", str(hf), "--nproc-per-node", "8"], ["train.py"])  # type: ignore[misc]
    assert [(n.name, n.devices) for n in inv.nodes] == [("worker-1", 4), ("worker-2", 2), ("worker-3", 8)]
    assert inv.path == hf  # messages about the nodes name the hostfile


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a slots=2\nb slots=0\n", ":2: slots: expected 1..1024, got '0'"),
        ("a slots=2\nb slots=x\n", ":2: slots: expected 1..1024, got 'x'"),
        ("a max_slots=4\n", ":1: unexpected 'max_slots=4': expected HOST [slots=N]"),
        ("a slots=1 slots=2\n", ":1: slots= given twice"),
        ("a slots=1\n-oProxyCommand=x slots=1\n", ":2: expected a hostname"),
        ("a slots=1\nb\n", ":2: b: no slots=N on this line and no --nproc-per-node"),
        ("a slots=1\nA slots=1\n", ": duplicate host 'A'"),
        ("# nothing\n\n", ": no hosts in it"),
        ("999.1.1.1 slots=1\n", ":1: not a valid IPv4 address"),
    ],
)
def test_bad_hostfile_is_one_line_naming_file_and_line(
    project: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    hf = project / "hosts.txt"
    hf.write_text(text)
    code = cli.main(["run", "--no-tui", "--hostfile", str(hf), "--", "train.py"])
    assert code == 2
    _one_line_error(capsys, f"{hf}{needle}")


def test_unreadable_hostfile(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--no-tui", "--hostfile", "nope", "--", "train.py"]) == 2
    _one_line_error(capsys, "--hostfile: cannot read nope")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--hosts", "a,-oProxyCommand=x", "--nproc-per-node", "1"], "--hosts: expected a hostname"),
        (["--hosts", "a b", "--nproc-per-node", "1"], "--hosts: expected a hostname"),
        (["--hosts", "a,,b", "--nproc-per-node", "1"], "--hosts: an empty host name"),
        (["--hosts", "fe80::1%eth0", "--nproc-per-node", "1"], "--hosts: not a valid IPv6 address"),
        (["--hosts", "a,a", "--nproc-per-node", "1"], "--hosts: duplicate host 'a'"),
        (["--hosts", "a"], "--hosts: give the ranks per node with --nproc-per-node N"),
        (["--hosts", "a", "--nproc-per-node", "0"], "--nproc-per-node: expected 1..1024, got 0"),
        (["--hosts", "a", "--nproc-per-node", "1", "--env", "1A=x"], "--env: expected an environment"),
        (["--hosts", "a", "--nproc-per-node", "1", "--env", "A-B=x"], "--env: expected an environment"),
        (["--hosts", "a", "--nproc-per-node", "1", "--env", "NOVALUE"], "--env: expected KEY=VALUE"),
        (["--hosts", "a", "--nproc-per-node", "1", "--env", "A=1", "--env", "A=2"], "--env: A given twice"),
        (["--hosts", "a", "--nproc-per-node", "1", "--env", "A=\x1b[2J"], "--env: A: value contains"),
        (["--hosts", "a", "--nproc-per-node", "1", "--python", "py; rm"], "--python: expected an absolute"),
        (["--hosts", "a", "--nproc-per-node", "1", "--master-port", "0"], "--master-port: expected a port"),
        (["--hosts", "a", "--hostfile", "h", "--nproc-per-node", "1"], "not both"),
        (["--hosts", "a", "--nproc-per-node", "1", "--slurm"], "--hosts: not with --slurm"),
        (["--hosts", "a", "--nproc-per-node", "1", "--detach"], "--detach: needs an inventory file"),
        (["--nproc-per-node", "2"], "--nproc-per-node: only with --hosts or --hostfile"),
    ],
)
def test_bad_flags_are_one_line_exit_2(
    project: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    assert cli.main(["run", "--no-tui", *flags, "--", "train.py"]) == 2
    _one_line_error(capsys, needle)


def test_hosts_with_an_inventory_or_without_a_script(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The script without -- reads as an inventory: the error says where the script goes.
    assert cli.main(["run", "--no-tui", "--hosts", "a", "--nproc-per-node", "1", "train.py"]) == 2
    _one_line_error(capsys, "--hosts replaces an inventory, and train.py was given as one", "-- train.py")
    assert cli.main(["check", "--hosts", "a", "--nproc-per-node", "1"]) == 2
    _one_line_error(capsys, "--hosts: give the script after --")
    assert cli.main(["run", "--no-tui", "--hosts", "a", "--nproc-per-node", "1", "--", "../x.py"]) == 2
    _one_line_error(capsys, f"script ../x.py is not a file inside the workdir {project}")


def test_device_target_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--device-target", "tpu"])
    assert exited.value.code == 2
    assert "--device-target: expected one of GPU, Ascend, CPU, got 'tpu'" in capsys.readouterr().err


def test_parse_env_keeps_values_as_given() -> None:
    assert parse_env(["A=", "B==", "C=a b\tc"]) == {"A": "", "B": "=", "C": "a b\tc"}
    with pytest.raises(AdhocError, match="^--env: expected KEY=VALUE"):
        parse_env(["X"])
    with pytest.raises(AdhocError, match="^--env: expected an environment variable name"):
        parse_env(["=x"])


# ------------------------------------------------------------------ mscon init


def test_init_writes_an_inventory_that_validates(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["init", "--hosts", "node-a,node-b", "--nproc-per-node", "2", "--device-target", "GPU"]
    argv += ["--python", "/opt/ms/bin/python3", "--env", "DATA_PATH=/data", "--", "train.py", "--epochs", "3"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "wrote mscon.yaml (2 node(s), 4 rank(s)" in out
    text = (project / "mscon.yaml").read_text()
    assert text.startswith("# An mscon inventory, written by `mscon init`")
    assert "shared/" not in text
    assert cli.main(["validate", "mscon.yaml"]) == 0
    inv = load_inventory(project / "mscon.yaml")
    assert inv.name == "mscon" and inv.device_target == "GPU"
    assert [(n.host, n.devices, n.python) for n in inv.nodes] == [
        ("node-a", 2, "/opt/ms/bin/python3"),
        ("node-b", 2, "/opt/ms/bin/python3"),
    ]
    assert inv.job.workdir == project and inv.job.script == "train.py" and inv.job.args == ("--epochs", "3")
    assert inv.job.env["DATA_PATH"] == "/data"
    assert "workdir: .  " in text  # relative: the project folder moves with the file
    # What the flags would run is what the file runs.
    flags_inv, _, _ = _job([a if a != "init" else "run" for a in argv[: argv.index("--")]], ["train.py"])
    assert flags_inv.nodes == inv.nodes and flags_inv.job.env == {"DATA_PATH": "/data"}


@pytest.mark.parametrize("target", ["CPU", "GPU", "Ascend"])
def test_init_from_each_sample_validates(project: Path, target: str) -> None:
    """With no script given, the sample's job in the current folder (a checkout, holding its trainer)."""
    (project / "trainer").mkdir()
    (project / "trainer" / "train.py").write_text("print('hi')\n")
    path = project / "sub" / f"{target.lower()}.yaml"
    path.parent.mkdir()
    assert cli.main(["init", str(path), "--device-target", target]) == 0
    inv = load_inventory(path)
    assert inv.device_target == target and inv.job.workdir == project
    assert "  workdir: ..  " in path.read_text()  # the current folder, relative to the file
    assert cli.main(["validate", str(path)]) == 0
    # Everything the sample says, the written file says (only its name, place and workdir differ).
    with resources.as_file(resources.files("mscon.inventory").joinpath(SAMPLES[target])) as p:
        sample = load_inventory(p)
    job = dataclasses.replace(sample.job, workdir=project)
    assert dataclasses.replace(inv, path=p, name=sample.name) == dataclasses.replace(sample, job=job)


def test_init_from_a_hostfile(project: Path) -> None:
    (project / "hostfile").write_text("a slots=1\nb slots=3\n")
    assert cli.main(["init", "x.yaml", "--hostfile", "hostfile", "--", "train.py"]) == 0
    assert [(n.host, n.devices) for n in load_inventory(project / "x.yaml").nodes] == [("a", 1), ("b", 3)]


def test_init_refuses_to_overwrite(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = project / "mscon.yaml"
    target.write_text("mine\n")
    assert cli.main(["init"]) == 2
    _one_line_error(capsys, "mscon.yaml: already exists; mscon init --force overwrites it")
    assert target.read_text() == "mine\n"
    assert (
        cli.main(["init", "--hosts", "bad host", "--nproc-per-node", "1", "--force", "--", "train.py"]) == 2
    )
    _one_line_error(capsys, "--hosts: expected a hostname")
    assert target.read_text() == "mine\n"  # a refused init writes nothing
    assert cli.main(["init", "--force", "--", "train.py"]) == 0
    assert load_inventory(target).nodes[0].transport == "local"
    assert not [p for p in os.listdir(project) if p.endswith(".tmp")]  # no temp file left behind


def test_init_into_a_folder_or_nowhere(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["init", str(project)]) == 2
    _one_line_error(capsys, "is a folder")
    assert cli.main(["init", "no/such/dir/x.yaml"]) == 2
    _one_line_error(capsys, "no such folder")
