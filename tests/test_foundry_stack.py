"""What llm-foundry's benchmark stack runs that a Megatron-style count does not: FlashAttention in Triton
(attn_impl: triton), FSDP's fp32 gradient reduction (composer's mixed_precision DEFAULT) and composer's training
metrics recomputing the loss. Each is a hand count against the engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dlperf.engine import predict
from dlperf.engine.device import kernel_times
from dlperf.engine.layers import element_bytes
from dlperf.engine.step import _dp_comm, step_flops
from dlperf.errors import SpecError
from dlperf.ops import OPS
from dlperf.ops.base import Layer
from dlperf.ops.dense import TRITON_SLOWDOWN, causal_fraction
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

SMALL_MPT = {"layers": 2, "hidden": 1024, "heads": 8, "seq": 2048}


def flash_layer(triton: bool, s: int = 8192, heads: int = 16, hd: int = 128, unpad: bool = False,
                kv_heads: int | None = None) -> Layer:
    rule = OPS["attention"]
    attrs = {**rule.attrs, "heads": heads, "head_dim": hd, "kv_heads": kv_heads or heads, "kv_seq": s,
             "out": heads * hd, "causal": True, "flash": True, "bias": False, "triton": triton, "unpad": unpad}
    return Layer("attention", tuple(sorted(attrs.items())), (s, heads * hd), (s, heads * hd), "attn",
                 rule.params((s, heads * hd), attrs))


def flash_kernel(triton: bool):
    (kernel,) = [k for k in OPS["attention"].kernels(flash_layer(triton), 4, 2) if k.name == "flash_attention"]
    return kernel


# ---- FlashAttention in Triton ---------------------------------------------------------------------------


def test_triton_attention_is_flashattention_2_stretched_per_pass() -> None:
    """Dao 2023 section 4.1: FlashAttention-2 is ~1.3-1.5x faster forward, ~2x backward. On the A100 file the
    attention curve has no startup, so each pass is launch + FLOPs x slowdown / rate, the rate the curve's at
    8,192 keys (peak x eff x s / (s + seq_half)): a hand count."""
    a100 = load_hardware("dgx-a100").device
    fa2, triton = flash_kernel(False), flash_kernel(True)
    # the same curve; the executed work differs only by the causal fraction (the Triton kernel masks every block
    # it visits: causal_fraction(triton=True) > the CUDA kernel's)
    assert triton.cls == fa2.cls == "attention"
    ratio = causal_fraction(8192, triton=True) / causal_fraction(8192)
    assert ratio > 1
    assert triton.cost.fwd_flops == pytest.approx(fa2.cost.fwd_flops * ratio, rel=1e-12)
    assert triton.cost.bwd_data_flops == pytest.approx(fa2.cost.bwd_data_flops * ratio, rel=1e-12)
    eff = a100.eff("attention")
    assert eff.startup == 0
    rate = 312e12 * eff.peak * 8192 / (8192 + eff.seq_half)
    fwd, bwd = kernel_times(triton, a100, "bf16")
    assert fwd == pytest.approx(a100.launch_latency + triton.cost.fwd_flops * TRITON_SLOWDOWN[0] / rate, rel=1e-12)
    launches = triton.phase_launches[1]
    assert bwd == pytest.approx(launches * a100.launch_latency + triton.bwd_flops * TRITON_SLOWDOWN[1] / rate,
                                rel=1e-12)
    fa2_fwd, fa2_bwd = kernel_times(fa2, a100, "bf16")
    assert fa2_fwd < fwd and fa2_bwd < bwd
    assert TRITON_SLOWDOWN == (1.4, 2.0)


def test_triton_attention_needs_a_fused_kernel() -> None:
    from dlperf.ops.dense import _attention_check

    attrs = {**OPS["attention"].attrs, "heads": 8, "kv_heads": 8, "flash": False, "triton": True}
    with pytest.raises(SpecError, match="triton"):
        _attention_check((1024, 1024), attrs)


def padded_mpt(tmp_path) -> str:
    """models/mpt.yaml without its `unpad` declaration: the flash-attn kernel called on the padded batch."""
    from dlperf.builtins import data_dir

    text = (data_dir("models") / "mpt.yaml").read_text()
    declared = "triton: triton_attention, unpad: true}"
    assert declared in text
    bare = tmp_path / "mpt-padded.yaml"
    bare.write_text(text.replace(declared, "triton: triton_attention}"))
    return str(bare)


def test_mpt_triton_switch_slows_only_attention(tmp_path) -> None:
    """The kernel alone: on the padded model (no bert_padding around the flash-attn kernel, whose host syncs
    outweigh the kernel's gain on this 2-layer model) the Triton kernel is slower and nothing else changes."""
    hw, plan = load_hardware("dgx-h100"), Plan(devices=1, global_batch=4, micro_batch=4)
    flash = predict(load_model(padded_mpt(tmp_path), {**SMALL_MPT, "triton_attention": False}), hw, plan)
    triton = predict(load_model(padded_mpt(tmp_path), {**SMALL_MPT, "triton_attention": True}), hw, plan)
    assert triton.step_time_s > flash.step_time_s
    for op in ("linear", "layernorm", "gelu", "cross_entropy"):
        assert triton.per_type_s[op] == pytest.approx(flash.per_type_s[op], rel=1e-12)
    assert triton.work_flops == flash.work_flops  # the same FLOPs, executed slower


# ---- attn_impl flash: flash-attn's bert_padding around the varlen kernel ------------------------------------


def test_unpad_moves_every_row_of_q_k_v_and_the_output() -> None:
    """bert_padding @v2.4.2 per attention layer (batch 4, s 2048, 16 query heads and 4 KV heads of 128): forward
    3 gathers (read + write of Q, K, V) and pad_input (zero-fill, read, write of O); backward 3 zero-fills and
    scatters (3 x Q, K, V) and the gather of O's gradient (read + write); 3 x 7 + 2 operators forward, 3 x 2 + 1
    backward; nonzero and .item() wait for the device in each of the 3 unpad_input calls."""
    batch, s, e = 4, 2048, 2
    q = o = e * batch * s * 16 * 128
    k = e * batch * s * 4 * 128
    qkv = q + 2 * k
    layer = flash_layer(False, s=s, unpad=True, kv_heads=4)
    (unpad,) = [k for k in OPS["attention"].kernels(layer, batch, e) if k.name == "unpad"]
    assert unpad.cls == "memory" and unpad.cost.work == 0  # copies only: no FLOPs, no model work
    assert unpad.cost.fwd_bytes == 2 * qkv + 3 * o
    assert unpad.cost.bwd_bytes == 3 * qkv + 2 * o
    assert unpad.phase_launches == (23, 7) and unpad.host_ops == (23, 7)
    assert unpad.syncs == 6


def test_unpad_forward_waits_for_the_host_at_each_sync() -> None:
    """Each host synchronisation adds the device's sync gap (one forward dispatch and two launch latencies, as a
    MoE dispatcher's wait) to the forward; the backward has none; the bytes stream at the element-wise rate."""
    from dataclasses import replace

    from dlperf.engine.device import sync_gap

    h100 = load_hardware("dgx-h100").device
    (unpad,) = [k for k in OPS["attention"].kernels(flash_layer(False, unpad=True), 4, 2) if k.name == "unpad"]
    fwd, bwd = kernel_times(unpad, h100, "bf16")
    no_sync = kernel_times(replace(unpad, syncs=0), h100, "bf16")
    assert sync_gap(h100) == pytest.approx(h100.dispatch_forward + 2 * h100.launch_latency, rel=1e-12)
    assert fwd - no_sync[0] == pytest.approx(6 * sync_gap(h100), rel=1e-9)
    assert bwd == no_sync[1]
    eff = h100.eff("memory")
    startup = eff.startup if eff.startup is not None else eff.half / (max(h100.peak_flops.values()) * eff.peak)
    bw = h100.memory_bandwidth * eff.peak
    assert no_sync[0] == pytest.approx(unpad.cost.fwd_bytes / bw + 23 * (startup + h100.launch_latency), rel=1e-9)


def test_unpad_applies_to_the_flash_attn_package_only() -> None:
    """llm-foundry's Triton kernel takes the padded batch (no unpad kernel, nothing saved beyond it); a layer
    without `unpad` keeps the plain fused kernel; `unpad` on an unfused layer is refused."""
    from dlperf.ops.dense import _attention_check

    def names(layer: Layer) -> list[str]:
        return [k.name for k in OPS["attention"].kernels(layer, 4, 2)]

    assert "unpad" in names(flash_layer(False, unpad=True))
    assert "unpad" not in names(flash_layer(True, unpad=True))
    assert "unpad" not in names(flash_layer(False))
    saved = OPS["attention"].saved
    s = 8192
    extra = saved(flash_layer(False, unpad=True), 2) - saved(flash_layer(False), 2)
    assert extra == 2 * s * 16 * 128 + 3 * 8 * s  # pad_input's output copy and three int64 index vectors
    assert saved(flash_layer(True, unpad=True), 2) == saved(flash_layer(True), 2)
    attrs = {**OPS["attention"].attrs, "heads": 8, "kv_heads": 8, "flash": False, "unpad": True}
    with pytest.raises(SpecError, match="unpad"):
        _attention_check((1024, 1024), attrs)


def test_mpt_flash_pays_the_unpad_and_triton_does_not(tmp_path) -> None:
    """models/mpt.yaml declares unpad (attn_impl flash, llmfoundry/models/layers/attention.py @5e85bd62): with
    the flash-attn kernel each layer's attention costs its unpad kernel more than without it, forward and
    backward; with triton_attention the declaration changes nothing."""
    hw, plan = load_hardware("dgx-h100"), Plan(devices=1, global_batch=4, micro_batch=4)
    bare = padded_mpt(tmp_path)
    for triton in (False, True):
        params = {**SMALL_MPT, "triton_attention": triton}
        unpadded, padded = predict(load_model("mpt", params), hw, plan), predict(load_model(bare, params), hw, plan)
        extra = unpadded.per_type_s["attention"] - padded.per_type_s["attention"]
        if triton:
            assert extra == 0 and unpadded.step_time_s == padded.step_time_s
            continue
        layer = [layer for layer, _ in load_model("mpt", params).layers() if layer.op == "attention"][0]
        (unpad,) = [k for k in OPS["attention"].kernels(layer, 4, 2) if k.name == "unpad"]
        assert extra == pytest.approx(SMALL_MPT["layers"] * sum(kernel_times(unpad, hw.device, "bf16")), rel=1e-9)
        assert unpadded.work_flops == padded.work_flops


# ---- FSDP mixed precision: weights gathered in bf16, gradients reduced in fp32 -----------------------------


class Recorder:
    """A comm stand-in that records (collective, bytes) and prices 1 s per GB."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def collective_time(self, op: str, nbytes: float, group: object, hw: object, *rest: object) -> float:
        self.calls.append((op, nbytes))
        return nbytes / 1e9

    def Group(self, n: int, stride: int) -> tuple[int, int]:  # noqa: N802 (mirrors dlperf.comm.Group)
        return n, stride


def zero3_bytes(grad_dtype: str | None) -> dict[str, set[float]]:
    hw = load_hardware("dgx-h100")
    params, units = 1.2e9, 24
    slow = SimpleNamespace(dp_params=params, backward_window=1.0, forward_window=0.5)
    comm = Recorder()
    _dp_comm(hw, Plan(devices=8, dp=8, global_batch=8, zero=3, grad_dtype=grad_dtype), slow, "bf16", comm, units)
    out: dict[str, set[float]] = {}
    for op, nbytes in comm.calls:
        out.setdefault(op, set()).add(nbytes)
    return out


def test_fsdp_default_mixed_precision_reduces_in_fp32_and_gathers_in_bf16() -> None:
    """composer's DEFAULT: param_dtype bf16 (all-gathers), reduce_dtype fp32 (reduce-scatters). Per FSDP unit of
    1.2e9 / 24 parameters: gathers 2 B each either way, reduce-scatters 2 B (PURE) or 4 B (DEFAULT)."""
    unit = 1.2e9 / 24
    pure, default = zero3_bytes(None), zero3_bytes("fp32")
    assert pure["allgather"] == default["allgather"] == {2 * unit}
    assert pure["reduce_scatter"] == {2 * unit}
    assert default["reduce_scatter"] == {4 * unit}


def test_fp32_reduction_makes_fsdp_no_faster() -> None:
    model, hw = load_model("mpt", SMALL_MPT), load_hardware("dgx-h100")
    plan = Plan(devices=16, dp=16, global_batch=16, micro_batch=1, zero=3)
    pure = predict(model, hw, plan)
    default = predict(model, hw, plan.with_(grad_dtype="fp32"))
    assert default.step_time_s >= pure.step_time_s
    # FSDP casts each reduced gradient shard back to its fp32 parameter's dtype (torch FSDP1
    # _cast_grad_to_param_dtype), so the sharded gradient weighs the same whichever dtype reduced it
    assert default.memory["gradients"] == pytest.approx(pure.memory["gradients"])


# ---- FSDP's root unit: MPT's embeddings and final norm outside the wrapped blocks -----------------------------


def test_mpt_root_unit_holds_the_embeddings_and_final_norm() -> None:
    """llm-foundry's `fsdp_wrap_fn` wraps each MPTBlock, so composer's root FSDP unit holds the rest: wte (tied to
    the head), wpe and norm_f, (vocab + seq) x h + 2h parameters; no root is modelled under pipeline stages."""
    from dlperf.engine.memory import root_unit_params

    model, h = load_model("mpt", SMALL_MPT), SMALL_MPT["hidden"]
    plan = Plan(devices=8, dp=8, global_batch=8, zero=3)
    assert root_unit_params(model, plan) == (50368 + SMALL_MPT["seq"]) * h + 2 * h
    assert root_unit_params(model, Plan(devices=16, dp=8, pp=2, global_batch=8, zero=3)) == 0


@pytest.mark.parametrize("zero", [3, 2])
def test_fsdp_root_unit_is_gathered_once_and_reduced_once_both_exposed(zero: int) -> None:
    """torch FSDP keeps the root gathered after the forward (`_post_forward_reshard` frees non-root units only)
    and reduce-scatters it at the end of the backward: one gather and one reduce-scatter of the root's bytes per
    micro-batch, both exposed; the L units are the blocks alone, each gathered in the forward (and again in the
    backward under FULL_SHARD) and reduce-scattered once. Priced at 1 s per GB, with windows that hide every block
    collective, the exposed time is the root's two collectives plus the first block gather and the last block
    reduce-scatter."""
    hw = load_hardware("dgx-h100")
    params, root, units = 1.2e9, 0.2e9, 20
    slow = SimpleNamespace(dp_params=params, backward_window=100.0, forward_window=100.0)
    plan = Plan(devices=8, dp=8, global_batch=8, zero=zero, grad_dtype="fp32")
    comm = Recorder()
    *_, total, exposed = _dp_comm(hw, plan, slow, "bf16", comm, units, None, root)
    block = (params - root) / units
    gathers = [n for op, n in comm.calls if op == "allgather"]
    reduces = [n for op, n in comm.calls if op == "reduce_scatter"]
    assert sorted(set(gathers)) == pytest.approx(sorted({2 * block, 2 * root}))
    assert sorted(set(reduces)) == pytest.approx(sorted({4 * block, 4 * root}))
    passes = 2 if zero == 3 else 1
    assert total == pytest.approx((passes * 2 * block + 4 * block) * units / 1e9 + 6 * root / 1e9)
    first_backward_gather = 2 * block if zero == 3 else 0.0  # FULL_SHARD's, still priced exposed
    shown = (2 * root + 4 * root + 2 * block + first_backward_gather + 4 * block) / 1e9
    assert 0 < exposed - shown < 0.25 * total  # the rest: the hidden collectives' SM share (_overlap_contention)
    no_root = Recorder()
    *_, flat_total, _ = _dp_comm(hw, plan, slow, "bf16", no_root, units)
    assert sorted({n for op, n in no_root.calls if op == "allgather"}) == pytest.approx([2 * params / units])
    if zero == 3:  # the averaged layout also re-gathered the root's share in every backward
        assert flat_total == pytest.approx(total + 2 * root / 1e9)
    else:
        assert flat_total == pytest.approx(total)


# ---- FSDP's passes over each unit's unsharded gradient (torch v2.1.0) ---------------------------------------


@pytest.mark.parametrize(("zero", "grad_dtype", "dp", "impl", "expected"), [
    (3, "fp32", 8, "fsdp", 2 * 2 + (2 + 4) + 2 * 4),  # split-backward copy + cast to fp32 + pre-divide in fp32
    (2, "fp32", 8, "fsdp", 18),                        # SHARD_GRAD_OP reduces the same way
    (3, None, 8, "fsdp", 2 * 2 + 2 * 2),              # PURE bf16: no cast, pre-divide in bf16
    (1, "fp32", 8, "fsdp", 0),                         # ZeRO-1 keeps whole gradients (DDP-style reduction)
    (3, "fp32", 1, "fsdp", 0),                         # one rank: no reduce-scatter, no pre-divide
    (3, None, 8, "deepspeed-0.3", 0),                  # DeepSpeed's stage 3 is priced by dlperf.engine.zero_impl
])
def test_fsdp_unsharded_gradient_bytes(zero: int, grad_dtype: str | None, dp: int, impl: str,
                                       expected: int) -> None:
    """Bytes per parameter and micro-batch: autograd's backward of the FlatParameter split (read + write 2 B),
    `_post_backward_hook`'s cast to the reduce dtype (read 2, write 4 B, only when it differs) and `_reduce_grad`'s
    in-place pre-divide (read + write in the reduce dtype)."""
    from dlperf.engine.step import _fsdp_unsharded_grad_bytes

    plan = Plan(devices=dp, dp=dp, global_batch=dp, zero=zero, grad_dtype=grad_dtype, zero_impl=impl)
    assert _fsdp_unsharded_grad_bytes(plan, "bf16") == expected


def test_fsdp_gradient_passes_are_charged_per_micro_batch_at_memory_speed() -> None:
    """The step's grad_accumulation entry holds, per micro-batch, the whole stage's 18 B/parameter at the
    device's element-wise bandwidth on top of the sharded accumulation (3 x 4 B over 1/dp of the parameters)."""
    model, hw = load_model("mpt", SMALL_MPT), load_hardware("dgx-h100")
    plan = Plan(devices=8, dp=8, global_batch=32, micro_batch=1, zero=3, grad_dtype="fp32")
    r = predict(model, hw, plan)
    params = model.total_params
    bw = hw.device.memory_bandwidth * hw.device.eff("memory").peak
    per_micro = (3 * 4 * params / 8 + 18 * params) / bw + hw.device.launch_latency
    assert r.breakdown_s["compute/grad_accumulation"] == pytest.approx(4 * per_micro, rel=1e-9)


def test_fsdp_gradient_passes_shrink_with_memory_bandwidth_not_with_peak() -> None:
    """Memory-bound: twice the HBM bandwidth halves them, twice the FLOP/s leaves them unchanged; neither makes
    the step slower (more peak or bandwidth never slows a step)."""
    from dataclasses import replace

    model, hw = load_model("mpt", SMALL_MPT), load_hardware("dgx-h100")
    plan = Plan(devices=8, dp=8, global_batch=32, micro_batch=1, zero=3, grad_dtype="fp32")
    base = predict(model, hw, plan)
    faster_mem = replace(hw, device=replace(hw.device, memory_bandwidth=2 * hw.device.memory_bandwidth))
    faster_flops = replace(hw, device=replace(hw.device, peak_flops={k: 2 * v for k, v in
                                                                        hw.device.peak_flops.items()}))
    mem, flops = predict(model, faster_mem, plan), predict(model, faster_flops, plan)
    launches = 4 * hw.device.launch_latency
    acc = base.breakdown_s["compute/grad_accumulation"] - launches
    assert mem.breakdown_s["compute/grad_accumulation"] - launches == pytest.approx(acc / 2, rel=1e-9)
    assert flops.breakdown_s["compute/grad_accumulation"] == pytest.approx(acc + launches, rel=1e-9)
    assert mem.step_time_s <= base.step_time_s and flops.step_time_s <= base.step_time_s


# ---- composer's training metrics --------------------------------------------------------------------------


def metric_kernels(metrics: int, classes: int = 50368, tokens: int = 4096) -> list:
    rule = OPS["cross_entropy"]
    attrs = {**rule.attrs, "metrics": metrics}
    layer = Layer("cross_entropy", tuple(sorted(attrs.items())), (classes,), (1,), "loss", 0)
    return list(rule.kernels(layer, tokens, 2))


def test_training_metrics_read_the_logits_in_fp32_after_backward() -> None:
    """Per metric and logit: cast bf16 -> fp32 (read 2, write 4 B), log_softmax (read 4, write 4 B): 14 B, 3
    kernels, after loss.backward() (so in the backward pass, never recomputed) and no model FLOPs."""
    (loss,) = metric_kernels(0)
    same_loss, metric = metric_kernels(2)
    assert same_loss == loss
    n = 4096 * 50368
    assert metric.cost.bwd_bytes == 2 * 14 * n and metric.cost.fwd_bytes == 0 and metric.cost.fwd_flops == 0
    assert metric.phase_launches == (0, 6)
    assert metric.model_work_scale == 0


def test_training_metrics_cost_time_not_model_flops(tmp_path) -> None:
    from dlperf.builtins import data_dir

    hw, plan = load_hardware("dgx-a100"), Plan(devices=1, global_batch=4, micro_batch=4)
    text = (data_dir("models") / "mpt.yaml").read_text()
    declared = "{op: cross_entropy, impl: fused, metrics: 2}"  # composer's LanguageCrossEntropy, LanguagePerplexity
    assert declared in text
    bare = tmp_path / "mpt-no-metrics.yaml"
    bare.write_text(text.replace(declared, "{op: cross_entropy, impl: fused}"))
    with_metrics, without = load_model("mpt", SMALL_MPT), load_model(str(bare), SMALL_MPT)
    e = element_bytes("bf16")
    assert step_flops(with_metrics, plan, e)[0] == step_flops(without, plan, e)[0]
    slower, faster = predict(with_metrics, hw, plan), predict(without, hw, plan)
    assert slower.step_time_s > faster.step_time_s
    assert slower.breakdown_s["compute/forward"] == pytest.approx(faster.breakdown_s["compute/forward"])


def test_grad_dtype_on_the_command_line(run) -> None:
    import json

    args = ["predict", "mpt", "dgx-h100", "--set", "layers=2", "--set", "hidden=1024", "--set", "heads=8",
            "--gpus", "16", "--dp", "16", "--zero", "3", "--global-batch", "16", "--format", "json"]
    code, out, _ = run(*args)
    code32, out32, _ = run(*args, "--grad-dtype", "fp32")
    assert code == code32 == 0
    bf16, fp32 = json.loads(out), json.loads(out32)
    assert fp32["plan"]["grad_dtype"] == "fp32"
    assert fp32["memory"]["gradients"] == pytest.approx(bf16["memory"]["gradients"])  # fp32 shards either way
    assert fp32["step_time_s"] >= bf16["step_time_s"]
    code, _, err = run(*args, "--grad-dtype", "fp7")
    assert code == 2 and "fp7" in err


def test_sharded_gradient_accumulation_shards_over_dp_times_cp() -> None:
    """Context-parallel ranks hold the same weights and shard ZeRO-2/3 states with the data-parallel ones (as
    `memory` counts them): the accumulated gradient shard is 1/(dp*cp). One FSDP rank with cp 2 still
    reduce-scatters over its 2 ranks, so the unsharded-gradient passes are charged."""
    from dlperf.engine.step import _fsdp_unsharded_grad_bytes, _grad_accumulation

    hw, params = load_hardware("dgx-h100"), 1e9
    bw = hw.device.memory_bandwidth * hw.device.eff("memory").peak
    cp2 = Plan(devices=8, dp=4, cp=2, global_batch=8, zero=2, grad_dtype="fp32", zero_impl="deepspeed-0.3")
    assert _grad_accumulation(hw, cp2, params, "bf16") == pytest.approx(
        3 * 4 * params / 8 / bw + hw.device.launch_latency, rel=1e-12)
    alone = Plan(devices=2, dp=1, cp=2, global_batch=2, zero=3, grad_dtype="fp32", zero_impl="fsdp")
    assert _fsdp_unsharded_grad_bytes(alone, "bf16") == 18
