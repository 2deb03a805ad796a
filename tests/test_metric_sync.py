"""Composer's per-batch collectives and train-metric sync (dlperf.engine.metric_sync)."""

import pytest

import dlperf.comm as comm
from dlperf.engine import predict
from dlperf.engine.metric_sync import STATES_PER_METRIC, metric_sync_time, per_rank_time, synced_metrics
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

MPT_1B = {"hidden": 2048, "heads": 16, "layers": 24, "seq": 2048}


def _plan(devices: int) -> Plan:
    return Plan(devices=devices, dp=devices, global_batch=12 * devices, micro_batch=12, zero=2, dtype="bf16")


def test_each_rank_adds_its_per_state_work_to_every_synced_state():
    """Doubling the world from 256 to 512 adds 256 ranks' zeros_like and copy-back to each of the 4 synced states
    (2 composer metrics x 2 states), on top of collectives that only grow."""
    model, hw = load_model("mpt", MPT_1B), load_hardware("dgx-h100")
    metrics = synced_metrics(model)
    states = STATES_PER_METRIC * metrics
    assert states == 4
    grown = metric_sync_time(metrics, hw, _plan(512), comm) - metric_sync_time(metrics, hw, _plan(256), comm)
    assert grown >= states * 256 * per_rank_time(hw) > 0


def test_one_device_or_no_metrics_syncs_nothing():
    """No peers, or a model without composer's training metrics (gpt), pays nothing."""
    hw = load_hardware("dgx-h100")
    assert metric_sync_time(synced_metrics(load_model("mpt", MPT_1B)), hw, _plan(1), comm) == 0.0
    assert synced_metrics(load_model("gpt")) == 0
    assert metric_sync_time(synced_metrics(load_model("gpt")), hw, _plan(64), comm) == 0.0


def test_the_sync_is_exposed_in_the_step_and_its_breakdown():
    """The step lasts the sync longer than without it, filed under overhead/metric_sync."""
    model, hw = load_model("mpt", MPT_1B), load_hardware("dgx-h100")
    result = predict(model, hw, _plan(128))
    sync = result.breakdown_s["overhead/metric_sync"]
    assert sync == metric_sync_time(synced_metrics(model), hw, _plan(128), comm) > 0
    assert result.step_time_s >= sync + result.breakdown_s["compute/forward"] + result.breakdown_s["compute/backward"]


def test_a_slower_host_pays_more_per_rank():
    """The per-rank host work is the reference host's, scaled by the host's speed like every other host cost:
    Grace (GB200, 0.362 of the reference) pays 1/0.362 of it, where the host and not the device sets the pace."""
    from dlperf.engine.device import host_scale
    from dlperf.engine.metric_sync import SLICE_PYTHON_OP_S
    from dlperf.spec.hardware import LAUNCH_CALL

    for name in ("dgx-h100", "gb200-nvl72", "dgx-a100"):
        device = load_hardware(name).device
        host = (SLICE_PYTHON_OP_S + LAUNCH_CALL) * host_scale(device)
        assert per_rank_time(load_hardware(name)) == pytest.approx(max(host, 2 * device.launch_latency))
    assert host_scale(load_hardware("gb200-nvl72").device) == pytest.approx(1 / 0.362, rel=0.01)


def test_dualpipe_pays_the_sync_too():
    """The sync follows every batch whatever the pipeline schedule: DualPipe's step carries it as 1F1B's does."""
    model, hw = load_model("mpt", MPT_1B), load_hardware("dgx-h100")
    plan = Plan(devices=16, dp=8, pp=2, global_batch=64, micro_batch=1, schedule="dualpipe", dtype="bf16")
    result = predict(model, hw, plan)
    sync = result.breakdown_s["overhead/metric_sync"]
    assert sync == metric_sync_time(synced_metrics(model), hw, plan, comm) > 0
    assert result.step_time_s >= sync + result.breakdown_s["compute/forward"] + result.breakdown_s["compute/backward"]
