"""Which of a layer's kernels a partial recomputation reruns, and what it and FP8 activation caching take off the
activations the layer keeps for backward (`Plan.recompute_modules`, `Plan.fp8_activations`).

DeepSeek-V3 (arXiv:2412.19437) describes both:
- Sec. 3.2.3, "Recomputation of RMSNorm and MLA Up-Projection": "We recompute all RMSNorm operations and MLA
  up-projections during back-propagation, thereby eliminating the need to persistently store their output
  activations" (modules "layernorm" and "mla_up_proj");
- Sec. 3.3.3, "Low-Precision Activation": "we cache the activations in FP8 format for the backward pass of the
  Linear operator", except (1) the inputs of the Linear after the attention operator, kept in a customized E5M6
  format, and (2) "the inputs of the SwiGLU operator in MoE ... we cache the inputs of the SwiGLU operator and
  recompute its output in the backward pass. These activations are also stored in FP8" (module "moe_act" and
  FP8 caching). Sec. 3.3.1 keeps "the embedding module, the output head, MoE gating modules, normalization
  operators, and attention operators" in their original precision: the router's input and the attention's
  Q, K, V are not Linear-only inputs and stay 16-bit.

The bytes freed are counted against the layer's own `saved` rule (dlperf.ops.moe _mla_saved and _moe_saved), term
by term, so that nothing is freed that the rule does not count. A norm's output is kept by the layer that consumes
it (its input term): "layernorm" frees that term in an mla, moe or linear layer that directly follows a norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlperf.ops.base import BYTES_PER_ELEMENT, Layer, numel
from dlperf.ops.moe import routed_width

NORM_OPS = ("rmsnorm", "layernorm")
FP8 = BYTES_PER_ELEMENT["fp8"]
# DeepSeek-V3 Sec. 3.3.3: the attention output projection's input is cached in E5M6 (1 sign, 5 exponent, 6
# mantissa bits): 12 bits per element.
E5M6 = 12 / 8
# Sec. 3.3.2 fine-grained quantization: one scaling factor per 1x128 tile of an activation; FP32, as DeepEP's FP8
# dispatch returns them (deepseek-ai/DeepEP deep_ep/buffer.py, low_latency_dispatch docstring: float8_e4m3fn values
# and `hidden // 128` scales "with torch.float" unless use_ue8m0).
TILE, SCALE_BYTES = 128, 4
FP8_TILED = FP8 + SCALE_BYTES / TILE


@dataclass(frozen=True)
class ActivationPolicy:
    """A plan's partial recomputation and FP8 activation caching, with the layers whose input is a norm's output
    (`norm_consumers`)."""

    modules: frozenset[str] = frozenset()
    fp8_cache: bool = False
    after_norm: frozenset[Layer] = frozenset()

    @property
    def active(self) -> bool:
        return bool(self.modules) or self.fp8_cache


def norm_consumers(root: Any) -> frozenset[Layer]:
    """Layers that directly follow a norm in some sequence of the model (a pre-norm block's attention or MoE), or
    open a path of the branches that follow it (a SwiGLU MLP written as gate and up projections side by side: both
    read the norm's output)."""
    from dlperf.spec.model import Branches, Seq

    out: set[Layer] = set()

    def visit(node: Any) -> None:
        if isinstance(node, Seq):
            for before, after in zip(node.items, node.items[1:], strict=False):
                if not (isinstance(before, Layer) and before.op in NORM_OPS):
                    continue
                if isinstance(after, Layer):
                    out.add(after)
                elif isinstance(after, Branches):
                    out.update(path.items[0] for path in after.paths if path.items and isinstance(path.items[0],
                                                                                                  Layer))
            for item in node.items:
                visit(item)
        elif isinstance(node, Branches):
            for path in node.paths:
                visit(path)

    visit(root)
    return frozenset(out)


def rerun_kernels(layer: Layer, modules: frozenset[str]) -> frozenset[str]:
    """Names of the layer's kernels that the recomputed `modules` run again in backward ("*": all of them)."""
    names: set[str] = set()
    if "layernorm" in modules and layer.op in NORM_OPS:
        return frozenset({"*"})
    if layer.op == "mla":
        if "layernorm" in modules:
            names |= {"q_norm", "kv_norm"}  # the latent RMSNorms
        if "mla_up_proj" in modules:  # Megatron-Core checkpoints qkv_up_proj_and_rope_apply: up-projections, RoPE
            names |= {"q_up", "kv_up", "mla_rope"}
    if layer.op == "moe" and "moe_act" in modules:
        names |= {"expert_swiglu", "expert_gelu", "shared_swiglu", "shared_gelu", "expert_act_clamp",
                  "glu_offset_copy"}
    return frozenset(names)


def reruns(rerun: frozenset[str], kernel: str) -> bool:
    """Whether a kernel named `kernel` is among `rerun` (rerun_kernels' answer for its layer)."""
    return "*" in rerun or kernel in rerun


def freed_bytes(layer: Layer, e: int, modules: frozenset[str], fp8: bool, after_norm: bool,
                operand: float | None = None) -> Any:
    """Bytes per sample the layer no longer keeps: outputs of recomputed modules, and with `fp8` its Linear
    inputs held in FP8 (with their tile scales) instead of `e` bytes. `after_norm`: the layer's input is a norm's
    output. `operand`: the bytes per element at which the layer's FP8 recipe already keeps its GEMM inputs
    (dlperf.ops.fp8.saved_bytes; None outside a recipe, where they are kept at `e`)."""
    rule = _RULES.get(layer.op)
    if rule is None:
        return 0
    return rule(layer, e, modules, fp8, "layernorm" in modules and after_norm, operand or e)


def _mla(layer: Layer, e: int, modules: frozenset[str], fp8: bool, input_recomputed: bool, kept: float) -> Any:
    """_mla_saved keeps, per token: input d, latents (q, kv and the rope key), per-head Q, K, V, the output
    projection's input O, and the log-sum-exp. Up-projection recompute rebuilds Q, K, V from the latents. An FP8
    recipe leaves those 16-bit (`kept` unused).

    FP8 caching keeps the q and kv latents in FP8 as the up-projections' inputs, unless the latent RMSNorms are
    recomputed ("layernorm"): then the up-projections' inputs are those norms' outputs, rebuilt in backward, and
    what stays is the norms' own input, the latents, in their original precision (Sec. 3.3.1 keeps normalization
    operators in it). DeepSeek-V3's framework does so: its attention backward reruns the 1536- and 512-wide RMSNorm
    forward kernels on BF16 inputs, with no FP8 cast-back before them (`layer_norm::ln_fwd_kernel<Kernel_traits<
    __nv_bfloat16, ..., 1536u ...>>` and `<... 512u ...>` in attn(B), deepseek-ai/profile-data @4496024
    train.json)."""
    s, d, h = layer.in_shape[-2], layer.in_shape[-1], layer["heads"]
    qd, vd = layer["qk_nope_head_dim"] + layer["qk_rope_head_dim"], layer["v_head_dim"]
    linear_latents = (layer["q_lora_rank"] or 0) + layer["kv_lora_rank"]  # inputs of q_up and kv_up
    freed = e * d if input_recomputed else 0
    if "mla_up_proj" in modules:
        freed += e * (2 * h * qd + h * vd)
    if fp8:
        if not input_recomputed:
            freed += (e - FP8_TILED) * d  # input of q_down and kv_down
        if "layernorm" not in modules:  # the up-projections keep their inputs, the (normed) latents, in FP8
            freed += (e - FP8_TILED) * linear_latents
        freed += (e - E5M6) * h * vd
    return s * freed


def _moe(layer: Layer, e: int, modules: frozenset[str], fp8: bool, input_recomputed: bool, kept: float) -> Any:
    """_moe_saved keeps, per token: input d (router), fp32 router probabilities, per routed copy the permuted
    token d, the expert's gate/up output (SwiGLU input: 2f, or f ungated), its activation f (the down
    projection's input) and its output d; the shared experts' gate/up and activation. The router input stays
    16-bit (Sec. 3.3.1: gating in original precision), as do the experts' outputs (the combine's input). The
    GEMM inputs (permuted token, activations) are held at `kept` bytes (an FP8 recipe's, dlperf.ops.fp8
    moe_gemm_inputs), the rest at `e`: FP8 caching moves both to FP8 with tile scales. With `latent` the routed
    copies are latent-wide and fc2_latent_proj's kept input, the combined latent, is one more GEMM input."""
    s, d, k, f = numel(layer.in_shape[:-1]), layer.in_shape[-1], layer["top_k"], layer["ffn"]
    w, fc2_in = routed_width(layer), layer["latent"] or 0
    width = layer["shared_experts"] * (layer["shared_ffn"] or layer["ffn"])
    act_in = 2 if layer["gated"] else 1
    act_recomputed = "moe_act" in modules
    freed = e * d if input_recomputed else 0
    if act_recomputed:
        freed += kept * (k * f + width)
    if fp8:
        kept_act = 0 if act_recomputed else 1
        freed += (e - FP8_TILED) * act_in * (k * f + width)
        freed += (kept - FP8_TILED) * (k * (w + kept_act * f) + kept_act * width + fc2_in)
    return s * freed


def _linear(layer: Layer, e: int, modules: frozenset[str], fp8: bool, input_recomputed: bool, kept: float) -> Any:
    """A linear layer keeps its input (at `kept` bytes: in FP8 under an FP8 recipe already,
    dlperf.ops.fp8.saved_bytes): a norm's output rebuilt in backward is not kept. `fp8` adds nothing: an FP8
    recipe's linear input is already FP8. A linear that keeps no input of its own (`fused_input`) frees
    nothing."""
    if not input_recomputed or layer["fused_input"]:
        return 0
    return numel(layer.in_shape) * kept


_RULES = {"mla": _mla, "moe": _moe, "linear": _linear}
