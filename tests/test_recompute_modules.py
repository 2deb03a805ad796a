"""Partial recomputation (recompute_modules), FP8 activation caching, the DeepEP dispatcher (DeepSeek-V3,
arXiv:2412.19437 Sec. 3.2.2, 3.2.3, 3.3.3) and HybridEP (dlperf.engine.context.HYBRIDEP_SMS): invariants, the
exact bytes they free, and one-line errors."""

from __future__ import annotations

import itertools

import pytest

from dlperf.engine import predict
from dlperf.ops.recompute import E5M6, FP8_TILED, freed_bytes, norm_consumers
from dlperf.plan import RECOMPUTE_MODULES, Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from tests.test_monotone import assert_more_bandwidth_on_any_level_never_slower

# two nodes of 8 in the ep group (ep ranks 1 apart): the hierarchical dispatch's IB and NVLink legs both run
PLAN = Plan(devices=64, dp=32, pp=2, ep=16, global_batch=128, micro_batch=1, zero=1, dtype="fp8",
            moe_imbalance=1.0)


@pytest.fixture(scope="module")
def model():
    return load_model("deepseek-v3", {"layers": 6, "dense_layers": 2, "seq": 1024})


@pytest.fixture(scope="module")
def h800():
    return load_hardware("h800")


def _subsets():
    for n in range(len(RECOMPUTE_MODULES) + 1):
        yield from itertools.combinations(RECOMPUTE_MODULES, n)


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipe"])
def test_recomputing_more_never_faster_never_more_memory(model, h800, schedule):
    results = {m: predict(model, h800, PLAN.with_(schedule=schedule, recompute_modules=m)) for m in _subsets()}
    for small, large in itertools.product(results, repeat=2):
        if set(small) < set(large):
            a, b = results[small], results[large]
            assert b.step_time_s >= a.step_time_s * (1 - 1e-12), (small, large)
            assert b.memory["activations"] <= a.memory["activations"] * (1 + 1e-12), (small, large)
    none, every = results[()], results[RECOMPUTE_MODULES]
    assert every.step_time_s > none.step_time_s and every.memory["activations"] < none.memory["activations"]
    assert every.breakdown_s["compute/recompute"] > 0


def test_fp8_activations_never_more_memory_same_time(model, h800):
    for modules in _subsets():
        plain = predict(model, h800, PLAN.with_(recompute_modules=modules))
        cached = predict(model, h800, PLAN.with_(recompute_modules=modules, fp8_activations=True))
        assert cached.memory["activations"] < plain.memory["activations"]
        assert cached.step_time_s == pytest.approx(plain.step_time_s, rel=1e-12)  # casts already priced


def test_freed_bytes_count_the_report_tensors(model):
    """MLA: up-projection recompute frees per-head Q, K, V; FP8 caching the linear inputs (latents, input in FP8
    with 1x128 scales, the output projection's input in E5M6). MoE: moe_act frees one f per routed copy and the
    shared experts' activation."""
    mla = next(layer for layer, _ in model.counted() if layer.op == "mla")
    moe = next(layer for layer, _ in model.counted() if layer.op == "moe")
    s, d, h = 1024, 7168, 128
    assert freed_bytes(mla, 2, frozenset({"mla_up_proj"}), False, True) == s * 2 * (2 * h * 192 + h * 128)
    assert freed_bytes(mla, 2, frozenset({"layernorm"}), False, True) == s * 2 * d
    assert freed_bytes(mla, 2, frozenset({"layernorm"}), False, False) == 0
    assert freed_bytes(mla, 2, frozenset(), True, False) == pytest.approx(
        s * ((2 - FP8_TILED) * (d + 1536 + 512) + (2 - E5M6) * h * 128))
    assert freed_bytes(moe, 2, frozenset({"moe_act"}), False, False) == s * 2 * (8 * 2048 + 2048)
    assert {layer.op for layer in norm_consumers(model.root)} >= {"mla", "moe"}


def test_fp8_dispatch_never_slower_than_bf16(model, h800):
    for schedule in ("1f1b", "dualpipe"):
        plan = PLAN.with_(schedule=schedule)
        bf16 = predict(model, h800, plan.with_(ep_dispatcher="deepep", dtype="bf16"))
        fp8 = predict(model, h800, plan.with_(ep_dispatcher="deepep"))
        assert fp8.breakdown_s["comm/ep"] < bf16.breakdown_s["comm/ep"]


def test_deepep_overlapped_legs_never_slower_all_to_all(model, h800):
    """Both in BF16: the overlapped legs (max) never take longer than the same legs in sequence (sum)."""
    plan = PLAN.with_(dtype="bf16")
    nccl = predict(model, h800, plan).breakdown_s["comm/ep"]
    deepep = predict(model, h800, plan.with_(ep_dispatcher="deepep")).breakdown_s["comm/ep"]
    assert deepep < nccl


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep", "hybridep"])
def test_more_bandwidth_never_slower(model, h800, dispatcher):
    plan = PLAN.with_(schedule="dualpipe", ep_dispatcher=dispatcher, recompute_modules=RECOMPUTE_MODULES,
                      fp8_activations=True)
    assert_more_bandwidth_on_any_level_never_slower(model, h800, plan)


def test_plans_without_the_options_unchanged(model, h800):
    """The defaults are the options off: an explicit off plan equals the default one."""
    plain = predict(model, h800, PLAN)
    off = predict(model, h800, PLAN.with_(recompute_modules=(), fp8_activations=False, ep_dispatcher="alltoall"))
    assert off.step_time_s == plain.step_time_s and off.memory == plain.memory


@pytest.mark.parametrize("args, words", [
    (["--recompute-modules", "layernorm,attention"], "recompute_modules"),
    (["--recompute-modules", "layernorm,layernorm"], "recompute_modules"),
    (["--recompute-modules", "layernorm", "--recompute", "full"], "full recomputation"),
    (["--fp8-activations", "--dtype", "bf16"], "--dtype fp8"),
    (["--ep-dispatcher", "deepep", "--ep", "1"], "ep > 1"),
    (["--ep-dispatcher", "hybridep", "--ep", "1"], "ep > 1"),
    (["--ep-dispatcher", "hybrid-ep", "--ep", "8"], "--ep-dispatcher"),
])
def test_cli_bad_input_one_line_exit_2(capsys, args, words):
    from dlperf.cli import main

    with pytest.raises(SystemExit) as bad:
        main(["predict", "mixtral-8x7b", "dgx-h100", "--gpus", "64", "--tp", "2", "--micro-batch", "1",
              "--global-batch", "64", *args])
    assert bad.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: ") and words in err and "\n" not in err


def test_grid_equals_timeline_with_the_options(model, h800):
    from dlperf.engine.step import StepModel

    plan = PLAN.with_(schedule="dualpipe", recompute_modules=RECOMPUTE_MODULES, fp8_activations=True,
                      ep_dispatcher="deepep")
    steps = StepModel(model, h800)
    batches = [128, 256]
    grid = steps.grid(plan, batches)
    for gb, step in zip(batches, grid["step_time_s"], strict=True):
        assert step == pytest.approx(steps.timeline(plan.with_(global_batch=gb)).step_time_s, rel=1e-12)


def test_search_tries_the_options_only_where_they_apply(model, h800):
    """Partial recomputation and FP8 caching are searched on MLA/MoE models (FP8 caching under an FP8 recipe),
    DeepEP with group-limited routing; a dense model's search is unchanged."""
    from dlperf.search import SearchSpace, search

    space = SearchSpace(zero=(1,), recompute=("none",), sequence_parallel=(False,), max_micro_batch=1, ep=(1, 16))
    # a memory cap that the published-style plan meets only with the options on
    options = predict(model, h800, PLAN.with_(recompute_modules=RECOMPUTE_MODULES, fp8_activations=True))
    cap = options.memory_bytes_per_device * 1.001
    assert predict(model, h800, PLAN).memory_bytes_per_device > cap
    found = search(model, h800, 64, 128, base=Plan(dtype="fp8"), space=space, max_memory=cap)
    plans = [ev.plan for ev in found.ranked]
    assert any(p.recompute_modules and p.fp8_activations for p in plans)
    assert {p.ep_dispatcher for p in plans if p.ep > 1} <= {"alltoall", "deepep"}
    for ev in found.ranked:  # a variant is priced only where its plain plan does not fit
        p = ev.plan
        if p.recompute_modules or p.fp8_activations:
            plain = p.with_(recompute_modules=(), fp8_activations=False)
            assert plain not in plans
    dense = load_model("llama3-8b")
    dense_plans = [ev.plan for ev in search(dense, h800, 8, 8, space=space).ranked]
    assert dense_plans and not any(p.recompute_modules or p.fp8_activations for p in dense_plans)


def test_deepep_exchange_by_hand(model, h800):
    """One MoE layer's exchange per pass, where no published table prices DeepEP (`ep_kernel` None): a
    dispatch-direction all-to-all (FP8 values plus a 4-byte scale per 128 under DeepEP and an FP8 recipe) and a
    combine-direction one (BF16), each the longer of its IB leg (one copy per node reached) and its NVLink leg
    under DeepEP, their sum otherwise."""
    from dataclasses import replace

    import dlperf.comm as comm
    from dlperf.engine.context import dispatch_bytes, ep_exchange, nodes_reached
    from dlperf.engine.layers import Use
    from dlperf.engine.step import _parallel as placed

    def _parallel(comm, hw, plan):
        return replace(placed(comm, hw, plan), ep_kernel=None)

    layer = next(layer for layer, _ in model.counted() if layer.op == "moe")
    use = Use(layer, 1, False)
    nbytes = dispatch_bytes(layer, 1, 2, 1, 1)
    reach = nodes_reached(layer, 2) / layer["top_k"]

    def legs(n):
        return (comm.collective_time("alltoall", n * reach, comm.Group(2, 8), h800),
                comm.collective_time("alltoall", n, comm.Group(8, 1), h800))

    nccl = ep_exchange(use, 1, 2, 1, _parallel(comm, h800, PLAN))
    assert nccl == pytest.approx(2 * sum(legs(nbytes)), rel=1e-12)
    deepep = ep_exchange(use, 1, 2, 1, _parallel(comm, h800, PLAN.with_(ep_dispatcher="deepep")))
    assert deepep == pytest.approx(max(legs(nbytes * FP8_TILED / 2)) + max(legs(nbytes)), rel=1e-12)
    bf16 = ep_exchange(use, 1, 2, 1, _parallel(comm, h800, PLAN.with_(ep_dispatcher="deepep", dtype="bf16")))
    assert bf16 == pytest.approx(2 * max(legs(nbytes)), rel=1e-12)
    assert deepep < bf16 < nccl


def test_hybridep_exchange_by_hand(model, h800):
    """HybridEP: DeepEP's overlapped legs (the longer of IB and NVLink per direction) with BF16 both ways under an
    FP8 recipe (Megatron-Core has no FP8 dispatch for it), so it is slower than DeepEP's FP8 dispatch and faster
    than the all-to-all's legs in sequence."""
    import dlperf.comm as comm
    from dlperf.engine.context import dispatch_bytes, ep_exchange, nodes_reached
    from dlperf.engine.layers import Use
    from dlperf.engine.step import _parallel

    layer = next(layer for layer, _ in model.counted() if layer.op == "moe")
    use = Use(layer, 1, False)
    nbytes = dispatch_bytes(layer, 1, 2, 1, 1)
    across = comm.collective_time("alltoall", nbytes * nodes_reached(layer, 2) / layer["top_k"],
                                  comm.Group(2, 8), h800)
    inside = comm.collective_time("alltoall", nbytes, comm.Group(8, 1), h800)
    hybridep = ep_exchange(use, 1, 2, 1, _parallel(comm, h800, PLAN.with_(ep_dispatcher="hybridep")))
    assert hybridep == pytest.approx(2 * max(across, inside), rel=1e-12)
    deepep = ep_exchange(use, 1, 2, 1, _parallel(comm, h800, PLAN.with_(ep_dispatcher="deepep")))
    nccl = ep_exchange(use, 1, 2, 1, _parallel(comm, h800, PLAN))
    assert deepep < hybridep < nccl


def test_hybridep_holds_its_32_sms_and_waits_like_deepep(model, h800):
    """Overlapped, HybridEP's all-to-alls hold the 32 SMs Megatron-Bridge gives them (of H800's 132) where DeepEP
    holds 20; beyond the tokens it adds the host-sync gap, as DeepEP, and forward its routing-map all-gather
    (context.routing_map_gather: 16 ranks x 4096 tokens x the model's experts, one bool each), one collective."""
    from dataclasses import replace

    from dlperf.engine.context import Parallel, ep_collectives, ep_dispatch_extra
    from dlperf.engine.layers import Use
    from dlperf.engine.step import _ep_contention
    from dlperf.ops.base import numel

    assert _ep_contention(h800, PLAN.with_(ep_dispatcher="hybridep")) == pytest.approx(32 / 132)
    assert _ep_contention(h800, PLAN.with_(ep_dispatcher="deepep")) == pytest.approx(20 / 132)
    layer = next(layer for layer, _ in model.counted() if layer.op == "moe")
    par = Parallel(ep=16, ep_alltoall=lambda n: 1e-9 * n, ep_allgather=lambda n: 1e-6 * n, sync_gap=3e-5,
                   ep_dispatcher="hybridep")
    gathered = 16 * numel(layer.in_shape[:-1]) * layer["experts"]
    assert ep_dispatch_extra(Use(layer, 1, False), 1, 1, par) == pytest.approx((1e-6 * gathered + 3e-5, 0.0))
    assert ep_collectives(layer, par) == (1, 0)
    assert ep_collectives(layer, replace(par, ep_dispatcher="alltoall")) != (1, 0)


def test_hybridep_dualpipe_slower_than_deepep_in_bf16(model, h800):
    """Same bytes and legs in BF16 (test_hybridep_exchange_by_hand); overlapped under DualPipe, HybridEP's 32 SMs
    slow the partner's compute more than DeepEP's 20."""
    plan = PLAN.with_(schedule="dualpipe", dtype="bf16")
    deepep = predict(model, h800, plan.with_(ep_dispatcher="deepep"))
    hybridep = predict(model, h800, plan.with_(ep_dispatcher="hybridep"))
    assert hybridep.step_time_s > deepep.step_time_s


@pytest.mark.parametrize(("model", "modules"), [
    ("deepseek-v3", ("layernorm", "mla_up_proj", "moe_act")),
    ("gpt-oss-120b", ("layernorm", "moe_act")),      # MoE without MLA: no mla_up_proj to recompute
    ("qwen3-30b-a3b", ("layernorm", "moe_act")),
])
def test_search_offers_only_the_modules_the_model_has(model, modules):
    from dlperf.search import SearchSpace, _applicable

    space = _applicable(SearchSpace(), load_model(model), Plan(devices=8, global_batch=8))
    assert space.recompute_modules == ((), modules)
