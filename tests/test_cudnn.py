"""Plan `cudnn`: fused attention (attention_fa3) priced at the curve a hardware file measures for the plan's cuDNN
version (efficiency.attention_fa3.by_cudnn; dlperf.spec.hardware.Device.for_cudnn). Without it, or on a file
without by_cudnn, every prediction is what it was."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dlperf.engine import predict
from dlperf.engine.step import StepModel
from dlperf.errors import DlperfError, PlanError, SpecError
from dlperf.plan import Plan, cudnn_version, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from dlperf.validate import load_dataset

# Megatron-Bridge's Llama 3 8B layout on one GB300 tray set (tests price one node's worth: the fused attention is a
# visible share of the step at 8k, so the curves' differences show)
PLAN = Plan(devices=8, dp=8, global_batch=64, micro_batch=1, dtype="bf16", zero=1, zero_impl="megatron",
            overlap=True)


def _step(hardware: str, plan: Plan = PLAN, model: str = "llama3-8b") -> float:
    return float(predict(load_model(model), load_hardware(hardware), plan).step_time_s)


@pytest.mark.parametrize("hardware", ["dgx-b200", "gb200-nvl72", "dgx-gb300", "dgx-b300", "dgx-h100"])
def test_a_plan_without_cudnn_predicts_as_the_file_without_by_cudnn(hardware: str) -> None:
    """No `cudnn`: the file's default curve, exactly as before by_cudnn existed (the same hardware with its
    per-version curves stripped prices every plan to the bit)."""
    hw = load_hardware(hardware)
    bare = replace(hw, device=replace(hw.device, cudnn_curves=()))
    model = load_model("llama3-8b")
    assert predict(model, hw, PLAN).step_time_s == predict(model, bare, PLAN).step_time_s
    assert predict(model, hw, PLAN).breakdown_s == predict(model, bare, PLAN).breakdown_s
    # and a version on a file that measures none changes nothing, with a note saying so
    named = predict(model, bare, PLAN.with_(cudnn="9.13.1"))
    assert named.step_time_s == predict(model, bare, PLAN).step_time_s
    assert any("measures fused attention at one cuDNN version" in n for n in named.notes)


@pytest.mark.parametrize(("hardware", "version", "measured"), [
    ("dgx-gb300", "9.11.0", "9.13.1"),     # older than every table: the oldest (a lower bound on the gap)
    ("dgx-gb300", "9.13.1", "9.13.1"),
    ("dgx-gb300", "9.13.1.26", "9.13.1"),  # NVIDIA's four-part form: the build does not move it
    ("dgx-gb300", "9.18.0", "9.17.0"),     # 9.18.1 is newer than 9.18.0
    ("dgx-gb300", "9.18.1", "9.18.1"),
    ("dgx-gb300", "9.21.1", "9.19.1"),
    ("gb200-nvl72", "9.13.1", "9.13.1"),   # B200's measurement carried over (the same die)
    ("gb200-nvl72", "9.11.0", "9.10.2"),
    ("dgx-b200", "9.11.0", "9.10.2"),
    ("dgx-b200", "9.20.0", "9.19.1"),      # GB200's measurement carried over (the same die)
    ("dgx-b300", "9.18.0", "9.17.0"),
])
def test_the_newest_measured_version_at_or_below_the_plans_is_used(hardware: str, version: str,
                                                                   measured: str) -> None:
    device = load_hardware(hardware).device
    picked = device.for_cudnn(version)
    assert picked.cudnn == measured
    curve = dict((text, c) for _, text, c in device.cudnn_curves)[measured]
    assert picked.eff("attention_fa3", "bf16") == curve
    # only the fused-attention class changes
    assert {k: v for k, v in picked.efficiency.items() if k != "attention_fa3"} == \
        {k: v for k, v in device.efficiency.items() if k != "attention_fa3"}


B200_OVER_GB200 = 1.0738  # gb200-nvl72.yaml's matrix curve: aiconfigurator's same-software BF16 GEMM time ratio


@pytest.mark.parametrize(("target", "sibling", "versions", "speed"), [
    ("gb200-nvl72", "dgx-b200", ("9.10.2", "9.13.1"), B200_OVER_GB200),
    ("dgx-b200", "gb200-nvl72", ("9.17.0", "9.18.1", "9.19.1"), 1 / B200_OVER_GB200),
])
def test_same_die_curves_carry_the_siblings_measured_rate(target: str, sibling: str, versions: tuple[str, ...],
                                                          speed: float) -> None:
    """B200 and GB200 are one die (GB100) at two power limits: a cuDNN version measured on one alone prices the
    other at the measured FLOP/s times the matrix curve's speed ratio, with the measured curve's shape."""
    mine, theirs = (load_hardware(name).device for name in (target, sibling))
    for version in versions:
        got, measured = mine.for_cudnn(version), theirs.for_cudnn(version)
        assert got.cudnn == measured.cudnn == version
        for seq in (2048, 4096, 8192, 32768):
            rate = got.eff("attention_fa3", "bf16").at(seq) * got.peak("bf16")
            expected = measured.eff("attention_fa3", "bf16").at(seq) * measured.peak("bf16") * speed
            assert rate == pytest.approx(expected, rel=2e-3)


def test_older_cudnn_prices_gb300_slower_and_the_newest_as_the_default() -> None:
    """GB300's cuDNN 9.13.1 attention ran at 0.507 of peak at 8k against 0.631 at 9.19.1: a plan on 9.13.1 is
    slower, one on 9.19.1 (the default curve's version) predicts exactly as the default."""
    default, old, new = (_step("dgx-gb300", PLAN.with_(cudnn=v)) for v in (None, "9.13.1", "9.19.1"))
    assert new == default
    assert old > default * 1.01
    result = predict(load_model("llama3-8b"), load_hardware("dgx-gb300"), PLAN.with_(cudnn="9.11.0"))
    assert any("older than every cuDNN" in n and "9.13.1" in n for n in result.notes)


def test_memoised_stage_costs_never_leak_between_cudnn_versions() -> None:
    """StepModel memoises stage costs and kernel times; a plan that differs only in its cuDNN version is priced
    as a fresh engine prices it, whatever the shared engine priced before."""
    model, hw = load_model("llama3-8b"), load_hardware("dgx-gb300")
    shared = StepModel(model, hw)
    for version in (None, "9.13.1", "9.17.0", None, "9.21.1", "9.13.1"):
        plan = PLAN.with_(cudnn=version)
        fresh = StepModel(model, hw).timeline(plan).step_time_s
        assert shared.timeline(plan).step_time_s == fresh, version


@pytest.mark.parametrize("value", ["9.13", "9", "9.13.1-1", "v9.13.1", "9.13.1.26.1", "9.013.1", 9.13, 91301, ""])
def test_a_bad_version_is_refused_in_one_line(value: object) -> None:
    with pytest.raises(PlanError) as err:
        validate(PLAN.with_(cudnn=value))
    text = str(err.value)
    assert text.startswith("cudnn; expected") and 'such as "9.13.1"' in text and "\n" not in text


def test_version_strings_order_as_releases() -> None:
    assert cudnn_version("9.9.0") < cudnn_version("9.10.2") < cudnn_version("9.13.1") < cudnn_version("9.13.1.26")


def test_cli_flag_prices_and_a_bad_one_exits_2_with_one_line() -> None:
    base = [sys.executable, "-m", "dlperf", "predict", "llama3-8b", "dgx-gb300", "--gpus", "8", "--global-batch",
            "64", "--micro-batch", "1", "--dp", "8"]
    ok = subprocess.run([*base, "--cudnn", "9.13.1"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "priced at the curve measured with cuDNN 9.13.1" in ok.stdout
    for bad in ("9.13", "latest"):
        proc = subprocess.run([*base, "--cudnn", bad], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert "cudnn" in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    search = subprocess.run([sys.executable, "-m", "dlperf", "search", "llama3-8b", "dgx-gb300", "--gpus", "8",
                             "--global-batch", "64", "--cudnn", "9.13"], capture_output=True, text=True)
    assert search.returncode == 2 and "--cudnn" in search.stderr
    assert search.stderr.count("\n") == 1 and "Traceback" not in search.stderr


TINY_ROW = """sources:
  s: {citation: "test"}
rows:
  - id: r
    source: s
    where: "here"
    evidence: verified
    model: llama3-8b
    set: {seq: 8192}
    hardware: dgx-gb300
    plan: {devices: 8, dp: 8, CUDNN global_batch: 64, micro_batch: 1}
    measured: {value: 1000, unit: tokens_per_s_per_device}
"""


@pytest.mark.parametrize(("field", "message"), [
    ("cudnn: 9.13, ", 'such as "9.13.1"'),       # YAML reads 9.13 as a number
    ("cudnn: 9.13.1-1, ", 'such as "9.13.1"'),
    ("cudnn: [9.13.1], ", 'such as "9.13.1"'),
])
def test_a_bad_row_version_gives_one_located_line(tmp_path: Path, field: str, message: str) -> None:
    path = tmp_path / "rows.yaml"
    path.write_text(TINY_ROW.replace("CUDNN ", field), encoding="utf-8")
    with pytest.raises(DlperfError) as err:
        load_dataset([path])
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith(f"{path}:")


def test_a_row_with_a_version_loads(tmp_path: Path) -> None:
    path = tmp_path / "rows.yaml"
    path.write_text(TINY_ROW.replace("CUDNN ", "cudnn: 9.13.1, "), encoding="utf-8")
    assert load_dataset([path])[0].plan.cudnn == "9.13.1"


HARDWARE = """name: mini
source: "..."
device:
  name: B
  peak_flops: {fp32: 80 TFLOP/s, bf16: 2500 TFLOP/s}
  memory: 192 GiB
  memory_bandwidth: 8 TB/s
  efficiency:
    attention_fa3:
      peak: 0.65
      seq_half: 869
      BY
network:
  - {name: nvlink, size: 72, bandwidth: 900 GB/s, latency: 3 us}
  - {name: ib, bandwidth: 400 Gb/s, latency: 5 us}
"""
GOOD = ('by_cudnn: {"9.17.0": {peak: 0.597, seq_half: 742, source: "t"}, '
        '"9.19.1": {peak: 0.65, seq_half: 869, source: "u"}}')


def _hardware(tmp_path: Path, by: str) -> Path:
    path = tmp_path / "hw.yaml"
    path.write_text(HARDWARE.replace("BY", by), encoding="utf-8")
    return path


def test_a_good_by_cudnn_loads_oldest_first(tmp_path: Path) -> None:
    good = GOOD.replace('"9.17.0": {peak: 0.597, seq_half: 742, source: "t"}, ', "") \
        .replace("}}", '}, 9.17.0: {peak: 0.597, seq_half: 742, source: "t"}}')  # unquoted, out of order
    device = load_hardware(_hardware(tmp_path, good)).device
    assert [(v, t) for v, t, _ in device.cudnn_curves] == [((9, 17, 0), "9.17.0"), ((9, 19, 1), "9.19.1")]
    assert device.for_cudnn("9.18.0").eff("attention_fa3").seq_half == 742


@pytest.mark.parametrize(("by", "field", "message"), [
    (GOOD.replace('"9.17.0"', "9.17"), "by_cudnn.9.17", 'major.minor.patch in quotes, such as "9.19.1"'),
    (GOOD.replace('"9.17.0"', '"9.17.0.1"'), "by_cudnn.9.17.0.1", "major.minor.patch"),
    (GOOD.replace('"9.17.0"', '"9.19.01"'), "by_cudnn.9.19.01", "major.minor.patch"),
    (GOOD.replace(', source: "t"', ""), "by_cudnn.9.17.0", "missing required key 'source'"),
    (GOOD.replace("peak: 0.597", "peak: 1.5"), "by_cudnn.9.17.0.peak", "a number in [1e-6, 1]"),
    (GOOD.replace("seq_half: 742", "seqhalf: 742"), "by_cudnn.9.17.0.seqhalf", "did you mean 'seq_half'?"),
    (GOOD.replace("seq_half: 742", "tile: [256, 128]"), "by_cudnn.9.17.0.tile", "unknown key 'tile'"),
    ('by_cudnn: {"9.17.0": 0.6}', "by_cudnn.9.17.0", "expected a mapping"),
    ("by_cudnn: {}", "by_cudnn", "one curve or more"),
    ("by_cudnn: 9.17.0", "by_cudnn", "expected a mapping"),
    (GOOD + "\n      dtypes: {bf16: {peak: 0.6}}", "by_cudnn", "by_cudnn or dtypes"),
])
def test_a_bad_by_cudnn_gives_one_located_line(tmp_path: Path, by: str, field: str, message: str) -> None:
    path = _hardware(tmp_path, by)
    with pytest.raises(DlperfError) as err:
        load_hardware(path)
    text = str(err.value)
    assert text.startswith(f"{path}:12: device.efficiency.attention_fa3.{field}"), text
    assert message in text and "\n" not in text


def test_by_cudnn_only_on_the_fused_attention_curve(tmp_path: Path) -> None:
    path = tmp_path / "hw.yaml"
    path.write_text(HARDWARE.replace("attention_fa3:", "matmul:").replace("      seq_half: 869\n", "")
                    .replace("BY", GOOD), encoding="utf-8")
    with pytest.raises(SpecError, match="by_cudnn only on the attention_fa3 curve"):
        load_hardware(path)


def test_megatron_bridge_rows_name_their_releases_cudnn() -> None:
    """Every Megatron-Bridge row of a release whose cuDNN NVIDIA documents (docs/releases/software-versions.md)
    names it; a patch release names its parent's (the release tags' container recipes are the same, the header of
    megatron_bridge.yaml); 26.08, on a new base image that page does not list, names none (the file's default)."""
    documented = {"2509": "9.11.0", "2511": "9.13.1", "2602": "9.18.0", "2604": "9.20.0", "2606": "9.21.1"}
    documented.update({"260201": "9.18.0", "260401": "9.20.0", "260601": "9.21.1"})
    rows = [r for r in load_dataset() if r.id.startswith("mbridge-")]
    assert len(rows) > 100
    for row in rows:
        assert row.plan.cudnn == documented.get(row.id.split("-")[1]), row.id
