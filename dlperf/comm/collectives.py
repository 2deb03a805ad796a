"""Collective algorithms in the alpha-beta model: one small pure function per algorithm.

Every function takes the message size `n` in bytes (a float, a numpy array or a sympy expression), the
group size `P` (a plain int >= 1), the per-message latency `alpha` (s) and the time per byte `beta` (s/B),
and returns the time in seconds as the same kind of value as `n`. In the survey's notation (Ben-Nun &
Hoefler 2019, section 2.5) alpha = L, beta = G and n = gamma * m. Reduction arithmetic is not charged.

Conventions for `n`, as nccl-tests reports sizes: allreduce/broadcast/reduce/p2p `n` is the buffer each
rank holds; reduce-scatter, allgather, gather and scatter `n` is the whole (concatenated) buffer, of
which each rank owns n/P; all-to-all `n` is what one rank sends in total (n/P to each peer).

Non-powers of two: log-round algorithms use ceil(log2 P) rounds where the textbook algorithm works for
any P (binomial trees, Bruck); recursive doubling folds the P - 2^floor(log2 P) extra ranks into
partners first and unfolds them last (Thakur, Rabenseifner & Gropp 2005, section 4), two extra rounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dlperf import mathx
from dlperf.errors import DlperfError


class CommError(DlperfError):
    """A communication query cannot be answered: unknown collective or algorithm, or a bad group."""


def log_rounds(P: int) -> int:
    """ceil(log2 P) for an int P >= 1: rounds of a binomial tree or of Bruck's algorithm."""
    return (P - 1).bit_length()


def is_pow2(P: int) -> bool:
    return P & (P - 1) == 0


def pow2_floor(P: int) -> int:
    """The largest power of two <= P."""
    return 1 << (P.bit_length() - 1)


def _zero(n: Any) -> Any:
    """0 of the same kind as n (0.0, an array of zeros, sympy 0)."""
    return n * 0


def _sqrt(x: Any) -> Any:
    if hasattr(x, "free_symbols"):
        import sympy

        return sympy.sqrt(x)
    return x**0.5


# ---------------------------------------------------------------- allreduce (survey section 3 table)


def allreduce_ring(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Ring (reduce-scatter then allgather around a ring): T = 2(P-1)*alpha + 2*(P-1)/P * n*beta.

    Survey T_ring; Patarasuk & Yuan 2009 (bandwidth-optimal allreduce).
    """
    if P == 1:
        return _zero(n)
    return 2 * (P - 1) * alpha + 2 * (P - 1) / P * n * beta


def allreduce_tree(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Binomial-tree reduce then binomial-tree broadcast: T = 2*ceil(log2 P)*(alpha + n*beta).

    Survey T_tree = 2 log2(P) (L + gamma m G).
    """
    return 2 * log_rounds(P) * (alpha + n * beta)


def allreduce_double_tree(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Pipelined double binary tree: T = 2*ceil(log2 P)*alpha + 2*n*beta.

    Two complementary trees each carry n/2; every rank is an inner node of at most one, so each rank sends
    and receives n per phase (reduce, then broadcast) and the depth is log2 P (Sanders, Speck & Traeff 2009,
    "Two-tree algorithms for full bandwidth broadcast, reduction and scan"; NCCL 2.4's tree algorithm).
    Segment pipelining costs are folded into the depth term.
    """
    if P == 1:
        return _zero(n)
    return 2 * log_rounds(P) * alpha + 2 * n * beta


def allreduce_recursive_doubling(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Butterfly / recursive doubling: T = log2(P)*(alpha + n*beta), P a power of two.

    Survey T_bfly. Otherwise floor(log2 P) + 2 rounds: the extra ranks fold into partners and unfold at the
    end (Thakur, Rabenseifner & Gropp 2005).
    """
    rounds = P.bit_length() - 1 + (0 if is_pow2(P) else 2)
    return rounds * (alpha + n * beta)


def allreduce_rabenseifner(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Reduce-scatter (recursive halving) then allgather (recursive doubling):
    T = 2*ceil(log2 P)*alpha + 2*(P-1)/P * n*beta.

    Survey T_rab; Rabenseifner 2004. For P not a power of two the Bruck-style dual (Bruck et al. 1997)
    keeps ceil(log2 P) rounds per phase.
    """
    return reduce_scatter_halving(n, P, alpha, beta) + allgather_doubling(n, P, alpha, beta)


def allreduce_lower_bound(n: Any, P: int, alpha: Any, beta: Any, redundant: bool = False) -> Any:
    """Lower bound on allreduce: T >= log2(P)*alpha + 2*(P-1)/P * n*beta.

    Survey section 3, "v1 talk" form. With redundant computation allowed (`redundant=True`) the bandwidth
    factor halves: T >= log2(P)*alpha + (P-1)/P * n*beta (the survey's v2 notes).
    """
    if P == 1:
        return _zero(n)
    factor = 1 if redundant else 2
    return math.log2(P) * alpha + factor * (P - 1) / P * n * beta


def parameter_server(n: Any, P: int, alpha: Any, beta: Any, servers: int = 1) -> Any:
    """Parameter server with s shards: T_PS = 2L + 2*P*gamma*m*G / s (survey section 7.2).

    P agents each push n bytes of gradients and pull n bytes of parameters; the server side's s links
    carry the 2Pn bytes. servers=1 is the central server.
    """
    if P == 1:
        return _zero(n)
    return 2 * alpha + 2 * P * n * beta / servers


# ------------------------------------------------------------ reduce-scatter and allgather (n = total)


def reduce_scatter_ring(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Ring reduce-scatter: T = (P-1)*alpha + (P-1)/P * n*beta (Thakur et al. 2005; survey section 3)."""
    if P == 1:
        return _zero(n)
    return (P - 1) * alpha + (P - 1) / P * n * beta


def reduce_scatter_halving(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Recursive halving: T = ceil(log2 P)*alpha + (P-1)/P * n*beta.

    Thakur et al. 2005 for powers of two; any P via the dual of Bruck's allgather (commutative reduction).
    """
    if P == 1:
        return _zero(n)
    return log_rounds(P) * alpha + (P - 1) / P * n * beta


def allgather_ring(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Ring allgather: T = (P-1)*alpha + (P-1)/P * n*beta."""
    return reduce_scatter_ring(n, P, alpha, beta)


def allgather_doubling(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Recursive doubling (Bruck et al. 1997 for any P): T = ceil(log2 P)*alpha + (P-1)/P * n*beta."""
    return reduce_scatter_halving(n, P, alpha, beta)


# ----------------------------------------------------------------------------- broadcast and reduce


def broadcast_binomial(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Binomial tree: T = ceil(log2 P)*(alpha + n*beta) (survey section 3, derived table)."""
    return log_rounds(P) * (alpha + n * beta)


def broadcast_scatter_allgather(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Binomial scatter then ring allgather (van de Geijn):
    T = (ceil(log2 P) + P - 1)*alpha + 2*(P-1)/P * n*beta.
    """
    return gather_binomial(n, P, alpha, beta) + allgather_ring(n, P, alpha, beta)


def pipeline_chain(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Pipelined chain (broadcast or reduce along a ring, as NCCL does), with the best segment count S.

    With S segments: T(S) = (P - 2 + S)*(alpha + n*beta/S). Minimised over real S >= 1:
    T = (P-2)*alpha + n*beta + max(alpha, r) + min((P-2)*n*beta, r),  r = sqrt((P-2)*alpha*n*beta),
    which is (sqrt((P-2)*alpha) + sqrt(n*beta))^2 when the optimum S* = sqrt((P-2)n*beta/alpha) >= 1 and
    (P-1)*(alpha + n*beta) (one segment) otherwise. (Standard pipelining result; e.g. Traeff 2008,
    "Optimal pipelining of tree algorithms".) Large n approaches n*beta: bus bandwidth = link bandwidth.
    """
    if P == 1:
        return _zero(n)
    r = _sqrt((P - 2) * alpha * n * beta)
    return (P - 2) * alpha + n * beta + mathx.maximum(alpha, r) + mathx.minimum((P - 2) * n * beta, r)


def reduce_binomial(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Binomial-tree reduce: T = ceil(log2 P)*(alpha + n*beta)."""
    return broadcast_binomial(n, P, alpha, beta)


def reduce_scatter_gather(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Rabenseifner's reduce: reduce-scatter (halving) then binomial gather to the root:
    T = 2*ceil(log2 P)*alpha + 2*(P-1)/P * n*beta.
    """
    return reduce_scatter_halving(n, P, alpha, beta) + gather_binomial(n, P, alpha, beta)


def reduce_linear(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Linear reduction, the root receives from each rank in turn: T = (P-1)*(L + gamma*m*G) (survey)."""
    return (P - 1) * (alpha + n * beta)


# ---------------------------------------------------------------------------- gather, scatter, all-to-all


def gather_binomial(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Binomial-tree gather or scatter of n bytes in total: T = ceil(log2 P)*alpha + (P-1)/P * n*beta."""
    return reduce_scatter_halving(n, P, alpha, beta)


def gather_linear(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Linear gather or scatter, the root talks to each rank in turn: T = (P-1)*alpha + (P-1)/P * n*beta."""
    return reduce_scatter_ring(n, P, alpha, beta)


def alltoall_pairwise(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Pairwise exchange, P-1 steps of n/P bytes: T = (P-1)*alpha + (P-1)/P * n*beta (survey section 3)."""
    return reduce_scatter_ring(n, P, alpha, beta)


def alltoall_bruck(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Bruck's all-to-all: T = ceil(log2 P)*alpha + (n/2)*ceil(log2 P)*beta (survey section 3; Bruck 1997).

    Each of the log rounds forwards about half of the data.
    """
    rounds = log_rounds(P)
    return rounds * alpha + n / 2 * rounds * beta


def sendrecv(n: Any, P: int, alpha: Any, beta: Any) -> Any:
    """Point-to-point message: T = alpha + n*beta (P is 2, or 1 for a message to oneself)."""
    if P == 1:
        return _zero(n)
    return alpha + n * beta


# ---------------------------------------------------------------------------------- the catalogue

Formula = Callable[[Any, int, Any, Any], Any]

# op -> algorithm -> closed form. The first key of each op is the default shown first.
ALGORITHMS: dict[str, dict[str, Formula]] = {
    "allreduce": {
        "ring": allreduce_ring,
        "tree": allreduce_tree,
        "double_tree": allreduce_double_tree,
        "recursive_doubling": allreduce_recursive_doubling,
        "rabenseifner": allreduce_rabenseifner,
    },
    "reduce_scatter": {"ring": reduce_scatter_ring, "recursive_halving": reduce_scatter_halving},
    "allgather": {"ring": allgather_ring, "recursive_doubling": allgather_doubling},
    "broadcast": {
        "binomial": broadcast_binomial,
        "scatter_allgather": broadcast_scatter_allgather,
        "pipeline": pipeline_chain,
    },
    "reduce": {
        "binomial": reduce_binomial,
        "reduce_scatter_gather": reduce_scatter_gather,
        "pipeline": pipeline_chain,
        "linear": reduce_linear,
    },
    "alltoall": {"pairwise": alltoall_pairwise, "bruck": alltoall_bruck},
    "gather": {"binomial": gather_binomial, "linear": gather_linear},
    "scatter": {"binomial": gather_binomial, "linear": gather_linear},
    "sendrecv": {"direct": sendrecv},
}

OP_ALIASES = {
    "all_reduce": "allreduce", "all_gather": "allgather", "reducescatter": "reduce_scatter",
    "bcast": "broadcast", "all_to_all": "alltoall", "p2p": "sendrecv", "send_recv": "sendrecv",
    "send": "sendrecv", "recv": "sendrecv",
}

ALGORITHM_ALIASES = {
    "butterfly": "recursive_doubling", "rd": "recursive_doubling", "recursive_halving_doubling": "rabenseifner",
    "rabenseifner_allreduce": "rabenseifner", "binary_tree": "tree", "binomial": "tree",
    "dbtree": "double_tree", "double_binary_tree": "double_tree", "halving": "recursive_halving",
    "doubling": "recursive_doubling", "chain": "pipeline", "pipelined": "pipeline",
    "scatter_gather": "scatter_allgather", "parameter_server": "ps",
}


def bus_factor(op: str, P: int) -> float:
    """nccl-tests' busbw / algbw: 2(P-1)/P for allreduce, (P-1)/P for allgather, reduce-scatter, all-to-all,
    gather and scatter, 1 for broadcast, reduce and send/recv (NVIDIA/nccl-tests doc/PERFORMANCE.md)."""
    if op == "allreduce":
        return 2 * (P - 1) / P
    if op in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return (P - 1) / P
    return 1.0
