"""Closed-form collectives (dlperf.comm.collectives) against their textbook forms, by hand-computed numbers.

alpha = 1 us, beta = 1 ns/B (1 GB/s), n = 1 MB, P = 8 unless stated: alpha-terms are multiples of 1e-6 s and
n*beta = 1e-3 s, so each expected value below is a sum the reader can check in their head.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.comm import collectives as C

A, B, N, P = 1e-6, 1e-9, 1e6, 8

# (function, expected time for P=8) -- survey section 3 tables, evaluated by hand.
TEXTBOOK_P8 = [
    (C.allreduce_ring, 14e-6 + 1.75e-3),  # 2(P-1)L + 2(P-1)/P nG
    (C.allreduce_tree, 6 * (1e-6 + 1e-3)),  # 2 log2 P (L + nG)
    (C.allreduce_double_tree, 6e-6 + 2e-3),  # 2 log2 P L + 2nG
    (C.allreduce_recursive_doubling, 3 * (1e-6 + 1e-3)),  # log2 P (L + nG)
    (C.allreduce_rabenseifner, 6e-6 + 1.75e-3),  # 2 log2 P L + 2(P-1)/P nG
    (C.reduce_scatter_ring, 7e-6 + 0.875e-3),
    (C.reduce_scatter_halving, 3e-6 + 0.875e-3),
    (C.allgather_ring, 7e-6 + 0.875e-3),
    (C.allgather_doubling, 3e-6 + 0.875e-3),
    (C.broadcast_binomial, 3 * (1e-6 + 1e-3)),
    (C.broadcast_scatter_allgather, (3 + 7) * 1e-6 + 1.75e-3),  # (log2 P + P - 1) L + 2(P-1)/P nG
    (C.reduce_binomial, 3 * (1e-6 + 1e-3)),
    (C.reduce_scatter_gather, 6e-6 + 1.75e-3),
    (C.reduce_linear, 7 * (1e-6 + 1e-3)),  # (P-1)(L + nG)
    (C.gather_binomial, 3e-6 + 0.875e-3),
    (C.gather_linear, 7e-6 + 0.875e-3),
    (C.alltoall_pairwise, 7e-6 + 0.875e-3),
    (C.alltoall_bruck, 3e-6 + 1.5e-3),  # log2 P L + (n/2) log2 P G
    (C.sendrecv, 1e-6 + 1e-3),
    # pipelined chain: (sqrt((P-2) L) + sqrt(nG))^2 since S* = sqrt(6e-3/1e-6) = 77 >= 1
    (C.pipeline_chain, (math.sqrt(6e-6) + math.sqrt(1e-3)) ** 2),
]

ALL_FORMULAS = sorted({f for algs in C.ALGORITHMS.values() for f in algs.values()}, key=lambda f: f.__name__)


@pytest.mark.parametrize(("formula", "expected"), TEXTBOOK_P8, ids=lambda x: getattr(x, "__name__", ""))
def test_textbook_value_p8(formula, expected) -> None:
    assert formula(N, P, A, B) == pytest.approx(expected, rel=1e-12)


def test_parameter_server_central_and_sharded() -> None:
    # T_PS = 2L + 2 P n G / s
    assert C.parameter_server(N, P, A, B) == pytest.approx(2e-6 + 16e-3, rel=1e-12)
    assert C.parameter_server(N, P, A, B, servers=4) == pytest.approx(2e-6 + 4e-3, rel=1e-12)


def test_lower_bounds_v1_and_v2() -> None:
    assert C.allreduce_lower_bound(N, P, A, B) == pytest.approx(3e-6 + 1.75e-3, rel=1e-12)
    assert C.allreduce_lower_bound(N, P, A, B, redundant=True) == pytest.approx(3e-6 + 0.875e-3, rel=1e-12)


def test_non_powers_of_two() -> None:
    # P = 6: butterfly folds 2 extra ranks: floor(log2 6) + 2 = 4 rounds; Bruck-style phases: ceil(log2 6) = 3.
    assert C.allreduce_recursive_doubling(N, 6, A, B) == pytest.approx(4 * (1e-6 + 1e-3), rel=1e-12)
    assert C.allreduce_rabenseifner(N, 6, A, B) == pytest.approx(6e-6 + 2 * 5 / 6 * 1e-3, rel=1e-12)
    assert C.allreduce_tree(N, 5, A, B) == pytest.approx(6 * (1e-6 + 1e-3), rel=1e-12)
    assert C.alltoall_bruck(N, 5, A, B) == pytest.approx(3e-6 + 1.5e-3, rel=1e-12)


def test_pipeline_chain_short_message_uses_one_segment() -> None:
    # S* = sqrt((P-2) n beta / alpha) = sqrt(6 * 1e-3 / 1) < 1 when alpha = 1 s: T = (P-1)(alpha + n beta)
    assert C.pipeline_chain(N, P, 1.0, B) == pytest.approx(7 * (1.0 + 1e-3), rel=1e-12)
    assert C.pipeline_chain(N, 2, A, B) == pytest.approx(1e-6 + 1e-3, rel=1e-12)


@pytest.mark.parametrize("P", [2, 3, 8, 17, 64])
def test_pipeline_chain_is_the_minimum_over_segment_counts(P: int) -> None:
    for n in (1e2, 1e5, 1e8):
        s = np.geomspace(1, 1e6, 400001)
        brute = float(np.min((P - 2 + s) * (A + n * B / s)))
        exact = C.pipeline_chain(n, P, A, B)
        assert exact <= brute * (1 + 1e-12)
        assert exact == pytest.approx(brute, rel=1e-4)


@pytest.mark.parametrize("formula", ALL_FORMULAS, ids=lambda f: f.__name__)
def test_one_rank_costs_nothing(formula) -> None:
    assert formula(N, 1, A, B) == 0
    zeros = formula(np.array([1.0, 2e9]), 1, A, B)
    assert isinstance(zeros, np.ndarray) and not zeros.any()
    assert formula(sympy.Symbol("n", positive=True), 1, A, B) == 0


@pytest.mark.parametrize("formula", ALL_FORMULAS, ids=lambda f: f.__name__)
def test_float_array_and_sympy_agree(formula) -> None:
    sizes = np.array([8.0, 1e3, 1e6, 1e9])
    out = formula(sizes, 12, A, B)
    assert isinstance(out, np.ndarray) and out.shape == sizes.shape
    n = sympy.Symbol("n", positive=True)
    expr = formula(n, 12, A, B)
    assert isinstance(expr, sympy.Expr) and expr.free_symbols == {n}
    for i, size in enumerate(sizes):
        scalar = formula(float(size), 12, A, B)
        assert out[i] == pytest.approx(scalar, rel=1e-12)
        assert float(expr.subs(n, size)) == pytest.approx(scalar, rel=1e-12)


def test_symbolic_ring_is_the_survey_formula() -> None:
    n, L, G = sympy.symbols("n L G", positive=True)
    assert sympy.simplify(C.allreduce_ring(n, 8, L, G) - (14 * L + sympy.Rational(7, 4) * n * G)) == 0
    assert sympy.simplify(C.allreduce_tree(n, 8, L, G) - 6 * (L + n * G)) == 0
    assert sympy.simplify(C.parameter_server(n, 8, L, G, servers=2) - (2 * L + 8 * n * G)) == 0


@pytest.mark.parametrize("formula", [C.allreduce_ring, C.allreduce_rabenseifner])
@pytest.mark.parametrize("P", [2, 7, 8, 64, 1000])
def test_bandwidth_term_approaches_the_optimum(formula, P: int) -> None:
    # T / (2(P-1)/P n beta) -> 1 as n grows: latency vanishes, the bandwidth term is exactly optimal
    for n, tol in ((1e9, 0.2), (1e12, 1e-3), (1e15, 1e-6)):
        ratio = formula(n, P, A, B) / (2 * (P - 1) / P * n * B)
        assert 1 <= ratio <= 1 + tol
    assert formula(1e15, P, A, B) / C.allreduce_lower_bound(1e15, P, A, B) == pytest.approx(1, rel=1e-6)


def test_bus_factors_follow_nccl_tests() -> None:
    assert C.bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert C.bus_factor("allgather", 8) == C.bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert C.bus_factor("alltoall", 4) == pytest.approx(0.75)
    assert C.bus_factor("broadcast", 8) == C.bus_factor("reduce", 8) == C.bus_factor("sendrecv", 2) == 1.0


sizes = st.floats(min_value=0.0, max_value=1e12, allow_nan=False)
groups = st.integers(min_value=1, max_value=300)
positive = st.floats(min_value=1e-9, max_value=1e-3)


@settings(max_examples=60, deadline=None)
@given(n1=sizes, n2=sizes, P=groups, alpha=positive, beta=st.floats(min_value=1e-13, max_value=1e-8))
def test_monotone_in_size(n1: float, n2: float, P: int, alpha: float, beta: float) -> None:
    lo, hi = sorted((n1, n2))
    for f in ALL_FORMULAS:
        assert f(lo, P, alpha, beta) <= f(hi, P, alpha, beta) * (1 + 1e-12) + 1e-300, f.__name__


@settings(max_examples=60, deadline=None)
@given(n=sizes, P=groups, alpha=positive, scale=st.floats(min_value=1.0, max_value=100.0),
       beta=st.floats(min_value=1e-13, max_value=1e-8))
def test_more_latency_never_faster_more_bandwidth_never_slower(n, P, alpha, scale, beta) -> None:
    for f in ALL_FORMULAS:
        base = f(n, P, alpha, beta)
        assert f(n, P, alpha * scale, beta) >= base * (1 - 1e-12), f.__name__
        assert f(n, P, alpha, beta / scale) <= base * (1 + 1e-12), f.__name__  # bandwidth x scale
