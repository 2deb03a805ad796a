"""Fused attention's rate by head dimension, relative to head dim 128, the head dim every fused-attention curve in
hardware/ was measured at.

A fused attention kernel does 4 x head_dim FLOPs per score element (QK^T and AV) against a softmax, a rescale and
a block prologue/epilogue per score element or per tile that do not shrink with the head dim, so a smaller head
dim runs at a lower FLOP rate. The published kernel benchmarks at head dim 64 and 128 show it on every CUDA kernel
(dlperf/data/kernels/flash-causal-speed.csv, fa3paper-h100-bwd-fp16.csv), with a ratio rate(64) / rate(128) that
is nearly flat in the sequence length (512-16k) but differs by kernel: FlashAttention-2 ~0.87-0.89 over a training
pass, cuDNN 0.69 forward and 0.85 backward. A curve therefore carries its kernel's measured ratio per pass
(`head_dim_64` in the hardware file, Efficiency.head_dim_64; the fits are in dlperf/data/kernels/FITTED.md and
tests/test_head_dim.py refits them), and a curve without one has no head-dim term.

Between the measured head dims the ratio is interpolated geometrically in log2(head_dim), so it rises
monotonically from the head-dim-64 ratio to 1 at 128. Outside them it is held: 1 above 128 (head dim 256 is
measured for FlashAttention-2's forward only, flash-causal-speed.csv, not its backward) and the head-dim-64 ratio
below 64 (no smaller head dim is measured; a lower bound on the slowdown there). FlashAttention in Triton
(`triton: true`) takes none: its slowdown against FlashAttention-2 (dlperf.ops.dense.TRITON_SLOWDOWN) was read over
head dims 64 and 128 together, and that kernel runs head dim 64 faster than 128 (the A100 figure's Triton panels).
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx

MEASURED_HEAD_DIM = 128  # the head dim of every fused-attention curve in hardware/
SMALL_HEAD_DIM = 64      # the other head dim the kernel benchmarks time on both passes


def head_dim_octaves(head_dim: Any) -> Any:
    """How far `head_dim` sits below 128 towards 64, in octaves: 0 at 128 and above, 1 at 64 and below; a number,
    array or sympy expression, as `head_dim` is."""
    span = mathx.log2(MEASURED_HEAD_DIM / SMALL_HEAD_DIM)
    return mathx.minimum(mathx.maximum(mathx.log2(MEASURED_HEAD_DIM / head_dim), 0), span) / span


def head_dim_rate(rate_64: tuple[float, float] | None, head_dim: Any) -> tuple[Any, Any]:
    """(forward, backward) rate of a fused attention kernel at `head_dim` over the rate its curve gives at head dim
    128, for a curve whose kernel runs head dim 64 at `rate_64` (forward, backward) of 128's (None: no term, 1).
    Exactly 1 at head dim 128 and above."""
    if rate_64 is None or head_dim is None:
        return 1.0, 1.0
    octaves = head_dim_octaves(head_dim)
    return rate_64[0] ** octaves, rate_64[1] ** octaves
