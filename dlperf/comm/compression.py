"""Gradient compression (survey section 7.3): quantization shrinks the bytes per value, top-k sparsification
sends k values plus their indices; both add compute, and sparse allreduce can be slower than dense.

Quantization to b bits replaces gamma with gamma' = b/8 (+ one fp32 scale per block of values) and runs the
same allreduce on m*gamma' bytes (every hop re-quantizes, as 1-bit SGD/1-bit Adam do; error feedback keeps
the residual locally, at no communication cost). Top-k with k = density*m sends n_i = k*(gamma + gamma_idx):
- allgather of every rank's sparse vector: T = AG(P*k*(gamma+gamma_idx)) = L log2 P + (P-1) k (gamma+gamma_idx) G
  on one level; cheaper than dense only while P*k*(gamma+gamma_idx) < 2*m*gamma (survey);
- recursive doubling with fill-in: round j exchanges the sum of 2^j sparse vectors, min(m*gamma,
  2^j*k*(gamma+gamma_idx)) bytes (density min(1, 2^j k/m), SparCML, Renggli et al. 2019);
- reduce-scatter + allgather with fill-in (P a power of two): halving round at distance d sends
  min(m*gamma/(2d), k/2*(gamma+gamma_idx)); the allgather moves P/(2d) regions of min(m*gamma/P, k*(gamma+gamma_idx)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlperf import mathx
from dlperf.comm import nccl as N
from dlperf.comm.collectives import CommError, is_pow2
from dlperf.comm.engine import AUTO, collective_time
from dlperf.comm.hierarchical import butterfly_rounds
from dlperf.comm.topology import RAILS, Group, Placed, place_group
from dlperf.spec.hardware import Hardware

SCALE_BYTES = 4  # one fp32 scale (or norm) per block of quantized values
INDEX_BYTES = 4  # int32 indices for top-k (Aji & Heafield 2017 send 32-bit index/value pairs)
# QSGD normalises per bucket of d values; d = 512 is the bucket size of QSGD's experiments (Alistarh et al.
# 2017, section 5) as recalled, not checked against the text.
QSGD_BUCKET = 512

SCHEMES = ("none", "fp16", "bf16", "int8", "1bit", "terngrad", "qsgd", "topk")


@dataclass(frozen=True)
class Compression:
    """A compression scheme: `bits` per sent value (quantizers) or `density` = k/m (top-k)."""

    name: str = "none"
    bits: float | None = None
    density: float | None = None
    levels: int | None = None  # QSGD's s
    block: int | None = None  # values per fp32 scale; None = one scale per tensor (negligible)
    error_feedback: bool = False

    @property
    def sparse(self) -> bool:
        return self.density is not None

    def value_bytes(self, bytes_per_element: float) -> float:
        """gamma' = b/8 for quantizers (never more than gamma), gamma otherwise."""
        if self.bits is None:
            return bytes_per_element
        return min(self.bits / 8, bytes_per_element)

    def wire_bytes_per_element(self, bytes_per_element: float) -> float:
        """Bytes on the wire per dense element for quantizers: gamma' + scale bytes / block."""
        scale = SCALE_BYTES / self.block if self.block else 0.0
        return self.value_bytes(bytes_per_element) + scale

    def __str__(self) -> str:
        if self.name == "qsgd":
            return f"qsgd:{self.levels}"
        if self.name == "topk":
            return f"topk:{self.density:g}"
        return self.name


def _positive_int(text: str, what: str, spec: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise CommError(f"bad {what} in compression {spec!r}", expected="a positive integer", found=text)
    return int(text)


def parse_compression(spec: str | Compression | None) -> Compression:
    """'none', 'fp16', 'bf16', 'int8', '1bit', 'terngrad', 'qsgd:S', 'topk:DENSITY', with an optional
    ':BLOCK' (values per fp32 scale) after a quantizer: 'int8:256', 'qsgd:16:512'."""
    if isinstance(spec, Compression):
        return spec
    text = "none" if spec is None else str(spec).strip().lower()
    name, *params = text.split(":")
    expected = "one of none, fp16, bf16, int8, 1bit, terngrad, qsgd:S, topk:DENSITY"
    if name not in SCHEMES:
        from dlperf.spec.yamlio import closest

        hint = closest(name, SCHEMES)
        raise CommError(f"unknown compression {spec!r}" + (f" (did you mean {hint!r}?)" if hint else ""),
                        expected=expected)
    if name == "topk":
        return _topk(params, text)
    if name == "qsgd":
        if not params:
            raise CommError(f"compression {spec!r} needs its level count", expected="qsgd:S, e.g. qsgd:16")
        levels = _positive_int(params[0], "level count", text)
        block = _positive_int(params[1], "block", text) if len(params) > 1 else QSGD_BUCKET
        # sign + level in {0..s}: 1 + ceil(log2(s+1)) bits fixed-length (survey: about (1 + log2 s)/8 bytes)
        return Compression("qsgd", bits=1 + math.ceil(math.log2(levels + 1)), levels=levels, block=block)
    if len(params) > 1 or (name == "none" and params):
        raise CommError(f"too many parameters in compression {spec!r}", expected=expected)
    block = _positive_int(params[0], "block", text) if params else None
    bits = {"none": None, "fp16": 16, "bf16": 16, "int8": 8, "1bit": 1, "terngrad": 2}[name]
    # 1-bit SGD needs error feedback to converge (Seide et al. 2014); TernGrad and QSGD are unbiased.
    return Compression(name, bits=bits, block=block, error_feedback=name == "1bit")


def _topk(params: list[str], text: str) -> Compression:
    try:
        density = float(params[0]) if len(params) == 1 else math.nan
    except ValueError:
        density = math.nan
    if not 0 < density <= 1:
        raise CommError(f"bad compression {text!r}", expected="topk:DENSITY with 0 < DENSITY <= 1, e.g. topk:0.01")
    # residuals of unsent values are accumulated locally (Aji & Heafield 2017; Lin et al. 2018, DGC)
    return Compression("topk", density=density, error_feedback=True)


@dataclass(frozen=True)
class CompressionDetail:
    """Breakdown of a compressed allreduce (values are the same kind as n_elements)."""

    scheme: str
    algorithm: str
    wire_bytes: Any  # bytes each rank contributes: m*gamma' for quantizers, k*(gamma+gamma_idx) for top-k
    comm_time: Any
    compute_time: Any
    dense_time: Any  # uncompressed allreduce of m*gamma bytes
    slower_than_dense: Any  # bool (or bool array / sympy relation): compression does not pay


def compute_time(m: Any, gamma: float, scheme: Compression, hw: Hardware, P: int) -> Any:
    """Encode/decode cost as memory-bound passes (survey: compression compute is O(m)).

    Quantizer: encode reads m*gamma and writes m*gamma', decode the reverse: 2m(gamma + gamma').
    Top-k: threshold by sampling then one compacting pass (DGC, Lin et al. 2018) read 2m*gamma and write
    k(gamma+gamma_idx); decode zeroes m*gamma and scatter-adds P*k*(gamma+gamma_idx).
    Error feedback reads and writes the residual: +2m*gamma.
    """
    if scheme.name == "none":
        return m * 0
    if scheme.sparse:
        k_bytes = scheme.density * m * (gamma + INDEX_BYTES)
        moved = 2 * m * gamma + k_bytes + m * gamma + P * k_bytes
    else:
        moved = 2 * m * (gamma + scheme.wire_bytes_per_element(gamma))
    if scheme.error_feedback:
        moved = moved + 2 * m * gamma
    return moved / hw.device.achieved_memory_bandwidth()


def _round_link(placed: Placed, distance: int) -> tuple[float, float]:
    link = placed.link(placed.placement.level_of_round(distance, True), RAILS)
    return link.alpha, link.beta


def sparse_recursive_doubling(m: Any, gamma: float, k: Any, placed: Placed) -> Any:
    """Butterfly on sparse vectors with fill-in: the message of a round holds the sum of c vectors,
    min(m*gamma, c*k*(gamma+gamma_idx)) bytes; c = 2^j, doubled after a fold for P not a power of two."""
    P, entry = placed.size, gamma + INDEX_BYTES
    folded = 1 if is_pow2(P) else 2
    total, rounds = m * 0, butterfly_rounds(P)
    for i, (distance, _, _) in enumerate(rounds):
        if folded == 2 and i == len(rounds) - 2:
            count = 1  # fold: the extra ranks hand over their own vector
        elif folded == 2 and i == len(rounds) - 1:
            count = P  # unfold: they receive the full result
        else:
            count = folded << i
        alpha, beta = _round_link(placed, distance)
        total = total + alpha + mathx.minimum(m * gamma, count * k * entry) * beta
    return total


def sparse_rs_ag(m: Any, gamma: float, k: Any, placed: Placed) -> Any:
    """Recursive-halving reduce-scatter then recursive-doubling allgather on sparse vectors (P a power of
    two). Halving at distance d: min(m*gamma/(2d), k/2*(gamma+gamma_idx)); allgather at distance d moves
    P/(2d) regions of min(m*gamma/P, k*(gamma+gamma_idx))."""
    P, entry = placed.size, gamma + INDEX_BYTES
    total = m * 0
    region = mathx.minimum(m * gamma / P, k * entry)
    for i in range(P.bit_length() - 1):
        d = 1 << i
        alpha, beta = _round_link(placed, d)
        total = total + 2 * alpha + (mathx.minimum(m * gamma / (2 * d), k / 2 * entry) + P // (2 * d) * region) * beta
    return total


def sparse_allreduce_times(m: Any, gamma: float, density: float, group: Group, hw: Hardware) -> dict[str, Any]:
    """Communication time of each sparse allreduce algorithm (rs_ag only for P a power of two)."""
    placed = place_group(group, hw)
    P, k = placed.size, density * m
    if P == 1:
        return {"allgather": m * 0}
    # the hand-built algorithms pay the per-call start-up NCCL's collectives do
    call = N.CALL_OVERHEAD
    times = {
        "allgather": collective_time("allgather", P * k * (gamma + INDEX_BYTES), group, hw),
        "recursive_doubling": sparse_recursive_doubling(m, gamma, k, placed) + call,
    }
    if is_pow2(P):
        times["rs_ag"] = sparse_rs_ag(m, gamma, k, placed) + call
    return times


def sparse_allgather_pays(P: int, density: float, gamma: float) -> bool:
    """Survey's rule for allgather-based sparse allreduce: P*k*(gamma+gamma_idx) < 2*m*gamma."""
    return P * density * (gamma + INDEX_BYTES) < 2 * gamma


def compressed_allreduce_time(n_elements: Any, bytes_per_element: float, scheme: Compression | str,
                              group: Group, hw: Hardware, algorithm: str = AUTO) -> tuple[Any, CompressionDetail]:
    """Allreduce of m = n_elements gradients of gamma = bytes_per_element bytes under `scheme`:
    (communication + compression compute time, detail). `algorithm` names the dense collective for
    quantizers (and the dense baseline: `auto` is NCCL's choice, `auto:textbook` the textbook minimum), or one of
    allgather / recursive_doubling / rs_ag for top-k (auto = the fastest; the dense baseline is then NCCL's)."""
    scheme = parse_compression(scheme)
    m, gamma = n_elements, float(bytes_per_element)
    dense = collective_time("allreduce", m * gamma, group, hw, AUTO if scheme.sparse else algorithm)
    if scheme.sparse:
        times = sparse_allreduce_times(m, gamma, scheme.density, group, hw)
        comm, chosen = _pick(times, algorithm)
        wire = scheme.density * m * (gamma + INDEX_BYTES)
    else:
        wire = m * scheme.wire_bytes_per_element(gamma)
        comm = collective_time("allreduce", wire, group, hw, algorithm) if scheme.name != "none" else dense
        chosen = algorithm
    work = compute_time(m, gamma, scheme, hw, group.size)
    total = comm + work
    detail = CompressionDetail(str(scheme), chosen, wire, comm, work, dense, total > dense)
    return total, detail


def _pick(times: dict[str, Any], algorithm: str) -> tuple[Any, str]:
    if str(algorithm).lower().split(":")[0] == AUTO:
        values = list(times.values())
        if all(isinstance(v, (int, float)) for v in values):
            name = min(times, key=times.__getitem__)
            return times[name], name
        return mathx.minimum(*values), AUTO
    if algorithm not in times:
        raise CommError(f"unknown sparse allreduce algorithm {algorithm!r}",
                        expected="one of auto, " + ", ".join(times))
    return times[algorithm], algorithm
