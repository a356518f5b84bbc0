"""One pass finds every error of an inventory: ``mscon validate`` names them all, one line each with
file:line:col and field, with "did you mean" for misspelt keys and values (case included)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import mscon
from mscon.console.cli.validate import validate_main
from mscon.console.config.inventory import InventoryError, load_inventory
from mscon.console.config.suggest import did_you_mean

GOOD = """\
name: t
device_target: GPU
restart:
  max_restarts: 3
nodes:
  - host: a
    devices: 8
  - host: b
    devices: 8
job:
  script: train.py
  args: [--epochs, "1"]
"""

# The inventory: three typos, each one line of its own in one run.
THREE_TYPOS = (
    GOOD.replace("max_restarts: 3", "max_restart: 3")
    .replace("  - host: a\n    devices: 8", "  - host: a\n    device: 8")
    .replace("  args: [", "  arg: [")
)


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    return p


def _validate(path: Path) -> tuple[int, list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    code = validate_main([str(path)], out, err)
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


def test_the_base_inventory_is_valid(tmp_path: Path) -> None:
    assert _validate(_write(tmp_path, GOOD))[0] == 0


def test_three_typos_are_three_lines_with_suggestions_in_one_run(tmp_path: Path) -> None:
    p = _write(tmp_path, THREE_TYPOS)
    code, out, err = _validate(p)
    assert code == 2 and out == []
    # each: position, field, the suggestion, then the keys known there
    assert [line.split(" (known: ")[0] for line in err] == [
        f"{p}:4:3: restart.max_restart: unknown key: did you mean max_restarts?",
        f"{p}:7:5: nodes[0].device: unknown key: did you mean devices?",
        f"{p}:12:3: job.arg: unknown key: did you mean args?",
    ]
    assert all(line.endswith(")") and "(known: " in line for line in err)


def test_the_cli_reports_them_all_with_exit_2(tmp_path: Path) -> None:
    p = _write(tmp_path, THREE_TYPOS)
    done = mscon("validate", p, cwd=tmp_path, timeout=60)
    assert done.code == 2 and done.out == ""
    assert [line.split(": ")[1] for line in done.err.splitlines()] == [
        "restart.max_restart",
        "nodes[0].device",
        "job.arg",
    ]
    # run stops at the same errors, all of them, before anything starts
    done = mscon("run", "--no-tui", p, cwd=tmp_path, timeout=60)
    assert done.code == 2 and len(done.err.splitlines()) == 3 and "Traceback" not in done.err


def test_a_value_in_the_wrong_case_is_named(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD.replace("device_target: GPU", "device_target: gpu"))
    code, _, err = _validate(p)
    assert code == 2
    assert err == [
        f"{p}:2:16: device_target: expected one of GPU, Ascend, CPU, got 'gpu': "
        "did you mean GPU? (values are case-sensitive)"
    ]


def test_a_key_in_the_wrong_case_is_named(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD.replace("  args: [", "  Args: ["))
    (line,) = _validate(p)[2]
    assert "job.Args: unknown key: did you mean args? (keys are case-sensitive)" in line


def test_unrelated_errors_of_every_kind_in_one_pass(tmp_path: Path) -> None:
    node_b = "  - host: b\n    devices: 0\n    port: 70000\n    transport: SSH"
    text = (
        GOOD.replace("device_target: GPU", "device_target: Ascnd")
        .replace("  - host: b\n    devices: 8", node_b)
        .replace("script: train.py", "script: nowhere.py")
        + "hang: {timeout_s: 1}\nbogus: 1\n"
    )
    code, _, err = _validate(_write(tmp_path, text))
    assert code == 2
    fields = [line.split(": ")[1] for line in err]
    assert fields == [
        "device_target",
        "nodes[1].devices",
        "nodes[1].port",
        "nodes[1].transport",
        "job.script",
        "hang.timeout_s",
        "bogus",
    ], err
    assert "did you mean Ascend?" in err[0] and "did you mean ssh? (values are case-sensitive)" in err[3]
    assert all(line.count("\n") == 0 for line in err)


def test_the_loader_raises_the_first_and_carries_them_all(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(_write(tmp_path, THREE_TYPOS))
    exc = info.value
    assert "\n" not in str(exc) and len(exc.all) == 3 and exc in exc.all
    assert exc.report().splitlines() == exc.lines() and len(exc.lines()) == 3


def test_a_missing_required_key_is_reported_once_and_skips_what_needs_it(tmp_path: Path) -> None:
    text = GOOD.replace("  - host: a\n    devices: 8\n", "  - devices: 8\n")
    code, _, err = _validate(_write(tmp_path, text))
    assert code == 2 and len(err) == 1 and "nodes[0].host: missing required key" in err[0]


def test_a_bad_yaml_file_is_still_one_error(tmp_path: Path) -> None:
    code, _, err = _validate(_write(tmp_path, GOOD + "  - [unclosed\n"))
    assert code == 2 and len(err) == 1 and "invalid YAML" in err[0]


def test_did_you_mean() -> None:
    targets = ("GPU", "Ascend", "CPU")
    assert did_you_mean("gpu", targets).hint == ": did you mean GPU? (values are case-sensitive)"
    assert did_you_mean("Ascnd", ("GPU", "Ascend", "CPU")).choice == "Ascend"
    assert did_you_mean("max_restart", ("max_restarts", "backoff_s")).choice == "max_restarts"
    assert did_you_mean("zzz", ("GPU", "Ascend", "CPU")).hint == ""
