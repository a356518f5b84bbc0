"""An inventory file read as YAML, within bounds: a regular file of at most ``MAX_FILE_BYTES``, UTF-8
without NUL bytes, one document composed (never constructed) by PyYAML's safe loader, at most
``MAX_DEPTH`` deep and ``MAX_YAML_VALUES`` values even once aliases are expanded. Explicit tags are
recorded, not applied, so the schema can refuse them by field. Every refusal is an
``InventoryError`` with the line and column where one applies."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import yaml
from mscon.console.config import named_files
from mscon.console.config.errors import InventoryError
from mscon.console.config.limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_YAML_VALUES

Tagged = dict[int, tuple[yaml.Node, str]]  # id(node) -> (node, its explicit tag)


def read_yaml(p: Path) -> tuple[yaml.Node, Tagged]:
    """The file's root node and its explicitly tagged nodes."""
    text = _decode(p, _read_bytes(p))
    root, tagged = _compose(p, text)
    _check_expanded(p, root)
    return root, tagged


def _read_bytes(p: Path) -> bytes:
    try:
        st = os.stat(p)
    except (OSError, ValueError) as exc:
        raise InventoryError(p, 0, 0, "", f"cannot read: {_os_reason(exc)}") from None
    _check_regular(p, st.st_mode)
    if st.st_size > MAX_FILE_BYTES:
        raise InventoryError(p, 0, 0, "", f"file too large: {st.st_size} bytes (at most {MAX_FILE_BYTES})")
    try:
        # Non-blocking: if the path became a FIFO since the stat, the open must not wait for a writer.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InventoryError(p, 0, 0, "", f"cannot read: {_os_reason(exc)}") from None
    try:
        _check_regular(p, os.fstat(fd).st_mode)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InventoryError(p, 0, 0, "", f"cannot read: {_os_reason(exc)}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise InventoryError(p, 0, 0, "", f"file too large: more than {MAX_FILE_BYTES} bytes")
    return data


def _os_reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _check_regular(p: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise InventoryError(p, 0, 0, "", f"cannot read: not a regular file ({named_files.kind(mode)})")


_BOMS = [
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
]


def _decode(p: Path, data: bytes) -> str:
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise InventoryError(p, 1, 1, "", f"the file is {name} (byte-order mark): save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        line, col = _position(data, nul)
        raise InventoryError(
            p, line, col, "", "contains a NUL byte (not a text file, or UTF-16/32: save it as UTF-8)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _position(data, exc.start)
        msg = f"not valid UTF-8 (byte 0x{data[exc.start]:02x}): save the file as UTF-8"
        raise InventoryError(p, line, col, "", msg) from None


def _position(data: bytes | str, offset: int) -> tuple[int, int]:
    nl: Any = b"\n" if isinstance(data, bytes) else "\n"
    return data.count(nl, 0, offset) + 1, offset - (data.rfind(nl, 0, offset) + 1) + 1


# ------------------------------------------------------------------ YAML, bounded


class _Limit(Exception):
    def __init__(self, mark: Any, message: str) -> None:
        super().__init__(message)
        self.mark, self.message = mark, message


class _Bounded:
    """Composing that records explicit tags and stops at the limits, before its recursion or the
    node count can grow (mixed into a PyYAML parser below)."""

    depth = 0
    count = 0
    tagged: Tagged

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            return super().compose_node(parent, index)
        self.count += 1
        if self.count > MAX_YAML_VALUES:
            raise _Limit(event.start_mark, f"more than {MAX_YAML_VALUES} YAML values")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Limit(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        tag = getattr(event, "tag", None)
        if tag is not None:
            self.tagged[id(node)] = (node, tag)
        return node


class _Composer(_Bounded, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader, used only to compose: its words are the errors'."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.tagged = {}


if getattr(yaml, "__with_libyaml__", False):

    class _FastComposer(_Bounded, yaml.composer.Composer, yaml.cyaml.CParser, yaml.resolver.Resolver):
        """The same composing over libyaml's parser: 10,000 nodes parse in ~1 s, not ~15 s."""

        def __init__(self, text: str) -> None:
            yaml.cyaml.CParser.__init__(self, text)
            yaml.composer.Composer.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self.tagged = {}

        def compose_scalar_node(self, anchor: Any) -> Any:
            node = super().compose_scalar_node(anchor)
            if node.style == "":  # libyaml's plain scalar; the pure-Python loader's is None
                node.style = None
            return node

    FAST: type[Any] | None = _FastComposer
else:  # pragma: no cover - PyYAML built without libyaml
    FAST = None


def _compose(p: Path, text: str) -> tuple[yaml.Node, Tagged]:
    try:
        yaml.reader.Reader(text)  # refuses unprintable characters, with their position
    except yaml.YAMLError as exc:
        raise _yaml_error(p, text, exc) from None
    if FAST is not None:
        # libyaml composes a good file; a file it refuses is composed again in pure Python, whose
        # messages (and positions) are the ones every refusal has always had.
        fast = FAST(text)
        try:
            root = fast.get_single_node()
        except (yaml.YAMLError, _Limit, RecursionError):
            pass
        else:
            if root is None:
                raise InventoryError(p, 0, 0, "", "the file is empty")
            return root, fast.tagged
        finally:
            fast.dispose()
    try:
        loader = _Composer(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(p, text, exc) from None
    try:
        root = loader.get_single_node()
    except _Limit as exc:
        raise InventoryError(p, exc.mark.line + 1, exc.mark.column + 1, "", exc.message) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(p, text, exc) from None
    except RecursionError:
        raise InventoryError(p, 0, 0, "", f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    if root is None:
        raise InventoryError(p, 0, 0, "", "the file is empty")
    return root, loader.tagged


def _yaml_error(p: Path, text: str, exc: yaml.YAMLError) -> InventoryError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        if exc.problem and exc.context:
            problem = f"{exc.problem} ({exc.context})"
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        return InventoryError(p, line, col, "", f"invalid YAML: {problem}")
    if isinstance(exc, yaml.reader.ReaderError):
        line, col = _position(text, exc.position)
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        msg = (
            f"invalid YAML: unacceptable character U+{ord(char):04X} (write it as an escape in double quotes)"
        )
        return InventoryError(p, line, col, "", msg)
    return InventoryError(p, 0, 0, "", f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else exc!r}")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expanded(p: Path, root: yaml.Node) -> None:
    """Refuse alias cycles, and trees that aliases make too deep or too big (billion laughs).

    An iterative depth-first walk over the composed graph, with each node's expanded size
    memoized, so the cost is that of the file, not of the expansion."""

    def fail(node: yaml.Node, message: str) -> NoReturn:
        m = node.start_mark
        raise InventoryError(p, m.line + 1, m.column + 1, "", message)

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = {id(root)}
    stack: list[tuple[yaml.Node, Iterator[yaml.Node]]] = [(root, iter(_children(root)))]
    while stack:
        node, it = stack[-1]
        child = next(it, None)
        if child is None:
            stack.pop()
            open_.discard(id(node))
            kids = _children(node)
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[id(node)] > MAX_YAML_VALUES:
                fail(node, f"more than {MAX_YAML_VALUES} YAML values once aliases are expanded")
            continue
        if id(child) in open_:
            fail(child, "an alias refers to a collection that contains it (a recursive alias)")
        if id(child) in size:
            if len(stack) + depth[id(child)] > MAX_DEPTH:
                fail(child, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
            continue
        if len(stack) >= MAX_DEPTH:
            fail(child, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
        open_.add(id(child))
        stack.append((child, iter(_children(child))))
