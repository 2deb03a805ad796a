"""DeepEP and HybridEP transfers at their published bandwidths (dlperf/data/ep_kernels/deepep.yaml,
dlperf.comm.ep_kernels): the README's own case reproduces its measured figure, time grows with bytes, and a
device without a table keeps the NCCL all-to-all model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import dlperf.comm as comm
from dlperf.comm import ep_kernels
from dlperf.engine.context import _alltoall, _kernel_transfer, _transfer, parts_reached
from dlperf.engine.step import _parallel
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware

# HybridEP README, GB200 Platform (deepseek-ai/DeepEP hybrid-ep @94a9f8f): 8 ranks, 4096 tokens x 7168 hidden,
# top-8 of 8 local experts per rank, random uniform router, BF16, 32 SMs, Torch API
README = {"tokens": 4096, "hidden": 7168, "top_k": 8, "experts": 64, "ranks": 8}
MEASURED = {"dispatch_bf16": 545.71e9, "combine": 568.94e9}
PLAN = Plan(devices=8, dp=8, ep=8, global_batch=8, micro_batch=1, moe_imbalance=1.0, ep_dispatcher="hybridep")


def _benchmark_received_bytes(seed: int = 0) -> float:
    """The bytes tests/test_hybrid_ep.py divides (`dispatched_hidden.numel() * 2`), by its own router: each
    token takes the first top_k of a random permutation of the experts, and reaches each rank holding one once."""
    rng = np.random.default_rng(seed)
    experts = rng.random((README["tokens"], README["experts"])).argsort(axis=1)[:, :README["top_k"]]
    ranks = experts // (README["experts"] // README["ranks"])
    reached = sum(len(set(row)) for row in ranks.tolist())
    return reached * README["hidden"] * 2


@pytest.mark.parametrize("column", sorted(MEASURED))
def test_readme_case_reproduces_its_measured_bandwidth(column):
    par = _parallel(comm, load_hardware("gb200-nvl72"), PLAN)
    layer = {"experts": README["experts"], "top_k": README["top_k"]}
    sent = README["tokens"] * README["top_k"] * README["hidden"] * 2  # dlperf's bytes: top_k copies per token
    seconds = _transfer(layer, par, sent, column)
    assert _benchmark_received_bytes() / seconds == pytest.approx(MEASURED[column], rel=0.01)


def test_time_grows_with_bytes_in_proportion():
    par = _parallel(comm, load_hardware("gb200-nvl72"), PLAN)
    layer = {"experts": 64, "top_k": 8}
    times = [_transfer(layer, par, n, "combine") for n in (1e6, 2e6, 4e6, 8e6)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    assert times[-1] == pytest.approx(8 * times[0], rel=1e-12)


@pytest.mark.parametrize("hardware", ["hgx-h200", "dgx-gb300"])
def test_device_without_a_table_keeps_the_nccl_model(hardware):
    par = _parallel(comm, load_hardware(hardware), PLAN)
    layer = {"experts": 64, "top_k": 8}
    assert all(par.ep_kernel(column) is None for column in ep_kernels.COLUMNS)
    assert _transfer(layer, par, 4e6, "combine") == _alltoall(layer, par, 4e6)


def test_h800_deepep_over_rdma_and_bf16_dispatch_fallback():
    """DeepEP's V1 table (docs/legacy.md): EP 16 on H800 is its internode row, 43 GB/s both ways, over one copy
    per node reached; it has no BF16 dispatch figure, so a BF16 dispatch keeps the all-to-all model."""
    h800 = load_hardware("h800")
    plan = PLAN.with_(devices=16, dp=16, ep=16, ep_dispatcher="deepep")
    par = _parallel(comm, h800, plan)
    assert par.ep_nodes == 2 and par.ep_kernel("dispatch_fp8") == par.ep_kernel("combine") == 43e9
    layer = {"experts": 256, "top_k": 8, "groups": 8, "top_groups": 4}
    nodes_reached = 2 * (1 - 1 / 70)  # 4 of 8 groups, 4 per node: all 4 on one node in 1 of C(8,4) = 70 draws
    assert _transfer(layer, par, 8e6, "combine") == pytest.approx(8e6 / 8 * nodes_reached / 43e9, rel=1e-12)
    assert par.ep_kernel("dispatch_bf16") is None
    assert _transfer(layer, par, 8e6, "dispatch_bf16") == _alltoall(layer, par, 8e6)
    assert _transfer(layer, replace(par, ep_kernel=None), 8e6, "combine") == _alltoall(layer, par, 8e6)


def test_closest_row_by_ep_size_then_sms():
    """GB200 HybridEP at EP 64 (beyond the table's 36 ranks) takes the 36-rank row; 20 SMs sits between 16 and
    24 of DeepEP's B200 rows and takes the fewer; the B200 tables never price GB200 nor the reverse."""
    assert ep_kernels.bandwidth("hybridep", "GB200-Blackwell-186GB", "nvlink", 64, 32, "combine") == 447.89e9
    assert ep_kernels.bandwidth("deepep", "B200-SXM-180GB", "nvlink", 8, 20, "combine") == 302e9
    assert ep_kernels.bandwidth("hybridep", "B200-SXM-180GB", "nvlink", 8, 32, "combine") == 530.86e9
    assert ep_kernels.bandwidth("hybridep", "B200-SXM-180GB", "rdma", 16, 32, "combine") is None


@pytest.mark.parametrize(("layer", "parts", "reached"), [
    ({"experts": 256, "top_k": 8, "groups": 8, "top_groups": 4}, 8, 4.0),   # a group per node, 4 chosen
    # 2 groups per node: C(6,4)/C(8,4) of the draws miss a given node
    ({"experts": 256, "top_k": 8, "groups": 8, "top_groups": 4}, 4, 4 * (1 - 15 / 70)),
    ({"experts": 64, "top_k": 8}, 1, 1.0),
])
def test_parts_reached_by_hand(layer, parts, reached):
    assert parts_reached(layer, parts) == pytest.approx(reached, rel=1e-12)


def test_kernel_transfer_counts_one_copy_per_rank_reached():
    layer = {"experts": 64, "top_k": 8}
    par = _parallel(comm, load_hardware("gb200-nvl72"), PLAN)
    seconds = _kernel_transfer(layer, par, 8.0, 1.0)
    assert seconds == pytest.approx(parts_reached(layer, 8)) and 5 < seconds < 6


def test_hierarchical_dispatcher_without_a_table_sends_once_per_node_reached():
    """DGX-B200 has no published HybridEP table across nodes: the all-to-all model prices it, but HybridEP and DeepEP
    still send a token over RDMA once per node it reaches and forward it over NVLink (DeepEP docs/legacy.md
    @dd758caf; README_Hybrid-EP.md @94a9f8f), so the inter-node leg carries nodes reached, not top_k copies; the
    all-to-all dispatcher stays flat. Nemotron 3 Super's routing, 22 of 512 experts on 8 nodes."""
    b200 = load_hardware("dgx-b200")
    layer = {"experts": 512, "top_k": 22}
    plan = PLAN.with_(devices=64, dp=64, ep=64)
    hybrid, flat = (_parallel(comm, b200, plan.with_(ep_dispatcher=d)) for d in ("hybridep", "alltoall"))
    assert hybrid.ep_nodes == 8 and hybrid.ep_kernel("combine") is None
    nodes = parts_reached(layer, 8)
    assert nodes == pytest.approx(8 * (1 - np.prod([(448 - i) / (512 - i) for i in range(22)])), rel=1e-12)
    across, inside = hybrid.ep_alltoall_nodes(8e6 / 22 * nodes), hybrid.ep_alltoall_node(8e6)
    assert _alltoall(layer, hybrid, 8e6) == pytest.approx(max(across, inside), rel=1e-12)
    assert _alltoall(layer, flat, 8e6) == flat.ep_alltoall(8e6)
    assert _alltoall(layer, hybrid, 8e6) < _alltoall(layer, flat, 8e6)
