"""YAML reading that remembers line numbers, and helpers that turn a bad value into a located SpecError."""

from __future__ import annotations

import copy
import difflib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dlperf.errors import DlperfError, SpecError

# Budgets checked before the work they bound (issue #15): the largest built-in file is ~20 KB and the largest
# document ~3,000 nodes, so these leave two orders of magnitude for hand-written files.
MAX_FILE_BYTES = 4 * 2**20
MAX_NODES = 200_000  # YAML nodes after alias expansion: `&a [*b, *b, ...]` nested 9 deep is 10^9 of them
# Documents already parsed, by (file name, text): `dlperf validate` reads the same model and hardware files once per
# row (2,134 rows), and PyYAML's pure-Python parser took about three quarters of its time; a deep copy of a parsed
# document costs ~1/50 of parsing it (dgx-h100.yaml: 0.2 vs 11 ms). Keyed on the text, so an edited file is
# parsed again; bounded, so a long session reading many files does not grow without limit.
_PARSED: dict[tuple[str, str], Any] = {}
_PARSED_LIMIT = 256


class LineDict(dict):
    """A mapping that knows the line of each of its keys (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class LineList(list):
    line: int = 0
    item_lines: list[int]


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise SpecError(expected="a plain key", found=key, line=key_node.start_mark.line + 1)
        if key in out:
            raise SpecError(f"duplicate key {key!r}", line=key_node.start_mark.line + 1)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _expanded_size(root: yaml.Node) -> int:
    """Nodes the document has once every alias is expanded, counted on the node graph without expanding it
    (an aliased subtree is counted once per use, computed once); a recursive alias counts as too many."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), MAX_NODES + 1)
            continue
        if id(node) in open_nodes:
            return MAX_NODES + 1  # an alias inside its own anchor: infinite when expanded
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                return MAX_NODES + 1
            stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_yaml_text(text: str, file: str) -> Any:
    """Parse YAML text; syntax errors become one located SpecError. A document that expands (through
    aliases) to more than MAX_NODES nodes is refused before anything is built from it. The caller gets its own
    copy, which it may change; the same text is parsed once (_PARSED)."""
    key = (file, text)
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.clear()
        _PARSED[key] = _parse(text, file)
    return copy.deepcopy(_PARSED[key])


def _parse(text: str, file: str) -> Any:
    try:
        loader = _LineLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            if _expanded_size(root) > MAX_NODES:
                raise SpecError(f"the document expands to more than {MAX_NODES:,} YAML nodes (aliases included)",
                                expected=f"at most {MAX_NODES:,} nodes (the limit yamlio.MAX_NODES)")
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except DlperfError as err:
        raise err.located(file=file) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(f"YAML syntax error: {err.problem or err.context}", file=file, line=line) from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as err:
        raise SpecError(f"YAML error: {err}", file=file) from None


def read_text_file(path: Path | str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes, checked before reading: a directory, a
    device (/dev/zero), a FIFO (which would block) or a huge file gets one SpecError naming the limit."""
    name = str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SpecError("file not found", file=name) from None
    except (OSError, ValueError) as err:
        raise SpecError(f"cannot read file: {_os_reason(err)}", file=name) from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a device, FIFO or socket"
        raise SpecError(expected="a regular file", found=kind, file=name)
    if info.st_size > limit:
        raise SpecError(f"the file has {info.st_size:,} bytes", expected=f"at most {limit:,} bytes", file=name)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise SpecError(f"cannot read file: {_os_reason(err)}", file=name) from None
    if len(data) > limit:  # it grew after the check
        raise SpecError(expected=f"at most {limit:,} bytes", found="a larger file", file=name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"not UTF-8 text (byte {err.start})", file=name) from None


def _os_reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or type(err).__name__


def load_yaml_file(path: Path) -> Any:
    return load_yaml_text(read_text_file(path), str(path))


def line_of(node: Any, key: Any = None) -> int | None:
    """Best line for `node[key]` (or for the node itself)."""
    if key is not None and isinstance(node, LineDict) and key in node.key_lines:
        return node.key_lines[key]
    if isinstance(node, LineList) and isinstance(key, int) and 0 <= key < len(node.item_lines):
        return node.item_lines[key]
    return getattr(node, "line", None) or None


def closest(word: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.5)
    return found[0] if found else None


def check_keys(
    node: Any, allowed: Iterable[str], file: str, where: str, required: Iterable[str] = ()
) -> None:
    """Reject unknown keys (suggesting the closest valid one) and missing required keys."""
    if not isinstance(node, dict):
        raise SpecError(expected="a mapping", found=node, file=file, line=line_of(node), field=where)
    allowed = list(allowed)
    for key in node:
        if key not in allowed:
            hint = closest(key, allowed)
            suggestion = f" (did you mean {hint!r}?)" if hint else ""
            raise SpecError(
                f"unknown key {key!r}{suggestion}",
                file=file,
                line=line_of(node, key),
                field=f"{where}.{key}" if where else str(key),
                expected="one of " + ", ".join(allowed),
            )
    for key in required:
        if key in node:
            continue
        if nulled(node, key):
            raise SpecError(
                f"missing required key {key!r}: a null drops the base's value", file=file, line=line_of(node, key),
                field=field_name(where, key), expected="a value, or no such line to keep the base's",
            )
        raise SpecError(
            f"missing required key {key!r}", file=file, line=line_of(node), field=where or key
        )


def nulled(node: Any, key: Any) -> bool:
    """Whether `key` was written as null over a base and so dropped (a hardware file's `extends:` merge): the
    mapping still knows the key's line, but no longer holds the key."""
    return isinstance(node, LineDict) and key in getattr(node, "key_lines", {}) and key not in node


def field_name(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
