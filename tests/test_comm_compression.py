"""Gradient compression (dlperf.comm.compression): parsing, wire bytes, sparse allreduce with fill-in, and the
flag that says when compression does not pay. Hand-computed on 8 devices of one node: alpha = 2 us,
beta = 1e-11 s/B, memory 1000 GB/s at the default 0.9 efficiency (9e11 B/s); m = 1e6 fp32 gradients."""

from __future__ import annotations

import numpy as np
import pytest

from dlperf.comm import (
    CommError,
    Compression,
    Group,
    collective_time,
    compressed_allreduce_time,
    nccl,
    parse_compression,
)
from dlperf.comm.compression import sparse_allgather_pays, sparse_allreduce_times
from dlperf.spec.hardware import hardware_from_dict

HW = hardware_from_dict({
    "name": "node",
    "device": {"name": "gpu", "peak_flops": {"fp32": "10 TFLOP/s"}, "memory": "16 GiB",
               "memory_bandwidth": "1000 GB/s"},
    "network": [{"name": "nvlink", "size": 8, "bandwidth": "100 GB/s", "latency": "2 us"},
                {"name": "ib", "bandwidth": "10 GB/s", "latency": "10 us"}],
}, "node.yaml")
A, B, MEM = 2e-6, 1e-11, 9e11
CALL = nccl.CALL_OVERHEAD  # every collective call's start-up (hand-built sparse algorithms too)
M, GAMMA = 1e6, 4.0
DENSE = 6 * A + 1.75 * 4e6 * B  # Rabenseifner on 4 MB is the fastest textbook dense allreduce here
TEXTBOOK = "auto:textbook"  # the hand arithmetic below is the survey's alpha-beta model, not NCCL's tuner


@pytest.mark.parametrize(("spec", "bits", "block", "feedback"), [
    ("fp16", 16, None, False), ("bf16", 16, None, False), ("int8", 8, None, False), ("int8:256", 8, 256, False),
    ("1bit", 1, None, True), ("terngrad", 2, None, False),
    ("qsgd:15", 5, 512, False), ("qsgd:16", 6, 512, False), ("qsgd:1:64", 2, 64, False), ("none", None, None, False),
])
def test_parse_quantizers(spec: str, bits, block, feedback: bool) -> None:
    scheme = parse_compression(spec)
    assert (scheme.bits, scheme.block, scheme.error_feedback, scheme.sparse) == (bits, block, feedback, False)


def test_parse_topk_and_errors() -> None:
    scheme = parse_compression("topk:0.01")
    assert scheme.sparse and scheme.density == 0.01 and scheme.error_feedback and str(scheme) == "topk:0.01"
    for bad, message in (("topk:2", "0 < DENSITY <= 1"), ("topk:x", "topk:DENSITY"), ("qsgd", "level count"),
                         ("qsgd:0", "positive integer"), ("int8:1:2", "too many"), ("fp61", "did you mean 'fp16'")):
        with pytest.raises(CommError, match=message):
            parse_compression(bad)


def test_wire_bytes_per_element() -> None:
    assert parse_compression("fp16").wire_bytes_per_element(4) == 2
    assert parse_compression("fp16").wire_bytes_per_element(2) == 2  # never more than the input
    assert parse_compression("1bit").wire_bytes_per_element(4) == 1 / 8
    assert parse_compression("qsgd:15").wire_bytes_per_element(4) == pytest.approx(5 / 8 + 4 / 512)


def test_quantized_allreduce_by_hand() -> None:
    # int8: 1 MB on the wire; Rabenseifner 6A + 1.75 * 1e6 B; encode+decode 2m(4+1) bytes of memory traffic
    time, detail = compressed_allreduce_time(M, GAMMA, "int8", Group(8), HW, TEXTBOOK)
    comm = 6 * A + 1.75e6 * B
    work = 2 * M * 5 / MEM
    assert (detail.comm_time, detail.compute_time) == (pytest.approx(comm), pytest.approx(work))
    assert time == pytest.approx(comm + work)
    assert detail.dense_time == pytest.approx(DENSE) and detail.slower_than_dense is False
    # 1-bit SGD adds the error-feedback residual pass: 2m(4 + 1/8) + 2m*4
    _, detail = compressed_allreduce_time(M, GAMMA, "1bit", Group(8), HW, TEXTBOOK)
    assert detail.compute_time == pytest.approx((2 * M * 4.125 + 8 * M) / MEM)


def test_sparse_algorithms_by_hand() -> None:
    # k = 1e4 values of 4 + 4 index bytes = 8e4 B per rank
    times = sparse_allreduce_times(M, GAMMA, 0.01, Group(8), HW)
    # allgather of 8 * 8e4 B, run by NCCL; the survey's L log2 P + (P-1) k (gamma + gamma_idx) G is the textbook one
    assert times["allgather"] == pytest.approx(collective_time("allgather", 8 * 8e4, Group(8), HW))
    assert collective_time("allgather", 8 * 8e4, Group(8), HW, TEXTBOOK) == pytest.approx(3 * A + 7 * 8e4 * B)
    # recursive doubling, no fill cap yet: 8e4 + 1.6e5 + 3.2e5
    assert times["recursive_doubling"] == pytest.approx(3 * A + 5.6e5 * B + CALL)
    # halving sends min(m*gamma/2d, k/2 * 8) = 4e4 three times; allgather moves 4+2+1 regions of min(5e5, 8e4)
    assert times["rs_ag"] == pytest.approx(6 * A + (1.2e5 + 5.6e5) * B + CALL)


def test_fill_in_caps_at_dense_and_flags_slower_than_dense() -> None:
    # density 0.2: k*(gamma+idx) = 1.6e6 B; recursive doubling rounds 1.6e6, 3.2e6, then capped at m*gamma = 4e6
    times = sparse_allreduce_times(M, GAMMA, 0.2, Group(8), HW)
    assert times["recursive_doubling"] == pytest.approx(3 * A + 8.8e6 * B + CALL)
    # rs_ag: halving min(2e6, 8e5) + min(1e6, 8e5) + min(5e5, 8e5); regions min(5e5, 1.6e6) * 7
    assert times["rs_ag"] == pytest.approx(6 * A + (2.1e6 + 3.5e6) * B + CALL)
    time, detail = compressed_allreduce_time(M, GAMMA, "topk:0.2", Group(8), HW)
    assert detail.algorithm == "rs_ag" and detail.comm_time < detail.dense_time
    # selection 2m*gamma + k bytes, decode m*gamma + P k bytes, error feedback 2m*gamma
    work = (8e6 + 1.6e6 + 4e6 + 8 * 1.6e6 + 8e6) / MEM
    assert detail.compute_time == pytest.approx(work)
    assert time == pytest.approx(6 * A + 5.6e6 * B + CALL + work)
    assert detail.slower_than_dense is True  # the compute eats the saving
    time, detail = compressed_allreduce_time(M, GAMMA, "topk:0.01", Group(8), HW)
    assert detail.slower_than_dense is False and time < DENSE


def test_survey_rule_for_allgather_sparse() -> None:
    # P k (gamma + gamma_idx) < 2 m gamma
    assert sparse_allgather_pays(8, 0.01, 4.0)
    assert not sparse_allgather_pays(128, 0.1, 4.0)
    for P, density in ((8, 0.01), (64, 0.1), (128, 0.1)):
        times = sparse_allreduce_times(1e8, GAMMA, density, Group(P, 8), HW)
        dense = collective_time("allreduce", 4e8, Group(P, 8), HW)
        assert (times["allgather"] < dense) == sparse_allgather_pays(P, density, GAMMA)


def test_arrays_flow_through() -> None:
    m = np.array([1e3, 1e6, 1e9])
    time, detail = compressed_allreduce_time(m, GAMMA, "topk:0.01", Group(16), HW)
    assert time.shape == (3,) and detail.slower_than_dense.dtype == bool
    for i, size in enumerate(m):
        scalar, _ = compressed_allreduce_time(float(size), GAMMA, "topk:0.01", Group(16), HW)
        assert time[i] == pytest.approx(scalar)
    quant, _ = compressed_allreduce_time(m, GAMMA, Compression("fp16", bits=16), Group(16), HW)
    assert quant.shape == (3,)


def test_none_is_dense() -> None:
    time, detail = compressed_allreduce_time(M, GAMMA, "none", Group(8), HW, TEXTBOOK)
    assert time == pytest.approx(DENSE) and detail.compute_time == 0 and detail.slower_than_dense is False
