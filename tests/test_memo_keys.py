"""Pricing order never changes a prediction: StepModel memoises stage costs, the slowest stage, communication and
memory across the plans it prices (what makes `dlperf search` fast), and each memo's key must hold everything its
computation reads of the plan. One StepModel pricing plans in any order gives exactly what a fresh one (`predict`)
gives for each plan."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dlperf.engine.step import StepModel
from dlperf.errors import PlanError
from dlperf.plan import Plan
from dlperf.search import SearchSpace, enumerate_plans
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model


def _same(shared: StepModel, fresh: StepModel, plan: Plan) -> None:
    """shared's timeline and memory of `plan` equal a fresh StepModel's, to the last bit."""
    got, want = shared.timeline(plan), fresh.timeline(plan)
    assert got.step_time_s == want.step_time_s, plan
    assert got.breakdown_s == want.breakdown_s, plan
    assert got.memory == want.memory, plan
    assert got.slow.params == want.slow.params, plan


def test_zero_stage_never_reuses_another_plans_slowest_stage():
    """The slowest stage is the one whose passes plus gradient accumulation last longest, and ZeRO-2 changes what
    a stage accumulates (1/dp of its gradient, plus FSDP's passes over the unsharded one): on 8 stages of BERT-Large
    with fp32 gradients the last stage (39.9M parameters, the heads) is the slowest at ZeRO-0, the first (69.6M, the
    embeddings) at ZeRO-2. Priced after the same layout at ZeRO-0, ZeRO-2 kept ZeRO-0's slowest stage: 0.0948 s
    where predict says 0.0964 s (StepModel.stages memoised the choice on a key without the fields
    _grad_accumulation reads; `search(base=Plan(grad_dtype="fp32"))` there: 30 of 3,012 plans off, up to 2.4%)."""
    model, hw = load_model("bert-large"), load_hardware("dgx1-v100")
    zero0 = Plan(devices=16, global_batch=64, tp=1, pp=8, dp=2, micro_batch=4, grad_dtype="fp32")
    zero2 = zero0.with_(zero=2)
    fresh = StepModel(model, hw)
    assert fresh.timeline(zero2).slow is not fresh.timeline(zero0).slow  # the choice differs: the case tests it
    shared = StepModel(model, hw)
    shared.timeline(zero0)
    _same(shared, StepModel(model, hw), zero2)


@pytest.mark.parametrize("change", [{"grad_dtype": "fp32"}, {"grad_passes": ("amp-casts",)},
                                    {"zero": 3, "zero_impl": "megatron-fsdp"}])
def test_gradient_knobs_never_reuse_another_plans_slowest_stage(change):
    """Every field _grad_accumulation reads picks the slowest stage: each, changed alone after the other plan was
    priced, gives what a fresh StepModel gives."""
    model, hw = load_model("bert-large"), load_hardware("dgx1-v100")
    base = Plan(devices=16, global_batch=64, tp=1, pp=8, dp=2, micro_batch=4, zero=3)
    for first, then in ((base, base.with_(**change)), (base.with_(**change), base)):
        shared = StepModel(model, hw)
        shared.timeline(first)
        _same(shared, StepModel(model, hw), then)


def test_model_files_fp8_dtype_is_the_plans(tmp_path):
    """DeepEP dispatches in FP8 under an FP8 recipe, whether the plan names the dtype or the model file does:
    the stage memos key on the dtype the plan computes in, and `_parallel` read only the plan's own (a model file
    with dtype fp8 dispatched in BF16 unless the plan repeated it, and one StepModel answered both plans with
    whichever it priced first: 7.80 s against 6.92 s for DeepSeek-V3 on 256 H800s)."""
    path = tmp_path / "deepseek-fp8.yaml"
    path.write_text("name: deepseek-fp8\nbase: deepseek-v3\ndtype: fp8\n")
    model, hw = load_model(path, {"layers": 6, "dense_layers": 2, "seq": 1024}), load_hardware("h800")
    implied = Plan(devices=64, dp=32, pp=2, ep=16, global_batch=128, micro_batch=1, zero=1, moe_imbalance=1.0,
                   ep_dispatcher="deepep")
    named = implied.with_(dtype="fp8")
    a, b = StepModel(model, hw).timeline(implied), StepModel(model, hw).timeline(named)
    assert (a.step_time_s, a.breakdown_s, a.memory) == (b.step_time_s, b.breakdown_s, b.memory)
    for first, then in ((implied, named), (named, implied)):
        shared = StepModel(model, hw)
        shared.timeline(first)
        _same(shared, StepModel(model, hw), then)


# (model, overrides, hardware, devices, global batch): a GPT with tensor, pipeline and data parallelism; BERT-Large,
# whose first and last stages differ; a small DeepSeek-V3 for expert parallelism, DualPipe and MLA.
CASES = [
    ("gpt", {"layers": 8, "hidden": 1024, "heads": 16, "seq": 512}, "dgx-a100", 16, 64),
    ("bert-large", {}, "dgx1-v100", 16, 64),
    ("deepseek-v3", {"layers": 6, "dense_layers": 2, "seq": 1024}, "h800", 64, 128),
]
# base plans whose fields search keeps fixed, pooled so that one StepModel sees plans that differ in them too
BASES = [{}, {"grad_dtype": "fp32"}, {"grad_passes": ("amp-casts",)}, {"zero_impl": "megatron-fsdp"}]


@pytest.mark.parametrize(("name", "overrides", "hw_name", "devices", "batch"), CASES)
def test_pricing_order_never_changes_a_prediction(name, overrides, hw_name, devices, batch):
    """200 plans of a search's space (several base plans pooled), priced in random order on one StepModel as
    search prices them (memory first, then the step), equal a fresh StepModel's for each plan, to the last bit."""
    model, hw = load_model(name, overrides), load_hardware(hw_name)
    shared = StepModel(model, hw)
    space = replace(SearchSpace(max_micro_batch=4), uneven_stages=True)
    experts = 16 if name == "deepseek-v3" else 0  # ep up to 16 (256 experts)
    plans = []
    for fields in BASES:
        base = Plan(devices=devices, global_batch=batch, **fields)
        plans += list(enumerate_plans(base, hw.devices_per_node, shared.heads, shared.layers, space,
                                      experts=experts))
    rng = random.Random(f"{name}-order")
    sample = rng.sample(plans, 200)
    priced = 0
    for plan in sample:
        try:
            memory = shared.memory(plan)
        except PlanError:  # a plan its rules refuse (megatron-fsdp below ZeRO-3, ...): refused alike afresh
            with pytest.raises(PlanError):
                StepModel(model, hw).memory(plan)
            continue
        fresh = StepModel(model, hw)
        assert memory == fresh.memory(plan), plan
        _same(shared, fresh, plan)
        priced += 1
    assert priced >= 100
