"""`extends:` in hardware files: a file that says only what differs from a base (hardware/a100-40gb.yaml on
dgx-a100), and one located line for every way it can go wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlperf.cli import main
from dlperf.errors import SpecError
from dlperf.spec.hardware import MAX_EXTENDS_DEPTH, load_hardware

GiB = 2.0**30


def test_a100_40gb_is_dgx_a100_but_for_memory_price_and_network_names() -> None:
    base, forty = load_hardware("dgx-a100"), load_hardware("a100-40gb")
    differ = {f.name for f in dataclasses.fields(base.device)
              if getattr(base.device, f.name) != getattr(forty.device, f.name)}
    assert differ == {"name", "memory", "memory_bandwidth"}
    assert (forty.device.memory, forty.device.memory_bandwidth) == (40 * GiB, 1555e9)
    assert forty.price_per_device_hour is None  # `price_per_device_hour: null` drops dgx-a100's p4de price
    assert [dataclasses.replace(level, name="") for level in forty.network] == \
        [dataclasses.replace(level, name="") for level in base.network]
    assert [level.name for level in forty.network] == ["nvswitch", "roce-200g"]


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


CHILD = "extends: {base}\nname: child\ndevice:\n  memory: 40 GiB\n"


def test_a_relative_path_is_read_from_the_extending_files_folder(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "base.yaml", "name: base\ndevice: {name: d, peak_flops: {fp32: 1 TFLOP/s}, memory: 8 GiB, "
                                   "memory_bandwidth: 1 TB/s, sms: 4}\nnetwork: [{name: n, bandwidth: 1 GB/s, "
                                   "latency: 1 us}]\nprice_per_device_hour: 2\n")
    child = _write(tmp_path / "sub" / "child.yaml", CHILD.format(base="../base.yaml"))
    hw = load_hardware(child)
    assert (hw.name, hw.device.name, hw.device.memory, hw.device.sms) == ("child", "d", 40 * GiB, 4)
    assert (hw.price_per_device_hour, hw.path) == (2, child)


def _error(path: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    return info.value


@pytest.mark.parametrize(("extends", "words"), [
    ("[dgx-a100]", "expected a built-in hardware name or a .yaml path"),
    ("''", "expected a built-in hardware name or a .yaml path"),
    ("7", "expected a built-in hardware name or a .yaml path"),
    ("dgx-a10", "no hardware file 'dgx-a10' to extend (did you mean 'dgx-a100'?)"),
    ("missing.yaml", "no hardware file 'missing.yaml' to extend"),
    ("child.yaml", "'child.yaml' extends itself (a cycle)"),
    (".", "no hardware file '.' to extend"),
])
def test_a_bad_extends_is_one_located_line(tmp_path: Path, extends: str, words: str) -> None:
    child = _write(tmp_path / "child.yaml", CHILD.format(base=extends))
    err = _error(child)
    assert words in str(err)
    assert str(err).startswith(f"{child}:1: extends: ")


def test_a_cycle_through_two_files_and_a_chain_too_deep_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "a.yaml", CHILD.format(base="b.yaml"))
    _write(tmp_path / "b.yaml", CHILD.format(base="a.yaml"))
    assert "extends itself (a cycle)" in str(_error(str(tmp_path / "a.yaml")))
    for i in range(MAX_EXTENDS_DEPTH + 1):
        _write(tmp_path / f"c{i}.yaml", CHILD.format(base=f"c{i + 1}.yaml" if i < MAX_EXTENDS_DEPTH else "dgx-a100"))
    assert load_hardware(str(tmp_path / "c1.yaml")).device.memory == 40 * GiB
    assert f"more than {MAX_EXTENDS_DEPTH} bases deep" in str(_error(str(tmp_path / "c0.yaml")))


def test_an_error_in_the_base_names_the_base_and_one_in_the_child_names_the_child(tmp_path: Path) -> None:
    base = _write(tmp_path / "base.yaml", "name: b\ndevice: {name: d, peak_flops: {fp32: 1 TFLOP/s}, "
                                          "memory: lots, memory_bandwidth: 1 TB/s}\nnetwork: [{name: n, "
                                          "bandwidth: 1 GB/s, latency: 1 us}]\n")
    err = _error(_write(tmp_path / "child.yaml", CHILD.format(base="base.yaml")))
    assert (err.file, err.line, err.field) == (base, 2, "device.memory")
    child = _write(tmp_path / "child2.yaml", "extends: dgx-a100\nname: c\ndevice:\n  memory: lots\n")
    err = _error(child)
    assert (err.file, err.line, err.field) == (child, 4, "device.memory")
    child = _write(tmp_path / "child3.yaml", "extends: dgx-a100\nname: c\ndevice: null\n")
    assert "missing required key 'device'" in str(_error(child))
    child = _write(tmp_path / "child4.yaml", "extends: dgx-a100\nname: c\ndevices: {}\n")
    assert "unknown key 'devices' (did you mean 'device'?)" in str(_error(child))


def test_a_child_needs_its_own_name(tmp_path: Path) -> None:
    """Else it loads, and every message reports it, under its base's name (reviewer)."""
    child = _write(tmp_path / "child.yaml", "extends: dgx-a100\ndevice:\n  memory: 40 GiB\n")
    with pytest.raises(SpecError, match="extends another needs its own name") as info:
        load_hardware(child)
    assert "child.yaml:1" in str(info.value) and "\n" not in str(info.value)


def test_the_cli_prints_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    child = _write(tmp_path / "child.yaml", CHILD.format(base="dgx-a10"))
    with pytest.raises(SystemExit) as info:
        main(["show", child])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and "no hardware file 'dgx-a10' to extend" in err


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


DEVICE_KEYS = st.sampled_from(["name", "memory", "memory_bandwidth", "peak_flops", "efficiency", "sms"])
DEVICES = st.dictionaries(DEVICE_KEYS | st.text(max_size=6), VALUES, max_size=3) | VALUES


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extends=st.sampled_from(["dgx-a100", "a100-40gb", "cpu-local"]) | VALUES, device=DEVICES, network=VALUES)
def test_fuzzed_extending_files_load_or_raise_a_spec_error(tmp_path: Path, extends, device, network) -> None:
    import yaml

    doc = {"extends": extends, "name": "f", "device": device, "network": network}
    path = _write(tmp_path / "fuzz.yaml", yaml.safe_dump(doc))
    try:
        load_hardware(path)
    except SpecError as err:
        assert "\n" not in str(err) and str(err)
        assert err.line and err.file in (path, str(load_hardware(extends).path) if extends in BASES else path), \
            str(err)  # one located line: this file's, or a built-in base's


BASES = ("dgx-a100", "a100-40gb", "cpu-local")


NULL_DROPS = [
    # (the extending file's body after `extends: dgx-a100`, the line of the null, the field it drops)
    ("name: c\nnetwork: null\n", 3, "network"),
    ("name: c\ndevice: null\n", 3, "device"),
    ("name: null\n", 2, "name"),
    ("name: c\ndevice:\n  memory: 40 GiB\n  memory_bandwidth: null\n", 5, "device.memory_bandwidth"),
    ("name: c\ndevice:\n  sms: 100\n  peak_flops:\n    fp16: 300 TFLOP/s\n    fp32: null\n", 7,
     "device.peak_flops.fp32"),
    ("name: c\ndevice:\n  efficiency:\n    matmul:\n      half: 1 GFLOP\n      peak: null\n", 7,
     "device.efficiency.matmul.peak"),
    ("name: c\nnetwork: null\nprice_per_device_hour: 3\n", 3, "network"),
]


@pytest.mark.parametrize(("body", "line", "field"), NULL_DROPS)
def test_a_null_that_drops_a_required_key_is_reported_at_the_null(tmp_path: Path, body: str, line: int,
                                                                  field: str) -> None:
    """`key: null` drops the base's value (the merge rule); where the key is required, the one line names the
    null's own line and the dotted field, not the mapping's first line (reviewer: `network: null` said line 1)."""
    child = _write(tmp_path / "child.yaml", "extends: dgx-a100\n" + body)
    err = _error(child)
    assert (err.file, err.line, err.field) == (child, line, field)
    assert "a null drops the base's value" in str(err) and "expected a value" in str(err) and "\n" not in str(err)


def test_a_null_dropped_in_a_middle_base_names_that_base(tmp_path: Path) -> None:
    middle = _write(tmp_path / "middle.yaml", "extends: dgx-a100\nname: m\nsource: x\nnetwork: null\n")
    err = _error(_write(tmp_path / "child.yaml", "extends: middle.yaml\nname: c\n"))
    assert (err.file, err.line, err.field) == (middle, 4, "network")


@pytest.mark.parametrize(("key", "value"), [("network", "null"), ("device", "null"), ("device", "7")])
def test_a_null_section_in_a_plain_file_is_reported_at_its_key(tmp_path: Path, key: str, value: str) -> None:
    """No base: `network: null` stays null, which carries no line of its own; the key's line is given."""
    text = Path(load_hardware("dgx-a100").path).read_text()
    lines = text.splitlines()
    at = next(i for i, s in enumerate(lines) if s.startswith(f"{key}:"))
    end = next((i for i in range(at + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines))
    path = _write(tmp_path / "plain.yaml", "\n".join(lines[:at] + [f"{key}: {value}"] + lines[end:]) + "\n")
    err = _error(path)
    assert (err.file, err.line, err.field) == (path, at + 1, key)


@pytest.mark.parametrize("body", [body for body, _, _ in NULL_DROPS])
def test_the_cli_reports_a_dropped_key_in_one_line_with_exit_2(tmp_path: Path, body: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    child = _write(tmp_path / "child.yaml", "extends: dgx-a100\n" + body)
    with pytest.raises(SystemExit) as info:
        main(["show", child])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{child}:" in err and "a null drops the base's value" in err
