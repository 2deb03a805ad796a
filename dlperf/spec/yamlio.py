"""YAML reading that remembers line numbers, and helpers that turn a bad value into a located SpecError."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dlperf.errors import DlperfError, SpecError


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


def load_yaml_text(text: str, file: str) -> Any:
    """Parse YAML text; syntax errors become one located SpecError."""
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except DlperfError as err:
        raise err.located(file=file) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(f"YAML syntax error: {err.problem or err.context}", file=file, line=line) from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as err:
        raise SpecError(f"YAML error: {err}", file=file) from None


def load_yaml_file(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"cannot read file: {err}", file=str(path)) from None
    return load_yaml_text(text, str(path))


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
        if key not in node:
            raise SpecError(
                f"missing required key {key!r}", file=file, line=line_of(node), field=where or key
            )


def field_name(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
