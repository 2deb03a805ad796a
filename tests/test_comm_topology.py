"""Groups placed on hierarchical networks (dlperf.comm.topology/hierarchical/engine), by hand-computed cases.

The test cluster: 8 devices per node at 100 GB/s and 2 us, nodes on a 10 GB/s, 10 us network (efficiency 1),
so beta0 = 1e-11 s/B and beta1 = 1e-10 s/B.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.comm import CommError, Group, algorithm_times, best_algorithm, collective_time, p2p_time
from dlperf.comm import collectives as C
from dlperf.comm import nccl as N
from dlperf.comm.hierarchical import CATALOGUE
from dlperf.comm.topology import place, place_group, twin_group
from dlperf.spec.hardware import hardware_from_dict

A0, B0, A1, B1 = 2e-6, 1e-11, 10e-6, 1e-10


def cluster(links: int | None = None, efficiency: float = 1.0):
    outer = {"name": "ib", "bandwidth": "10 GB/s", "latency": "10 us", "efficiency": efficiency}
    if links is not None:
        outer["links_per_domain"] = links
    return hardware_from_dict({
        "name": "test-cluster",
        "device": {"name": "gpu", "peak_flops": {"fp32": "10 TFLOP/s"}, "memory": "16 GiB",
                   "memory_bandwidth": "1000 GB/s"},
        "network": [{"name": "nvlink", "size": 8, "bandwidth": "100 GB/s", "latency": "2 us"}, outer],
    }, "test.yaml")


HW = cluster()


def test_placement_counts_by_hand() -> None:
    # 16 consecutive ranks: 8 per node; ring hops 0-1..6-7 and 8-9..14-15 stay inside (14), 7-8 and 15-0 cross
    p = place(16, 1, (8, None))
    assert (p.members, p.hops, p.peers, p.spanned, p.factors) == ((8, 16), (14, 2), (7, 8), (0, 1), ((0, 8), (1, 2)))
    # a data-parallel group of a tp=8 plan: one member per node
    p = place(8, 8, (8, None))
    assert (p.members, p.hops, p.peers, p.spanned) == ((1, 8), (0, 8), (0, 7), (1,))
    # tp=2: dp ranks 0,2,...,14, four per node
    p = place(8, 2, (8, None))
    assert (p.members, p.hops, p.peers, p.factors) == ((4, 8), (6, 2), (3, 4), ((0, 4), (1, 2)))
    assert [p.level_of_round(d, True) for d in (1, 2, 4)] == [0, 0, 1]
    assert place(16, 1, (8, None)).level_of_round(1, False) == 1  # Bruck: rank 7 -> 8 crosses


def test_twin_group_placement_by_hand() -> None:
    """DualPipe's twin group of a tp=1, dp=2, pp=8 plan, pipeline rank 0: its replicas (devices 0, 1) and those of
    rank 7 (14, 15). Four ranks, 4 <= 8 per node, yet two per node on two nodes; ring 0-1 and 14-15 inside, 1-14
    and 15-0 across; a butterfly's distance-1 rounds stay inside, its distance-2 round crosses."""
    group = twin_group(2, 1, 0, 14)
    assert group.devices == (0, 1, 14, 15) and group.size == 4
    p = place_group(group, HW).placement
    assert (p.members, p.hops, p.peers, p.spanned, p.factors) == ((2, 4), (2, 2), (1, 2), (0, 1), ((0, 2), (1, 2)))
    assert [p.level_of_round(d, True) for d in (1, 2)] == [0, 1]
    # the mirror rank in the same node (pp 4: ranks 0 and 3 hold devices 0, 1 and 6, 7): one level, as Group(4)
    inside = place_group(twin_group(2, 1, 0, 6), HW).placement
    assert (inside.members, inside.hops, inside.spanned) == ((4, 4), (4, 0), (0,))
    # a ring over both levels (textbook ring allreduce 2(P-1) alpha + 2(P-1)/P n beta): alpha the mean hop,
    # (A0 + A1)/2, beta the busiest link, 2/4 of the hops at B1
    n = 1e9
    expected = 6 * (A0 + A1) / 2 + 1.5 * n * 0.5 * B1
    assert collective_time("allreduce", n, group, HW, "ring") == pytest.approx(expected, rel=1e-12)
    assert collective_time("allreduce", n, Group(4), HW, "ring") == pytest.approx(6 * A0 + 1.5 * n * B0, rel=1e-12)
    assert collective_time("allreduce", n, twin_group(2, 1, 0, 6), HW) == collective_time("allreduce", n, Group(4), HW)


def test_group_rejects_bad_devices() -> None:
    for bad in ((0, 1, 2), (0, 2, 1, 3), (0, 1, 1, 2), (-1, 0, 1, 2), (0, 1, 2.0, 3)):
        with pytest.raises(CommError, match="group devices"):
            Group(4, devices=bad)


def test_group_rejects_bad_sizes() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(CommError):
            Group(bad)
    with pytest.raises(CommError):
        Group(4, stride=0)
    with pytest.raises(CommError):
        Group(4, concurrent=0)


def test_two_level_ring_by_hand() -> None:
    # ring link: alpha = (14*2 + 2*10)/16 us = 3 us; beta = max(14/16 * 1e-11, 2/16 * 1e-10) = 1.25e-11
    n = 1e9
    expected = 30 * 3e-6 + 2 * 15 / 16 * n * 1.25e-11
    assert collective_time("allreduce", n, Group(16), HW, "ring") == pytest.approx(expected, rel=1e-12)


def test_hierarchical_allreduce_by_hand() -> None:
    # reduce-scatter in the node (halving: 3*A0 + 7/8 n B0), allreduce of n/8 across 2 nodes (butterfly:
    # A1 + n/8 B1 is the fastest of the flat forms for P=2), allgather back (as the reduce-scatter)
    n = 1e9
    intra = 3 * A0 + 7 / 8 * n * B0
    expected = 2 * intra + (A1 + n / 8 * B1)
    assert collective_time("allreduce", n, Group(16), HW, "hierarchical") == pytest.approx(expected, rel=1e-12)
    # leaders: reduce and broadcast (pipelined chain on 8) in the node, allreduce of n among 2 leaders
    chain = C.pipeline_chain(n, 8, A0, B0)
    expected = 2 * chain + (A1 + n * B1)
    assert collective_time("allreduce", n, Group(16), HW, "leaders") == pytest.approx(expected, rel=1e-12)


def test_rabenseifner_across_nodes_keeps_big_halves_inside() -> None:
    # rounds at distance 1, 2, 4 inside the node carry n/2, n/4, n/8; distance 8 crosses with n/16
    n = 1e9
    half = 3 * A0 + (1 / 2 + 1 / 4 + 1 / 8) * n * B0 + A1 + n / 16 * B1
    assert collective_time("allreduce", n, Group(16), HW, "rabenseifner") == pytest.approx(2 * half, rel=1e-12)


SINGLE_LEVEL_GROUPS = [(P, 1) for P in range(2, 9)] + [(P, 8) for P in (2, 3, 5, 8, 13, 16, 33)]


@pytest.mark.parametrize(("P", "stride"), SINGLE_LEVEL_GROUPS)
def test_hierarchical_cost_inside_one_level_equals_flat_cost(P: int, stride: int) -> None:
    """Every placed implementation, forced on a group that lives on one level, gives the closed form on
    that level's link: round lists, ring/peer links and compositions all reduce to the textbook."""
    placed = place_group(Group(P, stride), HW)
    level = placed.single_level()
    assert level == (0 if stride == 1 else 1)
    alpha, beta = (A0, B0) if level == 0 else (A1, B1)
    n = 3.3e7
    for op, algorithms in CATALOGUE.items():
        for name, alg in algorithms.items():
            flat = alg.formula(n, P, alpha, beta) if alg.formula else min(
                f(n, P, alpha, beta) for f in C.ALGORITHMS[op].values())
            assert alg.placed(n, placed) == pytest.approx(flat, rel=1e-12), (op, name)
            if alg.formula:
                assert collective_time(op, n, Group(P, stride), HW, name) == pytest.approx(flat, rel=1e-12)


def test_one_rank_costs_nothing_and_keeps_the_kind() -> None:
    assert collective_time("allreduce", 1e9, Group(1), HW) == 0
    out = collective_time("allgather", np.array([1.0, 1e9]), Group(1), HW)
    assert isinstance(out, np.ndarray) and not out.any()


def test_placement_matters_tensor_parallel_inside_a_node() -> None:
    # large enough that the fixed terms (latency, start-up, the one-node pipeline fill, ~1% at 1 GiB) vanish
    n = 2**33
    inside = collective_time("allreduce", n, Group(8, 1), HW)
    spread = collective_time("allreduce", n, Group(8, 8), HW)  # one rank per node
    assert spread / inside == pytest.approx(B1 / B0, rel=0.01)


def test_contention_rails_versus_one_nic() -> None:
    """8 data-parallel rings (one per node-local rank) on 8 rails, versus the same 8 sharing one NIC."""
    n, group = 1e9, Group(4, stride=8)
    rails = collective_time("allreduce", n, group, cluster(links=8), "ring")
    one_nic = collective_time("allreduce", n, group, cluster(links=1), "ring")
    assert rails == pytest.approx(6 * A1 + 1.5 * n * B1, rel=1e-12)
    assert one_nic == pytest.approx(6 * A1 + 1.5 * n * B1 * 8, rel=1e-12)
    # only one group crossing at a time: no contention even on one NIC
    alone = collective_time("allreduce", n, Group(4, 8, concurrent=1), cluster(links=1), "ring")
    assert alone == pytest.approx(rails, rel=1e-12)
    # links=None means one link per device: the rails case
    assert collective_time("allreduce", n, group, HW, "ring") == pytest.approx(rails, rel=1e-12)


def test_leaders_see_less_contention_than_rails() -> None:
    # one group of 16: with a single NIC per node, every device crossing shares it (rails: 8 -> 1/8 link),
    # a leader crosses alone
    hw = cluster(links=1)
    placed = place_group(Group(16), hw)
    assert placed.link(1, "rails").beta == pytest.approx(8 * B1)
    assert placed.link(1, "leaders").beta == pytest.approx(B1)


def test_per_level_efficiency_scales_bandwidth_only() -> None:
    slow = cluster(efficiency=0.5)
    n = 1e9
    t = collective_time("allreduce", n, Group(4, 8), slow, "ring")
    assert t == pytest.approx(6 * A1 + 1.5 * n * B1 * 2, rel=1e-12)


def test_auto_is_the_minimum_and_names_the_winner() -> None:
    """`auto` is the fastest of NCCL's (algorithm, protocol) pairs, `auto:textbook` the fastest textbook one."""
    for P, stride in ((8, 1), (16, 1), (64, 1), (32, 8), (6, 2)):
        for n in (8.0, 4096.0, 2.0**20, 2.0**33):
            times = algorithm_times("allreduce", n, Group(P, stride), HW)
            best = best_algorithm("allreduce", n, Group(P, stride), HW)
            assert best.startswith("nccl:")
            assert collective_time("allreduce", n, Group(P, stride), HW) == times[best]
            assert times[best] == min(t for k, t in times.items() if k.startswith("nccl:"))
            text = best_algorithm("allreduce", n, Group(P, stride), HW, "auto:textbook")
            assert collective_time("allreduce", n, Group(P, stride), HW, "auto:textbook") == times[text]
            assert times[text] == min(t for k, t in times.items() if k != "ps" and not k.startswith("nccl:"))


def test_small_messages_choose_log_latency_large_choose_bandwidth_optimal() -> None:
    group = Group(64, 8)  # one level: 64 nodes
    textbook = "auto:textbook"
    assert best_algorithm("allreduce", 8.0, group, HW, textbook) == "recursive_doubling"
    assert best_algorithm("allreduce", 2.0**33, group, HW, textbook) in ("ring", "rabenseifner")
    t = collective_time("allreduce", 2.0**33, group, HW, textbook)
    assert 2 * 63 / 64 * 2.0**33 / t == pytest.approx(1 / B1, rel=0.01)  # busbw = link bandwidth
    assert best_algorithm("broadcast", 8.0, group, HW, textbook) == "binomial"
    assert best_algorithm("broadcast", 2.0**33, group, HW, textbook) == "pipeline"
    assert best_algorithm("allgather", 8.0, group, HW, textbook) == "recursive_doubling"
    # NCCL: low-latency protocols for small messages, the Simple ring at the link bandwidth for large ones
    assert best_algorithm("allreduce", 8.0, group, HW).endswith("/LL")
    assert best_algorithm("allreduce", 2.0**33, group, HW) == "nccl:ring/Simple"
    t = collective_time("allreduce", 2.0**33, group, HW)
    assert 2 * 63 / 64 * 2.0**33 / t == pytest.approx(1 / B1, rel=0.01)


def test_vectorized_matches_scalar_and_sympy_matches_float() -> None:
    sizes = np.geomspace(1, 2**34, 40)
    group = Group(64)
    vec = collective_time("allreduce", sizes, group, HW)
    assert isinstance(vec, np.ndarray) and vec.shape == sizes.shape
    scalar = [collective_time("allreduce", float(s), group, HW) for s in sizes]
    np.testing.assert_allclose(vec, scalar, rtol=1e-12)
    n = sympy.Symbol("n", positive=True)
    expr = collective_time("allreduce", n, group, HW)
    assert expr.free_symbols == {n}
    for s in (1e3, 1e6, 1e10):
        assert float(expr.subs(n, s)) == pytest.approx(collective_time("allreduce", s, group, HW), rel=1e-9)


def test_p2p_time() -> None:
    # NCCL send/recv with the Simple protocol: Ring base latency 8.4 us + the level's hop latency + n beta, and the
    # start-up every NCCL call pays (nccl.CALL_OVERHEAD)
    base = 8.4e-6 + N.CALL_OVERHEAD
    assert p2p_time(1e6, HW, 0) == pytest.approx(base + A0 + 1e6 * B0)
    assert p2p_time(1e6, HW, 1) == pytest.approx(base + A1 + 1e6 * B1)
    assert p2p_time(1e6, cluster(links=2), 1, concurrent=8) == pytest.approx(base + A1 + 4e6 * B1)
    with pytest.raises(CommError, match="level index 0..1"):
        p2p_time(1e6, HW, 2)


def test_unknown_names_suggest_the_closest() -> None:
    with pytest.raises(CommError, match="did you mean 'allreduce'"):
        collective_time("allreduc", 1.0, Group(2), HW)
    with pytest.raises(CommError, match="did you mean 'ring'"):
        collective_time("allreduce", 1.0, Group(2), HW, "rign")
    assert collective_time("all-reduce", 1e6, Group(8), HW, "butterfly") == pytest.approx(3 * (A0 + 1e6 * B0))
    assert collective_time("allreduce", 1e6, Group(8), HW, "ps:4") == pytest.approx(2 * A0 + 2 * 8 * 1e6 * B0 / 4)
    with pytest.raises(CommError, match="ps:S"):
        collective_time("allreduce", 1.0, Group(2), HW, "ring:2")


def _scaled(hw, latency: float = 1.0, bandwidth: float = 1.0):
    levels = tuple(replace(lv, latency=lv.latency * latency, bandwidth=lv.bandwidth * bandwidth) for lv in hw.network)
    return replace(hw, network=levels)


OPS = list(CATALOGUE)


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(OPS), P=st.integers(1, 80), stride=st.sampled_from([1, 2, 4, 8, 16]),
       n1=st.floats(0, 1e11), n2=st.floats(0, 1e11), scale=st.floats(1.0, 50.0), links=st.sampled_from([None, 1, 4]))
def test_placed_time_monotone(op, P, stride, n1, n2, scale, links) -> None:
    hw = cluster(links=links)
    group = Group(P, stride)
    lo, hi = sorted((n1, n2))
    base = collective_time(op, lo, group, hw)
    assert base <= collective_time(op, hi, group, hw) * (1 + 1e-12)
    assert collective_time(op, lo, group, _scaled(hw, latency=scale)) >= base * (1 - 1e-12)
    assert collective_time(op, lo, group, _scaled(hw, bandwidth=scale)) <= base * (1 + 1e-12)


def test_three_levels_hierarchical_by_hand() -> None:
    """8 GPUs per node (100 GB/s, 2 us), 32 nodes per leaf switch (20 GB/s, 5 us), spine (10 GB/s, 10 us).
    512 ranks: reduce-scatter in the node, then among the 32 nodes of a leaf on n/8, allreduce of n/256
    across the 2 leaves, then the allgathers back."""
    hw = hardware_from_dict({
        "name": "three", "device": {"name": "gpu", "peak_flops": {"fp32": "10 TFLOP/s"}, "memory": "16 GiB",
                                    "memory_bandwidth": "1000 GB/s"},
        "network": [{"name": "nvlink", "size": 8, "bandwidth": "100 GB/s", "latency": "2 us"},
                    {"name": "leaf", "size": 256, "bandwidth": "20 GB/s", "latency": "5 us"},
                    {"name": "spine", "bandwidth": "10 GB/s", "latency": "10 us"}],
    }, "three.yaml")
    p = place(512, 1, (8, 256, None))
    assert (p.members, p.hops, p.factors) == ((8, 256, 512), (448, 62, 2), ((0, 8), (1, 32), (2, 2)))
    n = 1e9
    node = 3 * 2e-6 + 7 / 8 * n * 1e-11  # recursive halving on 8
    leaf = 5 * 5e-6 + 31 / 32 * (n / 8) * 5e-11  # recursive halving on 32
    spine = 10e-6 + n / 256 * 1e-10  # butterfly on 2
    expected = 2 * node + 2 * leaf + spine
    assert collective_time("allreduce", n, Group(512), hw, "hierarchical") == pytest.approx(expected, rel=1e-12)
