"""What an FP8 or FP4 training recipe does to a layer's kernels (`--dtype fp8`, `--dtype mxfp8`, `--dtype nvfp4`).

FP8 training as Transformer Engine runs it (Micikevicius et al. 2022, "FP8 Formats for Deep Learning",
arXiv:2209.05433, sections 3-4; NVIDIA Transformer Engine docs, "Using FP8 with Transformer Engine"): only the
GEMMs of linear layers run in FP8 (E4M3 forward, E5M2 gradients), each operand scaled by a per-tensor factor
derived from its amax history (delayed scaling). Everything else keeps the 16-bit recipe: activations between
layers, normalisations, softmax, the attention core, the loss, communication and gradients stay bf16, and the
master weights and optimizer states fp32.

What this costs beyond the faster GEMM:
- before each FP8 GEMM, its bf16 activation operand is cast to FP8 with its amax taken, and on Hopper, whose FP8
  tensor cores take only the TN layout, transposed as well for the weight-gradient GEMM (TE's fused
  cast_transpose): a memory-bound kernel that reads 2 bytes and writes 2 (FP8 value and FP8 transpose) per
  element, forward; backward does the same for the output gradient dY before the data- and weight-gradient
  GEMMs. Counted as their own kernels, i.e. not fused into the producer (TE fuses some into LayerNorm/GELU).
- the weights are cast once per step, after the optimizer update (TE caches the FP8 weight and its transpose
  across the micro-batches of a step, `is_first_microbatch`): priced with the optimizer (engine/step.py).
- the FP8 copies of the weights live beside the bf16 ones (engine/memory.py).
With the plan's `fp8_weight_transpose: per_use` one FP8 copy of each weight is cached and a kernel of its own
transposes it before each GEMM that reads the other layout, once per micro-batch, as DeepSeek-V3's training
framework does (deepseek-ai/profile-data @4496024 train.json, a DualPipe forward/backward chunk pair at the
DeepSeek-V3 pre-training settings, EP 64, 4K tokens: no weight is quantized in either chunk; FP8
`batched_transpose<512, 128, 1, 1>` kernels the size of the routed experts' weights run before their forward
grouped GEMMs -- 7168 and 3584 tiles of 128x128 for the four local experts' 4096x7168 gate/up and 7168x2048 down
weights -- and ones the size of every other FP8 weight before its data-gradient GEMM -- 896 and 1792 tiles for the
shared expert's, 7168 for the attention output projection's): `weight_transpose_kernel`.

MXFP8 (`--dtype mxfp8`) is the same recipe with block scales instead of per-tensor ones, as Transformer Engine's
MXFP8 recipe runs it on Blackwell's block-scaled tensor cores (TE user guide, "Low precision training: MXFP8",
release 2.18: one E8M0 power-of-two scale per 32 consecutive values, one-dimensional blocks, E4M3 both ways; OCP
Microscaling Formats (MX) v1.0 spec): every FP8 operand carries one scale byte per 32 elements, 1 + 1/32 bytes
per element. The blocks run along the GEMM's reduction dimension, so the operand a transposed GEMM reads is not a
transpose of the quantized one: TE keeps a row-wise and a column-wise copy, each quantized from the 16-bit tensor
with its own scales (TE user guide, "Performance considerations: handling transposes", tensor usages) -- the two
outputs Hopper's cast_transpose writes, plus the scales. The block amax is taken inside the quantize kernel, priced
as the per-tensor recipe's amax is (CAST_FLOPS).
cuBLASLt's block-scaled GEMMs read the scales in a tiled ("swizzled") layout, not the row-major one the quantizer
writes, so Transformer Engine swizzles an operand's scales in a kernel of its own (nvte_swizzle_scaling_factors) before
the GEMM reads them, into a fresh buffer each time (nothing is cached on the tensor): mx_swizzle_kernel.

NVFP4 (`--dtype nvfp4`) is Transformer Engine's NVFP4BlockScaling recipe (transformer_engine/common/recipe/__init__.py
@71bbefbf, the TE Megatron-Bridge @0a25f911 pins; NVIDIA, "Pretraining Large Language Models with NVFP4",
arXiv:2509.25149): E2M1 values (half a byte) with one E4M3 scale byte per 16 consecutive values and a per-tensor fp32
scale (second level, negligible), 0.5 + 1/16 bytes per element; all three GEMMs of a linear layer (fprop, dgrad,
wgrad) run in FP4; weights take 2D 16x16 blocks, activations and gradients 1D blocks; the column-wise copies of the
input and of the output gradient (the wgrad GEMM's operands) pass through a 16x16 random Hadamard transform (RHT, "only
applied to column-wise usage so that it can be used for wgrad GEMM"), and gradients are stochastically rounded. Its
quantizer (transformer_engine/pytorch/csrc/quantizer.cpp @71bbefbf, NVFP4Quantizer::quantize_impl) first runs
nvte_hadamard_transform_amax over the 16-bit input (the per-tensor amax of the tensor and of its RHT, needed before any
block can be scaled), then the fused row-cast / column-RHT-cast kernel (row_cast_col_hadamard_transform_cast_fusion, for
BF16 inputs with rows % 64 == 0 and cols % 128 == 0): two reads of the 16-bit tensor, two NVFP4 copies written. The
RHT is 16 multiply-adds per element of the column-wise copy (RHT_FLOPS), done on the tensor cores; stochastic
rounding draws its random bits in the same kernel. Weights are quantized likewise, without RHT: an amax pass and the
cast (weight_cast_bytes).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dlperf.cost import Cost
from dlperf.ops.base import BYTES_PER_ELEMENT, Kernel, Layer, numel
from dlperf.ops.moe import routed_width
from dlperf.spec.hardware import LAUNCH_CALL

FP8_GEMM = "matmul_fp8"      # kernel class: a low-precision GEMM, timed on the recipe dtype's peak and GEMM curve
# the low-precision training recipes: per-tensor scaled FP8, MXFP8 (block-scaled FP8) and NVFP4 (block-scaled FP4)
RECIPES = ("fp8", "mxfp8", "nvfp4")
STORAGE = dict.fromkeys(RECIPES, "bf16")  # FP8 recipes store activations, gradients and messages in bf16
FP8 = BYTES_PER_ELEMENT["fp8"]
MX_BLOCK = 32                # elements per E8M0 scale byte (TE's MXFP8 block size; OCP MX v1.0)
NV_BLOCK = 16                # elements per E4M3 scale byte (TE's NVFP4 block size, recipe/__init__.py @71bbefbf)
FP4 = 0.5                    # an E2M1 value
# Bytes per element of a low-precision operand: the value, and under MXFP8/NVFP4 its share of the block's scale byte.
OPERAND_BYTES = {"fp8": FP8, "mxfp8": FP8 + 1 / MX_BLOCK, "nvfp4": FP4 + 1 / NV_BLOCK}
CAST_FLOPS = 2               # per element: |x| into the amax reduction, and the multiply by the scale
RHT_FLOPS = 2 * NV_BLOCK     # per element of NVFP4's column-wise copy: a 16-point Hadamard row, 16 multiply-adds
# 16-bit reads per element of a quantized tensor: the cast, and under NVFP4 the amax pass before it (quantizer.cpp)
READS = {"fp8": 1, "mxfp8": 1, "nvfp4": 2}
# Launches of one quantization under the per-tensor FP8 recipe (`fp8`), by how it takes its scales (plan
# `fp8_scaling`, dlperf.plan.FP8_SCALINGS): "delayed" from an amax history
# (TE's DelayedScaling: the cast takes the amax inside its own kernel, Float8Quantizer::quantize, one
# nvte_quantize_v2), "current" from the tensor being cast (TE's Float8CurrentScaling, Megatron-Bridge's FP8-CS:
# Float8CurrentScalingQuantizer::quantize_impl launches zero_amax_kernel and the amax reduction
# (nvte_compute_amax_with_config), compute_scale_from_amax_kernel, then the cast (nvte_quantize_v2):
# transformer_engine/pytorch/csrc/quantizer.cpp and common/recipe/current_scaling.cu, NVIDIA/TransformerEngine
# v2.9 @70f53666, the same through v2.13).
QUANTIZE_LAUNCHES = {"delayed": 1, "current": 4}
# Which MXFP8 GEMM operands get their scales swizzled by a kernel of their own before each GEMM (plan `mx_swizzle`,
# dlperf.plan.MX_SWIZZLES), as (pass, operand) pairs: a linear layer's forward GEMM reads the input X and the weight
# W row-wise, its data-gradient GEMM the output gradient dY row-wise and W column-wise, its weight-gradient GEMM X and
# dY column-wise.
# - "gemm": Transformer Engine before 2.12 swizzles both operands of every GEMM: general_gemm calls
#   swizzle_scaling_factors on A and on B, one nvte_swizzle_scaling_factors each, and a grouped GEMM one
#   nvte_multi_tensor_swizzle_scaling_factors for A's and one for B's list (te_general_grouped_gemm:
#   multi_tensor_swizzle_scaling_factors), transformer_engine/pytorch/csrc/extensions/gemm.cpp and csrc/util.cpp,
#   NVIDIA/TransformerEngine v2.9 @70f53666 (the Megatron-Bridge 25.11 pins; the same through v2.11).
# - "quantize": from 2.12 (99df88106, "Add logic for block-scaled tensors with GEMM swizzled scales", #2486) Linear,
#   LayerNormLinear, LayerNormMLP and GroupedLinear set optimize_for_gemm on their input and output-gradient
#   quantizers, whose kernels then write the scales already swizzled (with_gemm_swizzled_scales), except for the
#   operand sequence parallelism all-gathers: a column-parallel layer's input, a row-parallel layer's output
#   gradient (`if not (self.parallel_mode == "column" and self.sequence_parallel)`, module/linear.py
#   _get_quantizers). The weights' quantizer is left alone, so swizzle_scales_for_gemm still swizzles the weight's
#   scales before the forward and the data-gradient GEMM (csrc/extensions/swizzle.cpp and gemm.cpp @71bbefbf, the
#   Megatron-Bridge 26.02 pins; the same in release_v2.15).
_SWIZZLED = {
    "gemm": {"X": ("fwd", "bwd"), "W": ("fwd", "bwd"), "dY": ("bwd", "bwd")},
    "quantize": {"W": ("fwd", "bwd")},
}
_GATHERED = {"n": {"X": ("fwd", "bwd")}, "k": {"dY": ("bwd", "bwd")}}  # column-, row-parallel under SP


def is_recipe(dtype: str | None) -> bool:
    """Whether `dtype` names a low-precision training recipe (fp8, mxfp8 or nvfp4)."""
    return dtype in RECIPES


def weight_cast_bytes(dtype: str, transpose: str = "cached") -> float:
    """Per parameter, per step: read the bf16 weight, write its FP8 copy and FP8 transpose (MXFP8: row-wise and
    column-wise copies with their scales; NVFP4: an amax pass reads the weight once more first); under
    `transpose` per_use (dlperf.plan.FP8_WEIGHT_TRANSPOSES) the one copy it keeps."""
    return 2 * READS[dtype] + weight_copy_bytes(dtype, transpose)


def param_gather_bytes(dtype: str) -> float:
    """Bytes per parameter the distributed optimizer all-gathers under `fp8_param_gather`: the FP8 (NVFP4) weight
    itself, but under MXFP8 bf16. Megatron-Core keeps no MXFP8 parameter buffer: it all-gathers the updated
    weights in bf16 through a buffer it shares with the gradients, then copies each into its MXFP8 parameter, which
    quantizes it ("For MXFP8 param: Create a shared buffer for param AG and grad RS", param_and_grad_buffer.py
    lines 726-742; "The paramaters are cast from bf16 to MXFP8 during copy", distributed_data_parallel.py line 507,
    NVIDIA/Megatron-LM @92c8482e, the Megatron-Bridge 25.11 pin; the same at @3758b54b, the 26.02 pin). That
    copy is the per-step weight cast (weight_cast_bytes)."""
    return BYTES_PER_ELEMENT["bf16"] if dtype == "mxfp8" else OPERAND_BYTES[dtype]


def weight_copy_bytes(dtype: str, transpose: str = "cached") -> float:
    """Per parameter, resident: TE's cached FP8 weight and its FP8 transpose (Hopper's TN-only FP8 GEMMs; MXFP8's
    row-wise and column-wise copies; NVFP4's 2D 16x16 blocks make the two copies transposes of each other, but TE
    still keeps both layouts); under `transpose` per_use (DeepSeek-V3's framework, dlperf.plan.
    FP8_WEIGHT_TRANSPOSES) the one FP8 copy, its transposes made per GEMM (weight_transpose_kernel)."""
    return (1 if transpose == "per_use" else 2) * OPERAND_BYTES[dtype]


def fp8_layers(root: Any) -> frozenset[Layer]:
    """The layers an FP8 recipe runs in FP8: those inside the model's blocks (the transformer layers), less those a
    `{block: ..., precision: bf16}` call keeps in 16 bits (Megatron-Bridge's keep_mtp_spec_in_bf16: the MTP layers
    built outside the FP8 context). The top-level embedding, final norm and output head stay bf16, as Megatron-LM
    keeps its output layer outside Transformer Engine and torchtitan's float8 conversion skips the `output`
    projection."""
    from dlperf.spec.model import Seq, walk

    return frozenset(layer for item in root.items if isinstance(item, Seq) for layer, _ in walk(item, 1)
                     if not layer.precision)


def storage_dtype(dtype: str) -> str:
    """The dtype tensors are stored and communicated in under `dtype`'s training recipe."""
    return STORAGE.get(dtype, dtype)


def kernel_dtype(kernel: Kernel, dtype: str) -> str:
    """The dtype whose peak times this kernel: its own when it pins one (a MoE router in fp32), FP8 GEMMs at the
    recipe's peak (fp8, mxfp8 or nvfp4), every other kernel in storage dtype."""
    if kernel.dtype:
        return kernel.dtype
    if kernel.cls == FP8_GEMM:
        return dtype if is_recipe(dtype) else "fp8"  # fp8, mxfp8 or nvfp4
    return storage_dtype(dtype)


def fp8_kernels(kernels: list[Kernel], e: int, recipe: str = "fp8", scaling: str = "delayed",
                swizzle: str = "quantize", sp_dim: str | None = None, transpose: str = "cached") -> list[Kernel]:
    """Each weight GEMM becomes its operand casts and an FP8 GEMM (MXFP8: and its scale swizzles; under
    `transpose` per_use, dlperf.plan.FP8_WEIGHT_TRANSPOSES, and its weight's transpose); other kernels
    are unchanged, and so is a GEMM whose precision the layer pins (a MoE router: Megatron-Core computes it with
    torch's linear outside Transformer Engine's fp8_autocast, router.py TopKRouter.gating @92c8482e). `scaling` is
    the `fp8` recipe's (dlperf.plan.FP8_SCALINGS), `swizzle` the `mxfp8` recipe's (dlperf.plan.MX_SWIZZLES);
    `sp_dim` is the layer's tensor-parallel dimension when sequence parallelism gathers its operands (None: it
    does not)."""
    out: list[Kernel] = []
    b, reads, rht = OPERAND_BYTES[recipe], READS[recipe], RHT_FLOPS if recipe == "nvfp4" else 0
    for kernel in kernels:
        if kernel.weight_gemm is None or kernel.dtype is not None:
            out.append(kernel)
            continue
        m, k, n = kernel.weight_gemm
        launches = quantize_launches(recipe, scaling, kernel.weight_groups)
        cast = _cast_kernel(f"{kernel.name}_fp8_cast", m * k, m * n, e, b, reads, rht, launches)
        host = per_expert_quantize_host(recipe, scaling, kernel.weight_groups)
        out += [replace(cast, library_host=(host, host)), _fp8_gemm(kernel, m, k, n, e, b)]
        if transpose == "per_use":
            out.append(weight_transpose_kernel(kernel, b))
        if recipe == "mxfp8":
            gathered = (kernel.tp_dim or sp_dim) if sp_dim and kernel.split and not kernel.expert else None
            out.append(mx_swizzle_kernel(kernel, swizzle, gathered))
    return out


def weight_transpose_kernel(kernel: Kernel, b: float = FP8) -> Kernel:
    """The transpose of a weight GEMM's one cached FP8 weight copy (plan fp8_weight_transpose per_use): reads and
    writes `b` bytes per element of the [k, n] weights it reads (`weight_groups` of them), in one launch per
    micro-batch, issued inside the GEMM's own call (no framework operator of its own). DeepSeek-V3's framework
    transposes the routed experts' weights before their forward GEMMs and every other FP8 weight before its
    data-gradient GEMM (deepseek-ai/profile-data @4496024 train.json, module docstring): `expert` GEMMs pay it
    forward, the others backward. The weight's size does not follow the routed tokens, so the kernel is not
    marked `expert` (no load-imbalance scaling)."""
    _, k, n = kernel.weight_gemm
    nbytes = 2 * b * kernel.weight_groups * k * n
    forward = bool(kernel.expert)
    return Kernel(f"{kernel.name}_fp8_weight_transpose", "memory",
                  Cost(fwd_bytes=nbytes if forward else 0, bwd_bytes=0 if forward else nbytes, depth=1, bwd_depth=1),
                  launches=1 if forward else 0, bwd_launches=0 if forward else 1, framework_ops=0,
                  bwd_framework_ops=0)


def swizzled_operands(swizzle: str, gathered: str | None = None) -> dict[str, tuple[str, ...]]:
    """The MXFP8 operands (X, W, dY) whose scales a linear layer's three GEMMs swizzle in kernels of their own,
    each with the passes that do (one entry per GEMM): _SWIZZLED under `swizzle`, plus under "quantize" the
    operand that sequence parallelism gathers (`gathered`: the layer's tensor-parallel dimension, n or k)."""
    operands = dict(_SWIZZLED[swizzle])
    if swizzle == "quantize" and gathered in _GATHERED:
        operands.update(_GATHERED[gathered])
    return operands


def mx_swizzle_kernel(kernel: Kernel, swizzle: str, gathered: str | None = None) -> Kernel:
    """The scale swizzles before an MXFP8 weight GEMM's forward and backward GEMMs (swizzled_operands): each reads
    an operand's scales and writes the swizzled copy, 2 bytes per MX_BLOCK elements of the operand, in one launch
    (a grouped GEMM's operand list too: nvte_multi_tensor_swizzle_scaling_factors). Issued from C++ inside the
    GEMM's own call, so no framework operator of its own."""
    m, k, n = kernel.weight_gemm
    size = {"X": m * k, "W": kernel.weight_groups * k * n, "dY": m * n}
    nbytes = {"fwd": 0, "bwd": 0}
    launches = {"fwd": 0, "bwd": 0}
    for operand, passes in swizzled_operands(swizzle, gathered).items():
        for phase in passes:
            nbytes[phase] = nbytes[phase] + 2 * size[operand] / MX_BLOCK
            launches[phase] += 1
    return Kernel(f"{kernel.name}_mx_swizzle", "memory",
                  Cost(fwd_bytes=nbytes["fwd"], bwd_bytes=nbytes["bwd"], depth=1, bwd_depth=1),
                  launches=launches["fwd"], bwd_launches=launches["bwd"], framework_ops=0, bwd_framework_ops=0)


def quantize_launches(recipe: str, scaling: str, groups: Any = 1) -> Any:
    """Kernels one quantization of a GEMM operand launches (forward: the input; backward: the output gradient),
    over `groups` experts' row blocks when the GEMM is grouped.

    A tensor: READS (the cast; NVFP4's amax pass and cast), or under current scaling QUANTIZE_LAUNCHES. A grouped
    GEMM (Transformer Engine's GroupedLinear, Megatron-Core's TEGroupedMLP) quantizes its input forward and its
    output gradient backward with tex.split_quantize, one call over the experts' row blocks (m_splits), which runs
    one fused kernel for all of them only for delayed scaling (nvte_multi_cast_transpose, "Currently only have
    fused kernel for FP8 delayed scaling") and otherwise quantizes each block on its own, a whole quantization per
    expert: multi_tensor_quantize_impl in transformer_engine/pytorch/csrc/extensions/cast.cpp, called from
    _GroupedLinear.forward and .backward in pytorch/module/grouped_linear.py (NVIDIA/TransformerEngine v2.9
    @70f53666, the TE Megatron-Bridge 25.11 pins, unchanged through v2.13)."""
    per_tensor = QUANTIZE_LAUNCHES[scaling] if recipe == "fp8" else READS[recipe]
    if (recipe == "fp8" and scaling == "delayed") or not isinstance(groups, int) or groups <= 1:
        return per_tensor
    return per_tensor * groups


def per_expert_quantize_host(recipe: str, scaling: str, groups: Any = 1) -> Any:
    """Reference-host seconds one grouped quantization (tex.split_quantize, one framework operator) spends
    launching its per-expert kernels beyond one tensor's (quantize_launches): multi_tensor_quantize_impl
    (pytorch/csrc/extensions/cast.cpp line 119 on, TE v2.9 @70f53666) quantizes each expert's rows with a call of
    its own, each launch a driver launch call (LAUNCH_CALL). Left out, with no published cost found: the
    per-expert output tensors and their Python wrappers it builds."""
    return (quantize_launches(recipe, scaling, groups) - quantize_launches(recipe, scaling)) * LAUNCH_CALL


def _fp8_gemm(kernel: Kernel, m: Any, k: Any, n: Any, e: int, b: float = FP8) -> Kernel:
    """Same FLOPs; FP8 operands (`b` bytes each, scales included) and 16-bit outputs: forward reads X and W,
    writes Y; backward reads dY twice with W and X, writes dX and dW. A grouped expert GEMM reads and writes every
    resident expert's [k, n] (`weight_groups`), as its 16-bit form does (dlperf.ops.moe.grouped_gemm)."""
    weights = kernel.weight_groups * k * n
    cost = replace(kernel.cost, fwd_bytes=b * (m * k + weights) + e * m * n,
                   bwd_bytes=b * 2 * (m * n) + b * (weights + m * k) + e * (m * k + weights))
    return replace(kernel, cls=FP8_GEMM, cost=cost)


def _cast_kernel(name: str, activation: Any, gradient: Any, e: int, b: float, reads: int, rht: int,
                 launches: Any) -> Kernel:
    """cast_transpose of the activation (forward) and of the output gradient (backward), with their amax: reads
    the 16-bit tensor `reads` times (NVFP4: the amax pass, then the cast), writes two copies of `b` bytes per
    element; `rht` FLOPs per element for NVFP4's Hadamard transform of the column-wise copy. `launches` per pass
    (quantize_launches) come from one framework call each way (tex.quantize; under NVFP4 NVFP4Quantizer::
    quantize_impl runs the amax pass and the cast from C++, quantizer.cpp @71bbefbf): Transformer Engine's C++
    issues the amax, scale and per-expert kernels itself."""
    per_element = reads * e + 2 * b
    flops = CAST_FLOPS + rht
    return Kernel(name, "memory", Cost(
        fwd_flops=flops * activation, bwd_data_flops=flops * gradient,
        fwd_bytes=per_element * activation, bwd_bytes=per_element * gradient, depth=1, bwd_depth=1,
    ), launches=launches, bwd_launches=launches, framework_ops=1, bwd_framework_ops=1)


def saved_bytes(layer: Layer, saved: Any, e: int, recipe: str = "fp8") -> Any:
    """What an FP8 recipe changes in the layer's `saved` bytes: a weight GEMM keeps the FP8 cast of its input
    for the weight-gradient GEMM instead of the 16-bit tensor. Transformer Engine's Linear and LayerNormLinear
    save their quantized input, column-wise usage only (transformer_engine/pytorch/module/linear.py @d0067d0d,
    lines 600-621; layernorm_linear.py lines 477-487 and 526-536), GroupedLinear likewise (grouped_linear.py
    lines 537-548). A linear layer keeps that cast of its input (one sharing its sibling's input,
    `fused_input`, keeps none); attention and MoE layers as below."""
    b = OPERAND_BYTES[recipe]
    if (layer.op == "linear" and not layer["fused_input"]) or layer.op == "attention":
        return saved - (e - b) * numel(layer.in_shape)
    if layer.op == "moe":
        return saved - (e - b) * moe_gemm_inputs(layer) + b * latent_input_copy(layer)
    return saved


# Attention: the QKV projection (TE LayerNormLinear) keeps its input, the norm's output, in FP8. The output
# projection's input O stays 16-bit and is kept once: the fused kernel saves O itself (TE FusedAttnFunc saves q, k,
# v, out and the softmax statistics, attention/dot_product_attention/backends.py @d0067d0d lines 1630-1664), and
# Megatron-Core sets linear_proj to save that original tensor rather than a second, quantized copy for FP8 recipes
# other than delayed scaling (megatron/core/transformer/attention.py @d98e8a64 lines 428-444, TE >= 2.6; the
# Megatron-Bridge recipes run current scaling or MXFP8). Likewise the shared experts' fc1 keeps the router's
# 16-bit input (moe/shared_experts.py lines 150-161), so only the routed GEMM inputs below change.


def moe_gemm_inputs(layer: Layer) -> Any:
    """Elements per sample of the MoE layer's kept GEMM inputs that an FP8 recipe keeps in FP8 where _moe_saved
    counts them 16-bit: each routed copy's permuted token (the experts' fc1 input) and activation output (fc2's
    input), and the shared experts' activation output (their fc2 input). Megatron-Core's experts are TE
    GroupedLinear modules; the SwiGLU input, the router input and the expert outputs stay 16-bit. With `latent`
    the routed copies are latent-wide, and fc2_latent_proj (a TE Linear) keeps its input, the combined latent."""
    tokens, k, w = numel(layer.in_shape[:-1]), layer["top_k"], routed_width(layer)
    inputs = tokens * (k * (w + layer["ffn"]) + layer["shared_experts"] * (layer["shared_ffn"] or layer["ffn"]))
    return inputs + tokens * w if layer["latent"] else inputs


def latent_input_copy(layer: Layer) -> Any:
    """Elements per sample an FP8 recipe keeps on top of _moe_saved's: fc1_latent_proj, a TE Linear, saves the FP8
    cast of its input, the layer's input, which the router keeps in 16 bits as well (0 without `latent`)."""
    return numel(layer.in_shape[:-1]) * layer.in_shape[-1] if layer["latent"] else 0
