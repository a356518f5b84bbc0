"""Inventories at the console's scale (issue 44): 10,000 nodes of 8 ranks validate, one node over
the cap is refused in one line naming file, line and field (exit 2), and libyaml composes what the
pure-Python loader composes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from mscon.console.cli.validate import validate_main
from mscon.console.config import yaml_source
from mscon.console.config.limits import MAX_NODES, MAX_WORLD_SIZE

REPO = Path(__file__).resolve().parents[2]

HEAD = """\
name: big
device_target: GPU
defaults: {user: train, python: /opt/venv/bin/python3}
nodes:
"""
TAIL = """\
scheduler: {port: 8118}
job: {workdir: ., script: train.py}
"""


def _inventory(tmp_path: Path, nodes: int, devices: int = 8) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    lines = (
        f"  - {{host: node-{i:05d}.cluster.internal, name: node-{i:05d}, devices: {devices}, "
        f"address: 10.{i >> 16}.{i >> 8 & 255}.{i & 255}}}\n"
        for i in range(nodes)
    )
    path = tmp_path / f"inv{nodes}.yaml"
    path.write_text(HEAD + "".join(lines) + TAIL)
    return path


def test_10000_nodes_of_8_ranks_validate(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert validate_main([str(_inventory(tmp_path, 10_000))], out, err) == 0, err.getvalue()
    assert "(10000 nodes, 80000 ranks)" in out.getvalue()
    assert 10_000 * 8 <= MAX_WORLD_SIZE


def test_one_node_over_the_cap_is_refused_in_one_line_with_exit_2(tmp_path: Path) -> None:
    path = _inventory(tmp_path, MAX_NODES + 1, devices=1)
    out, err = io.StringIO(), io.StringIO()
    assert validate_main([str(path)], out, err) == 2
    assert out.getvalue() == ""
    assert err.getvalue() == f"{path}:5:3: nodes: too many nodes: {MAX_NODES + 1} (at most {MAX_NODES})\n"


def _shape(node: yaml.Node) -> object:
    """A composed node as plain data: its kind, tag, value, style and where it starts."""
    where = (node.start_mark.line, node.start_mark.column, node.end_mark.line, node.end_mark.column)
    if isinstance(node, yaml.ScalarNode):
        return ("scalar", node.tag, node.value, node.style, where)
    if isinstance(node, yaml.SequenceNode):
        return ("seq", node.tag, [_shape(n) for n in node.value], node.flow_style, where)
    return ("map", node.tag, [(_shape(k), _shape(v)) for k, v in node.value], node.flow_style, where)


SAMPLES = [
    *sorted((REPO / "inventory").glob("*.yaml")),
    "a: &x {b: [1, 2.5, 'c', \"d\\te\", ~, true]}\nf: *x\ng: !!str 3\n"
    "h: |\n  block\n  text\ni: >-\n  folded\n",
    "# comment\n- é ünï: 'ç'\n- {k: [x, {y: z}]}\n- ? complex\n  : key\n- !custom tagged\n",
]


@pytest.mark.skipif(yaml_source.FAST is None, reason="PyYAML without libyaml: only the pure-Python loader")
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name if isinstance(s, Path) else s[:12])
def test_libyaml_composes_what_the_pure_python_loader_composes(sample: Path | str) -> None:
    text = sample.read_text() if isinstance(sample, Path) else sample
    slow, fast = yaml_source._Composer(text), yaml_source.FAST(text)
    try:
        assert _shape(fast.get_single_node()) == _shape(slow.get_single_node())
        assert {_shape(n): t for n, t in fast.tagged.values()} == {
            _shape(n): t for n, t in slow.tagged.values()
        }
    finally:
        slow.dispose()
        fast.dispose()
