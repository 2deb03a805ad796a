"""Tensor-parallel communication overlapped with the GEMMs that produce or consume it (`--tp-overlap`).

Megatron-Core's `--tp-comm-overlap` runs Transformer Engine's userbuffers overlap: with sequence parallelism, the
all-gather before a column-parallel GEMM and the reduce-scatter after a row-parallel GEMM are split into chunks
and pipelined with the GEMM's own chunks (Wang et al. 2022, "Overlap Communication with Dependent Computation via
Decomposition in Large Deep Learning Models", ASPLOS'23, section 3; NVIDIA Transformer Engine,
`transformer_engine/pytorch/module/base.py` `initialize_ub`). Per layer and pass:

    exposed = max(comm - hideable GEMM time, comm / splits)

The first all-gather chunk (or the last reduce-scatter chunk) has nothing to hide behind, so at least one
chunk's share stays exposed. The overlap is never free: TE's default configuration runs all-gathers as a
peer-to-peer ring exchange on the copy engines with 1 SM and no SM margin, but reduce-scatters as a `pipeline`
(forward) or `bulk` (backward) overlap on 16 SMs, with `set_sm_margin`, i.e. the overlapped GEMM is launched on
the remaining SMs for its whole duration. Backward, a column-parallel layer's data-gradient reduce-scatter can
only hide behind its weight-gradient GEMM (TE's `bulk` method), half of that layer's backward GEMM work.
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx

# TE initialize_ub default_cfg: "num_sm": 1 if method == "ring_exchange" else 16; "num_splits": tp_size for
# ring_exchange, 4 for pipeline. These 16 SMs are Transformer Engine's userbuffers, a mechanism of their own;
# NCCL collectives overlapped with compute take their `channels` instead (engine/step.py _overlap_contention).
# A device without an SM count in its hardware file gets no contention, as there.
RS_SMS = 16
PIPELINE_SPLITS = 4


def hidden_transfer(t: Any, window: Any, stolen: float) -> Any:
    """Exposed time of a transfer of `t` seconds run beside `window` seconds of compute: what outlasts the
    window, plus the compute's slowdown from the share of the SMs (`stolen`) the transfer's NCCL kernel holds
    over the part they overlap. Shared by the pipeline's overlapped sends (dlperf.engine.pipeline.overlapped_p2p)
    and ZeRO-3's per-unit gathers (dlperf.engine.step._pipelined)."""
    return mathx.maximum(t - window, 0.0) + stolen * mathx.minimum(t, window)


def rs_slowdown(sms: int | None) -> float:
    """Extra GEMM time while a reduce-scatter holds 16 SMs: 16 / (132 - 16) = 13.8% on an H100 (0 when the
    hardware file gives no SM count)."""
    if sms is None:
        return 0.0
    return RS_SMS / (sms - RS_SMS) if sms > RS_SMS else 1.0


def exposed(parts: list[tuple[str, Any]], gemm_time: Any, phase: str, tp: int,
            sms: int | None = None) -> tuple[Any, Any]:
    """(exposed communication, extra GEMM time from the SMs the communication takes) for one layer's
    collectives `parts` [(op, seconds)] in one pass, overlapped with that layer's GEMM time in that pass."""
    comm = sum(t for _, t in parts)
    reduce_scatter = any(op == "reduce_scatter" for op, _ in parts)
    window = gemm_time / 2 if phase == "bwd" and reduce_scatter else gemm_time
    floor = sum(t / (PIPELINE_SPLITS if op == "reduce_scatter" else tp) for op, t in parts)
    slowdown = window * rs_slowdown(sms) if reduce_scatter else 0.0
    return mathx.maximum(comm - window, floor), slowdown
