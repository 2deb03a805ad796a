"""jean-zay-a100, the fabric of the BigScience tr11 (BLOOM) topology search, against dgx-a100.

The two files describe the same GPU and the same NVSwitch node; only the inter-node level differs (4x 100 Gb/s
Omni-Path shared by 8 GPUs at the busbw measured on Jean Zay, against one 200 Gb/s HDR NIC per GPU). So any plan
is at least as slow on Jean Zay, and giving Omni-Path more bandwidth or efficiency never slows a plan down.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.engine import predict
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from dlperf.validate import load_dataset

SOURCE = "bigscience-tr11-prequel"


@functools.cache
def bloom_rows() -> tuple:
    return tuple(r for r in load_dataset() if r.source == SOURCE)


@functools.cache
def model_for(sets: tuple):
    return load_model("gpt", dict(sets))


def step(row, hw) -> float:
    return float(predict(model_for(tuple(sorted(row.sets.items()))), hw, row.plan).step_time_s)


def same_host(hw, like):
    """`hw` with the host time per launch of `like` (Jean Zay's EPYC 7543 is faster per thread than DGX A100's
    EPYC 7742: device.host), so that only the fabric differs."""
    device = dataclasses.replace(hw.device, dispatch_forward=like.device.dispatch_forward,
                                 dispatch_backward=like.device.dispatch_backward, host_cpu=like.device.host_cpu,
                                 host_speed=like.device.host_speed, host_cores=like.device.host_cores)
    return dataclasses.replace(hw, device=device)


def test_rows_run_on_jean_zay_and_it_differs_from_dgx_a100_only_across_nodes_and_in_its_host() -> None:
    rows = bloom_rows()
    assert len(rows) == 56 and {r.hardware for r in rows} == {"jean-zay-a100"}
    jz, dgx = load_hardware("jean-zay-a100"), load_hardware("dgx-a100")
    assert jz.device.dispatch_forward < dgx.device.dispatch_forward
    assert jz.device == same_host(dgx, jz).device and jz.network[0] == dgx.network[0]
    opa = jz.network[1]
    assert (opa.bandwidth, opa.links_per_domain) == (100e9 / 8, 4)  # 4x 100 Gb/s per 8-GPU node


def test_every_bloom_plan_is_at_least_as_slow_on_jean_zay_as_on_dgx_a100_with_its_host() -> None:
    jz = load_hardware("jean-zay-a100")
    dgx = same_host(load_hardware("dgx-a100"), jz)
    for row in bloom_rows():
        assert step(row, jz) >= step(row, dgx) * (1 - 1e-9), row.id


@settings(max_examples=20, deadline=None, derandomize=True)
@given(index=st.integers(min_value=0, max_value=55), field=st.sampled_from(["bandwidth", "efficiency"]),
       factor=st.sampled_from([1.5, 2.0, 4.0, 9.9]))
def test_a_better_omni_path_never_makes_a_bloom_plan_slower(index: int, field: str, factor: float) -> None:
    row = bloom_rows()[index]
    jz = load_hardware("jean-zay-a100")
    opa = jz.network[1]
    better = dataclasses.replace(opa, **{field: getattr(opa, field) * factor})
    assert better.efficiency <= 1
    faster = dataclasses.replace(jz, network=(jz.network[0], better))
    assert step(row, faster) <= step(row, jz) * (1 + 1e-9)


def test_data_parallel_heavier_plans_pay_more_for_the_fabric() -> None:
    """The gradient all-reduce crosses Omni-Path once per step: the bytes a device reduces grow as parameters /
    (tp x pp), so DP 24 x PP 2 slows down more against dgx-a100 than DP 8 x PP 6 at the same TP 8 (02-25 rows)."""
    rows = {r.id: r for r in bloom_rows()}
    light = rows["bloom-prequel-02-25-h14336-l72-a64-dp8-tp8-pp6-mb4-gbs2048"]
    heavy = rows["bloom-prequel-02-25-h14336-l72-a64-dp24-tp8-pp2-mb2-gbs2016"]
    jz, dgx = load_hardware("jean-zay-a100"), load_hardware("dgx-a100")
    assert step(heavy, jz) / step(heavy, dgx) > step(light, jz) / step(light, dgx)


def _p2p(row, hw) -> float:
    return float(predict(model_for(tuple(sorted(row.sets.items()))), hw, row.plan).breakdown_s["comm/pp_p2p"])


def test_a_node_crossing_stage_boundary_shares_the_nodes_links() -> None:
    """A stage spans tp x dp >= 8 devices, so all 8 GPUs of a node send their activations across the boundary at
    once: 4 links of 100 Gb/s serve them as 8 links of 50 Gb/s would, and less well than a 100 Gb/s rail each."""
    row = {r.id: r for r in bloom_rows()}["bloom-prequel-02-25-h14336-l72-a64-dp8-tp8-pp6-mb4-gbs2048"]
    jz = load_hardware("jean-zay-a100")
    opa = jz.network[1]

    def with_opa(**changes):
        return dataclasses.replace(jz, network=(jz.network[0], dataclasses.replace(opa, **changes)))

    shared = _p2p(row, jz)
    assert shared == pytest.approx(_p2p(row, with_opa(links_per_domain=8, bandwidth=opa.bandwidth / 2)), rel=1e-12)
    assert shared > _p2p(row, with_opa(links_per_domain=None))


def test_stages_smaller_than_a_node_pay_the_boundary_that_leaves_it() -> None:
    """tp 4 x pp 12: two stages per 8-GPU node, so every other boundary crosses Omni-Path with the stage's four
    devices sending at once; it sets the pipeline's pace (it was priced on NVSwitch, 40x faster than tp 8's)."""
    from dlperf.comm import engine as comm
    from dlperf.engine.step import _p2p_time
    from dlperf.plan import Plan

    hw = load_hardware("jean-zay-a100")
    boundary = 2048 * 14336
    small, whole = (_p2p_time(boundary, hw, Plan(devices=12 * tp, tp=tp, pp=12, global_batch=12, micro_batch=1), 2,
                              comm) for tp in (4, 8))
    assert small > 0.5 * whole
    omni_path = dataclasses.replace(hw.network[1], bandwidth=2 * hw.network[1].bandwidth)
    faster = dataclasses.replace(hw, network=(hw.network[0], omni_path))
    assert _p2p_time(boundary, faster, Plan(devices=48, tp=4, pp=12, global_batch=12, micro_batch=1), 2, comm) < small


def test_sequence_parallel_boundaries_send_the_slice_and_gather_nothing() -> None:
    """Under sequence parallelism each tp rank sends its 1/tp of the sequence across the boundary and the next
    stage keeps it sharded: the transfer is the scatter/gather one less its allgather (Megatron-LM sends
    [s/tp, b, h] and scatter-gathers only without sequence parallelism)."""
    from dlperf.comm import engine as comm
    from dlperf.engine.step import _p2p_route, _p2p_time
    from dlperf.plan import Plan

    hw = load_hardware("jean-zay-a100")
    boundary = 2048 * 14336
    plan = Plan(devices=48, tp=4, pp=12, global_batch=12, micro_batch=1)
    sp = plan.with_(sequence_parallel=True)
    gather = comm.collective_time("allgather", 2 * boundary, comm.Group(4, 1), hw)
    assert _p2p_time(boundary, hw, plan, 2, comm) == pytest.approx(_p2p_time(boundary, hw, sp, 2, comm) + gather)
    assert _p2p_time(boundary, hw, sp, 2, comm) == comm.p2p_time(2 * boundary / 4, hw, *_p2p_route(hw, sp))
