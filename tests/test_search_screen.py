"""Search screens plans by memory before pricing them (StepModel.memory, StepModel.fitting_timeline): the memory it
screens with is the memory a priced plan reports, and the search's answer is the one pricing every plan gives."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dlperf.engine.layers import element_bytes
from dlperf.engine.stage import StageCost
from dlperf.engine.step import StepModel
from dlperf.errors import DlperfError
from dlperf.plan import Plan
from dlperf.search import SearchSpace, search
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

GPT_SMALL = {"layers": 8, "hidden": 2048, "heads": 16, "seq": 1024}
# DeepSeek-V3's layer kinds (MLA, dense and group-limited MoE layers) at a size a brute-force search prices quickly
DEEPSEEK_SMALL = {"layers": 9, "dense_layers": 1, "experts": 16, "groups": 4, "top_groups": 2, "hidden": 1024,
                  "heads": 16, "seq": 1024, "moe_ffn": 512, "ffn": 2048, "vocab": 32000}
SMALL = SearchSpace(max_micro_batch=4)
MOE_SPACE = SearchSpace(max_micro_batch=1, zero=(0, 1, 3), recompute=("none", "full"))


def _searched(model: Any, hw: Any, devices: int, batch: int, **kw: Any) -> tuple[Any, list[Plan]]:
    """search()'s result and the plans it went through (in its order, from its progress hook)."""
    seen: list[Plan] = []

    def progress(items: list[Plan]) -> Any:
        seen.extend(items)
        return _Over(items)
    return search(model, hw, devices, batch, progress=progress, **kw), seen


def _plans(model: Any, hw: Any, devices: int, batch: int, **kw: Any) -> list[Plan]:
    """The plans search() would go through, without going through them."""
    seen: list[Plan] = []

    def progress(items: list[Plan]) -> Any:
        seen.extend(items)
        return _Over([])
    search(model, hw, devices, batch, progress=progress, **kw)
    return seen


class _Over:
    """A progress bar that shows nothing."""

    def __init__(self, items: list[Plan]) -> None:
        self.items = items

    def __enter__(self) -> list[Plan]:
        return self.items

    def __exit__(self, *exc: Any) -> None:
        return None


def _sample(plans: list[Plan], n: int, seed: int = 0) -> list[Plan]:
    return random.Random(seed).sample(plans, min(n, len(plans)))


class _PricedStages(StepModel):
    """A StepModel that reads memory off the priced stages (stage_cost's), as it did before stage_memory."""

    def _held(self, plan: Plan, dtype: str, e: int) -> list[StageCost]:
        return self.stages(plan, dtype, e)[0]


HELD = ("params", "expert_params", "fp8_params", "saved_bytes", "saved_blocks", "saved_outside")


def _memory_is_timelines(model: Any, hw: Any, plans: list[Plan]) -> int:
    """memory(plan) is timeline(plan).memory, key by key and exactly, on one evaluator that has screened other plans
    and on a fresh one (predict's), and is the memory read off the priced stages: stage_memory's fields are
    stage_cost's, bit for bit. A plan refused by one is refused by the other. Returns the plans compared."""
    shared, compared = StepModel(model, hw), 0
    for plan in plans:
        try:
            screened = shared.memory(plan)
        except DlperfError:
            with pytest.raises(DlperfError):
                StepModel(model, hw).timeline(plan)
            continue
        priced = StepModel(model, hw).timeline(plan).memory
        assert screened == priced == _PricedStages(model, hw).memory(plan), plan
        assert shared.timeline(plan).memory == priced, plan
        dtype = plan.dtype or model.dtype
        held, staged = shared._held(plan, dtype, element_bytes(dtype)), shared.stages(plan, dtype,
                                                                                      element_bytes(dtype))[0]
        assert [[getattr(s, k) for k in HELD] for s in held] == [[getattr(s, k) for k in HELD] for s in staged]
        compared += 1
    return compared


def test_memory_equals_the_timelines_on_gpt3_plans():
    """GPT-3 on 1024 A100s, the search's own plans: 1F1B, GPipe, interleaved; ZeRO 0-3; every recomputation."""
    model, hw = load_model("gpt3-175b"), load_hardware("dgx-a100")
    sample = _sample(_plans(model, hw, 1024, 1536), 120)
    assert {p.schedule for p in sample} >= {"1f1b", "interleaved", "gpipe"} and {p.zero for p in sample} == {0, 1, 2, 3}
    assert _memory_is_timelines(model, hw, sample) == len(sample)


def test_memory_equals_the_timelines_on_deepseek_v3_plans():
    """DeepSeek-V3 on 2048 H800s: DualPipe, expert parallelism with and without the combined 1F1B, partial
    recomputation and the DeepEP dispatcher, as the search enumerates them."""
    model, hw = load_model("deepseek-v3"), load_hardware("h800")
    plans = _plans(model, hw, 2048, 15360)
    dualpipe = [p for p in plans if p.schedule == "dualpipe"]
    sample = _sample(dualpipe, 30) + _sample([p for p in plans if p.ep_overlap], 30) + _sample(plans, 40) + \
        _sample([p for p in plans if p.recompute_modules], 20)
    assert {p.ep for p in sample} > {1} and any(p.recompute_modules for p in sample)
    assert _memory_is_timelines(model, hw, sample) == len(sample)


def test_memory_equals_the_timelines_under_fp8_and_context_parallelism():
    """DeepSeek-V3 under FP8 on 256 H800s with context parallelism: FP8 weight copies, FP8 activation caching, the
    experts' states over the expert-data-parallel group, activations split by cp."""
    model, hw = load_model("deepseek-v3"), load_hardware("h800")
    plans = _plans(model, hw, 256, 4096, base=Plan(dtype="fp8"), space=SearchSpace(cp=(1, 2)))
    sample = _sample([p for p in plans if p.cp > 1], 30) + _sample([p for p in plans if p.fp8_activations], 30)
    assert _memory_is_timelines(model, hw, sample) == len(sample)


@pytest.mark.parametrize("changes", [
    {"zero": 3, "dp": 8},
    {"zero": 3, "dp": 4, "tp": 2, "zero_impl": "fsdp"},
    {"zero": 3, "dp": 8, "zero_impl": "deepspeed-0.3"},
    {"pp": 4, "dp": 2, "schedule": "interleaved", "virtual_stages": 2, "micro_batch": 1},
    {"pp": 2, "dp": 4, "schedule": "gpipe", "recompute": "full"},
    {"pp": 4, "dp": 2, "micro_batch": 2, "recompute": "selective", "zero": 1},
    {"dp": 4, "cp": 2, "zero": 2},
    {"data_backend": "cpu", "loader_workers": 2, "input_ops": ("fast-collate",), "dp": 8},
    {"devices": 6, "pp": 3, "dp": 2, "global_batch": 12, "micro_batch": 1},
])
def test_memory_equals_the_timeline_on_a_small_gpt(changes):
    """ZeRO-3 by each implementation, interleaved and GPipe schedules, context parallelism, a CPU input pipeline, and
    a pipeline the layers do not divide (its balanced split is chosen by pricing, and memory reads it)."""
    model, hw = load_model("gpt", GPT_SMALL), load_hardware("dgx-a100")
    plan = Plan(devices=8, global_batch=32).with_(**changes)
    assert _memory_is_timelines(model, hw, [plan]) == 1


def test_memory_equals_the_timeline_with_offloaded_activations():
    """Activation offloading keeps (L-N)/L of the blocks' activations on the device."""
    model, hw = load_model("llama3-8b", {"seq": 4096}), load_hardware("gb200-nvl72")
    plans = [Plan(devices=8, dp=8, global_batch=64, micro_batch=2, zero=z, offload_layers=n)
             for z in (1, 3) for n in (0, 4, 16)]
    assert _memory_is_timelines(model, hw, plans) == len(plans)
    assert len({StepModel(model, hw).memory(p)["total"] for p in plans}) == len(plans)


def test_memory_equals_the_timeline_under_hybrid_fc():
    """Krizhevsky's one weird trick: the stage is built from priced parts, and memory reads it."""
    model, hw = load_model("vgg16"), load_hardware("dgx-a100")
    assert _memory_is_timelines(model, hw, [Plan(devices=8, global_batch=256, hybrid_fc=True, zero=z)
                                            for z in (0, 1)]) == 2


def _priced_one_by_one(model: Any, hw: Any, plans: list[Plan], limit: float,
                       max_step_time: float | None) -> dict[str, Any]:
    """What search reports by its definition, every plan priced: of the plans, those with partial recomputation or
    FP8 caching whose plain plan fits are left out; of the rest, those priced and fitting are ranked (those that
    miss the time budget counted), and the smallest is the first that needs the least memory."""
    steps = StepModel(model, hw)
    priced = {plan: _priced(steps, plan) for plan in plans}

    def plain(plan: Plan) -> Plan:
        return plan.with_(recompute_modules=(), fp8_activations=False)
    fit = {plan for plan, ev in priced.items() if ev is not None and ev.memory_bytes_per_device <= limit}
    kept = [ev for plan, ev in priced.items() if ev is not None and (plain(plan) == plan or plain(plan) not in fit)]
    fitting = [ev for ev in kept if ev.plan in fit]
    fast = [ev for ev in fitting if max_step_time is None or ev.step_time_s <= max_step_time]
    return {"ranked": sorted(fast, key=lambda ev: (ev.step_time_s, ev.memory_bytes_per_device)),
            "smallest": min(kept, key=lambda ev: ev.memory_bytes_per_device, default=None),
            "too_slow": len(fitting) - len(fast)}


def _priced(steps: StepModel, plan: Plan) -> Any:
    try:
        return steps.timeline(plan)
    except DlperfError:
        return None


def _same_search(model: Any, hw: Any, devices: int, batch: int, **kw: Any) -> Any:
    """search() with screening reports what pricing every plan reports: the ranked plans with their times and
    memory, the counts, the smallest plan and the plans too slow."""
    result, plans = _searched(model, hw, devices, batch, **kw)
    brute = _priced_one_by_one(model, hw, plans, result.memory_limit, kw.get("max_step_time"))
    assert result.considered == len(plans)
    assert result.feasible == len(brute["ranked"])
    assert [(ev.plan, ev.step_time_s, ev.memory, ev.breakdown_s) for ev in result.ranked] == \
        [(ev.plan, ev.step_time_s, ev.memory, ev.breakdown_s) for ev in brute["ranked"]]
    assert result.too_slow == brute["too_slow"]
    if brute["smallest"] is None:
        assert result.smallest is None
    else:
        assert (result.smallest.plan, result.smallest.memory, result.smallest.step_time_s) == \
            (brute["smallest"].plan, brute["smallest"].memory, brute["smallest"].step_time_s)
    return result


@pytest.mark.parametrize("max_memory, max_step_time", [(3 * 2**30, None), (2**30, None), (None, 1.0)])
def test_screened_search_equals_pricing_every_plan_on_a_small_gpt(max_memory, max_step_time):
    """Some plans fit; none fits (the smallest is priced at the end); all fit but some miss the time budget."""
    model, hw = load_model("gpt", GPT_SMALL), load_hardware("dgx-a100")
    result = _same_search(model, hw, 8, 32, max_memory=max_memory, max_step_time=max_step_time, space=SMALL)
    if max_memory == 2**30:
        assert result.feasible == 0 and result.smallest is not None
    if max_step_time is not None:
        assert result.too_slow > 0


@pytest.mark.parametrize("max_memory", [3 * 2**30, 2**30])
def test_screened_search_equals_pricing_every_plan_on_a_small_deepseek(max_memory):
    """MLA and group-limited MoE layers under FP8: expert parallelism, DualPipe, the combined 1F1B, partial
    recomputation and FP8 activation caching (skipped where the plan fits without them)."""
    model, hw = load_model("deepseek-v3", DEEPSEEK_SMALL), load_hardware("h800")
    result = _same_search(model, hw, 8, 32, max_memory=max_memory, base=Plan(dtype="fp8"), space=MOE_SPACE)
    ranked = [ev.plan for ev in result.ranked]
    if max_memory > 2**30:
        assert {p.schedule for p in ranked} >= {"dualpipe", "interleaved"} and any(p.recompute_modules for p in ranked)
        assert any(p.fp8_activations for p in ranked) and any(p.ep_overlap for p in ranked)
    else:
        assert not ranked and result.smallest is not None


def test_plans_whose_kernels_cannot_be_priced_are_passed_over_as_before():
    """FP8 on A100s, which have no FP8 peak: memory screens every plan, pricing refuses each, those that fit and the
    smallest of those that do not alike, so no plan is valid, as when every plan was priced."""
    model, hw = load_model("gpt", GPT_SMALL), load_hardware("dgx-a100")
    result = _same_search(model, hw, 8, 32, max_memory=3 * 2**30, base=Plan(dtype="fp8"), space=SMALL)
    assert result.considered > 0 and result.feasible == 0 and result.smallest is None


FLASH_GPT = {**GPT_SMALL, "flash": True}


def _same_rows(ev: Any) -> tuple:
    return ev.step_time_s, ev.memory_bytes_per_device, tuple(sorted(ev.breakdown_s.items()))


def test_selective_recompute_is_none_where_every_attention_is_fused():
    """dlperf.engine.stage.selective_changes: FlashAttention (a GPT with flash) and MLA's fused core keep no s^2
    scores, so a plan with recompute selective prices as its recompute none twin, in time, breakdown and memory;
    an unfused attention does not (its scores are freed and recomputed)."""
    from dlperf.engine.stage import selective_changes

    cases = [(load_model("gpt", FLASH_GPT), load_hardware("dgx-a100"), Plan(), SMALL),
             (load_model("deepseek-v3", DEEPSEEK_SMALL), load_hardware("h800"), Plan(dtype="fp8"), MOE_SPACE)]
    for model, hw, base, space in cases:
        assert not any(selective_changes(layer) for layer, _ in model.counted())
        steps = StepModel(model, hw)
        plans = [p for p in _plans(model, hw, 8, 32, base=base, space=space) if p.recompute == "none"]
        for plan in _sample(plans, 12):
            none, selective = _priced(steps, plan), _priced(steps, plan.with_(recompute="selective"))
            assert (none is None) == (selective is None), plan
            if none is not None:
                assert _same_rows(none) == _same_rows(selective), plan
    unfused = load_model("gpt", GPT_SMALL)
    assert any(selective_changes(layer) for layer, _ in unfused.counted())
    plan = Plan(devices=8, global_batch=32)
    steps = StepModel(unfused, load_hardware("dgx-a100"))
    assert steps.timeline(plan).memory_bytes_per_device > steps.timeline(plan.with_(recompute="selective")) \
        .memory_bytes_per_device


def test_folded_search_equals_pricing_every_plan_with_the_twins(monkeypatch):
    """Folding recompute selective where it is recompute none, and GPipe at one micro-batch into 1F1B, leaves the
    same ranking as pricing every plan, twins included, and dropping the twins: the same best plan and step time,
    the same distinct plans, none twice; the plans considered and folded add up to those enumerated without
    folding. (At 32 samples on 8 GPUs no pipeline runs one micro-batch: test_gpipe_at_one_micro_batch_is_folded
    covers that fold.)"""
    model, hw = load_model("gpt", FLASH_GPT), load_hardware("dgx-a100")
    result, plans = _searched(model, hw, 8, 32, max_memory=3 * 2**30, space=SMALL)
    assert result.folded > 0 and not any(p.recompute == "selective" for p in plans)
    assert not any(p.schedule == "gpipe" and p.pp > 1 and p.micro_batches == 1 for p in plans)
    monkeypatch.setattr("dlperf.engine.stage.selective_changes", lambda layer: True)  # fold nothing:
    monkeypatch.setattr("dlperf.search.FOLD_GPIPE", False)  # neither selective nor GPipe at one micro-batch
    every = _plans(model, hw, 8, 32, max_memory=3 * 2**30, space=SMALL)
    assert len(every) == result.considered + result.folded and set(plans) < set(every)
    brute = _priced_one_by_one(model, hw, every, result.memory_limit, None)["ranked"]
    assert {p.recompute for p in (ev.plan for ev in brute)} >= {"none", "selective"}
    assert result.ranked[0].plan == brute[0].plan and result.ranked[0].step_time_s == brute[0].step_time_s
    assert [(ev.plan, *_same_rows(ev)) for ev in result.ranked] == \
        [(ev.plan, *_same_rows(ev)) for ev in brute if ev.plan.recompute != "selective" and not _gpipe_at_one(ev.plan)]
    assert {_same_rows(ev) for ev in result.ranked} == {_same_rows(ev) for ev in brute}
    kept = {(_canonical(ev.plan), _same_rows(ev)) for ev in result.ranked}
    assert len(kept) == len(result.ranked)  # no two ranked plans are twins
    assert {(_canonical(ev.plan), _same_rows(ev)) for ev in brute} == kept  # every twin priced as its kept plan


def _gpipe_at_one(plan: Plan) -> bool:
    return plan.schedule == "gpipe" and plan.pp > 1 and plan.micro_batches == 1


def _canonical(plan: Plan) -> Plan:
    """The plan a folded twin stands for: selective as none (FLASH_GPT's attention is fused), GPipe at one
    micro-batch as 1F1B."""
    if plan.recompute == "selective":
        plan = plan.with_(recompute="none")
    return plan.with_(schedule="1f1b") if _gpipe_at_one(plan) else plan


def test_gpipe_at_one_micro_batch_is_folded_and_prices_as_1f1b(monkeypatch):
    """GPipe with one micro-batch per step is 1F1B's run: predict gives the same step, breakdown and memory (with
    recomputation full, except_last and none), and search lists it once, as 1F1B, counting the twin as folded."""
    model, hw = load_model("gpt", GPT_SMALL), load_hardware("dgx-a100")
    steps = StepModel(model, hw)
    for recompute in ("none", "full", "except_last"):
        plan = Plan(devices=8, dp=2, pp=4, global_batch=4, micro_batch=2, recompute=recompute)
        one, other = steps.timeline(plan), steps.timeline(plan.with_(schedule="gpipe"))
        assert _same_rows(one) == _same_rows(other), recompute
    folded, plans = _searched(model, hw, 8, 4, space=SMALL)
    assert not any(_gpipe_at_one(p) for p in plans) and any(p.pp > 1 and p.micro_batches == 1 for p in plans)
    monkeypatch.setattr("dlperf.search.FOLD_GPIPE", False)
    every, all_plans = _searched(model, hw, 8, 4, space=SMALL)
    twins = sum(_gpipe_at_one(p) for p in all_plans)
    assert twins > 0 and folded.considered + twins == every.considered and folded.folded == every.folded + twins
    assert [(ev.plan, *_same_rows(ev)) for ev in folded.ranked] == \
        [(ev.plan, *_same_rows(ev)) for ev in every.ranked if not _gpipe_at_one(ev.plan)]
