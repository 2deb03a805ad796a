"""Stacks that all-reduce and update in their own way: the gradient all-reduce after the backward pass with its
copies (dp_impl "post-backward", dlperf.engine.post_backward: DeepSpeed's engine without ZeRO, Megatron-LM's local
DDP of 2019-2021) and the fp16 optimizer wrappers around the fused update (optimizer_impl "deepspeed-fp16",
"megatron-fp16-2020": dlperf.engine.fp16_wrappers)."""

from __future__ import annotations

import functools

import pytest

from dlperf.engine import fp16_wrappers, post_backward
from dlperf.engine.optimizer_loop import OPTIMIZER_OP_HOST, parameter_tensors
from dlperf.engine.step import StepModel
from dlperf.errors import PlanError
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import LAUNCH_CALL, load_hardware
from dlperf.spec.model import load_model


@functools.cache
def _gpt():
    """vTrain's 3.6B GPT (hidden 3072, 32 heads, 30 layers, sequence 2048)."""
    return load_model("gpt", {"hidden": 3072, "heads": 32, "layers": 30, "seq": 2048, "vocab": 50257})


def _plan(**changes) -> Plan:
    base = dict(devices=64, dp=64, global_batch=512, micro_batch=8, recompute="full", dtype="fp16", optimizer="adam")
    return Plan(**{**base, **changes})


def _breakdown(plan: Plan, hw_name: str = "a100-800g") -> dict:
    return StepModel(_gpt(), load_hardware(hw_name)).predict(plan).breakdown_s


def test_the_engines_allreduce_is_all_exposed_and_pays_its_three_copy_passes():
    """nccl without overlap exposes the same allreduce; DeepSpeed adds flatten, 1/dp scale and copy back, each a
    read and a write of the fp16 gradient (2 bytes): 12 bytes per parameter at the achieved HBM bandwidth."""
    hw = load_hardware("a100-800g")
    plain = _breakdown(_plan(overlap=False))["comm/dp_allreduce"]
    engine = _breakdown(_plan(dp_impl="post-backward"))["comm/dp_allreduce"]
    params = _gpt().total_params
    copies = post_backward.COPY_PASSES * 2 * 2 * params / hw.device.achieved_memory_bandwidth()
    assert engine - plain == pytest.approx(copies, rel=1e-6)
    assert engine > _breakdown(_plan())["comm/dp_allreduce"]  # the default nccl plan overlaps it at pp 1


# (optimizer_impl, bytes per parameter before the host waits, operators per tensor that wait, bytes after,
# operators per tensor after, group-wide kernels after)
WRAPPED = [
    # DeepSpeed @38327e07: the check (.float, .sum, float: 10 B) waits; cast, cat, norm, unscale and fp16 refresh
    # (32 B) follow, a cast and a copy_ per tensor, the cat, norm and unscale over the flat gradient
    ("deepspeed-fp16", 10, 3, 32, 2, 3),
    # Megatron-LM @5281919: the check and the clip's norm (.norm, .item) wait (14 B); the copy to the fp32 masters,
    # the unscale and the refresh (20 B) follow, one copy_ per tensor and two multi-tensor kernels
    ("megatron-fp16-2020", 14, 5, 20, 1, 2),
]


@pytest.mark.parametrize(("impl", "waited_bytes", "waited_ops", "after_bytes", "tensor_ops", "group_ops"), WRAPPED)
def test_an_fp16_wrapper_adds_its_counted_passes_to_the_update(impl: str, waited_bytes: int, waited_ops: int,
                                                                after_bytes: int, tensor_ops: int, group_ops: int):
    """Per gradient tensor the operators the host waits on, each with its launch, then the rest: the longer of
    the device's traffic and launches and the host's issuing of the per-tensor operators."""
    hw = load_hardware("a100-800g")
    fused = _breakdown(_plan())["optimizer"]
    wrapped = _breakdown(_plan(optimizer_impl=impl))["optimizer"]
    params, tensors = _gpt().total_params, parameter_tensors(_gpt())
    bw, lat = hw.device.achieved_memory_bandwidth(), hw.device.launch_latency
    op = (OPTIMIZER_OP_HOST + LAUNCH_CALL) / hw.device.host_speed
    waited = waited_bytes * params / bw + tensors * waited_ops * (op + lat)
    passes = max(after_bytes * params / bw + (tensor_ops * tensors + group_ops) * lat, tensor_ops * tensors * op)
    assert wrapped - fused == pytest.approx(waited + passes, rel=1e-9)
    assert fp16_wrappers.fp16_optimizer_time(_gpt(), hw, _plan(), params) == 0.0  # fused: nothing added


@pytest.mark.parametrize("faster", ["memory_bandwidth", "host"])
def test_a_faster_device_or_host_never_slows_the_deepspeed_step(tmp_path, faster: str):
    """Physics invariant across both DeepSpeed knobs, with pipeline stages (pp 2) and recomputation."""
    edit = ("device: {memory_bandwidth: 4000 GB/s}" if faster == "memory_bandwidth"
            else "device: {host: {speed: 2.0, cores: 128}}")
    path = tmp_path / "fast.yaml"
    path.write_text(f"extends: a100-800g\nname: fast\n{edit}\n")
    plan = _plan(devices=64, dp=32, pp=2, dp_impl="post-backward", optimizer_impl="deepspeed-fp16")
    base = StepModel(_gpt(), load_hardware("a100-800g")).predict(plan).step_time_s
    fast = StepModel(_gpt(), load_hardware(str(path))).predict(plan).step_time_s
    assert fast <= base


@pytest.mark.parametrize(("changes", "match"), [
    ({"dp_impl": "post-backward", "overlap": True}, "after the backward pass"),
    ({"dp_impl": "post-backward", "zero": 1}, "whole gradients"),
    ({"dp_impl": "post-backward", "compression": "fp16"}, "uncompressed"),
    ({"optimizer_impl": "deepspeed-fp16", "dtype": "bf16"}, "dtype: fp16"),
    ({"optimizer_impl": "deepspeed-fp16", "zero": 1}, "flat shards"),
    ({"optimizer_impl": "megatron-fp16-2020", "dtype": "bf16"}, "dtype: fp16"),
])
def test_a_deepspeed_knob_outside_its_code_path_is_a_one_line_plan_error(changes: dict, match: str):
    with pytest.raises(PlanError, match=match) as info:
        validate(_plan(**changes))
    assert "\n" not in str(info.value)


def test_the_vtrain_rows_run_megatron_deepspeeds_fp16_engine():
    from dlperf.validate import load_dataset

    rows = [r for r in load_dataset() if r.source.startswith("vtrain")]
    assert rows and all(r.plan.dp_impl == "post-backward" and r.plan.optimizer_impl == "deepspeed-fp16" for r in rows)


def test_the_cli_takes_both_knobs(run):
    code, out, err = run("predict", "gpt2-xl", "a100-800g", "--gpus", "16", "--global-batch", "64",
                         "--micro-batch", "4", "--dtype", "fp16", "--dp-impl", "post-backward",
                         "--optimizer-impl", "deepspeed-fp16")
    assert code == 0, err
    assert "comm/dp_allreduce" in out and "optimizer" in out


def test_the_2020_2021_megatron_rows_all_reduce_after_the_backward_pass():
    """Megatron-LM's local DDP (the default DDP_impl) at the commits those tables were measured with: @5281919
    backward_step calls allreduce_params after loss.backward(); @6fd78189 train_step calls allreduce_gradients
    after the schedule (dlperf.engine.post_backward). ZeRO-3 rows of Narayanan's Table 2 run DeepSpeed's ZeRO."""
    from dlperf.validate import load_dataset

    rows = [r for r in load_dataset() if r.source in ("megatron2020-tables", "narayanan2021-table1",
                                                       "narayanan2021-table2")]
    assert len(rows) == 44
    assert all(r.plan.dp_impl == ("nccl" if r.plan.zero else "post-backward") for r in rows)
    # @5281919's megatron/fp16 FP16_Optimizer; the 2021 rows run the fused Float16Optimizer (no per-tensor waits)
    assert all(r.plan.optimizer_impl == ("megatron-fp16-2020" if r.source == "megatron2020-tables" else "fused")
               for r in rows)


def test_an_fp16_wrapper_on_a_bf16_model_is_refused_in_one_line(run):
    """Without --dtype the model's own dtype decides: Llama 3 trains in bf16, which no fp16 wrapper runs."""
    code, out, err = run("predict", "llama3-8b", "dgx-h100", "--gpus", "8", "--optimizer-impl", "megatron-fp16-2020")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "fp16 optimizer wrapper" in err and "found 'bf16'" in err
