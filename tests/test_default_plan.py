"""The filled-in plan (`predict` without degrees, `compare`'s best hybrid) is the fastest candidate that fits, found
faster than by pricing every candidate: a candidate whose pipeline split is chosen by pricing (StepModel._balanced)
is screened by the memory of every split it could take (StepModel.may_fit), and only the chosen candidate's
Prediction is made. Neither may change which plan wins nor any of its figures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlperf.engine.defaults import ZERO1_IMPL, best_plan, hybrid_candidates
from dlperf.engine.step import StepModel
from dlperf.errors import DlperfError
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

# (model, overrides, hardware, devices, global batch, share of the device's memory): pipeline depths the repeated
# block does not divide take a balanced split, chosen by pricing; a small DeepSeek-V3 (16 pipeline units, many
# candidates that do not fit), and a 10-layer Llama-3-70B whose fastest plan at a quarter of the memory is one
CASES = [("deepseek-v3", {"layers": 6, "dense_layers": 2, "seq": 1024}, "h800", 64, 128, 1.0),
         ("llama3-70b", {"layers": 10}, "dgx-h100", 16, 64, 0.25)]


def _setup(name: str, overrides: dict, hw_name: str, share: float) -> tuple:
    hw = load_hardware(hw_name)
    return load_model(name, overrides), replace(hw, device=replace(hw.device, memory=share * hw.device.memory))


def _balanced(engine: StepModel, plan: Plan) -> bool:
    return engine._partition(plan, engine._dtype(plan), 2) is None


def test_the_screen_refuses_only_plans_that_do_not_fit():
    """may_fit(plan, limit) is False only where memory(plan) exceeds the limit, and never at the plan's own memory
    (the split _balanced chooses is one of those screened, and holds that memory exactly); at the device's memory
    it refuses some balanced candidates, which are then never priced."""
    name, overrides, hw_name, devices, batch, share = CASES[0]
    model, hw = _setup(name, overrides, hw_name, share)
    screen, refused = StepModel(model, hw), 0
    plans = hybrid_candidates(model, hw, Plan(devices=devices, global_batch=batch), ZERO1_IMPL)
    balanced = [plan for plan in plans if _balanced(screen, plan)]
    assert len(balanced) > 50
    for plan in balanced:
        try:
            total = StepModel(model, hw).memory(plan)["total"]
        except DlperfError:
            continue
        assert screen.may_fit(plan, total), plan
        if not screen.may_fit(plan, hw.device.memory):
            assert total > hw.device.memory, plan
            refused += 1
    assert refused > 10


@pytest.mark.parametrize(("name", "overrides", "hw_name", "devices", "batch", "share"), CASES)
def test_the_filled_in_plan_is_the_first_fastest_fitting_candidate(name, overrides, hw_name, devices, batch, share):
    """best_plan equals pricing every candidate in order (a fresh StepModel, without the screen) and keeping the
    first of the fastest that fits: the same plan and the same Prediction, to the last bit."""
    model, hw = _setup(name, overrides, hw_name, share)
    base = Plan(devices=devices, global_batch=batch)
    reference, best = StepModel(model, hw), None
    for plan in hybrid_candidates(model, hw, base, ZERO1_IMPL):
        try:
            _, timeline = reference.fitting_timeline(plan, hw.device.memory)
        except DlperfError:
            continue
        if timeline is not None and (best is None or timeline.step_time_s < best.step_time_s):
            best = timeline
    plan, prediction = best_plan(model, hw, base, ZERO1_IMPL)
    assert plan == best.plan and _balanced(reference, plan) == (name == "llama3-70b")
    assert prediction.to_dict() == reference.prediction(best).to_dict()
