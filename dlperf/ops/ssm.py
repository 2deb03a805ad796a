"""Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060, Sections 6-7), as Megatron-Core's
MambaMixer trains it (megatron/core/ssm/mamba_mixer.py @d98e8a64, `_ssm_training` :679-731):

  in_proj    one column-parallel GEMM d -> [z, x, B, C, dt] = 2 d_inner + 2 G N + H (:281-294), d_inner = H P;
  conv1d     causal depthwise conv of width K (4) with bias and SiLU over [x, B, C] (:321-340), inside
             mamba_ssm's MambaSplitConv1dScanCombinedFn (state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py
             @e9594ce1 :820-895), which recomputes it in backward (:918-923);
  SSD        _mamba_chunk_scan_combined_fwd (:343-389): five Triton kernels, chunk_cumsum, chunk_state, state_passing,
             bmm_chunk (C B^T per group) and chunk_scan (the masked intra-chunk product, the inter-chunk states read
             out by C, D skip and the z gate); backward (:397-520) reruns the first four and runs eleven more;
  norm       Megatron's grouped RMSNorm over d_inner in groups of d_inner / G (ExtendedRMSNorm, :422-432; Megatron
             passes no rmsnorm_weight to the combined function, so z gates inside the scan and the norm is plain);
  out_proj   one row-parallel GEMM d_inner -> d (:437-450).

Parameters: in_proj and out_proj weights (mamba_proj_bias false), conv weight (d_inner + 2 G N) x K and bias,
dt_bias, A_log and D per head (:378-421, D_has_hdim false), the norm's d_inner weights.

SSD FLOPs per token and head (chunk Q, head dim P, state N; the paper's Section 6 block decomposition; B and C are
shared by the H/G heads of a group): C B^T within the chunk 2 Q N per group; the chunk's states B^T x 2 P N;
state passing between chunks 2 P N / Q; the causal intra-chunk product (CB o L) x (Q + 1) P (the lower triangle
with its diagonal, the blocks the Triton kernel visits); the states read out by C 2 P N.

Tensor parallelism splits heads and groups (:262-271: tp must divide both); context parallelism is not modelled.
"""

from __future__ import annotations

from typing import Any

from dlperf.cost import Cost
from dlperf.errors import ShapeError
from dlperf.ops.base import REQUIRED, Kernel, Layer, OpRule, clog2, need_rank
from dlperf.ops.dense import gemm

# The SSD kernels' rate: Mamba-2 paper Section 9.3, Figure 10 (left), A100: SSD takes as long as FlashAttention-2 at
# 2K tokens (state 64, head dim 64) and grows linearly with the length (dlperf/data/kernels/
# mamba2paper-ssd-crossover.csv). An SSD call over L tokens is priced as the FlashAttention-2 work of L queries
# against SSD_FA2_CROSSOVER keys on the device's `attention` curve; its backward, as FlashAttention-2's, runs 2x
# the forward's GEMM work plus a recomputed QK^T (half the forward's): no published SSD backward timing was found.
SSD_FA2_CROSSOVER = 2048
SSD_FWD_LAUNCHES = 5   # chunk_cumsum, chunk_state, state_passing, bmm_chunk, chunk_scan (ssd_combined.py :374-387)
# backward (:397-520): 4 recomputed, dz, dstates, state_passing_bwd, dx, db, dC, dcb, 2 bmm_bwd, ddAcs, cumsum_bwd
SSD_BWD_LAUNCHES = 15


def dims(layer: Layer) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(seq, heads, head_dim, state, groups, chunk)."""
    return (layer.in_shape[-2], layer["heads"], layer["head_dim"], layer["state"], layer["groups"],
            layer["chunk"])


def proj_width(a: Any) -> Any:
    """in_proj's output width per token: z, x (d_inner each), B, C (G N each), dt (one per head)."""
    return 2 * a["heads"] * a["head_dim"] + 2 * a["groups"] * a["state"] + a["heads"]


def conv_width(a: Any) -> Any:
    """Channels of the causal conv: x, B and C."""
    return a["heads"] * a["head_dim"] + 2 * a["groups"] * a["state"]


def ssd_flops(layer: Layer, batch: Any) -> tuple[Any, Any, Any]:
    """(forward, backward data, backward recompute) FLOPs of the SSD scan (module docstring's counts)."""
    s, h, p, n, g, q = dims(layer)
    t = batch * s
    cb, states, readout = 2 * t * q * g * n, 2 * t * h * p * n, 2 * t * h * p * n
    intra, passing = t * (q + 1) * h * p, 2 * t * h * p * n // q
    forward = cb + states + passing + intra + readout
    # backward: dstates, dx (intra + B dstates), dB, dC (4 state-sized products), dcb and ddAcs (2 more intra),
    # dB and dC from dCB (2 per group)
    backward = 3 * intra + 4 * states + 2 * cb + passing
    return forward, backward, cb + states + passing


def _ssd_kernel(layer: Layer, batch: Any, e: int) -> Kernel:
    s, h, p, n, g, q = dims(layer)
    t = batch * s
    fwd, bwd, recompute = ssd_flops(layer, batch)
    equivalent = 4 * t * h * SSD_FA2_CROSSOVER * p  # FlashAttention-2's forward work, L queries x 2048 keys
    io = e * t * (2 * h * p + 2 * g * n + h)  # x, z, B, C, dt read
    chunk_states = 4 * (t // q) * h * p * n  # fp32 states per chunk, written and read back 4 times
    cost = Cost(fwd_flops=equivalent, bwd_data_flops=2 * equivalent,
                fwd_bytes=io + 2 * e * t * h * p + 4 * chunk_states,
                bwd_bytes=2 * io + 4 * e * t * h * p + 8 * chunk_states,
                depth=clog2(q) + clog2(n) + s // q, bwd_depth=clog2(q) + clog2(n) + s // q)
    return Kernel("ssd", "attention", cost, launches=SSD_FWD_LAUNCHES, bwd_launches=SSD_BWD_LAUNCHES,
                  bwd_recompute_flops=equivalent // 2, model_work_scale=(fwd + bwd) / (3 * equivalent),
                  seq=SSD_FA2_CROSSOVER, head_dim=p)


def _conv_kernel(layer: Layer, batch: Any, e: int) -> Kernel:
    """causal_conv1d forward (K taps, bias, SiLU); backward reruns it, then the data and weight gradients."""
    n, k = batch * layer.in_shape[-2] * conv_width(dict(layer.attrs)), layer["conv"]
    return Kernel("conv1d", "memory", Cost(
        fwd_flops=(2 * k + 5) * n, bwd_data_flops=(2 * k + 5) * n, bwd_weight_flops=2 * k * n,
        fwd_bytes=2 * e * n, bwd_bytes=5 * e * n, depth=clog2(k) + 1, bwd_depth=clog2(k) + 1),
        launches=1, bwd_launches=2)


def _copy(name: str, n: Any, e: int) -> Kernel:
    """A rearrange(...).contiguous() between Megatron's [s, b, d] and the kernels' [b, s, d] (_ssm_training
    :691, :726), a copy each way."""
    return Kernel(name, "memory", Cost(fwd_bytes=2 * e * n, bwd_bytes=2 * e * n, depth=1, bwd_depth=1),
                  launches=1, bwd_launches=1)


def _norm_kernel(n: Any, e: int) -> Kernel:
    return Kernel("gated_rmsnorm", "memory", Cost(
        fwd_flops=5 * n, bwd_data_flops=7 * n, bwd_weight_flops=2 * n, fwd_bytes=2 * e * n, bwd_bytes=4 * e * n,
        depth=2, bwd_depth=2))


def _kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    s, h, p, _, _, _ = dims(layer)
    t, d, a = batch * s, layer.in_shape[-1], dict(layer.attrs)
    return (gemm("in_proj", t, d, proj_width(a), e, tp_dim="n"), _copy("to_bsd", t * proj_width(a), e),
            _conv_kernel(layer, batch, e), _ssd_kernel(layer, batch, e), _copy("to_sbd", t * h * p, e),
            _norm_kernel(t * h * p, e), gemm("out_proj", t, h * p, layer["out"], e, tp_dim="k"))


def _params(shape: tuple, a: dict) -> Any:
    d, din, h = shape[-1], a["heads"] * a["head_dim"], a["heads"]
    convs = conv_width(a) * (a["conv"] + 1)  # depthwise weights and bias
    return d * proj_width(a) + convs + 3 * h + din + din * a["out"]


def _saved(layer: Layer, e: int) -> Any:
    """in_proj's input; the combined function's zxbcdt and out_x (ssd_combined.py :888); the norm's input and
    its fp32 rstd per group; out_proj's input."""
    s, h, p, _, g, _ = dims(layer)
    return e * s * (layer.in_shape[-1] + proj_width(dict(layer.attrs)) + 3 * h * p) + 4 * s * g


def _asymptotic(layer: Layer, batch: Any) -> tuple[Any, Any]:
    s, h, p, n, _, q = dims(layer)
    return batch * s * h * p * (q + n), s // q + clog2(q * n)


def _check(shape: tuple, a: dict) -> None:
    need_rank(shape, 2, "mamba2")
    a["out"] = a["out"] or shape[-1]
    for key in ("heads", "head_dim", "state", "groups", "chunk", "conv"):
        if isinstance(a[key], int) and a[key] < 1:
            raise ShapeError(f"mamba2 {key} must be a positive integer", expected=">= 1", found=a[key])
    if isinstance(a["heads"], int) and isinstance(a["groups"], int) and a["heads"] % a["groups"]:
        raise ShapeError("mamba2 groups must divide heads (nheads % ngroups, mamba_mixer.py :274)",
                         expected=f"a divisor of {a['heads']}", found=a["groups"])
    if isinstance(shape[0], int) and isinstance(a["chunk"], int) and shape[0] % a["chunk"]:
        raise ShapeError("mamba2 sequence must be a multiple of the chunk size", expected=f"multiple of {a['chunk']}",
                         found=shape[0])


MAMBA2 = OpRule(
    attrs={"heads": REQUIRED, "head_dim": REQUIRED, "state": REQUIRED, "groups": 1, "chunk": 128, "conv": 4,
           "out": None},
    shape=lambda s, a: (*s[:-1], a["out"]),
    params=_params,
    kernels=_kernels,
    saved=_saved,
    asymptotic=_asymptotic,
    tp="attention",  # heads split: column-parallel in_proj, row-parallel out_proj, one reduction of the output
    check=_check,
)
