"""Collectives over a group that spans network levels: the closed forms of collectives.py, placed.

Three ways a multi-level cost is built, all equal to the closed form when the group lives on one level:
- log-round algorithms (trees, butterflies, recursive halving, Bruck) sum their rounds, each round paying
  the link of the outermost level its partners cross (partner distance 2^k in group order; with members
  filling nodes first, near rounds stay inside a node);
- ring-like algorithms (ring, pipelined chain) use the effective link of Placed.ring_link (NCCL's channels
  spread the node-crossing hops over all NICs, every level busy at once); one-peer-at-a-time algorithms
  (pairwise exchange, linear) use Placed.peer_link;
- explicit compositions for allreduce (section 3 of the survey notes, "hierarchical"): `hierarchical`
  = reduce-scatter inside each inner domain, allreduce of the 1/f shard across the next level by every
  device (over all rails), allgather back; `leaders` = reduce to one leader per domain, allreduce among
  leaders, broadcast. Each phase takes the fastest algorithm on its level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlperf import mathx
from dlperf.comm import collectives as C
from dlperf.comm.topology import LEADERS, RAILS, Link, Placed, Round


def halving_rounds(P: int) -> list[Round]:
    """Recursive halving (or doubling, reversed): near partners carry the big halves. Powers of two pair
    k with k XOR 2^i and send n/2^(i+1); otherwise Bruck's rounds send min(2^i, P-2^i) blocks of n/P."""
    if C.is_pow2(P):
        return [(1 << i, 1 / (2 << i), True) for i in range(C.log_rounds(P))]
    return [(1 << i, min(1 << i, P - (1 << i)) / P, False) for i in range(C.log_rounds(P))]


def binomial_rounds(P: int) -> list[Round]:
    """Binomial tree: ceil(log2 P) rounds of the whole message."""
    return [(1 << i, 1.0, True) for i in range(C.log_rounds(P))]


def gather_rounds(P: int) -> list[Round]:
    """Binomial gather/scatter: round i moves a subtree of min(2^i, P-2^i) blocks of n/P."""
    return [(1 << i, min(1 << i, P - (1 << i)) / P, True) for i in range(C.log_rounds(P))]


def butterfly_rounds(P: int) -> list[Round]:
    """Recursive doubling on the largest power of two, plus fold and unfold rounds for the rest."""
    p2 = C.pow2_floor(P)
    rounds = [(1 << i, 1.0, True) for i in range(p2.bit_length() - 1)]
    return rounds + ([(p2, 1.0, True)] * 2 if p2 != P else [])


def bruck_rounds(P: int) -> list[Round]:
    """Bruck all-to-all: rank k sends about n/2 to k + 2^i."""
    return [(1 << i, 0.5, False) for i in range(C.log_rounds(P))]


# --------------------------------------------------------------------------------- placed algorithms


def ring_like(formula: C.Formula, cls: str = RAILS) -> Callable[[Any, Placed], Any]:
    """The closed form on the pipelined multi-level ring link."""
    return lambda n, pl: formula(n, pl.size, *_ab(pl.ring_link(cls)))


def peer_like(formula: C.Formula, cls: str) -> Callable[[Any, Placed], Any]:
    """The closed form on the mean link over peers (one peer per step)."""
    return lambda n, pl: formula(n, pl.size, *_ab(pl.peer_link(cls)))


def rounds_of(*parts: tuple[Callable[[int], list[Round]], str]) -> Callable[[Any, Placed], Any]:
    """Sum of round lists, each with its concurrency class: latency + coefficient * n, memoised."""

    def cost(pl: Placed) -> tuple[float, float]:
        sums = [pl.rounds_cost(make(pl.size), cls) for make, cls in parts]
        return sum(a for a, _ in sums), sum(b for _, b in sums)

    def time(n: Any, pl: Placed) -> Any:
        latency, coefficient = pl.memo(("rounds", parts), lambda: cost(pl))
        return latency + coefficient * n

    return time


def _ab(link: Link) -> tuple[float, float]:
    return link.alpha, link.beta


def double_tree_placed(n: Any, pl: Placed) -> Any:
    """NCCL's tree across levels (Jeaugey 2019, "Massively scale your deep learning training with NCCL
    2.4"): a chain inside a domain, double binary trees between domains, all pipelined. Depth costs the
    binomial rounds' latencies twice; each device moves 2n through its own link, and 2n/members[j-1] across
    level j (the domain's tree traffic shared over its devices' rails)."""
    latency, beta = pl.memo(("double_tree",), lambda: _double_tree_link(pl))
    return 2 * latency + 2 * n * beta


def _double_tree_link(pl: Placed) -> tuple[float, float]:
    latency, _ = pl.rounds_cost(binomial_rounds(pl.size), RAILS)
    members = (1, *pl.placement.members)
    return latency, max(pl.link(j, RAILS).beta / members[j] for j in pl.placement.spanned)


def sendrecv_placed(n: Any, pl: Placed) -> Any:
    """Neighbour exchange: alpha + n*beta on the outermost level the group spans."""
    return C.sendrecv(n, pl.size, *_ab(pl.link(pl.outer_level(), RAILS)))


def parameter_server_placed(n: Any, pl: Placed, servers: int = 1) -> Any:
    """Parameter server with the agents' traffic on the outermost level the group spans."""
    return C.parameter_server(n, pl.size, *_ab(pl.link(pl.outer_level(), RAILS)), servers=servers)


def best_on_link(op: str, n: Any, P: int, link: Link) -> Any:
    """Fastest closed form of `op` for P ranks on one link (elementwise for arrays)."""
    return mathx.minimum(*(f(n, P, link.alpha, link.beta) for f in C.ALGORITHMS[op].values()))


def hierarchical_allreduce(n: Any, pl: Placed) -> Any:
    """Reduce-scatter in each inner level, allreduce of the n/(f_0...f_k-1) shard on the outermost level
    by all devices at once (rails), allgather back: T = sum_j [RS_j + AG_j](n_j) + AR_out(n_out)."""
    *inner, (outer, f_out) = pl.placement.factors
    total, shard = n * 0, n
    for level, f in inner:
        link = pl.link(level, RAILS)
        total = total + best_on_link("reduce_scatter", shard, f, link) + best_on_link("allgather", shard, f, link)
        shard = shard / f
    return total + best_on_link("allreduce", shard, f_out, pl.link(outer, RAILS))


def leaders_allreduce(n: Any, pl: Placed) -> Any:
    """Reduce to a leader in each inner level, allreduce among the outermost level's leaders, broadcast
    back: T = sum_j [Reduce_j + Bcast_j](n) + AR_out(n)."""
    *inner, (outer, f_out) = pl.placement.factors
    total = n * 0
    for level, f in inner:
        link = pl.link(level, LEADERS)
        total = total + best_on_link("reduce", n, f, link) + best_on_link("broadcast", n, f, link)
    return total + best_on_link("allreduce", n, f_out, pl.link(outer, LEADERS))


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of one collective: its closed form on a single link, the concurrency class that
    link is taken with, and its cost on a group that spans levels."""

    formula: C.Formula | None
    cls: str
    placed: Callable[[Any, Placed], Any]
    auto: bool = True  # a candidate for `auto`
    multi_level_only: bool = False


def _catalogue() -> dict[str, dict[str, Algorithm]]:
    halving, binomial, gather = (halving_rounds, RAILS), (binomial_rounds, LEADERS), (gather_rounds, LEADERS)
    scatter, ring_allgather = rounds_of(gather), ring_like(C.allgather_ring)
    return {
        "allreduce": {
            "ring": Algorithm(C.allreduce_ring, RAILS, ring_like(C.allreduce_ring)),
            "tree": Algorithm(C.allreduce_tree, LEADERS, rounds_of(binomial, binomial)),
            "double_tree": Algorithm(C.allreduce_double_tree, RAILS, double_tree_placed),
            "recursive_doubling": Algorithm(C.allreduce_recursive_doubling, RAILS,
                                            rounds_of((butterfly_rounds, RAILS))),
            "rabenseifner": Algorithm(C.allreduce_rabenseifner, RAILS, rounds_of(halving, halving)),
            "hierarchical": Algorithm(None, RAILS, hierarchical_allreduce, multi_level_only=True),
            "leaders": Algorithm(None, LEADERS, leaders_allreduce, multi_level_only=True),
            "ps": Algorithm(C.parameter_server, RAILS, parameter_server_placed, auto=False),
        },
        "reduce_scatter": {
            "ring": Algorithm(C.reduce_scatter_ring, RAILS, ring_like(C.reduce_scatter_ring)),
            "recursive_halving": Algorithm(C.reduce_scatter_halving, RAILS, rounds_of(halving)),
        },
        "allgather": {
            "ring": Algorithm(C.allgather_ring, RAILS, ring_like(C.allgather_ring)),
            "recursive_doubling": Algorithm(C.allgather_doubling, RAILS, rounds_of(halving)),
        },
        "broadcast": {
            "binomial": Algorithm(C.broadcast_binomial, LEADERS, rounds_of(binomial)),
            "scatter_allgather": Algorithm(
                C.broadcast_scatter_allgather, LEADERS,
                lambda n, pl: scatter(n, pl) + ring_allgather(n, pl)),
            "pipeline": Algorithm(C.pipeline_chain, RAILS, ring_like(C.pipeline_chain)),
        },
        "reduce": {
            "binomial": Algorithm(C.reduce_binomial, LEADERS, rounds_of(binomial)),
            "reduce_scatter_gather": Algorithm(C.reduce_scatter_gather, RAILS, rounds_of(halving, gather)),
            "pipeline": Algorithm(C.pipeline_chain, RAILS, ring_like(C.pipeline_chain)),
            "linear": Algorithm(C.reduce_linear, LEADERS, peer_like(C.reduce_linear, LEADERS)),
        },
        "alltoall": {
            "pairwise": Algorithm(C.alltoall_pairwise, RAILS, peer_like(C.alltoall_pairwise, RAILS)),
            "bruck": Algorithm(C.alltoall_bruck, RAILS, rounds_of((bruck_rounds, RAILS))),
        },
        "gather": {
            "binomial": Algorithm(C.gather_binomial, LEADERS, rounds_of(gather)),
            "linear": Algorithm(C.gather_linear, LEADERS, peer_like(C.gather_linear, LEADERS)),
        },
        "scatter": {
            "binomial": Algorithm(C.gather_binomial, LEADERS, rounds_of(gather)),
            "linear": Algorithm(C.gather_linear, LEADERS, peer_like(C.gather_linear, LEADERS)),
        },
        "sendrecv": {"direct": Algorithm(C.sendrecv, RAILS, sendrecv_placed)},
    }


CATALOGUE = _catalogue()
