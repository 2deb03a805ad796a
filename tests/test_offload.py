"""Activation offloading to host memory (dlperf.engine.offload): memory, time and refusals."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from dlperf.engine import predict
from dlperf.engine.offload import pass_time
from dlperf.errors import PlanError
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

PLAN = Plan(devices=64, dp=64, global_batch=256, micro_batch=2, zero=3, fp8_param_gather=True, dtype="fp8")


@functools.cache
def llama70b():
    return load_model("llama3-70b", overrides={"seq": 8192})


def hw_with_link(name: str, factor: float):
    hw = load_hardware(name)
    d = hw.device
    return dataclasses.replace(hw, device=dataclasses.replace(
        d, host_to_device=d.host_to_device * factor, device_to_host=d.device_to_host * factor))


def test_offload_zero_is_todays_prediction_exactly():
    hw = load_hardware("gb200-nvl72")
    base, zero = predict(llama70b(), hw, PLAN), predict(llama70b(), hw, PLAN.with_(offload_layers=0))
    assert zero.step_time_s == base.step_time_s
    assert zero.memory == base.memory
    assert zero.breakdown_s["comm/host_offload"] == 0


@pytest.mark.parametrize("n", [1, 20, 40, 79])
def test_memory_drops_by_the_offloaded_layers_activations(n):
    """TE keeps (L-N) of L layers' saved activations (DefaultOffloadSynchronizer): the blocks' share drops by N/L."""
    hw = load_hardware("dgx-gb300")
    base = predict(llama70b(), hw, PLAN)
    off = predict(llama70b(), hw, PLAN.with_(offload_layers=n))
    from dlperf.engine.step import StepModel

    stage = StepModel(llama70b(), hw).stages(PLAN, "fp8", 2)[1]
    assert base.memory["activations"] - off.memory["activations"] == pytest.approx(stage.saved_blocks * n / 80)
    assert 0 < stage.saved_blocks <= stage.saved_bytes


def test_pass_time_hides_transfers_within_the_window_and_exposes_the_rest():
    # 80 layers of 10 ms; 40 copies of 15 ms queue on one stream: 600 ms + 2 layers < 800 ms, hidden
    assert pass_time(0.8, 80, 40, 15e9, 1e12) == pytest.approx(0.8)
    # 40 copies of 25 ms: 1000 ms of copies + the first and last layer = 1.02 s
    assert pass_time(0.8, 80, 40, 25e9, 1e12) == pytest.approx(1.02)


@pytest.mark.parametrize("factor", [1.0, 0.5, 0.1, 0.02])
def test_a_slower_host_link_never_makes_a_plan_faster(factor):
    plan = PLAN.with_(offload_layers=40)
    fast = predict(llama70b(), load_hardware("gb200-nvl72"), plan)
    slow = predict(llama70b(), hw_with_link("gb200-nvl72", factor), plan)
    assert slow.step_time_s >= fast.step_time_s
    assert slow.breakdown_s["comm/host_offload"] >= fast.breakdown_s["comm/host_offload"]


def test_a_slow_enough_link_is_exposed():
    """At 1/10 of GB200's link, 40 layers of ~3.8 GB cannot hide behind a pass: the step grows by the excess."""
    plan = PLAN.with_(offload_layers=40)
    p = predict(llama70b(), hw_with_link("gb200-nvl72", 0.1), plan)
    base = predict(llama70b(), load_hardware("gb200-nvl72"), PLAN)
    assert p.breakdown_s["comm/host_offload"] > 0
    assert p.step_time_s == pytest.approx(base.step_time_s + p.breakdown_s["comm/host_offload"])


@pytest.mark.parametrize(("changes", "field"), [
    ({"offload_layers": 80}, "offload_layers"),       # TE never offloads the last layer
    ({"offload_layers": -1}, "offload_layers"),
    ({"offload_layers": 4, "pp": 2, "dp": 32}, "pp = 1"),
    ({"offload_layers": 4, "recompute": "full"}, "recompute"),
])
def test_bad_offload_plans_are_refused(changes, field):
    with pytest.raises(PlanError, match=field):
        predict(llama70b(), load_hardware("gb200-nvl72"), PLAN.with_(**changes))


def test_hardware_without_a_host_link_refuses_offloading():
    with pytest.raises(PlanError, match="host_link"):
        predict(llama70b(), load_hardware("dgx-b200"), PLAN.with_(devices=64, offload_layers=4))


ARGS = ("predict", "llama3-70b", "--gpus", "64", "--dp", "64", "--global-batch", "256", "--micro-batch", "2",
        "--zero", "3", "--dtype", "fp8", "--fp8-param-gather", "--set", "seq=8192")


def test_cli_offload_layers_too_many_is_one_line_exit_2(run):
    code, out, err = run(*ARGS[:2], "gb200-nvl72", *ARGS[2:], "--offload-layers", "80")
    assert code == 2
    assert "offload_layers" in err and "at most 79" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_offload_layers_prices_the_memory(run):
    import json

    args = (*ARGS[:2], "dgx-gb300", *ARGS[2:], "--format", "json")
    base, off = run(*args), run(*args, "--offload-layers", "20")
    assert (base[0], off[0]) == (1, 0)  # 20 offloaded layers make the recipe's plan fit a GB300 (exit 1: no fit)
    assert json.loads(off[1])["memory"]["activations"] < json.loads(base[1])["memory"]["activations"]
