"""The measured cuDNN convolution curve of p40-pcie (DeepBench's Titan Xp FP32 table, FITTED.md) and the
`algorithm_choice` flag that makes `auto` price the direct form on it."""

from __future__ import annotations

import dataclasses

import pytest

from dlperf.builtins import data_dir
from dlperf.engine.device import kernel_times
from dlperf.engine.layers import Use
from dlperf.engine.stage import conv_choice
from dlperf.engine.step import StepModel
from dlperf.errors import SpecError
from dlperf.ops import OPS
from dlperf.ops.base import Layer
from dlperf.plan import Plan
from dlperf.spec.hardware import CONV_OVER_GEMM, CONV_STARTUP, hardware_from_dict, load_hardware
from dlperf.spec.model import load_model
from dlperf.spec.yamlio import load_yaml_file


def _conv(channels: int, size: int, out: int, kernel: int, stride: int = 1) -> Layer:
    rule = OPS["conv2d"]
    attrs = {**rule.attrs, "out": out, "kernel": kernel, "stride": stride, "padding": kernel // 2, "bias": False}
    shape = (channels, size, size)
    return Layer("conv2d", tuple(sorted(attrs.items())), shape, rule.shape(shape, attrs), "conv2d",
                 rule.params(shape, attrs))


def _conv_time(hw, layer: Layer, batch: int) -> float:
    kernel = conv_choice(Use(layer, 1, False), batch, 4, hw, "fp32", 1)[0]
    return sum(kernel_times(kernel, hw.device, "fp32"))


def test_p40_conv_curve_is_the_titanxp_fit() -> None:
    eff = load_hardware("p40-pcie").device.eff("conv", "fp32")
    assert eff.peak == 0.678 and eff.startup == pytest.approx(30e-6) and eff.algorithm_choice
    assert "DeepBench_NV_TitanXp.xlsx" in eff.source


def test_auto_prices_the_direct_form_on_a_curve_that_holds_cudnns_choice() -> None:
    """A 3x3 stride-1 fp32 convolution would take Winograd under the matmul curve; on p40-pcie it is direct."""
    layer = _conv(256, 14, 256, 3)
    assert conv_choice(Use(layer, 1, False), 32, 4, load_hardware("p40-pcie"), "fp32", 1)[1] == "direct"
    # a device whose conv curve does not say so keeps cuDNN-style auto (dgx1-v100's predictions are unchanged)
    assert conv_choice(Use(layer, 1, False), 32, 4, load_hardware("dgx1-v100"), "fp32", 1)[1] == "winograd"


@pytest.mark.parametrize("algorithm", ["winograd", "fft", "im2col", "direct"])
def test_no_explicit_algorithm_beats_cudnns_choice_on_a_curve_that_holds_it(algorithm: str) -> None:
    """cuDNN's pick is no slower than an algorithm it could have picked: on p40-pcie an explicit algorithm is
    priced on the same measured curve as `auto` (it had been priced on the unsourced matmul curve, faster)."""
    hw = load_hardware("p40-pcie")
    layer = _conv(256, 14, 256, 3)
    attrs = tuple((k, algorithm if k == "algorithm" else v) for k, v in layer.attrs)
    assert ("algorithm", algorithm) in attrs
    explicit = dataclasses.replace(layer, attrs=attrs)
    assert _conv_time(hw, explicit, 32) >= _conv_time(hw, layer, 32)


@pytest.mark.parametrize("kernel,stride", [(1, 1), (3, 1), (1, 2), (7, 2)])
def test_larger_convolutions_never_take_less_time(kernel: int, stride: int) -> None:
    hw = load_hardware("p40-pcie")
    times = [_conv_time(hw, _conv(c, s, k, kernel, stride), b)
             for b in (1, 8, 118) for s in (7, 28, 56) for c, k in ((64, 64), (256, 256))]
    for batch_step in range(0, len(times) - 6, 6):  # same layer, next batch size
        for i in range(6):
            assert times[batch_step + 6 + i] >= times[batch_step + i]
    for b in range(3):  # same batch: a larger image, then more channels
        t = times[6 * b:6 * b + 6]
        assert t[0] <= t[2] <= t[4] and t[1] <= t[3] <= t[5] and all(t[2 * j] <= t[2 * j + 1] for j in range(3))


def _step(hw, batch: int = 118) -> float:
    plan = Plan(devices=1, global_batch=batch, micro_batch=batch, dtype="fp32", optimizer="sgd")
    return StepModel(load_model("resnet101"), hw).predict(plan).step_time_s


@pytest.mark.parametrize("factor", [1.1, 2.0])
def test_more_peak_never_makes_the_p40_slower(factor: float) -> None:
    hw = load_hardware("p40-pcie")
    d = hw.device
    more_flops = dataclasses.replace(hw, device=dataclasses.replace(
        d, peak_flops={k: v * factor for k, v in d.peak_flops.items()}))
    conv = d.eff("conv")
    better = dataclasses.replace(conv, peak=min(1.0, conv.peak * factor))
    more_conv = dataclasses.replace(hw, device=dataclasses.replace(d, efficiency={**d.efficiency, "conv": better}))
    base = _step(hw)
    assert _step(more_flops) < base and _step(more_conv) < base


@pytest.mark.parametrize("cls,key,value,expected", [("conv", "algorithm_choice", "yes", "true or false"),
                                                    ("matmul", "algorithm_choice", True, "only on a conv curve"),
                                                    ("attention_fa3", "seq_half", "long", "a number of tokens"),
                                                    ("attention_fa3", "seq_half", -5, "a number of tokens"),
                                                    ("matmul", "seq_half", 500, "only on an attention"),
                                                    ("attention", "head_dim_64", [0.8], "[forward, backward]"),
                                                    ("attention", "head_dim_64", [0.8, 1.2], "each in (0, 1]"),
                                                    ("attention_fa3", "head_dim_64", [0.8, True], "[forward,"),
                                                    ("matmul", "head_dim_64", [0.8, 0.9], "only on an attention")])
def test_curve_option_bad_input_is_one_clear_error(cls: str, key: str, value: object, expected: str) -> None:
    data = load_yaml_file(data_dir("hardware") / "p40-pcie.yaml")
    data["device"]["efficiency"][cls] = {"peak": 0.5, key: value, "source": "test"}
    with pytest.raises(SpecError) as info:
        hardware_from_dict(data, "bad.yaml")
    assert expected in str(info.value) and key in str(info.value)


# ------------------------------------------------------------- convolutions on matrix units without a measured curve
def test_conv_over_gemm_is_v100s_measured_ratio() -> None:
    """CONV_OVER_GEMM is dgx1-v100's DeepBench convolution asymptote over its GEMM asymptote, the one tensor-core
    device that measures both (spec/hardware.py)."""
    v100 = load_hardware("dgx1-v100").device
    assert pytest.approx(v100.eff("conv", "fp16").peak / v100.eff("matmul", "fp16").peak) == CONV_OVER_GEMM
    assert pytest.approx(v100.eff("conv", "fp16").startup) == CONV_STARTUP


@pytest.mark.parametrize("name", ["dgx-a100", "a100-40gb", "dgx-h100", "dgx-b200", "mi300x"])
@pytest.mark.parametrize("dtype", ["tf32", "fp16", "bf16"])
def test_matrix_unit_conv_without_a_curve_runs_at_the_gemm_curve_times_the_ratio(name: str, dtype: str) -> None:
    device = load_hardware(name).device
    assert "conv" not in device.efficiency  # the files measure none: the derived curve applies
    conv, gemm = device.eff("conv", dtype), device.eff("matmul", dtype)
    assert conv.peak == pytest.approx(gemm.peak * CONV_OVER_GEMM)
    assert conv.startup == CONV_STARTUP and conv.tile is None and not conv.algorithm_choice
    assert "CONV_OVER_GEMM" in conv.source


def test_cuda_core_convs_and_measured_curves_are_unchanged() -> None:
    a100, v100, p40 = (load_hardware(n).device for n in ("dgx-a100", "dgx1-v100", "p40-pcie"))
    assert a100.eff("conv", "fp32") is a100.eff("matmul", "fp32")  # CUDA cores: NeuSight's fp32 GEMM curve
    assert v100.eff("conv", "fp16") is v100.efficiency["conv"]
    assert v100.eff("conv", "fp32") is v100.eff("matmul", "fp32")
    assert p40.eff("conv", "fp32") is p40.efficiency["conv"]
    p100 = load_hardware("p100-roce").device  # packed fp16 on CUDA cores (2x fp32): no matrix units
    assert p100.eff("conv", "fp16") == p100.eff("matmul", "fp16")


def test_a100_conv_is_never_faster_than_on_the_gemm_curve() -> None:
    """On A100 a 1x1 convolution (priced direct, on the conv curve) slows down against the GEMM curve; a 3x3 one
    that `auto` prices as im2col (a GEMM on the matmul curve, as on V100) is unchanged, never faster."""
    hw = load_hardware("dgx-a100")
    gemm_only = dataclasses.replace(hw, device=dataclasses.replace(
        hw.device, efficiency={**hw.device.efficiency, "conv": hw.device.eff("matmul", "fp16")}))
    times = {}
    for layer in (_conv(1024, 14, 256, 1), _conv(256, 14, 256, 3)):  # both compute-bound at batch 256
        times[layer.in_shape] = [sum(kernel_times(conv_choice(Use(layer, 1, False), 256, 2, h, "fp16", 1)[0],
                                                  h.device, "fp16")) for h in (hw, gemm_only)]
    (one_slow, one_fast), (three_slow, three_fast) = times.values()
    assert one_slow > one_fast and three_slow >= three_fast


def test_resnet50_one_a100_amp_slows_to_the_carried_over_conv_rate() -> None:
    """The step the DeepLearningExamples AMP row prices (ResNet-50, batch 256, fp16) with and without the ratio."""
    model, hw = load_model("resnet50"), load_hardware("dgx-a100")
    gemm_only = dataclasses.replace(hw, device=dataclasses.replace(
        hw.device, efficiency={**hw.device.efficiency, "conv": hw.device.eff("matmul", "fp16")}))
    plan = Plan(global_batch=256, dtype="fp16")
    carried, gemm = (StepModel(model, h).predict(plan).step_time_s for h in (hw, gemm_only))
    assert 1.05 < carried / gemm < 1.5


def test_show_says_where_the_convolution_rate_comes_from() -> None:
    """`dlperf show` names the carried-over ratio only where it applies: not on P100 (no matrix units) nor on a
    file with its own convolution curve."""
    from dlperf.commands.catalog import _efficiency_rows

    def conv_row(name: str) -> str:
        rows = _efficiency_rows(load_hardware(name).device)
        return next(r["value"] for r in rows if r["item"].startswith("convolution rate"))

    assert "cuDNN-over-GEMM ratio" in conv_row("dgx-a100")
    assert "cuDNN-over-GEMM ratio" not in conv_row("p100-roce")
    assert "none measured" not in conv_row("dgx1-v100")
