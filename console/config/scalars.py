"""Plain YAML scalars, read by YAML 1.2's core schema: which texts are numbers, which are refused as
ambiguous (YAML 1.1 would read them differently), and how a value is quoted back in a message."""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

import yaml
from mscon.console.config.limits import MAX_INT_DIGITS, MAX_NUMBER_CHARS

NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_DEC_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_SPECIAL = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
_LEADING_ZERO = re.compile(r"[-+]?0[0-9]+")
_BASE_PREFIX = re.compile(r"[-+]?0[xXoObB][0-9a-fA-F_]*")
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_UNDERSCORED = re.compile(r"[-+]?[0-9_]*[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class _Num:
    """A plain scalar read where a number is expected: its value, or why it has none."""

    value: int | float | None = None
    problem: str = ""  # a complete message, when the text looks like a number but is refused
    nonfinite: bool = False  # .nan, .inf, 1e999: the message names the expected range


def plain_number(text: str) -> _Num:
    sign_free = text.lstrip("+-")
    if _DEC_INT.fullmatch(text):
        if len(sign_free) > MAX_INT_DIGITS:
            return _Num(problem=f"too many digits: {len(sign_free)} (at most {MAX_INT_DIGITS})")
        return _Num(int(text))
    if _LEADING_ZERO.fullmatch(text):
        octal = f", YAML 1.1 as octal {int(text, 8)}" if set(sign_free) <= set("01234567") else ""
        return _Num(
            problem=f"ambiguous number {text!r} (YAML 1.2 reads it as {int(text)}{octal}): "
            "write a decimal without leading zeros, or quote it where a string is meant"
        )
    if _BASE_PREFIX.fullmatch(text):
        return _Num(problem=f"ambiguous number {text!r}: write it as a plain decimal")
    if _SEXAGESIMAL.fullmatch(text):
        base60 = ""
        if "." not in text and "_" not in text:
            total = 0
            for part in sign_free.split(":"):
                total = total * 60 + int(part)
            base60 = f" {-total if text.startswith('-') else total}"
        return _Num(
            problem=f"ambiguous value {text!r} (YAML 1.1 reads it as the base-60 number{base60}): "
            "write a plain decimal number, or quote it where a string is meant"
        )
    if "_" in text and _UNDERSCORED.fullmatch(text):
        return _Num(problem=f"ambiguous number {text!r} (YAML 1.1 ignores '_'): write it without underscores")
    if _FLOAT.fullmatch(text):
        if len(text) > MAX_NUMBER_CHARS:
            return _Num(problem=f"number too long: {len(text)} characters (at most {MAX_NUMBER_CHARS})")
        value = float(text)
        return _Num(value) if math.isfinite(value) else _Num(nonfinite=True)
    if _SPECIAL.fullmatch(text):
        return _Num(nonfinite=True)
    return _Num()


_CORE_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")


def core_type(text: str) -> str | None:
    """What YAML 1.2's core schema makes of a plain scalar that is not a string: "number" or
    "boolean" (None for a string; nulls are the caller's). Only the core schema's own forms count:
    1:30 or 1_000 are strings there, and a host such as 1:2:3:4:5:6:7:8 stays one."""
    if text in _BOOLS:
        return "boolean"
    if _CORE_INT.fullmatch(text) or _FLOAT.fullmatch(text) or _SPECIAL.fullmatch(text):
        return "number"
    return None


def is_plain(node: yaml.ScalarNode) -> bool:
    return node.style is None or node.style == ""


def show_value(node: yaml.Node) -> str:
    """How a value is quoted back in a message: numbers as written, strings quoted and cut short."""
    if not isinstance(node, yaml.ScalarNode):
        return kind_of(node)
    text = node.value
    if is_plain(node):
        if text in NULLS:
            return "nothing"
        if text in _BOOLS or _DEC_INT.fullmatch(text) or _SPECIAL.fullmatch(text):
            return text[:40] + ("..." if len(text) > 40 else "")
        if _FLOAT.fullmatch(text) and len(text) <= MAX_NUMBER_CHARS:
            return text
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def kind_of(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    return "a list" if isinstance(node, yaml.SequenceNode) else "a value"


_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def first_bad_char(value: str, allowed: str = "") -> str | None:
    """The first control or invisible character in ``value`` that is not in ``allowed``."""
    for m in _ASCII_CONTROL.finditer(value):
        if m.group() not in allowed:
            return m.group()
    if not value.isascii():
        for c in value:
            if ord(c) >= 0x7F and unicodedata.category(c) in _BAD_CATEGORIES:
                return c
    return None


def describe_char(c: str) -> str:
    if c == "\0":
        return "a NUL character"
    if c in "\n\r\x85\u2028\u2029":
        return f"a line break (U+{ord(c):04X})"
    if unicodedata.category(c) == "Cc":
        return f"a control character (U+{ord(c):04X})"
    return f"an invisible or unpaired character (U+{ord(c):04X})"


def key_label(key: str) -> str:
    """A mapping key as a part of a field name."""
    if re.fullmatch(r"[A-Za-z0-9_.<-]{1,64}", key):
        return key
    return repr(key[:40] + ("..." if len(key) > 40 else ""))
