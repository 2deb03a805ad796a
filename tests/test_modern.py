"""FlashAttention, FP8 training and overlapped tensor-parallel communication: the counts each model states, and
the invariants they must keep (FP8 never slower on GEMM-bound H100 layers, overlap never worse than none)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.cost import Cost
from dlperf.engine import predict
from dlperf.engine.device import kernel_times
from dlperf.engine.overlap import exposed, rs_slowdown
from dlperf.errors import PlanError
from dlperf.ops import OPS
from dlperf.ops.base import Layer
from dlperf.ops.dense import gemm
from dlperf.ops.fp8 import FP8_GEMM, fp8_kernels, kernel_dtype
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

SMALL_LLAMA = {"layers": 2, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn": 5632, "vocab": 32000, "seq": 2048}


def attention(causal: bool = True, flash: bool = True, s: int = 1024, heads: int = 8, hd: int = 128,
              version: int = 2) -> Layer:
    rule = OPS["attention"]
    attrs = {**rule.attrs, "heads": heads, "head_dim": hd, "kv_heads": heads, "kv_seq": s, "out": heads * hd,
             "causal": causal, "flash": flash, "bias": False, "flash_version": version}
    return Layer("attention", tuple(sorted(attrs.items())), (s, heads * hd), (s, heads * hd), "attn",
                 rule.params((s, heads * hd), attrs))


def core(layer: Layer) -> list:
    names = ("flash_attention", "scores", "softmax", "attend")
    return [k for k in OPS["attention"].kernels(layer, 2, 2) if k.name in names]


# ---- FlashAttention -------------------------------------------------------------------------------------


def test_flash_backward_executes_2_5x_the_forward_attention_matmuls() -> None:
    """Dao 2023 section 4.1: 2 matmuls forward, 5 backward (QK^T recomputed)."""
    (kernel,) = core(attention(causal=False))
    b, s, h, d = 2, 1024, 8, 128
    matmuls = 4 * b * s * s * h * d                     # QK^T and AV, forward
    softmax = 5 * b * h * s * s
    assert kernel.cost.fwd_flops == matmuls + softmax
    backward_matmuls = kernel.cost.bwd_data_flops - 4 * b * h * s * s + kernel.bwd_recompute_flops - softmax
    assert backward_matmuls == 2.5 * matmuls
    # the recomputed QK^T is executed, not model work: the cost's work is the unfused attention's
    unfused = sum((k.cost for k in core(attention(causal=False, flash=False))), Cost())
    assert kernel.cost.work == unfused.work


def test_flash_causal_skips_the_masked_blocks() -> None:
    """Dao 2023 section 3.1.1: skipping the masked blocks makes causal attention faster, by the key length's
    executed fraction (dense.causal_fraction: 0.68 of the no-mask time at 1k); MFU still counts the whole matrix
    (Dao 2023 section 4.2, Megatron-LM's convention)."""
    from dlperf.ops.dense import causal_speedup

    (full,), (causal,) = core(attention(causal=False)), core(attention(causal=True))
    assert causal.cost.fwd_flops == pytest.approx(full.cost.fwd_flops / causal_speedup(1024))
    assert causal.bwd_recompute_flops == pytest.approx(full.bwd_recompute_flops / causal_speedup(1024))
    assert 1.45 < causal_speedup(1024) < 1.5
    assert causal.cost.work * causal.model_work_scale == pytest.approx(full.cost.work)
    h100 = load_hardware("dgx-h100").device  # at 8k tokens the kernels' fixed costs no longer matter
    (big_full,), (big_causal,) = core(attention(causal=False, s=8192, heads=32)), core(attention(s=8192, heads=32))
    t_full, t_causal = (sum(kernel_times(k, h100, "bf16")) for k in (big_full, big_causal))
    assert 0.97 * causal_speedup(8192) < t_full / t_causal <= causal_speedup(8192)


def test_flash_keeps_no_quadratic_activations() -> None:
    saved = OPS["attention"].saved
    small, large = attention(s=1024), attention(s=4096)
    assert saved(large, 2) == pytest.approx(4 * saved(small, 2))          # linear in the sequence
    plain_small, plain_large = attention(s=1024, flash=False), attention(s=4096, flash=False)
    assert saved(plain_large, 2) > 10 * saved(plain_small, 2)             # s^2 term dominates


def test_flash_is_a_switch_on_every_builtin_transformer() -> None:
    for name in ("gpt", "gpt3-175b", "gpt2-xl", "llama2-7b", "llama2-70b", "bert-large", "transformer-base"):
        off = [layer["flash"] for layer, _ in load_model(name).counted() if layer.op == "attention"]
        on = [layer["flash"] for layer, _ in load_model(name, {"flash": True}).counted() if layer.op == "attention"]
        assert not any(off) and all(on), name
    for name in ("llama3-8b", "llama3-70b", "llama3-405b"):  # the reference Llama 3 stacks run fused attention
        assert all(layer["flash"] for layer, _ in load_model(name).counted() if layer.op == "attention")


@pytest.mark.parametrize(("version", "curve"), [(2, "attention"), (3, "attention_fa3")])
def test_flash_uses_the_device_curve_of_its_generation(version: int, curve: str) -> None:
    """FlashAttention-2 and FlashAttention-3-class kernels differ on Hopper: up to 335 TFLOP/s over a training pass
    (Dao 2023) against cuDNN's 535-635 (NVIDIA's H200 table, dlperf/data/kernels/cudnn-h200-sdpa-bf16.csv)."""
    h100 = load_hardware("dgx-h100").device
    (kernel,) = core(attention(version=version))
    fwd, _ = kernel_times(kernel, h100, "bf16")
    eff = h100.eff(curve)
    rate = kernel.cost.fwd_flops / (fwd - h100.launch_latency - eff.startup)
    keys = 1024  # attention()'s sequence; a curve with a key-length term loses (s + seq_half) / s of its peak
    assert rate == pytest.approx(989e12 * eff.peak * keys / (keys + eff.seq_half), rel=1e-9)
    assert h100.eff(curve).peak != h100.eff("matmul").peak


def test_flash_version_is_2_or_3() -> None:
    from dlperf.errors import SpecError

    with pytest.raises(SpecError, match="flash_version"):
        load_model("llama3-8b", {"flash_version": 4})


def test_flash_speeds_up_and_shrinks_llama_training() -> None:
    hw, plan = load_hardware("dgx-h100"), Plan(devices=1, global_batch=1)
    off = predict(load_model("llama3-8b", {**SMALL_LLAMA, "flash": False}), hw, plan)
    on = predict(load_model("llama3-8b", {**SMALL_LLAMA, "flash": True}), hw, plan)
    assert on.step_time_s < off.step_time_s
    assert on.memory["activations"] < off.memory["activations"]


# ---- FP8 ------------------------------------------------------------------------------------------------


def test_fp8_gemm_runs_at_the_fp8_peak_with_its_casts() -> None:
    kernels = fp8_kernels([gemm("gemm", 4096, 2048, 8192, 2)], 2)
    cast, main = kernels
    assert main.cls == FP8_GEMM and kernel_dtype(main, "fp8") == "fp8" and kernel_dtype(cast, "fp8") == "bf16"
    assert main.cost.work == gemm("gemm", 4096, 2048, 8192, 2).cost.work
    # cast_transpose: read bf16 (2 B), write FP8 and its transpose (2 B) per element of X forward and dY backward
    assert cast.cost.fwd_bytes == 4 * 4096 * 2048 and cast.cost.bwd_bytes == 4 * 4096 * 8192


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2048, 4096, 8192, 16384, 32768]), st.sampled_from([2048, 4096, 8192, 16384]),
       st.sampled_from([2048, 4096, 8192, 14336, 28672, 53248]))
def test_fp8_never_slower_than_bf16_on_gemm_bound_h100_layers(tokens: int, width: int, out: int) -> None:
    """A transformer linear layer (tokens x width -> out, training shapes) on an H100: the FP8 GEMM plus its
    casts is never slower than the bf16 GEMM."""
    h100 = load_hardware("dgx-h100").device
    bf16 = sum(kernel_times(gemm("gemm", tokens, width, out, 2), h100, "bf16"))
    fp8 = sum(sum(kernel_times(k, h100, kernel_dtype(k, "fp8"))) for k in fp8_kernels(
        [gemm("gemm", tokens, width, out, 2)], 2))
    assert fp8 < bf16


def test_mxfp8_operands_carry_one_scale_byte_per_32_elements() -> None:
    """MXFP8's quantize writes a row-wise and a column-wise FP8 copy, each with an E8M0 scale per 32 values: the
    per-tensor recipe's traffic plus 2/32 byte per element; the GEMM's FLOPs and rate class are the same."""
    x = gemm("gemm", 4096, 2048, 8192, 2)
    (cast, main), (mx_cast, mx_main, _) = fp8_kernels([x], 2), fp8_kernels([x], 2, "mxfp8")
    assert mx_main.cls == main.cls == FP8_GEMM and mx_main.cost.work == main.cost.work
    assert kernel_dtype(mx_main, "mxfp8") == "mxfp8" and kernel_dtype(mx_cast, "mxfp8") == "bf16"
    assert mx_cast.cost.fwd_bytes - cast.cost.fwd_bytes == pytest.approx(2 / 32 * 4096 * 2048)
    assert mx_cast.cost.bwd_bytes - cast.cost.bwd_bytes == pytest.approx(2 / 32 * 4096 * 8192)
    # forward reads X and W in FP8: each element one byte and 1/32 of a scale byte
    assert mx_main.cost.fwd_bytes - main.cost.fwd_bytes == pytest.approx((4096 * 2048 + 2048 * 8192) / 32)


def test_mxfp8_swizzles_scales_per_gemm_as_transformer_engine_does() -> None:
    """Before cuBLASLt reads MXFP8 scales, Transformer Engine swizzles them in a kernel per operand: under TE < 2.12
    ("gemm") both operands of all three GEMMs (forward X, W; data gradient dY, W; weight gradient X, dY), from 2.12
    ("quantize") only the weight (forward and data gradient), plus the operand sequence parallelism gathers
    (column-parallel: X in the forward and weight-gradient GEMMs; row-parallel: dY in the two backward GEMMs).
    Each reads and writes 1 scale byte per 32 elements; a grouped GEMM swizzles each operand list in one launch."""
    from dlperf.ops.moe import grouped_gemm

    m, k, n, g = 4096, 2048, 8192, 16
    x, w, dy = m * k, k * n, m * n

    def swizzle(kernel, mode, sp_dim=None):
        out = fp8_kernels([kernel], 2, "mxfp8", swizzle=mode, sp_dim=sp_dim)[2]
        assert out.cls == "memory" and out.host_ops == (0, 0)
        return out.phase_launches, out.cost.fwd_bytes * 32 / 2, out.cost.bwd_bytes * 32 / 2

    dense = gemm("gemm", m, k, n, 2)
    assert swizzle(dense, "gemm") == ((2, 4), x + w, dy + w + x + dy)
    assert swizzle(dense, "quantize") == ((1, 1), w, w)
    assert swizzle(dense, "quantize", "n") == ((2, 2), w + x, w + x)       # column-parallel, SP gathers X
    assert swizzle(dense, "quantize", "k") == ((1, 3), w, w + 2 * dy)      # row-parallel, SP gathers dY
    assert swizzle(dense, "gemm", "n") == swizzle(dense, "gemm")          # TE < 2.12 swizzles them anyway
    grouped = grouped_gemm("up", m, k, n, 2, g, "n")
    assert swizzle(grouped, "gemm") == ((2, 4), x + g * w, dy + g * w + x + dy)
    assert swizzle(grouped, "quantize") == ((1, 1), g * w, g * w)
    assert len(fp8_kernels([dense], 2, "fp8")) == len(fp8_kernels([dense], 2, "nvfp4")) == 2  # MXFP8's alone


def test_mx_swizzle_gemm_slows_an_mxfp8_step_and_needs_mxfp8() -> None:
    """TE < 2.12's extra swizzles (four more per linear layer and micro-batch) make the same MXFP8 step slower;
    the knob describes MXFP8's scales, so other dtypes refuse it."""
    hw, model = load_hardware("dgx-b200"), load_model("llama3-8b", {"layers": 2, "seq": 4096})
    plan = Plan(devices=1, global_batch=4, micro_batch=2, dtype="mxfp8")
    assert predict(model, hw, plan.with_(mx_swizzle="gemm")).step_time_s > predict(model, hw, plan).step_time_s
    with pytest.raises(PlanError, match="--mx-swizzle gemm is how the MXFP8 recipe lays out its block scales"):
        predict(model, hw, plan.with_(dtype="fp8", mx_swizzle="gemm"))


def test_mxfp8_param_gather_moves_bf16_weights() -> None:
    """Megatron-Core keeps no MXFP8 parameter buffer: under fp8_param_gather it all-gathers bf16 weights through
    the gradient buffer and quantizes them on copy, so MXFP8's gather moves 2 bytes per parameter (FP8's 1,
    NVFP4's 0.5 + 1/16) and prices as the 16-bit gather does."""
    from dlperf.ops.fp8 import param_gather_bytes

    assert [param_gather_bytes(d) for d in ("fp8", "mxfp8", "nvfp4")] == [1, 2, 0.5 + 1 / 16]
    hw, model = load_hardware("dgx-b200"), load_model("llama3-8b", {"layers": 2, "seq": 4096})
    plan = Plan(devices=8, global_batch=16, micro_batch=2, zero=1, dtype="mxfp8")
    gathered = predict(model, hw, plan.with_(fp8_param_gather=True)).breakdown_s["comm/dp_allreduce"]
    assert gathered == pytest.approx(predict(model, hw, plan).breakdown_s["comm/dp_allreduce"])
    fp8 = predict(model, hw, plan.with_(dtype="fp8", fp8_param_gather=True)).breakdown_s["comm/dp_allreduce"]
    assert fp8 < gathered


def test_mxfp8_takes_the_fp8_curve_until_one_is_measured() -> None:
    from dlperf.spec.hardware import Efficiency

    b200 = load_hardware("dgx-b200").device
    assert b200.peak("mxfp8") == b200.peak("fp8")
    assert b200.curve_key(FP8_GEMM, "mxfp8") == b200.curve_key(FP8_GEMM, "fp8") == "matmul/fp8"
    own = Efficiency(0.5, 0.0, "test", 0.0)
    measured = dataclasses.replace(b200, efficiency={**b200.efficiency, "matmul/mxfp8": own})
    assert measured.curve_key(FP8_GEMM, "mxfp8") == "matmul/mxfp8" and measured.eff(FP8_GEMM, "mxfp8") is own


def test_mxfp8_step_on_b200_sits_between_fp8_and_bf16() -> None:
    """Same FP8 rate, more bytes (the scales): never faster than per-tensor FP8, and faster than bf16 on a
    GEMM-bound model; its cached weight copies carry their scales (2 x 33/32 bytes per parameter)."""
    hw, model = load_hardware("dgx-b200"), load_model("llama3-8b", {"layers": 2, "seq": 4096})
    plan = Plan(devices=1, global_batch=4, micro_batch=2)
    bf16, fp8, mx = (predict(model, hw, plan.with_(dtype=d)) for d in ("bf16", "fp8", "mxfp8"))
    assert fp8.step_time_s < mx.step_time_s < bf16.step_time_s
    assert mx.memory["fp8_weights"] == pytest.approx(fp8.memory["fp8_weights"] * 33 / 32)


def test_nvfp4_operands_are_half_a_byte_and_one_scale_byte_per_16_elements() -> None:
    """NVFP4 (TE's NVFP4BlockScaling): E2M1 values with an E4M3 scale per 16, 0.5 + 1/16 bytes per element; its
    quantize reads the 16-bit tensor twice (the amax pass, then the cast) and writes two copies; the Hadamard
    transform adds 32 FLOPs per element; the GEMM's FLOPs are the same, timed on the nvfp4 peak. Its two kernels
    come from one framework call each way (NVFP4Quantizer::quantize_impl issues both from C++)."""
    m, k, n, b = 4096, 2048, 8192, 0.5 + 1 / 16
    x = gemm("gemm", m, k, n, 2)
    (_, main), (fp4_cast, fp4_main) = fp8_kernels([x], 2), fp8_kernels([x], 2, "nvfp4")
    assert fp4_main.cls == FP8_GEMM and fp4_main.cost.work == main.cost.work
    assert kernel_dtype(fp4_main, "nvfp4") == "nvfp4" and kernel_dtype(fp4_cast, "nvfp4") == "bf16"
    assert fp4_cast.cost.fwd_bytes == pytest.approx((2 * 2 + 2 * b) * m * k)
    assert fp4_cast.cost.bwd_bytes == pytest.approx((2 * 2 + 2 * b) * m * n)
    assert fp4_cast.cost.fwd_flops == pytest.approx((2 + 32) * m * k)
    assert (fp4_cast.launches, fp4_cast.framework_ops, fp4_cast.bwd_framework_ops) == (2, 1, 1)
    assert fp4_main.cost.fwd_bytes == pytest.approx(b * (m * k + k * n) + 2 * m * n)


def test_nvfp4_step_on_blackwell_is_faster_than_mxfp8_and_bf16() -> None:
    """A GEMM-bound model: nvfp4 <= mxfp8 <= bf16 on every Blackwell part with an FP4 peak; the cached weight
    copies shrink to 2 x 9/16 bytes per parameter."""
    model = load_model("llama3-8b", {"layers": 2, "seq": 4096})
    plan = Plan(devices=1, global_batch=4, micro_batch=2)
    for name in ("dgx-b200", "gb200-nvl72", "dgx-gb300"):
        hw = load_hardware(name)
        bf16, mx, fp4 = (predict(model, hw, plan.with_(dtype=d)) for d in ("bf16", "mxfp8", "nvfp4"))
        assert fp4.step_time_s < mx.step_time_s < bf16.step_time_s, name
        assert fp4.memory["fp8_weights"] == pytest.approx(mx.memory["fp8_weights"] * (9 / 16) / (33 / 32))


@pytest.mark.parametrize(("dtype", "phrase"), [("mxfp8", "Blackwell"), ("nvfp4", "FP4 tensor cores")])
def test_block_scaled_recipes_are_refused_on_hopper(run, dtype: str, phrase: str) -> None:  # noqa: ANN001 - fixture
    """Hopper has no block-scaled (MXFP8) or FP4 tensor cores; neither recipe is a gradient dtype anywhere."""
    code, out, err = run("predict", "llama3-8b", "dgx-h100", "--gpus", "8", "--dtype", dtype)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"no peak_flops for {dtype}" in err and phrase in err
    code, _, err = run("predict", "llama3-8b", "dgx-b200", "--gpus", "8", "--grad-dtype", dtype)
    assert code == 2 and dtype in err and len(err.strip().splitlines()) == 1


def test_fp8_llama_step_is_faster_and_holds_fp8_weight_copies() -> None:
    hw, model = load_hardware("dgx-h100"), load_model("llama3-8b", SMALL_LLAMA)
    plan = Plan(devices=1, global_batch=2, micro_batch=1)
    bf16, fp8 = predict(model, hw, plan.with_(dtype="bf16")), predict(model, hw, plan.with_(dtype="fp8"))
    assert fp8.step_time_s < bf16.step_time_s
    # 16 bytes per parameter with Adam (bf16 weights and grads, fp32 master + moments), plus the FP8 copy and its
    # transpose (2 bytes) of the weights in FP8 layers only: the embedding, final norm and output head stay bf16
    from dlperf.ops.fp8 import fp8_layers

    inside = fp8_layers(model.root)
    in_fp8 = sum(layer.params * n for layer, n in model.counted() if layer in inside)
    assert 0 < in_fp8 < model.total_params
    states = sum(fp8.memory[k] for k in ("weights", "gradients", "optimizer", "fp8_weights"))
    assert states == pytest.approx(16 * model.total_params + 2 * in_fp8)
    assert sum(bf16.memory[k] for k in ("weights", "gradients", "optimizer")) == pytest.approx(
        16 * model.total_params)
    # activations, gradients and messages stay bf16; linear layers keep FP8 inputs, so activations shrink
    assert fp8.memory["activations"] < bf16.memory["activations"]


def test_fp8_keeps_the_output_head_in_bf16() -> None:
    from dlperf.ops.fp8 import fp8_layers

    model = load_model("llama3-8b", SMALL_LLAMA)
    inside = fp8_layers(model.root)
    heads = [layer for layer, _ in model.layers() if layer.name == "lm_head"]
    assert heads and not inside & set(heads)
    assert any(layer.op == "linear" for layer in inside)


def test_fp8_param_gather_halves_the_zero_gather() -> None:
    hw, model = load_hardware("dgx-h100"), load_model("llama3-8b", SMALL_LLAMA)
    plan = Plan(devices=16, global_batch=16, zero=1, dtype="fp8")
    plain, gathered = predict(model, hw, plan), predict(model, hw, plan.with_(fp8_param_gather=True))
    assert gathered.breakdown_s["comm/dp_allreduce"] < plain.breakdown_s["comm/dp_allreduce"]
    with pytest.raises(PlanError, match="fp8"):
        predict(model, hw, plan.with_(dtype="bf16", fp8_param_gather=True))
    with pytest.raises(PlanError, match="zero"):
        predict(model, hw, plan.with_(zero=0, fp8_param_gather=True))


# ---- overlapped tensor-parallel communication -----------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.floats(1e-6, 1e-2), st.floats(0.0, 1e-2), st.sampled_from(["fwd", "bwd"]),
       st.sampled_from(["allgather", "reduce_scatter"]), st.sampled_from([2, 4, 8]))
def test_overlap_hides_at_most_the_gemm_and_is_never_free(comm: float, gemm_s: float, phase: str, op: str,
                                                          tp: int) -> None:
    shown, slowdown = exposed([(op, comm)], gemm_s, phase, tp, sms=132)
    assert 0 < shown <= comm                                  # at least one chunk stays exposed
    window = gemm_s / 2 if phase == "bwd" and op == "reduce_scatter" else gemm_s
    assert shown >= comm - window - 1e-18
    assert slowdown == (pytest.approx(window * 16 / (132 - 16)) if op == "reduce_scatter" else 0.0)
    assert rs_slowdown(132) == 16 / 116 and rs_slowdown(108) == 16 / 92
    assert rs_slowdown(None) == 0.0  # no SM count in the hardware file: no contention, as for NCCL channels


def test_tp_overlap_shrinks_exposed_tp_comm_but_costs_compute() -> None:
    hw, model = load_hardware("dgx-h100"), load_model("llama3-70b", {"layers": 4})
    plan = Plan(devices=8, tp=8, global_batch=8, micro_batch=1, sequence_parallel=True)
    plain, overlapped = predict(model, hw, plan), predict(model, hw, plan.with_(tp_overlap=True))
    assert overlapped.breakdown_s["comm/tp"] < plain.breakdown_s["comm/tp"]
    assert overlapped.breakdown_s["compute/forward"] > plain.breakdown_s["compute/forward"]
    assert overlapped.step_time_s < plain.step_time_s


def test_tp_overlap_needs_sequence_parallelism() -> None:
    hw, model = load_hardware("dgx-h100"), load_model("llama3-8b", SMALL_LLAMA)
    with pytest.raises(PlanError, match="sequence-parallel"):
        predict(model, hw, Plan(devices=8, tp=8, global_batch=8, tp_overlap=True))


def test_cli_flags_reach_the_plan(run) -> None:  # noqa: ANN001 - the conftest fixture
    import json

    args = ("predict", "llama3-8b", "dgx-h100", "--gpus", "8", "--tp", "8", "--global-batch", "8",
            "--sequence-parallel", "--set", "layers=2", "--format", "json")
    code, plain, _ = run(*args)
    code2, out, _ = run(*args, "--tp-overlap", "--dtype", "fp8")
    assert code == code2 == 0
    plan = json.loads(out)["plan"]
    assert plan["tp_overlap"] and plan["dtype"] == "fp8"
    assert json.loads(out)["step_time_s"] < json.loads(plain)["step_time_s"]
    code, _, err = run("predict", "llama3-8b", "dgx-h100", "--gpus", "8", "--tp", "8", "--tp-overlap")
    assert code == 2 and "sequence-parallel" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("dtype", "hardware"), [("bf16", "dgx-h100"), ("fp8", "dgx-h100"), ("mxfp8", "dgx-b200")])
def test_closed_form_prices_flash_and_fp8_as_the_engine(dtype: str, hardware: str) -> None:
    from dlperf.engine.symbolic import F32, LAM, B, F, M, step_time_expr

    model, hw = load_model("llama3-8b", {"layers": 2, "seq": 1024}), load_hardware(hardware)
    values = {B: 2, F: hw.device.peak(dtype), F32: hw.device.peak("fp32"), M: hw.device.memory_bandwidth,
              LAM: hw.device.launch_latency}
    breakdown = predict(model, hw, Plan(global_batch=2, dtype=dtype)).breakdown_s
    compute = breakdown["compute/forward"] + breakdown["compute/backward"]
    assert float(step_time_expr(model, hw, dtype, choose_at=2).subs(values)) == pytest.approx(compute, rel=1e-5)


def test_cli_set_flash_switch(run) -> None:  # noqa: ANN001 - the conftest fixture
    import json

    base = ("predict", "gpt", "dgx-a100", "--set", "layers=2", "--set", "hidden=2048", "--set", "heads=16",
            "--set", "seq=4096", "--format", "json")
    code, off, _ = run(*base)
    code2, on, _ = run(*base, "--set", "flash=true")
    assert code == code2 == 0
    assert json.loads(on)["memory"]["activations"] < json.loads(off)["memory"]["activations"]
    code, _, err = run(*base, "--set", "flash=2")
    assert code == 2 and "flash" in err and "true or false" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(*base[:3], "--set", "layers=true", *base[5:])  # (a name given twice is its own error)
    assert code == 2 and "positive integer" in err
