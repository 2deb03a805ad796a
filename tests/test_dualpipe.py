"""DeepSeek-V3's DualPipe schedule (`--schedule dualpipe`): the report's formulas, invariants against 1F1B, rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dlperf.engine import predict
from dlperf.engine.pipeline import dualpipe_bubble, dualpipe_pairs
from dlperf.engine.step import StepModel
from dlperf.errors import PlanError
from dlperf.plan import Plan
from dlperf.search import SearchSpace, enumerate_plans
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from tests.test_monotone import assert_more_bandwidth_on_any_level_never_slower


@pytest.fixture(scope="module")
def mixtral():
    return load_model("mixtral-8x7b")


@pytest.fixture(scope="module")
def h100():
    return load_hardware("dgx-h100")


# mixtral-8x7b (32 layers, 8 experts) on 64 H100s: ep 8 spans the node's 8 GPUs at tp 1 -- here tp 2, so across two
MOE_PLAN = Plan(devices=64, tp=2, pp=4, ep=8, global_batch=64, micro_batch=1, zero=1, sequence_parallel=True)


def test_pairs_follow_the_reference_schedule():
    """deepseek-ai/DualPipe's step(): every rank runs m forward chunks; the edge rank (0) pairs the fewest. pp = 8,
    m = 20 (the report's Figure 5): steps 4 and 5 give 2 * (10 - 8 + 0 + 1) + 3 = 9 pairs on rank 0, and on the
    middle rank 3: 2 * (10 - 8 + 3 + 1) - 1 + 0 = 11."""
    assert dualpipe_pairs(20, 8, 0) == 9
    assert dualpipe_pairs(20, 8, 3) == 11
    for pp, m in itertools.product((2, 4, 8, 16), (32, 64, 120)):
        pairs = [dualpipe_pairs(m, pp, r) for r in range(pp // 2)]
        assert all(0 < p < m for p in pairs)
        assert min(pairs) == pairs[0]


def test_bubble_never_exceeds_1f1b():
    """(PP/2-1)(F&B + B - 3W) <= (PP-1)(F+B) whenever the overlapped pair is no slower than its two chunks run
    apart (F&B <= F + B) and W is part of B (0 <= W <= B); equal to zero at pp = 2."""
    values = (0.0, 0.3, 1.0, 2.5)
    for pp, f, b in itertools.product((2, 4, 8, 16, 64), values, values):
        for w in (0.0, b / 3, b / 2, b):
            for paired in (0.5 * (f + b), f + b):
                bubble = dualpipe_bubble(paired, b, w, pp)
                assert 0 <= bubble <= (pp - 1) * (f + b) + 1e-12
    assert dualpipe_bubble(3.0, 2.0, 0.1, 2) == 0


@pytest.mark.parametrize("ep", [1, 8])
def test_engine_bubble_and_compute_not_above_1f1b(mixtral, h100, ep):
    """Same stages, same micro-batches: DualPipe's bubble and its exposed all-to-alls are no larger than 1F1B's,
    and its busiest rank computes no more (it averages stage r with stage pp-1-r)."""
    plan = MOE_PLAN.with_(ep=ep)
    one = predict(mixtral, h100, plan).breakdown_s
    dual = predict(mixtral, h100, plan.with_(schedule="dualpipe")).breakdown_s
    assert dual["pipeline/bubble"] <= one["pipeline/bubble"]
    assert dual["comm/ep"] <= one["comm/ep"]
    assert dual["comm/pp_p2p"] <= one["comm/pp_p2p"]
    for part in ("compute/forward", "compute/backward"):
        assert dual[part] <= one[part] * (1 + 1e-12)
    if ep == 1:
        assert dual["comm/ep"] == 0


def test_all_to_all_hides_behind_the_paired_chunk(mixtral, h100):
    """With ep > 1 most of the expert all-to-all is hidden: only the unpaired warm-up/cool-down chunks expose all
    of theirs, so the exposed share is at least their share of chunks and less than all of it."""
    plan = MOE_PLAN.with_(schedule="dualpipe")
    exposed = predict(mixtral, h100, plan).breakdown_s["comm/ep"]
    unpaired = predict(mixtral, h100, MOE_PLAN).breakdown_s["comm/ep"]  # 1F1B exposes every all-to-all
    m, pp = plan.micro_batches, plan.pp
    alone = m - dualpipe_pairs(m, pp, 0)
    assert alone / m * unpaired * 0.5 <= exposed < unpaired


def test_breakdown_sums_to_step(mixtral, h100):
    r = predict(mixtral, h100, MOE_PLAN.with_(schedule="dualpipe"))
    assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert sum(r.per_type_s.values()) == pytest.approx(
        r.breakdown_s["compute/forward"] + r.breakdown_s["compute/backward"], rel=1e-9)


def test_memory_two_copies_and_pp_plus_one(mixtral, h100):
    """Table 2: 2x parameters per device, PP+1 micro-batches of activations (1F1B: 1x and PP). Mixtral's stages
    differ only by the embedding (first) and the head (last), so the pair (0, pp-1) holds just under twice the
    heaviest stage's weights."""
    plan = MOE_PLAN.with_(zero=0)
    one = predict(mixtral, h100, plan).memory
    dual = predict(mixtral, h100, plan.with_(schedule="dualpipe")).memory
    assert 1.8 < dual["weights"] / one["weights"] <= 2.0
    assert 1.8 < dual["gradients"] / one["gradients"] <= 2.0
    # activations: the 1F1B first stage keeps pp micro-batches, a DualPipe rank pp+1 chunks of its two stages
    assert dual["activations"] > one["activations"]
    assert dual["activations"] / one["activations"] < (plan.pp + 1) / plan.pp * 1.2


def test_more_bandwidth_never_slower(mixtral, h100):
    assert_more_bandwidth_on_any_level_never_slower(mixtral, h100, MOE_PLAN.with_(schedule="dualpipe"))


def test_grid_equals_timeline(mixtral, h100):
    plan = MOE_PLAN.with_(schedule="dualpipe")
    model = StepModel(mixtral, h100)
    batches = [64, 96, 128, 32, 48]  # dp 8: m = 8, 12, 16 valid; 4 and 6 under 2*pp = 8
    grid = model.grid(plan, batches)
    for gb, step in zip(batches, grid["step_time_s"], strict=True):
        m = gb // plan.data_parallel
        if m % 2 or m < 2 * plan.pp:
            assert np.isnan(step)
        else:
            assert step == pytest.approx(model.timeline(plan.with_(global_batch=gb)).step_time_s, rel=1e-12)


def test_existing_schedules_untouched_by_dualpipe_pricing(mixtral, h100):
    """Pricing a DualPipe plan first must not change a 1F1B or interleaved plan priced after it (shared caches)."""
    fresh = {s: predict(mixtral, h100, MOE_PLAN.with_(schedule=s, virtual_stages=v)).step_time_s
             for s, v in (("1f1b", 1), ("interleaved", 2))}
    model = StepModel(mixtral, h100)
    model.timeline(MOE_PLAN.with_(schedule="dualpipe"))
    for (s, v), t in zip((("1f1b", 1), ("interleaved", 2)), fresh.values(), strict=True):
        assert model.timeline(MOE_PLAN.with_(schedule=s, virtual_stages=v)).step_time_s == t


@pytest.mark.parametrize(("changes", "message"), [
    ({"pp": 1, "tp": 8}, "needs an even pp >= 2"),
    ({"global_batch": 56}, "even number of micro-batches, at least 2\\*pp = 8"),   # m = 7
    ({"global_batch": 48}, "even number of micro-batches"),                          # m = 6 < 8
    ({"recompute": "full"}, "does not combine with full recomputation"),
])
def test_rules(mixtral, h100, changes, message):
    with pytest.raises(PlanError, match=message):
        predict(mixtral, h100, MOE_PLAN.with_(schedule="dualpipe", **changes))


def test_odd_pp_refused(mixtral, h100):
    with pytest.raises(PlanError, match="even pp"):
        predict(load_model("mixtral-8x7b", {"layers": 30}), h100,
                Plan(devices=48, tp=2, pp=3, ep=8, global_batch=96, micro_batch=1, schedule="dualpipe"))


@pytest.mark.parametrize("args", [
    ["--pp", "4", "--global-batch", "56"],     # 7 micro-batches per replica
    ["--pp", "1", "--tp", "8", "--global-batch", "64"],
])
def test_cli_bad_input_one_line_exit_2(capsys, args):
    from dlperf.cli import main

    with pytest.raises(SystemExit) as bad:
        main(["predict", "mixtral-8x7b", "dgx-h100", "--gpus", "64", "--tp", "2", "--ep", "8", "--micro-batch", "1",
              "--schedule", "dualpipe", *args])
    assert bad.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: ") and "dualpipe" in err and "\n" not in err


def test_search_tries_dualpipe_only_with_expert_parallelism(mixtral):
    space = SearchSpace(zero=(1,), recompute=("none", "full"), sequence_parallel=(False,))
    plans = list(enumerate_plans(Plan(devices=64, global_batch=128), 8, 8, 32, space, experts=8))
    dual = [p for p in plans if p.schedule == "dualpipe"]
    assert dual and all(p.ep > 1 and p.pp % 2 == 0 and p.recompute == "none" and not p.ep_overlap for p in dual)
    assert all(p.micro_batches % 2 == 0 and p.micro_batches >= 2 * p.pp for p in dual)
    dense = list(enumerate_plans(Plan(devices=64, global_batch=128), 8, 8, 32, space, experts=0))
    assert not any(p.schedule == "dualpipe" for p in dense)


def test_step_is_set_by_the_busiest_rank():
    """DeepSeek-V3's 61 layers split over pp 4 unevenly (balanced partition): the step's compute is the largest of
    the ranks' (each rank holds stages r and pp-1-r and pairs a different number of chunks)."""
    from dataclasses import replace

    from dlperf.engine.step import _dualpipe_chunks, _dualpipe_time, _overlap_contention

    model, hw = load_model("deepseek-v3", {"layers": 13, "dense_layers": 1}), load_hardware("h800")
    hw = replace(hw, device=replace(hw.device, speed_spread=0.0))  # each rank's own pace (test_straggler: the slowest)
    plan = Plan(devices=256, pp=4, ep=32, global_batch=512, micro_batch=1, zero=1, schedule="dualpipe")
    engine = StepModel(model, hw)
    r = engine.predict(plan)
    stages = engine.stages(plan, "bf16", 2)[0]
    devices = engine._twin_devices(stages, plan.pp)
    twin = plan.with_(dp=2 * plan.data_parallel)
    stolen = _overlap_contention(hw, plan.ep)
    t_p2p = engine._p2p_time(plan, 2, engine.stages(plan, "bf16", 2)[3])
    per_rank = [sum(_dualpipe_time(_dualpipe_chunks(hw, twin, d, "bf16", 1.0, stolen), d, plan.micro_batches,
                                   plan.pp, rank, t_p2p)[:3]) for rank, d in enumerate(devices)]
    compute = sum(v for k, v in r.breakdown_s.items() if k not in ("comm/dp_allreduce", "optimizer"))
    assert len(set(per_rank)) > 1
    assert compute == pytest.approx(max(per_rank), rel=1e-9)


# A small GPT (8 layers, hidden 1024): 12h^2 + 13h parameters per layer, embeddings (vocab + seq) h on the first
# stage, the final LayerNorm (2h) on the last, the output layer tied to the embedding (models/gpt.yaml).
GPT_SET = {"layers": 8, "hidden": 1024, "heads": 16, "seq": 1024}


def _gpt_params_by_stage(pp: int) -> list[int]:
    h, s, vocab, layers = 1024, 1024, 50257, 8
    per_stage = layers // pp * (12 * h * h + 13 * h)
    return [per_stage + (vocab + s) * h * (r == 0) + 2 * h * (r == pp - 1) for r in range(pp)]


def _slower_network(hw, level: int, factor: float):
    from dataclasses import replace

    network = list(hw.network)
    network[level] = replace(network[level], bandwidth=network[level].bandwidth / factor)
    return replace(hw, network=tuple(network))


@pytest.mark.parametrize(("pp", "crosses"), [(8, True), (4, False)])
def test_twin_group_reduces_where_its_members_sit(pp, crosses):
    """tp 1, dp 2: a twin group of 2 * tp * dp = 4 ranks, which fits in a DGX's 8 GPUs. Ranks are laid out tp,
    dp, then pp (pipeline rank r on devices 2r, 2r+1), so at pp 8 rank r's mirror 7-r sits on the other node: the
    group is two GPUs on each of two nodes and its allreduce (exposed: pp > 1, no overlap) pays InfiniBand; at pp
    4 the whole pipeline is one node and the group stays on NVLink. Hand count: the largest over the ranks of
    the bf16 gradient allreduce of the rank's two stages over its four devices."""
    from dlperf.comm import Group, collective_time

    model, hw = load_model("gpt", GPT_SET), load_hardware("dgx-a100")
    plan = Plan(devices=2 * pp, tp=1, pp=pp, global_batch=4 * pp, micro_batch=1, schedule="dualpipe", dtype="bf16")
    params = _gpt_params_by_stage(pp)

    def expected(hw):
        return max(collective_time("allreduce", 2 * (params[r] + params[pp - 1 - r]),
                                   Group(4, devices=(2 * r, 2 * r + 1, 2 * (pp - 1 - r), 2 * (pp - 1 - r) + 1)), hw)
                   for r in range(pp // 2))

    exposed = predict(model, hw, plan).breakdown_s["comm/dp_allreduce"]
    assert exposed == pytest.approx(expected(hw), rel=1e-9)
    slow_ib = _slower_network(hw, 1, 2.0)
    again = predict(model, slow_ib, plan).breakdown_s["comm/dp_allreduce"]
    assert again == pytest.approx(expected(slow_ib), rel=1e-9)
    inside = max(collective_time("allreduce", 2 * (params[r] + params[pp - 1 - r]), Group(4), hw)
                 for r in range(pp // 2))
    if crosses:  # half the InfiniBand bandwidth: a slower reduction, well above the one-node group's
        assert again > 1.5 * exposed and exposed > 2 * inside
    else:
        assert again == exposed == pytest.approx(inside, rel=1e-12)


def _chunks_in_flight(pp: int, m: int, rank: int) -> tuple[int, int]:
    """The most chunks rank `rank` (< pp/2) holds through each of its two stages, walking the eight steps of
    deepseek-ai/DualPipe dualpipe/dualpipe.py @3da1bbe (DualPipe.step): a forward chunk of phase p keeps its
    activations until that micro-batch's backward chunk of phase p; phase 0 is stage `rank`, phase 1 stage
    pp-1-rank. Returns the counts at the moment the total peaks, checking each count peaks there too."""
    half, held, seen = pp // 2, [0, 0], []

    def run(*chunks: tuple[str, int]) -> None:
        for kind, phase in chunks:
            held[phase] += 1 if kind == "F" else -1
            seen.append(tuple(held))

    for _ in range(2 * (half - rank - 1)):
        run(("F", 0))
    for _ in range(rank + 1):
        run(("F", 0), ("F", 1))
    for _ in range(half - rank - 1):
        run(("B", 1), ("F", 1))
    for _ in range(m // 2 - pp + rank + 1):
        run(("F", 0), ("B", 1), ("F", 1), ("B", 0))
    for _ in range(half - rank - 1):
        run(("B", 1), ("F", 1), ("B", 0))
    for _ in range(rank + 1):
        run(("B", 1), ("B", 0))
    for _ in range(half - rank - 1):
        run(("B", 0))
    assert held == [0, 0]
    peak = max(seen, key=sum)
    assert peak == (max(a for a, _ in seen), max(b for _, b in seen))
    return peak


def test_memory_is_the_fullest_ranks_own_sum():
    """Hand count on a small GPT at pp 4, dp 2, ZeRO-1, bf16 Adam: rank 0 holds stages 0 (embeddings) and 3 and is
    the fullest. Weights and gradients: 2 bytes for each parameter of both stages; optimizer: 12 bytes (fp32 master,
    two moments) sharded over the twin group of 2 * dp = 4. Activations: each stage's per-micro-batch activations
    times the chunks in flight through it at the rank's peak (pp-r through stage r, r+1 through stage pp-1-r: PP+1
    in all, Table 2), the larger over the ranks -- not PP+1 times the two stages' average, which a last stage
    holding the output layer's logits (50257 per token, against 1024 per token for a layer's outputs) overstates."""
    model, hw = load_model("gpt", GPT_SET), load_hardware("dgx-a100")
    pp, m = 4, 8
    plan = Plan(devices=8, tp=1, pp=pp, global_batch=2 * m, micro_batch=1, zero=1, schedule="dualpipe",
                dtype="bf16")
    memory = predict(model, hw, plan).memory
    params = _gpt_params_by_stage(pp)
    held = params[0] + params[3]
    assert memory["weights"] == pytest.approx(2 * held, rel=1e-12)
    assert memory["gradients"] == pytest.approx(2 * held, rel=1e-12)
    assert memory["optimizer"] == pytest.approx(12 * held / 4, rel=1e-12)
    counts = [_chunks_in_flight(pp, m, r) for r in range(pp // 2)]
    assert counts == [(4, 1), (3, 2)]
    saved = [s.saved_bytes for s in StepModel(model, hw).stages(plan, "bf16", 2)[0]]
    acts = max(a * saved[r] + b * saved[pp - 1 - r] for r, (a, b) in enumerate(counts))
    assert memory["activations"] == pytest.approx(acts, rel=1e-12)
    assert saved[3] > 1.5 * saved[0]  # the logits: the averaged count, (pp+1)/2 * (A0 + A3), is 22% more here
    assert (pp + 1) * (saved[0] + saved[3]) / 2 > 1.2 * acts


def test_twin_groups_with_context_and_expert_parallelism():
    """tp 2, cp 2, dp 4, ep 4, pp 4: a pipeline rank is 16 devices. The dense twin group of rank 0 is its dp*cp = 8
    replicas 2 (tp) apart plus rank 3's; the experts' is dp*cp/ep = 2 replicas per rank, tp*ep = 8 apart
    (Megatron-Core's expert ranks: tp, ep, then dp, cp folded in), each half inside its own pipeline rank's devices
    (a stride of tp*cp*ep = 16 would have put rank 1's second replica on rank 2, which holds its mirror)."""
    from dlperf.comm import place_group
    from dlperf.comm import topology as comm
    from dlperf.engine.step import _dense_group, _expert_group, _replicas, _twin_starts

    hw = load_hardware("dgx-h100")
    plan = Plan(devices=64, tp=2, cp=2, pp=4, ep=4, global_batch=64, micro_batch=1, zero=1, schedule="dualpipe")
    twin = plan.with_(dp=2 * plan.data_parallel)
    starts = _twin_starts(plan)
    assert starts == [(0, 48, 16), (16, 32, 16)]
    dense = [_replicas(comm, hw, _dense_group(twin), t)[0].devices for t in starts]
    experts = [_replicas(comm, hw, _expert_group(twin), t)[0].devices for t in starts]
    assert dense[0] == (*range(0, 16, 2), *range(48, 64, 2))
    assert experts == [(0, 8, 48, 56), (16, 24, 32, 40)]
    # 8 apart on 8-GPU nodes: one member per node, four nodes
    assert place_group(comm.Group(4, devices=experts[1]), hw).placement.members == (1, 4)
    assert predict(load_model("mixtral-8x7b"), hw, plan).step_time_s > 0
