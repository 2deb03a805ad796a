"""Physics that never runs backwards (issue #15, classes 5 and 6), over pipelines, ZeRO and recomputation.

- Scaling any hardware constant the right way (a peak or a bandwidth up, a latency down) never makes a step
  slower. Before the fix, 535 of 2,674 such predictions got slower, all with pp > 1: the data-parallel
  communication was priced for the stage slowest to compute, so faster compute could pick the stage holding
  a VGG's fully connected layers and a 480x larger allreduce.
- Memory per device never shrinks by adding layers, and a stage holding a huge layer is counted at every pp.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.engine import predict
from dlperf.engine.step import StepModel
from dlperf.errors import DlperfError
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

MODELS = ("vgg16", "alexnet", "resnet50", "inception-v3", "bert-large", "gpt2-xl")
HARDWARE = ("p100-roce", "dgx-a100", "dgx1-v100", "p40-pcie")
CONSTANTS = ("peak_flops", "memory_bandwidth", "launch_latency", "network_bandwidth", "network_latency",
             "matmul_peak", "network_efficiency", "host_speed")


def assert_more_bandwidth_on_any_level_never_slower(model, hw, plan) -> None:
    """Doubling the bandwidth of any one network level never makes `plan` slower."""
    base = predict(model, hw, plan).step_time_s
    for i in range(len(hw.network)):
        net = list(hw.network)
        net[i] = dataclasses.replace(net[i], bandwidth=net[i].bandwidth * 2)
        assert predict(model, dataclasses.replace(hw, network=tuple(net)), plan).step_time_s <= base * (1 + 1e-12)


def faster(hw, constant: str, factor: float):
    """`hw` with one constant improved by `factor` (efficiencies are capped at 1)."""
    d = hw.device
    if constant == "peak_flops":
        return dataclasses.replace(hw, device=dataclasses.replace(
            d, peak_flops={k: v * factor for k, v in d.peak_flops.items()}))
    if constant == "memory_bandwidth":
        return dataclasses.replace(hw, device=dataclasses.replace(d, memory_bandwidth=d.memory_bandwidth * factor))
    if constant == "launch_latency":
        return dataclasses.replace(hw, device=dataclasses.replace(d, launch_latency=d.launch_latency / factor))
    if constant == "host_speed":  # a faster host CPU (device.host.speed): less host time per launch, faster loader
        return dataclasses.replace(hw, device=dataclasses.replace(
            d, dispatch_forward=d.dispatch_forward / factor, dispatch_backward=d.dispatch_backward / factor,
            host_speed=d.host_speed * factor))
    if constant == "matmul_peak":
        eff = d.eff("matmul")
        better = dataclasses.replace(eff, peak=min(1.0, eff.peak * factor))
        return dataclasses.replace(hw, device=dataclasses.replace(d, efficiency={**d.efficiency, "matmul": better}))
    levels = []
    for level in hw.network:
        if constant == "network_bandwidth":
            level = dataclasses.replace(level, bandwidth=level.bandwidth * factor)
        elif constant == "network_latency":
            level = dataclasses.replace(level, latency=level.latency / factor)
        else:
            level = dataclasses.replace(level, efficiency=min(1.0, level.efficiency * factor))
        levels.append(level)
    return dataclasses.replace(hw, network=tuple(levels))


def step(model, hw, plan: Plan) -> float:
    return StepModel(model, hw).predict(plan).step_time_s


@functools.cache
def built(kind: str, name: str):
    return load_model(name) if kind == "model" else load_hardware(name)




@settings(max_examples=150, deadline=None, derandomize=True)
@given(model=st.sampled_from(MODELS), hw=st.sampled_from(HARDWARE), tp=st.sampled_from([1, 2]),
       pp=st.sampled_from([2, 4]), dp=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 2, 3]),
       recompute=st.sampled_from(["none", "selective", "full", "except_last"]),
       schedule=st.sampled_from(["1f1b", "gpipe"]), constant=st.sampled_from(CONSTANTS),
       factor=st.sampled_from([1.1, 2.0, 10.0]))
def test_better_hardware_never_makes_a_pipelined_step_slower(model, hw, tp, pp, dp, zero, recompute, schedule,
                                                             constant, factor):
    plan = Plan(devices=dp * tp * pp, tp=tp, pp=pp, global_batch=8 * dp, micro_batch=1, zero=zero,
                recompute=recompute, schedule=schedule)
    try:
        before = step(built("model", model), built("hardware", hw), plan)
    except DlperfError:  # a plan the model cannot take (tp not dividing the heads, ...)
        return
    after = step(built("model", model), faster(built("hardware", hw), constant, factor), plan)
    assert after <= before * (1 + 1e-9), (model, hw, plan, constant, factor, before, after)


@pytest.mark.parametrize(("model", "hw", "plan", "constant", "factor"), [
    # the issue's examples: 210 ms -> 6.8 s with every peak x10; +10% memory bandwidth 312% slower
    ("vgg16", "p100-roce", Plan(devices=32, tp=4, pp=2, global_batch=64, micro_batch=1, zero=3, recompute="full"),
     "peak_flops", 10.0),
    ("alexnet", "dgx-a100", Plan(devices=16, pp=4, global_batch=64, micro_batch=1, zero=3), "memory_bandwidth", 1.1),
    ("alexnet", "dgx-a100", Plan(devices=16, pp=4, global_batch=64, micro_batch=1, zero=3), "memory_bandwidth", 10.0),
    ("vgg16", "p100-roce", Plan(devices=8, pp=4, global_batch=64, micro_batch=1), "memory_bandwidth", 1.1),
    ("alexnet", "p100-roce", Plan(devices=16, pp=4, global_batch=64, micro_batch=1), "peak_flops", 10.0),
])
def test_issue_examples_get_faster(model, hw, plan, constant, factor):
    before = StepModel(built("model", model), built("hardware", hw)).predict(plan)
    after = StepModel(built("model", model), faster(built("hardware", hw), constant, factor)).predict(plan)
    assert after.step_time_s <= before.step_time_s * (1 + 1e-9)
    assert after.breakdown_s["comm/dp_allreduce"] <= before.breakdown_s["comm/dp_allreduce"] * (1 + 1e-9)


def test_data_parallel_traffic_is_the_largest_stage_s():
    """VGG-16's fully connected layers (~90% of its parameters) sit on the last stage at pp=2; the step waits
    for that stage's gradient exchange whichever stage is slowest to compute."""
    plan = Plan(devices=32, tp=4, pp=2, global_batch=64, micro_batch=1, zero=3, recompute="full")
    engine = StepModel(built("model", "vgg16"), built("hardware", "p100-roce"))
    stages, slow, _, _ = engine.stages(plan, "fp32", 4)
    heaviest = max(stages, key=lambda s: s.params)
    assert heaviest.params > 3 * min(s.params for s in stages)
    alone = engine._dp_over_stages(plan, [heaviest], slow, "fp32", plan.micro_batches)
    both = engine._dp_over_stages(plan, stages, slow, "fp32", plan.micro_batches)
    assert both == alone


@pytest.mark.parametrize("pp", [1, 2, 4])
@pytest.mark.parametrize("extra", [1, 2])
def test_memory_never_shrinks_by_adding_layers(pp, extra):
    hw = load_hardware("dgx-a100")
    plan = Plan(devices=pp, pp=pp, global_batch=8, micro_batch=1)
    layers = 4 * pp
    small = StepModel(load_model("gpt", {"layers": layers, "hidden": 256, "heads": 4}), hw).predict(plan)
    more = StepModel(load_model("gpt", {"layers": layers + extra * pp, "hidden": 256, "heads": 4}), hw).predict(plan)
    assert more.memory_bytes_per_device >= small.memory_bytes_per_device


def test_memory_never_shrinks_by_appending_layers_to_a_cnn():
    hw = load_hardware("dgx-a100")
    base = load_model("lenet5")
    plan = Plan(devices=1, global_batch=8)
    before = StepModel(base, hw).predict(plan).memory_bytes_per_device
    bigger = dataclasses.replace(base, root=dataclasses.replace(base.root, items=base.root.items[:-1]
                                                                  + base.root.items[-3:]))
    assert StepModel(bigger, hw).predict(plan).memory_bytes_per_device >= before


HUGE = """\
name: huge-kv
input: [16, 64]
layers:
  - {op: linear, out: 64}
  - {op: linear, out: 64}
  - {op: linear, out: 64}
  - {op: attention, heads: 4, kv_seq: 100000000000}
"""


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_the_stage_holding_a_huge_layer_is_counted_at_every_pp(tmp_path, pp):
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE)
    model, hw = load_model(str(path)), load_hardware("dgx-a100")
    result = StepModel(model, hw).predict(Plan(devices=pp, pp=pp, global_batch=8, micro_batch=1))
    one = StepModel(model, hw).predict(Plan(devices=1, global_batch=8, micro_batch=1))
    assert not result.fits
    assert result.memory["activations"] >= one.memory["activations"] * 0.99


LOADER_OPS = ("jpeg-decode-pillow", "rrc224-flip-pillow", "fast-collate")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(model=st.sampled_from(("resnet50", "vgg16", "inception-v3", "bert-large")),
       hw=st.sampled_from(("dgx-a100", "jean-zay-a100", "dgx1-v100")), pp=st.sampled_from([1, 2, 4]),
       dp=st.sampled_from([1, 2, 8]), zero=st.sampled_from([0, 1, 3]),
       recompute=st.sampled_from(["none", "selective", "full"]), dtype=st.sampled_from(["fp32", "tf32", "fp16"]),
       micro=st.sampled_from([1, 8, 32]), workers=st.sampled_from([1, 2, 4, 16]),
       factor=st.sampled_from([1.1, 2.0, 10.0]))
def test_a_faster_host_more_workers_or_cores_and_nhwc_are_never_slower(model, hw, pp, dp, zero, recompute, dtype,
                                                                       micro, workers, factor):
    """The host and the input pipeline across pipelines, ZeRO and recomputation: a faster host CPU (launches and
    loader), more loader workers, more cores on the node, and NHWC activations instead of NCHW never make a step
    slower (dlperf.engine.input, spec/hardware.py device.host, dlperf.ops.conv.layout_transpose_kernel)."""
    base_hw = built("hardware", hw)
    if hw == "dgx1-v100" and dtype == "tf32":
        return
    plan = Plan(devices=dp * pp, pp=pp, global_batch=4 * micro * dp, micro_batch=micro, zero=zero,
                recompute=recompute, dtype=dtype, data_backend="cpu", loader_workers=workers, input_ops=LOADER_OPS,
                memory_format="nchw")
    try:
        before = step(built("model", model), base_hw, plan)
    except DlperfError:  # a plan the model cannot take (more stages than layers, ...)
        return
    d = base_hw.device
    more_cores = dataclasses.replace(base_hw, device=dataclasses.replace(d, host_cores=2 * max(d.host_cores, 64)))
    variants = {
        "host speed": (faster(base_hw, "host_speed", factor), plan),
        "workers": (base_hw, plan.with_(loader_workers=2 * workers)),
        "cores": (more_cores, plan),
        "nhwc": (base_hw, plan.with_(memory_format="nhwc")),
    }
    for name, (hw_after, plan_after) in variants.items():
        after = step(built("model", model), hw_after, plan_after)
        assert after <= before * (1 + 1e-9), (name, model, hw, plan, before, after)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(dtype=st.sampled_from(["fp8", "mxfp8", "nvfp4"]),
       hw=st.sampled_from(["dgx-b200", "gb200-nvl72", "dgx-gb300"]),
       pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1, 3]),
       recompute=st.sampled_from(["none", "selective", "full"]),
       constant=st.sampled_from(("peak_flops", "memory_bandwidth", "launch_latency", "network_bandwidth")),
       factor=st.sampled_from([1.1, 2.0]))
def test_better_blackwell_hardware_never_slows_an_fp8_recipe(dtype, hw, pp, dp, zero, recompute, constant, factor):
    """The low-precision recipes (per-tensor FP8, MXFP8 and NVFP4, whose GEMMs run on their own peaks) keep the
    invariant over pipelines, ZeRO and recomputation: scaling every peak scales the FP8 and FP4 ones too."""
    model = load_model("llama3-8b", {"layers": 4, "seq": 2048})
    plan = Plan(devices=dp * pp, pp=pp, global_batch=4 * dp, micro_batch=1, zero=zero, recompute=recompute,
                dtype=dtype)
    before = step(model, built("hardware", hw), plan)
    after = step(model, faster(built("hardware", hw), constant, factor), plan)
    assert after <= before * (1 + 1e-9), (dtype, hw, plan, constant, factor, before, after)
