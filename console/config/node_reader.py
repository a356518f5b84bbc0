"""Typed values read off a composed YAML node tree: mappings with known and required keys, lists,
text, numbers in a range, choices and the field domains, each refusal an ``InventoryError`` that
points at the value's line and column and names the field.

One pass finds every error: the schema reads each field through ``gather``, which records a refusal
and lets reading go on without that field; mappings record unknown, duplicate and missing keys the
same way (a missing required key raises its recorded error when it is looked up)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from mscon.console.config.domains import (
    ADDRESS_WHAT,
    DOTTED_NUMBERS,
    ENV_KEY_RE,
    HOST_WHAT,
    host_problem,
    ip_literal,
    is_hostname,
)
from mscon.console.config.errors import InventoryError
from mscon.console.config.limits import MAX_ENV_KEY, MAX_HOST, MAX_ITEMS, MAX_TEXT, MAX_VALUE
from mscon.console.config.scalars import (
    NULLS,
    core_type,
    describe_char,
    first_bad_char,
    is_plain,
    key_label,
    kind_of,
    plain_number,
    show_value,
)
from mscon.console.config.suggest import did_you_mean
from mscon.console.config.yaml_source import Tagged

_T = TypeVar("_T")


class Fields(dict[str, yaml.Node]):
    """A mapping's value nodes by key. Looking up a required key that is missing raises the error
    already recorded for it, so what depends on it is skipped without a second message."""

    def __init__(self, values: dict[str, yaml.Node], missing: dict[str, InventoryError]) -> None:
        super().__init__(values)
        self.missing = missing

    def __missing__(self, key: str) -> yaml.Node:
        if key in self.missing:
            raise self.missing[key]
        raise KeyError(key)


class NodeReader:
    """Walks a composed YAML node tree, so every error can point at a line and column."""

    def __init__(self, path: Path, tagged: Tagged | None = None) -> None:
        self.path = path
        self.tagged = tagged if tagged is not None else {}
        self.errors: list[InventoryError] = []  # in the order found

    def note(self, error: InventoryError) -> None:
        if not any(e is error for e in self.errors):
            self.errors.append(error)

    def gather(self, read: Callable[..., _T], *args: Any) -> _T | None:
        """``read(*args)``, or None once its refusal is recorded: reading goes on past a bad field."""
        try:
            return read(*args)
        except InventoryError as exc:
            self.note(exc)
            return None

    def field(
        self, m: dict[str, yaml.Node], key: str, where: str, read: Callable[..., _T], *args: Any
    ) -> _T | None:
        """``read(m[key], where, *args)`` gathered: None when the key is missing (a required one's
        error is recorded already) or its value is refused."""
        return self.gather(lambda: read(m[key], where, *args))

    def fail(self, node: yaml.Node | None, fieldname: str, message: str) -> InventoryError:
        if node is None:
            return InventoryError(self.path, 0, 0, fieldname, message)
        return InventoryError(
            self.path, node.start_mark.line + 1, node.start_mark.column + 1, fieldname, message
        )

    def check_tag(self, node: yaml.Node, where: str) -> None:
        if id(node) in self.tagged:
            tag = self.tagged[id(node)][1]
            raise self.fail(node, where, f"explicit YAML tags are not supported (found {tag[:60]})")

    def mapping(
        self, node: yaml.Node, where: str, allowed: dict[str, bool], aliases: dict[str, str] | None = None
    ) -> Fields:
        """Key -> value node; ``allowed`` maps each known key to whether it is required;
        ``aliases`` maps old key names to current ones. Unknown, duplicate and missing keys are
        recorded (``errors``), not raised; a value that is not a mapping raises."""
        self.check_tag(node, where or "(top level)")
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where or "(top level)", f"expected a mapping, got {kind_of(node)}")
        aliases = aliases or {}
        out: dict[str, yaml.Node] = {}
        spelled: dict[str, str] = {}
        misspelt: dict[str, InventoryError] = {}  # known key -> the unknown key that looks like it
        for key_node, value_node in node.value:
            key = self.gather(self.key, key_node, where)
            if key is None:
                continue
            name = f"{where}.{key_label(key)}" if where else key_label(key)
            canon = aliases.get(key, key)
            if canon in out:
                other = spelled[canon]
                self.note(
                    self.fail(
                        key_node,
                        name,
                        "duplicate key" if other == key else f"duplicate key (also given as {other})",
                    )
                )
                continue
            if canon not in allowed:
                known = ", ".join(sorted(allowed))
                meant = did_you_mean(key, [*allowed, *aliases], "keys")
                error = self.fail(key_node, name, f"unknown key{meant.hint} (known: {known})")
                self.note(error)
                if meant.choice:
                    misspelt.setdefault(aliases.get(meant.choice, meant.choice), error)
                continue
            out[canon] = value_node
            spelled[canon] = key
        missing: dict[str, InventoryError] = {}
        for key, required in allowed.items():
            if required and key not in out:
                # A required key given misspelt (device: for devices:) is one error, not two.
                missing[key] = misspelt.get(key) or self.fail(
                    node, f"{where}.{key}" if where else key, "missing required key"
                )
                self.note(missing[key])
        return Fields(out, missing)

    def key(self, node: yaml.Node, where: str) -> str:
        if not isinstance(node, yaml.ScalarNode):
            self.check_tag(node, where or "(top level)")
            raise self.fail(node, where or "(top level)", "keys must be plain names")
        name = f"{where}.{key_label(node.value)}" if where else key_label(node.value)
        self.check_tag(node, name)
        if node.value == "<<" and is_plain(node):
            raise self.fail(
                node,
                name,
                "YAML merge keys (<<) are not supported: write the keys out "
                "(settings shared by all nodes go in defaults)",
            )
        return node.value

    def sequence(self, node: yaml.Node, where: str, what: str = "a list") -> list[yaml.Node]:
        self.check_tag(node, where)
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, where, f"expected {what}, got {show_value(node)}")
        if len(node.value) > MAX_ITEMS:
            raise self.fail(node, where, f"too many items: {len(node.value)} (at most {MAX_ITEMS})")
        return node.value

    def _scalar(self, node: yaml.Node, where: str, what: str) -> yaml.ScalarNode:
        self.check_tag(node, where)
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, where, f"expected {what}, got {kind_of(node)}")
        return node

    def text(
        self,
        node: yaml.Node,
        where: str,
        what: str = "a non-empty string",
        maxlen: int = MAX_TEXT,
        *,
        allow_empty: bool = False,
        allowed_controls: str = "",
        noun: str = "",
    ) -> str:
        """A string field: the scalar's text as written (a plain 010 stays "010"), never null.
        With ``noun`` (a name, a path, a host) the field takes strings only: a plain number or
        boolean there is a slip (``name: 7``, ``python: true``), refused with the quoted spelling."""
        s = self._scalar(node, where, what)
        if is_plain(s) and s.value in NULLS:
            raise self.fail(node, where, f"expected {what}, got nothing")
        value = s.value
        kind = core_type(value) if noun and is_plain(s) else None
        if kind is not None:
            if len(value) > 40:
                raise self.fail(node, where, f"expected {noun}, got the {kind} {value[:40]}... (quote it)")
            raise self.fail(node, where, f'expected {noun}, got the {kind} {value} (quote it: "{value}")')
        if not allow_empty and not value.strip():
            raise self.fail(node, where, f"expected {what}, got {value!r}")
        if len(value) > maxlen:
            raise self.fail(node, where, f"too long: {len(value)} characters (at most {maxlen})")
        bad = first_bad_char(value, allowed_controls)
        if bad is not None:
            raise self.fail(node, where, f"contains {describe_char(bad)}")
        return value

    def matching(
        self, node: yaml.Node, where: str, pattern: re.Pattern[str], what: str, maxlen: int, noun: str = ""
    ) -> str:
        value = self.text(node, where, what, maxlen, noun=noun)
        if not pattern.fullmatch(value):
            raise self.fail(node, where, f"expected {what}, got {show_value(node)}")
        return value

    def choice(self, node: yaml.Node, where: str, choices: tuple[str, ...]) -> str:
        what = f"one of {', '.join(choices)}"
        value = self.text(node, where, what, 64)
        if value not in choices:
            meant = did_you_mean(value, choices)
            raise self.fail(node, where, f"expected {what}, got {show_value(node)}{meant.hint}")
        return value

    def _number(self, node: yaml.Node, where: str, what: str) -> int | float:
        s = self._scalar(node, where, what)
        if not is_plain(s):
            raise self.fail(node, where, f"expected {what}, got {show_value(node)} (a quoted string)")
        num = plain_number(s.value)
        if num.problem:
            raise self.fail(node, where, num.problem)
        if num.nonfinite:
            raise self.fail(node, where, f"expected {what} (a finite number), got {show_value(node)}")
        if num.value is None:
            raise self.fail(node, where, f"expected {what}, got {show_value(node)}")
        return num.value

    def integer(self, node: yaml.Node, where: str, lo: int, hi: int, what: str = "") -> int:
        what = what or f"an integer in {lo}..{hi}"
        value = self._number(node, where, what)
        if not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(node, where, f"expected {what}, got {show_value(node)}")
        return value

    def number(self, node: yaml.Node, where: str, lo: float, hi: float, lo_open: bool = False) -> float:
        what = f"a number > {lo:g} and <= {hi:g}" if lo_open else f"a number in {lo:g}..{hi:g}"
        value = self._number(node, where, what)
        if value < lo or value > hi or (lo_open and value == lo):
            raise self.fail(node, where, f"expected {what}, got {show_value(node)}")
        return float(value)

    def env_map(self, node: yaml.Node, where: str) -> dict[str, str]:
        self.check_tag(node, where)
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where, f"expected a mapping of names to values, got {show_value(node)}")
        if len(node.value) > MAX_ITEMS:
            raise self.fail(node, where, f"too many entries: {len(node.value)} (at most {MAX_ITEMS})")
        out: dict[str, str] = {}
        for k, v in node.value:
            key = self.key(k, where)
            name = f"{where}.{key_label(key)}"
            if not ENV_KEY_RE.fullmatch(key) or len(key) > MAX_ENV_KEY:
                raise self.fail(
                    k,
                    name,
                    f"expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*), got {key[:60]!r}",
                )
            if key in out:
                raise self.fail(k, name, "duplicate key")
            out[key] = self.word(v, name)
        return out

    def word(self, node: yaml.Node, where: str) -> str:
        """An env value or argv word: any text (empty too, tabs and newlines allowed), or a number."""
        return self.text(
            node, where, "a string or number", MAX_VALUE, allow_empty=True, allowed_controls="\t\n"
        )

    def words(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        return tuple(self.word(item, f"{where}[{i}]") for i, item in enumerate(self.sequence(node, where)))

    def path_text(self, node: yaml.Node, where: str) -> str:
        value = self.text(node, where, "a path", noun="a path")
        if value.startswith("-"):
            raise self.fail(node, where, f"a path must not start with '-', got {show_value(node)}")
        return value

    def path_pattern(self, node: yaml.Node, where: str) -> str:
        return self.text(node, where, "a glob pattern", noun="a glob pattern")

    def host(self, node: yaml.Node, where: str) -> str:
        value = self.text(node, where, HOST_WHAT, MAX_HOST, noun="a host")
        problem = host_problem(value)
        if problem is None:
            raise self.fail(node, where, f"expected {HOST_WHAT}, got {show_value(node)}")
        if problem:
            raise self.fail(node, where, f"{problem}: {show_value(node)}")
        return value

    def address(self, node: yaml.Node, where: str) -> str:
        value = self.text(node, where, ADDRESS_WHAT, MAX_HOST, noun="an address")
        if not (ip_literal(value) or (is_hostname(value) and not DOTTED_NUMBERS.fullmatch(value))):
            raise self.fail(
                node,
                where,
                f"expected {ADDRESS_WHAT} (RFC 1123: letters, digits, '-', '.'), got {show_value(node)}",
            )
        return value
