"""Activations a transformer layer keeps for backward, pinned analytically per token.

Llama (Megatron-Core + Transformer Engine, what Megatron-Bridge runs): TE's LayerNormLinear keeps the norm's
input and its output (ln_out, quantized under FP8: one value byte, plus 1/32 scale byte under MXFP8), the fused
attention keeps Q, K, V, its output and the fp32 softmax statistics, the fused SwiGLU only its input [gate; up],
and linear_fc2 its FP8 input. GPT (Megatron-LM, Korthikanti et al. 2022 Table 2): 34 sbh + 5 a s^2 b bytes per
layer in 16-bit, which dlperf's Korthikanti-checked rows rely on.
"""

from __future__ import annotations

import pytest

from dlperf.ops import OPS
from dlperf.ops.fp8 import OPERAND_BYTES, saved_bytes
from dlperf.spec.model import load_model, walk

H, F, HEADS, KV, HD, SEQ = 8192, 28672, 64, 8, 128, 8192  # Llama 3 70B (models/llama3-70b.yaml)


def _layer_saved_per_token(model_name: str, dtype: str | None = None, **sets: object) -> float:
    """Bytes one decoder layer keeps per token (per sample, divided by the sequence length)."""
    model = load_model(model_name, {"seq": SEQ, **sets})
    block = next(item for item in model.root.items if getattr(item, "repeat", 1) > 1)
    e = 2
    total = 0
    for layer, _ in walk(block, 1):
        saved = OPS[layer.op].saved(layer, e)
        total += saved_bytes(layer, saved, e, dtype) if dtype else saved
    return float(total) / SEQ


def _llama_attention_half(ln_out: float) -> float:
    """Norm input (bf16 h), the QKV GEMM's input `ln_out` (bytes per element), Q (h), K and V (kv heads), O
    (h, kept once in bf16: Megatron-Core's linear_proj saves the fused kernel's own output), fp32 LSE per head."""
    return 2 * H + ln_out * H + 2 * H + 2 * 2 * KV * HD + 2 * H + 4 * HEADS


def test_llama_layer_megatron_core_bf16():
    # MLP: norm input 2h, fc1 input (one copy for gate and up) 2h, fused SwiGLU input 2 x 2f, fc2 input 2f
    mlp = 2 * H + 2 * H + 2 * 2 * F + 2 * F
    assert _layer_saved_per_token("llama3-70b") == _llama_attention_half(2) + mlp


@pytest.mark.parametrize("recipe", ["fp8", "mxfp8"])
def test_llama_layer_megatron_core_fp8(recipe):
    b = OPERAND_BYTES[recipe]
    mlp = 2 * H + b * H + 2 * 2 * F + b * F  # ln_out and fc2's input quantized (TE Linear, columnwise only)
    assert _layer_saved_per_token("llama3-70b", recipe) == pytest.approx(_llama_attention_half(b) + mlp)


def test_llama_layer_unfused_swiglu_keeps_gate_activation_and_both_inputs():
    """torchtitan / Hugging Face: silu(w1 x) * (w3 x) as autograd ops keeps w1 x (silu), silu's output and w3 x
    (the product), and w1 and w3 each save their input: 2f and 2h more bytes than Megatron-Core's fused MLP."""
    fused = _layer_saved_per_token("llama3-70b")
    assert _layer_saved_per_token("llama3-70b", fused_swiglu=False) == fused + 2 * F + 2 * H


def test_gpt_layer_keeps_korthikanti_table_2():
    """Korthikanti et al. 2022 eq. (1): sbh (34 + 5 a s / h) bytes per layer, 16-bit with dropout masks."""
    h, a, s = 12288, 96, 2048
    model = load_model("gpt", {"seq": s})
    block = next(item for item in model.root.items if getattr(item, "repeat", 1) > 1)
    total = sum(OPS[layer.op].saved(layer, 2) for layer, _ in walk(block, 1))
    # two LayerNorm inputs 4sbh, attention 10sbh + 5as^2b with its dropout mask sbh, MLP 2 + 8 + 8 sbh and its
    # dropout mask sbh (Table 2's terms; unfused attention, so no log-sum-exp)
    assert total == s * h * 34 + 5 * a * s * s


@pytest.mark.parametrize("recipe", ["fp8", "mxfp8"])
def test_fp8_param_gather_keeps_no_16_bit_weights(recipe):
    """Megatron-Core's fp8_param_gather makes the FP8 (MXFP8: row- and column-wise) copies the weights: per
    parameter of an FP8 layer 2 (bf16 grads) + 12 / dp (fp32 master, moments; ZeRO 1) + 2 x operand bytes, no
    2-byte weight. The embedding, final norm and output head are not Transformer Engine modules: they keep their
    bf16 weight and have no FP8 copy."""
    from dlperf.engine.step import StepModel
    from dlperf.ops.fp8 import fp8_layers
    from dlperf.plan import Plan
    from dlperf.spec.hardware import load_hardware

    model, hw = load_model("llama3-8b", {"layers": 2, "seq": 1024}), load_hardware("dgx-b200")
    inside = fp8_layers(model.root)
    in_fp8 = sum(layer.params * n for layer, n in model.counted() if layer in inside)
    outside = 2 * 128256 * 4096 + 4096  # embedding, output head, final RMSNorm (llama3-8b.yaml)
    assert in_fp8 == model.total_params - outside
    plan = Plan(devices=8, global_batch=8, zero=1, dtype=recipe)
    plain = StepModel(model, hw).predict(plan).memory
    gathered = StepModel(model, hw).predict(plan.with_(fp8_param_gather=True)).memory
    assert plain["weights"] == pytest.approx(2 * model.total_params)
    assert gathered["weights"] == pytest.approx(2 * outside)
    assert gathered["fp8_weights"] == plain["fp8_weights"] == pytest.approx(2 * OPERAND_BYTES[recipe] * in_fp8)
    assert gathered["activations"] == plain["activations"]


@pytest.mark.parametrize("recipe", ["fp8", "mxfp8"])
def test_moe_layer_fp8_keeps_expert_gemm_inputs_quantized(recipe):
    """Qwen3-30B-A3B's MoE layer per token (Megatron-Core's TEGroupedMLP): router input 2d and fp32
    probabilities over 128 experts, per routed copy (top 8) the permuted token in FP8 (experts' fc1 input), the
    SwiGLU input 2 x 2f with the copy's fp32 routing weight, the activation output in FP8 (fc2's input). Where
    the combine weighs the outputs instead (probs_in_expert false), each copy's 2d output is kept."""
    b, d, f, k, experts = OPERAND_BYTES[recipe], 2048, 768, 8, 128
    common = 2 * d + 4 * experts + k * (b * d + 2 * 2 * f + b * f)
    for in_expert, combine in ((True, 4), (False, 2 * d)):
        model = load_model("qwen3-30b-a3b", {"seq": 4096, "probs_in_expert": in_expert})
        moe = next(layer for layer, _ in model.layers() if layer.op == "moe")
        kept = saved_bytes(moe, OPS["moe"].saved(moe, 2), 2, recipe) / 4096
        assert kept == pytest.approx(common + k * combine)


def test_resnet50_bottleneck_keeps_each_tensor_once_with_in_place_relus():
    """An identity bottleneck (DeepLearningExamples' and torchvision's, ReLU(inplace=True)) keeps per sample: each
    convolution's input and each batch norm's input; every ReLU's output is the next convolution's input, and the
    block's last one the next block's, so the ReLUs add nothing: 2 x (c_in) + 4 x (mid) channels of H x W."""
    walked = list(walk(load_model("resnet50").root, 1))
    layers = [layer for layer, count in walked if count == 2][:10]  # conv2_x's two identity blocks, as one
    c_in, h, w = layers[0].in_shape
    mid = layers[0].out_shape[0]
    saved = sum(OPS[layer.op].saved(layer, 2) for layer in layers)
    assert saved == 2 * (2 * c_in + 4 * mid) * h * w
    relus = [layer for layer in layers if layer.op == "relu"]
    assert len(relus) == 3 and all(layer["inplace"] for layer in relus)
