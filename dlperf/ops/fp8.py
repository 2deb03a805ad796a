"""What an FP8 training recipe does to a layer's kernels (`--dtype fp8`).

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
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dlperf.cost import Cost
from dlperf.ops.base import BYTES_PER_ELEMENT, Kernel, Layer, numel

FP8_GEMM = "matmul_fp8"      # kernel class: an FP8 GEMM, timed on the device's FP8 peak and FP8 GEMM curve
STORAGE = {"fp8": "bf16"}    # FP8 recipes store activations, gradients and messages in bf16
FP8 = BYTES_PER_ELEMENT["fp8"]
CAST_FLOPS = 2               # per element: |x| into the amax reduction, and the multiply by the scale
# Per parameter, per step: read the bf16 weight, write its FP8 copy and FP8 transpose.
WEIGHT_CAST_BYTES = 2 + 2 * FP8
# Per parameter, resident: TE's cached FP8 weight and its FP8 transpose (Hopper's TN-only FP8 GEMMs).
WEIGHT_COPY_BYTES = 2 * FP8


def fp8_layers(root: Any) -> frozenset[Layer]:
    """The layers an FP8 recipe runs in FP8: those inside the model's blocks (the transformer layers). The
    top-level embedding, final norm and output head stay bf16, as Megatron-LM keeps its output layer outside
    Transformer Engine and torchtitan's float8 conversion skips the `output` projection."""
    from dlperf.spec.model import Seq, walk

    return frozenset(layer for item in root.items if isinstance(item, Seq) for layer, _ in walk(item, 1))


def storage_dtype(dtype: str) -> str:
    """The dtype tensors are stored and communicated in under `dtype`'s training recipe."""
    return STORAGE.get(dtype, dtype)


def kernel_dtype(kernel: Kernel, dtype: str) -> str:
    """The dtype whose peak times this kernel: its own when it pins one (a MoE router in fp32), FP8 GEMMs at the
    FP8 peak, every other kernel in storage dtype."""
    if kernel.dtype:
        return kernel.dtype
    return "fp8" if kernel.cls == FP8_GEMM else storage_dtype(dtype)


def fp8_kernels(kernels: list[Kernel], e: int) -> list[Kernel]:
    """Each weight GEMM becomes its operand casts and an FP8 GEMM; other kernels are unchanged, and so is a GEMM
    whose precision the layer pins (a MoE router: Megatron-Core computes it with torch's linear outside Transformer
    Engine's fp8_autocast, router.py TopKRouter.gating @92c8482e)."""
    out: list[Kernel] = []
    for kernel in kernels:
        if kernel.weight_gemm is None or kernel.dtype is not None:
            out.append(kernel)
            continue
        m, k, n = kernel.weight_gemm
        out += [_cast_kernel(f"{kernel.name}_fp8_cast", m * k, m * n, e), _fp8_gemm(kernel, m, k, n, e)]
    return out


def _fp8_gemm(kernel: Kernel, m: Any, k: Any, n: Any, e: int) -> Kernel:
    """Same FLOPs; FP8 operands (1 byte) and 16-bit outputs: forward reads X and W, writes Y; backward reads
    dY twice with W and X, writes dX and dW. A grouped expert GEMM reads and writes every resident expert's
    [k, n] (`weight_groups`), as its 16-bit form does (dlperf.ops.moe.grouped_gemm)."""
    weights = kernel.weight_groups * k * n
    cost = replace(kernel.cost, fwd_bytes=FP8 * (m * k + weights) + e * m * n,
                   bwd_bytes=FP8 * 2 * (m * n) + FP8 * (weights + m * k) + e * (m * k + weights))
    return replace(kernel, cls=FP8_GEMM, cost=cost)


def _cast_kernel(name: str, activation: Any, gradient: Any, e: int) -> Kernel:
    """cast_transpose of the activation (forward) and of the output gradient (backward), with their amax."""
    per_element = e + 2 * FP8
    return Kernel(name, "memory", Cost(
        fwd_flops=CAST_FLOPS * activation, bwd_data_flops=CAST_FLOPS * gradient,
        fwd_bytes=per_element * activation, bwd_bytes=per_element * gradient, depth=1, bwd_depth=1,
    ), launches=1, bwd_launches=1)


def saved_bytes(layer: Layer, saved: Any, e: int) -> Any:
    """A linear layer keeps the FP8 cast of its input for the weight-gradient GEMM instead of the bf16 input."""
    if layer.op != "linear":
        return saved
    return saved - (e - FP8) * numel(layer.in_shape)
