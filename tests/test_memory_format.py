"""The plan's memory_format: NCHW activations make every tensor-core convolution pay cuDNN's NCHW <-> NHWC
transposes (dlperf.ops.conv.layout_transpose_kernel), priced as memory-bound kernels; NHWC (the default) and
CUDA-core dtypes pay nothing."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.engine.layers import Use
from dlperf.engine.stage import use_kernels
from dlperf.engine.step import StepModel
from dlperf.errors import PlanError
from dlperf.ops.conv import layout_transpose_kernel
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from tests.test_conv_curve import _conv
from tests.test_monotone import CONSTANTS, faster


@functools.cache
def _resnet():
    return load_model("resnet50")


@functools.cache
def _hw(name: str):
    return load_hardware(name)


def _step(hw, dtype: str, memory_format: str, batch: int = 64) -> float:
    plan = Plan(global_batch=batch, micro_batch=batch, dtype=dtype, optimizer="momentum", memory_format=memory_format)
    return StepModel(_resnet(), hw).predict(plan).step_time_s


def test_transposes_move_every_operand_of_each_cudnn_call_once_in_and_once_out():
    """A 3x3 conv 64 -> 128 channels, 56x56 -> 28x28 (stride 2), batch 8, fp32 (4 bytes): forward transposes x, w
    and y (read + write each); backward-data and backward-filter each transpose three tensors again."""
    layer = _conv(64, 56, 128, 3, stride=2)
    x, w, y = 8 * 64 * 56 * 56, 128 * 64 * 3 * 3, 8 * 128 * 28 * 28
    kernel = layout_transpose_kernel(layer, 8, 4)
    assert kernel.cost.fwd_bytes == 2 * 4 * (x + w + y)
    assert kernel.cost.bwd_bytes == 2 * kernel.cost.fwd_bytes
    assert kernel.cls == "memory" and kernel.phase_launches == (3, 6) and kernel.host_ops == (0, 0)


@pytest.mark.parametrize("dtype", ["tf32", "fp16", "bf16"])
def test_nchw_adds_the_transposes_to_tensor_core_convolutions_only(dtype):
    use, hw = Use(_conv(256, 14, 256, 3), 1, False), _hw("dgx-a100")
    nhwc = use_kernels(use, 32, 2, hw, dtype, 1)
    nchw = use_kernels(use, 32, 2, hw, dtype, 1, nchw=True)
    assert [k.name for k in nchw] == [k.name for k in nhwc] + ["layout_transpose"]
    # fp32 runs on CUDA cores, whose NCHW kernels need no transposes
    assert use_kernels(use, 32, 4, hw, "fp32", 1, nchw=True) == use_kernels(use, 32, 4, hw, "fp32", 1)


def test_nchw_is_slower_on_tensor_cores_and_the_same_on_cuda_cores():
    hw = _hw("dgx-a100")
    assert _step(hw, "tf32", "nchw") > _step(hw, "tf32", "nhwc")
    assert _step(hw, "fp16", "nchw") > _step(hw, "fp16", "nhwc")
    assert _step(_hw("dgx1-v100"), "fp32", "nchw") == _step(_hw("dgx1-v100"), "fp32", "nhwc")


def test_the_transposes_cost_what_their_bytes_take_at_the_memory_curve():
    """ResNet-50, batch 256, tf32 on dgx-a100: the NCHW step is longer by 3 x 8 bytes per element of every conv
    input and output (plus weights) at the A100's element-wise bandwidth (BabelStream 0.834 x 2039 GB/s), and
    one launch latency per transpose; nothing else changes."""
    hw = _hw("dgx-a100")
    extra = _step(hw, "tf32", "nchw", 256) - _step(hw, "tf32", "nhwc", 256)
    convs = [layer for layer, _ in _resnet().counted() if layer.op == "conv2d"]
    counts = dict(_resnet().counted())
    moved = sum(counts[c] * 6 * layout_transpose_kernel(c, 256, 4).cost.fwd_bytes for c in convs) / 2
    launches = sum(counts[c] * 9 for c in convs)
    device = hw.device
    expected = moved / (device.memory_bandwidth * device.eff("memory").peak) + launches * device.launch_latency
    assert extra == pytest.approx(expected, rel=0.02)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(constant=st.sampled_from(CONSTANTS), factor=st.sampled_from([1.1, 2.0, 10.0]),
       dtype=st.sampled_from(["tf32", "fp16"]), batch=st.sampled_from([8, 64, 256]))
def test_better_hardware_never_makes_an_nchw_step_slower(constant, factor, dtype, batch):
    hw = _hw("dgx-a100")
    assert _step(faster(hw, constant, factor), dtype, "nchw", batch) <= _step(hw, dtype, "nchw", batch) * (1 + 1e-9)


@pytest.mark.parametrize("dtype", ["tf32", "fp16"])
def test_nchw_transposes_grow_with_the_batch(dtype):
    """The extra time never shrinks with the batch; at small batches an eager step is host-bound (the transposes
    launch inside cuDNN, no framework op of their own), so it can be 0 there."""
    hw = _hw("dgx-a100")
    extras = [_step(hw, dtype, "nchw", b) - _step(hw, dtype, "nhwc", b) for b in (1, 8, 64, 256)]
    assert all(0 <= a <= b for a, b in zip(extras, extras[1:], strict=False)) and extras[-1] > extras[-2] > 0


def test_an_unknown_memory_format_is_refused():
    with pytest.raises(PlanError, match="memory_format"):
        validate(Plan(memory_format="chwn"))
