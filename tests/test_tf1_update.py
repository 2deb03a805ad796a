"""The TF1 graph-mode update branch issued after Horovod's allreduce (dlperf.engine.tf1_update)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlperf.engine.optimizer_loop import parameter_tensors
from dlperf.engine.step import StepModel
from dlperf.engine.tf1_update import (
    ACCUMULATE_SYNC_HOST,
    HOST_PER_VARIABLE,
    VARIABLES_MEASURED,
    XEON_VM_SPEED,
    accumulation_sync_host,
    branch_host_time,
)
from dlperf.errors import PlanError
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

BERT = {"seq": 128, "mlm_positions": 20, "tf_dropout": True, "tf_xla": True}


def _plan(devices: int, dtype: str, **changes) -> Plan:
    fields = {"devices": devices, "dp": devices, "global_batch": 65536, "micro_batch": 64, "dtype": dtype,
              "optimizer": "adam", "overlap": False, "dp_impl": "horovod-0.19" if devices > 1 else "nccl",
              "optimizer_impl": "tf1-graph"}
    return Plan(**(fields | changes))


def _optimizer_s(plan: Plan) -> float:
    return StepModel(load_model("bert-large", BERT), load_hardware("a100-40gb")).predict(plan).breakdown_s["optimizer"]


@pytest.mark.parametrize("dtype", ["fp16", "tf32"])
def test_after_horovod_the_step_lasts_the_hosts_issuing_time(dtype: str):
    """A100 host (EPYC 7742, speed 0.683): BERT-large's tensors x the measured per-variable host time, longer than
    the device's memory-bound update, so the optimizer time is the host's."""
    hw, model = load_hardware("a100-40gb"), load_model("bert-large", BERT)
    host = parameter_tensors(model) * HOST_PER_VARIABLE[dtype] / hw.device.host_speed
    assert branch_host_time(model, hw, _plan(256, dtype), dtype) == pytest.approx(host, rel=1e-12)
    device = _optimizer_s(_plan(256, dtype, optimizer_impl="fused")) + _assign_copies_s(model, hw, dtype)
    assert _optimizer_s(_plan(256, dtype, optimizer_impl="fused")) < host
    assert _optimizer_s(_plan(256, dtype)) == pytest.approx(max(device, host), rel=1e-12)


def _assign_copies_s(model, hw, dtype: str) -> float:
    """TF32's reference variables: three fp32 copies (read + write) per parameter outside the XLA cluster."""
    return (24 if dtype == "tf32" else 0) * model.total_params / hw.device.achieved_memory_bandwidth()


def test_tf32_reference_variables_copy_every_parameter_three_times_even_on_one_gpu():
    hw, model = load_hardware("a100-40gb"), load_model("bert-large", BERT)
    fused = _optimizer_s(_plan(1, "tf32", optimizer_impl="fused"))
    assert _assign_copies_s(model, hw, "tf32") > 0
    assert _optimizer_s(_plan(1, "tf32")) == pytest.approx(fused + _assign_copies_s(model, hw, "tf32"), rel=1e-12)


def test_without_horovod_the_host_runs_ahead_and_nothing_is_added():
    assert _optimizer_s(_plan(1, "fp16")) == _optimizer_s(_plan(1, "fp16", optimizer_impl="fused"))
    assert _optimizer_s(_plan(8, "fp16", dp_impl="nccl")) == _optimizer_s(_plan(8, "fp16", dp_impl="nccl",
                                                                                optimizer_impl="fused"))


def test_the_dle_tf1_bert_rows_run_the_graph_mode_branch():
    from dlperf.validate import load_dataset

    rows = [r for r in load_dataset() if r.source == "dle-bert-tf1"]
    assert len(rows) == 21 and all(r.plan.optimizer_impl == "tf1-graph" for r in rows)


def test_tf1_graph_with_zero_is_a_one_line_plan_error():
    with pytest.raises(PlanError, match="flat shards") as info:
        validate(Plan(devices=8, global_batch=2048, micro_batch=256, optimizer_impl="tf1-graph", zero=1))
    assert "\n" not in str(info.value)


# ---- the AMP accumulation run's sync on all_are_finite (accumulation_sync_host) -----------------------------------
AMP_PASSES = ("amp-casts", "unscale", "finite-check", "global-norm", "clip")


def _accumulation_s(plan: Plan) -> float:
    """Gradient accumulation per micro-batch (the breakdown's term over the plan's micro-batches)."""
    model = StepModel(load_model("bert-large", BERT), load_hardware("a100-40gb"))
    return model.predict(plan).breakdown_s["compute/grad_accumulation"] / plan.micro_batches


def test_the_sync_is_the_measured_tail_per_variable_at_the_hosts_speed_and_only_with_the_finite_check():
    hw, model = load_hardware("a100-40gb"), load_model("bert-large", BERT)
    per_variable = ACCUMULATE_SYNC_HOST / VARIABLES_MEASURED * XEON_VM_SPEED
    amp = _plan(1, "fp16", grad_passes=AMP_PASSES, grad_dtype="fp32")
    assert accumulation_sync_host(model, hw, amp) == pytest.approx(
        parameter_tensors(model) * per_variable / hw.device.host_speed, rel=1e-12)
    # TF32: all_are_finite is tf.constant(True), no finite-check pass, no sync; nor outside the TF1 graph
    assert accumulation_sync_host(model, hw, _plan(1, "tf32", grad_passes=("global-norm", "clip"))) == 0.0
    assert accumulation_sync_host(model, hw, replace(amp, optimizer_impl="fused")) == 0.0


def test_after_the_sync_the_tail_lasts_the_hosts_issuing_time_when_longer():
    """BERT-large on an A100 40GB: the global norm, clip and accumulate over 336M fp32 gradients (~6 ms) are shorter
    than the host's tail (~11 ms at the EPYC 7742's speed), so the tail is the host's and the passes before the
    sync (casts, unscale, finite check) add to it."""
    hw, model = load_hardware("a100-40gb"), load_model("bert-large", BERT)
    amp = _plan(1, "fp16", grad_passes=AMP_PASSES, grad_dtype="fp32")
    fused = replace(amp, optimizer_impl="fused")  # the same device work, no sync
    accumulate = _accumulation_s(replace(fused, grad_passes=()))
    before = _accumulation_s(replace(fused, grad_passes=AMP_PASSES[:3])) - accumulate
    device_tail = _accumulation_s(fused) - before  # global norm, clip and the accumulate itself
    host = accumulation_sync_host(model, hw, amp)
    assert accumulate < device_tail < host
    assert _accumulation_s(amp) == pytest.approx(before + host, rel=1e-9)


def test_without_the_sync_the_accumulation_is_unchanged():
    tf32 = _plan(1, "tf32", grad_passes=("global-norm", "clip"))
    assert _accumulation_s(tf32) == _accumulation_s(replace(tf32, optimizer_impl="fused"))


def test_the_amp_rows_check_finiteness_and_the_tf32_rows_do_not():
    """optimization.py @729963dd line 130: all_are_finite is a reduce_all over the gradients with AMP, a constant
    otherwise, which is what decides whether the accumulation run syncs."""
    from dlperf.validate import load_dataset

    rows = [r for r in load_dataset() if r.source == "dle-bert-tf1"]
    assert {r.plan.dtype: "finite-check" in r.plan.grad_passes for r in rows} == {"fp16": True, "tf32": False}
