"""Every number in every built-in hardware file carries its source (issue #12: the honest protocol).

A number is sourced when its own line has a comment, when the comment block right above its key says where it
comes from, or when the mapping that holds it (a device, an efficiency curve, a network level, a dispatch
record) has a `source:` key. The file's top-level `source` does not count for numbers nested below it: it is
too far from the number to say which figure it backs.
"""

from __future__ import annotations

import re

import pytest
import yaml

from dlperf import builtins

NUMBER = re.compile(r"^[-+]?(\d|\.\d)")
TEXT_KEYS = ("name", "description", "source")  # prose, even when it starts with a digit


def _numbers_without_source(text: str) -> list[str]:
    lines = text.splitlines()
    missing: list[str] = []

    def commented(line_index: int) -> bool:
        if "#" in lines[line_index]:
            return True
        above = line_index - 1
        return above >= 0 and lines[above].strip().startswith("#")

    def walk(node: yaml.Node, path: str, sourced: bool, depth: int) -> None:
        if isinstance(node, yaml.MappingNode):
            keys = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
            here = sourced or (depth > 0 and "source" in keys)
            for key, value in node.value:
                if key.value in TEXT_KEYS:
                    continue
                key_line = key.start_mark.line
                walk(value, f"{path}.{key.value}" if path else key.value, here or commented(key_line), depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]", sourced or commented(item.start_mark.line), depth + 1)
        elif (isinstance(node, yaml.ScalarNode) and NUMBER.match(str(node.value)) and not sourced
              and not commented(node.start_mark.line)):
            missing.append(f"line {node.start_mark.line + 1}: {path} = {node.value}")

    walk(yaml.compose(text), "", False, 0)
    return missing


@pytest.mark.parametrize("name", builtins.builtin_names("hardware"))
def test_every_number_in_a_builtin_hardware_file_has_a_source(name: str) -> None:
    text = builtins.resolve(name, "hardware").read_text()
    assert _numbers_without_source(text) == []


@pytest.mark.parametrize("name", builtins.builtin_names("hardware"))
def test_an_extending_builtin_inherits_only_from_a_builtin(name: str) -> None:
    """A file with `extends:` holds only the numbers that differ (checked above); the rest come from its base,
    which must itself be a built-in so that the same check covers every number the loaded spec has."""
    base = yaml.safe_load(builtins.resolve(name, "hardware").read_text()).get("extends")
    assert base is None or base in builtins.builtin_names("hardware")


def test_the_check_finds_an_unsourced_number() -> None:
    text = "name: x\nsource: top\ndevice:\n  name: d\n  memory: 80 GiB\n  sms: 108   # whitepaper\n"
    assert _numbers_without_source(text) == ["line 5: device.memory = 80 GiB"]
    sourced_block = "device:\n  source: datasheet\n  memory: 80 GiB\n"
    assert _numbers_without_source(sourced_block) == []
    comment_above = "device:\n  # datasheet, 80GB column\n  memory: 80 GiB\n"
    assert _numbers_without_source(comment_above) == []
