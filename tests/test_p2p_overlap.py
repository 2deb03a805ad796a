"""Pipeline sends overlapped with compute in interleaved 1F1B (Megatron-Core overlap_p2p_comm, plan.p2p_overlap):
dlperf.engine.pipeline.overlapped_p2p against a hand count of NVIDIA/Megatron-LM @3758b54b's schedule, the
blocking pricing it must never exceed, and the plan rule and validation rows that go with it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dlperf.engine import predict
from dlperf.engine.pipeline import interleaved_warmup, overlapped_p2p, schedule_time
from dlperf.errors import PlanError
from dlperf.plan import Plan
from dlperf.search import enumerate_plans
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from dlperf.validate import DATA_DIR, load_dataset


def test_warmup_is_megatron_ranks_zero_count():
    # get_pp_rank_microbatches, schedules.py:821-822 @3758b54b: (pp - 0 - 1) * 2 + (v - 1) * pp on rank 0
    assert interleaved_warmup(8, 4, 2) == 3 * 2 + 1 * 4
    assert interleaved_warmup(384, 16, 8) == 15 * 2 + 7 * 16
    assert interleaved_warmup(2, 4, 2) == 4  # at most every chunk of every micro-batch (v * m)


def test_hand_count_for_a_small_plan():
    # pp 4, v 2, m 8: 16 chunk passes each way. Rank 0 warms up with 10 forward chunks and cools down with 10
    # backward ones, sending after each with a blocking call: 20 exposed transfers, plus the fill and drain over
    # 3 boundaries each (6). The 6 steady iterations each hide one activation transfer behind a backward chunk
    # (t_bwd / v = 2.0) and one gradient transfer behind a forward chunk (t_fwd / v = 1.0).
    t_fwd, t_bwd, t_p2p, stolen = 2.0, 4.0, 0.5, 0.1
    _, _, exposed = schedule_time(t_fwd, t_bwd, t_p2p, 8, 4, 2, stolen)
    assert exposed == pytest.approx(26 * 0.5 + 6 * (0.1 * 0.5 + 0.1 * 0.5))
    # a transfer longer than its chunk shows what outlasts it: 1.5 beside a 1.0 forward chunk, 2.0 beside 2.0
    _, _, long = schedule_time(t_fwd, t_bwd, 1.5, 8, 4, 2, 0.0)
    assert long == pytest.approx(26 * 1.5 + 6 * (0.0 + 0.5))


def test_off_is_the_blocking_count():
    for m, pp, v in [(8, 4, 2), (384, 16, 8), (1, 2, 1), (12, 3, 1)]:
        assert schedule_time(2.0, 4.0, 0.25, m, pp, v)[2] == 2 * (v * m + pp - 1) * 0.25
    assert schedule_time(2.0, 4.0, 0.25, 8, 1, 1, 0.1)[2] == 0.0  # no pipeline, nothing sent


@pytest.mark.parametrize("stolen", [0.0, 0.15, 1.0])
def test_overlap_never_costs_more_than_blocking(stolen):
    grid = itertools.product([0.1, 1.0, 10.0], [0.1, 2.0, 30.0], [0.01, 1.0, 50.0], [1, 4, 16, 384], [2, 4, 16],
                             [1, 2, 8])
    for t_fwd, t_bwd, t_p2p, m, pp, v in grid:
        blocking = schedule_time(t_fwd, t_bwd, t_p2p, m, pp, v)[2]
        overlapped = schedule_time(t_fwd, t_bwd, t_p2p, m, pp, v, stolen)[2]
        assert overlapped <= blocking * (1 + 1e-12), (t_fwd, t_bwd, t_p2p, m, pp, v)
        if v * m <= interleaved_warmup(m, pp, v):  # every chunk in the warm-up: every send blocks
            assert overlapped == pytest.approx(blocking)


def test_overlap_takes_micro_batch_arrays():
    m = np.array([8.0, 16.0, 384.0])
    out = overlapped_p2p(2.0, 4.0, 0.5, m, 4, 2, 0.1)
    assert out == pytest.approx([overlapped_p2p(2.0, 4.0, 0.5, float(x), 4, 2, 0.1) for x in m])


@pytest.fixture(scope="module")
def gpt_on_a100():
    return load_model("gpt"), load_hardware("dgx-a100")


def test_engine_prices_the_hand_count(gpt_on_a100):
    model, hw = gpt_on_a100
    # 16 GPUs, pp 4 x dp 4: each boundary's 4 replicas sit inside a node of 8 until every other boundary leaves
    # it over InfiniBand, whose 16 NCCL channels (hardware/dgx-a100.yaml) take 16 of the A100's 108 SMs.
    plan = Plan(devices=16, pp=4, global_batch=32, micro_batch=1, schedule="interleaved", virtual_stages=2)
    off = predict(model, hw, plan)
    on = predict(model, hw, plan.with_(p2p_overlap=True))
    t_p2p = off.breakdown_s["comm/pp_p2p"] / (2 * (2 * 8 + 4 - 1))
    assert t_p2p < off.breakdown_s["compute/forward"] / (8 * 2)  # each transfer fits beside its chunk
    assert on.breakdown_s["comm/pp_p2p"] == pytest.approx((2 * (10 + 3) + 2 * 6 * 16 / 108) * t_p2p)
    assert on.step_time_s == pytest.approx(off.step_time_s - off.breakdown_s["comm/pp_p2p"]
                                           + on.breakdown_s["comm/pp_p2p"])


def test_p2p_overlap_needs_the_interleaved_schedule(gpt_on_a100):
    model, hw = gpt_on_a100
    with pytest.raises(PlanError, match="needs --schedule interleaved"):
        predict(model, hw, Plan(devices=16, pp=4, global_batch=32, micro_batch=1, p2p_overlap=True))


def test_search_keeps_the_overlap_where_megatron_has_it():
    base = Plan(devices=8, global_batch=64, p2p_overlap=True)
    plans = list(enumerate_plans(base, 8, 16, 24))
    assert any(p.p2p_overlap for p in plans)
    assert all(p.p2p_overlap == (p.schedule == "interleaved") for p in plans)


def test_bridge_rows_overlap_exactly_when_interleaved():
    # Megatron-Bridge comm_overlap.py:453-463 @0a25f911: overlap_p2p_comm iff pp > 1 and vp > 1
    rows = [r for r in load_dataset([DATA_DIR / "megatron_bridge.yaml"]) if r.source == "megatron-bridge-perf"]
    assert rows
    for row in rows:
        interleaved = row.plan.pp > 1 and row.plan.schedule == "interleaved"
        assert row.plan.p2p_overlap == interleaved, row.id


def test_other_sources_keep_blocking_sends():
    # Megatron-LM added overlap_p2p_comm on 2023-05-31 (f9283c5a); the 2021/2022 papers, BLOOM's
    # Megatron-DeepSpeed and torchgpipe send with blocking calls
    rows = [r for path in sorted(DATA_DIR.glob("*.yaml")) if path.name != "megatron_bridge.yaml"
            for r in load_dataset([path])]
    assert rows and not any(r.plan.p2p_overlap for r in rows)
