"""A per-tensor optimizer step (dlperf.engine.optimizer_loop): PyTorch < 2.0's torch.optim loop launches a few
kernels per parameter tensor; after fp16's GradScaler sync the host's time to issue them is the step's."""

from __future__ import annotations

import pytest

from dlperf.engine.optimizer_loop import (
    KERNELS_PER_TENSOR,
    OPTIMIZER_OP_HOST,
    ZERO_GRAD_KERNELS,
    parameter_tensors,
)
from dlperf.engine.step import StepModel
from dlperf.errors import PlanError
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import LAUNCH_CALL, load_hardware
from tests.test_input_pipeline import _hw, _resnet


def _optimizer_s(dtype: str, impl: str, hw=None) -> float:
    plan = Plan(devices=8, global_batch=2048, micro_batch=256, dtype=dtype, optimizer="momentum", grad_dtype="fp32",
                optimizer_impl=impl)
    return StepModel(_resnet(), hw or _hw()).predict(plan).breakdown_s["optimizer"]


def test_resnet50_holds_torchvisions_161_parameter_tensors():
    # len(list(torchvision.models.resnet50().parameters())): 53 convolution weights (no biases), 53 batch norms'
    # weight and bias, the classifier's weight and bias
    assert parameter_tensors(_resnet()) == 53 + 2 * 53 + 2


def _host_file(tmp_path, speed: float):
    """DGX A100 with another host CPU of the given single-thread speed (spec/hardware.py HOST_REFERENCE)."""
    path = tmp_path / f"host-{speed}.yaml"
    path.write_text(f"extends: dgx-a100\nname: host-{speed}\ndevice: {{host: {{speed: {speed}, cores: 128}}}}\n")
    return load_hardware(str(path))


def test_fp16_per_tensor_step_lasts_the_hosts_issuing_time(tmp_path):
    """After GradScaler's .item() the device has drained: 161 tensors x (3 momentum kernels + zero_grad) issued by
    a host at half the reference's speed (2.04 + 1.09 us per operator / 0.5 = 6.3 us), longer than the device's
    644 launches (5 us each)."""
    hw = _host_file(tmp_path, 0.5)
    launches = parameter_tensors(_resnet()) * (KERNELS_PER_TENSOR["momentum"] + ZERO_GRAD_KERNELS)
    host = launches * (OPTIMIZER_OP_HOST + LAUNCH_CALL) / hw.device.host_speed
    assert host > launches * hw.device.launch_latency
    assert _optimizer_s("fp16", "per-tensor", hw) == pytest.approx(host, rel=1e-9)


def test_a_host_faster_than_the_devices_launches_leaves_the_device_bound():
    """DGX A100's EPYC 7742 (speed 0.683) issues an operator in (2.04 + 1.09) / 0.683 = 4.6 us, under the device's
    5 us launch latency: the step is the device's, at least the host's issuing time."""
    hw = _hw()
    launches = parameter_tensors(_resnet()) * (KERNELS_PER_TENSOR["momentum"] + ZERO_GRAD_KERNELS)
    host = launches * (OPTIMIZER_OP_HOST + LAUNCH_CALL) / hw.device.host_speed
    assert host < launches * hw.device.launch_latency
    assert _optimizer_s("fp16", "per-tensor") > host


def test_without_the_sync_only_the_devices_launches_show():
    """TF32 (no GradScaler): the host issued the loop during backward; the device still runs a kernel per launch."""
    hw = _hw()
    fused, loop = _optimizer_s("tf32", "fused"), _optimizer_s("tf32", "per-tensor")
    launches = parameter_tensors(_resnet()) * (KERNELS_PER_TENSOR["momentum"] + ZERO_GRAD_KERNELS)
    assert loop - fused == pytest.approx((launches - 1) * hw.device.launch_latency, rel=1e-9)


def test_fused_is_the_default_and_a_faster_host_never_slows_the_loop(tmp_path):
    assert Plan().optimizer_impl == "fused"
    assert _optimizer_s("fp16", "fused") < _optimizer_s("fp16", "per-tensor")
    slow, base, fast = (_optimizer_s("fp16", "per-tensor", _host_file(tmp_path, speed)) for speed in (0.5, 0.683, 1.5))
    assert slow > base >= fast


def test_the_dle_resnet_rows_run_torch_optim_sgds_loop():
    """DeepLearningExamples @7bdfc81d image_classification/optimizers.py: torch.optim.SGD, PyTorch 1.9 (21.03)."""
    from dlperf.validate import load_dataset

    rows = [r for r in load_dataset() if r.source == "dle-resnet50"]
    assert len(rows) == 8 and all(r.plan.optimizer_impl == "per-tensor" for r in rows)


@pytest.mark.parametrize(("changes", "match"), [
    ({"optimizer_impl": "foreach"}, "optimizer_impl"),
    ({"optimizer_impl": "per-tensor", "zero": 1}, "flat shards"),
])
def test_a_bad_optimizer_impl_is_a_one_line_plan_error(changes: dict, match: str):
    with pytest.raises(PlanError, match=match) as info:
        validate(Plan(devices=8, global_batch=2048, micro_batch=256, **changes))
    assert "\n" not in str(info.value)


def test_the_cli_takes_the_loop_and_refuses_it_with_zero_in_one_line(run):
    code, out, _ = run("predict", "resnet50", "dgx-a100", "--gpus", "8", "--global-batch", "2048",
                       "--micro-batch", "256", "--dtype", "fp16", "--optimizer", "momentum",
                       "--optimizer-impl", "per-tensor")
    assert code == 0 and "optimizer" in out
    code, _, err = run("predict", "resnet50", "dgx-a100", "--gpus", "8", "--optimizer-impl", "per-tensor",
                       "--zero", "1")
    assert code == 2 and "flat shards" in err and len(err.strip().splitlines()) == 1


def test_explain_re_predicts_the_per_tensor_step_fused():
    from dlperf.search import explain

    plan = Plan(devices=8, global_batch=2048, micro_batch=256, dtype="fp16", optimizer="momentum",
                optimizer_impl="per-tensor")
    rows = {r["change"]: r["step_time_s"] for r in explain(_resnet(), _hw(), plan)["sensitivities"]}
    fused = StepModel(_resnet(), _hw()).predict(plan.with_(optimizer_impl="fused")).step_time_s
    assert rows["optimizer per-tensor -> fused"] == pytest.approx(fused, rel=1e-9)
    assert fused < StepModel(_resnet(), _hw()).predict(plan).step_time_s
