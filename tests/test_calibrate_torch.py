"""Calibration parts that need torch: its kernels, gloo collectives between 2 processes, the check models."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from dlperf.calibrate import backend_torch as T  # noqa: E402
from dlperf.calibrate import check, check_nets, comm, hwfile, network  # noqa: E402
from dlperf.calibrate.timing import summarize  # noqa: E402
from dlperf.spec.hardware import load_hardware  # noqa: E402
from dlperf.spec.model import load_model  # noqa: E402


def test_torch_kernels_compute_what_they_claim():
    k = T.TorchKernels(torch, "cpu")
    assert k.dtypes == ("fp32", "bf16", "fp16")
    out = k.gemm(3, 4, 5, "bf16")()
    assert out.shape == (3, 5) and out.dtype == torch.bfloat16
    assert k.gemm(3, 4, 5, "fp32", batch=2)().shape == (2, 3, 5)
    from dlperf.calibrate.probes import ConvShape

    shape = ConvShape("t", 3, 8, 4, 3, 2, 1)
    assert k.conv(shape, 2, backward=False)().shape == (2, 4, shape.out_size, shape.out_size)
    grad_in, grad_w, _ = k.conv(shape, 2, backward=True)()
    assert grad_in.shape == (2, 3, 8, 8) and grad_w.shape == (4, 3, 3, 3)
    assert float(k.memory("sum", 4 * 10)()) == 10.0
    soft = k.memory("softmax", 4 * 2048)
    soft()
    for kind in ("relu", "gelu", "tanh"):
        k.memory(kind, 4 * 16)()
    assert T.device_memory(torch, "cpu") > 0


def test_flags_are_restored():
    before = torch.backends.cuda.matmul.allow_tf32
    with T.saved_flags(torch):
        torch.backends.cuda.matmul.allow_tf32 = not before
    assert torch.backends.cuda.matmul.allow_tf32 == before


@pytest.mark.parametrize("name", check.MODELS)
def test_check_models_match_their_specs(name):
    model, make = check_nets.build(name)
    spec = load_model(check_nets.spec_path(name))
    assert check_nets.param_count(model) == spec.total_params
    x, y = make(3)
    logits = model(x)
    assert logits.shape[0] == y.shape[0]
    step = check_nets.train_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y)
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_gloo_collectives_between_two_processes():
    result = comm.calibrate_comm(quick=True, ops=comm.OPS, sizes=(4, 64, 1024, 16384, 262144), timeout_s=120)
    assert set(result.fits) == set(comm.OPS)
    for f in result.fits.values():
        assert f.bandwidth > 0 and f.alpha >= 0 and len(f.sizes) == 5
        assert all(t > 0 for t in f.medians)
    level = network.loopback_level(result)
    assert level["name"] == "loopback" and "gloo allreduce" in level["source"]
    stamp = result.stamp()["comm"]
    assert stamp["processes"] == 2 and set(stamp["fits"]) == set(comm.OPS)


def test_comm_rejects_unknown_collectives():
    from dlperf.errors import CalibrationError

    with pytest.raises(CalibrationError, match="unknown collective"):
        comm.calibrate_comm(ops=("alltoall",))


def test_data_parallel_step_is_timed_between_the_ranks_calibration_sweeps():
    cal, timing = check.data_parallel_rank(quick=True, kinds=("launch",))
    assert timing.repeats == check.steps_config(True).repeats and timing.median > 0
    assert cal.environment["concurrent_processes"] == 2 and cal.environment["threads"] == 1
    assert cal.launch is not None and cal.launch.median > 0


def test_check_rows_and_verdict(tmp_path):
    from test_calibrate import synthetic_calibration

    hw = hwfile.write_hardware(tmp_path / "hw.yaml", synthetic_calibration(), "hw",
                               network.template_levels("cpu-local"))
    row = check.CheckRow("mlp", "1 process", 8, 0.012, summarize([0.010], 1), {})
    assert row.error == pytest.approx(0.2)
    result = check.CheckResult([row, check.CheckRow("cnn", "1 process", 8, 0.0099, summarize([0.010], 1), {})],
                               tolerance=0.15, median_tolerance=0.10)
    assert result.median_error == pytest.approx(0.105)
    assert result.failures == ["mlp (1 process): error +20.0% exceeds 15%", "median |error| 10.5% exceeds 10%"]
    assert result.stamp()["check"]["passed"] is False
    pred = check.predict_step("mlp", load_hardware(tmp_path / "hw.yaml"), 1, 16)
    assert math.isfinite(pred.step_time_s) and pred.step_time_s > 0
    measured = {name: summarize([0.01], 1) for name in check.MODELS}
    full = check.run_check(load_hardware(tmp_path / "hw.yaml"), measured, load_hardware(tmp_path / "hw.yaml"),
                           summarize([0.02], 1))
    assert [(r.model, r.setup, r.batch) for r in full.rows] == [
        ("mlp", "1 process", check.BATCH["mlp"]), ("cnn", "1 process", check.BATCH["cnn"]),
        ("transformer", "1 process", check.BATCH["transformer"]),
        ("mlp", "dp=2 (gloo, 1 thread each)", 2 * check.BATCH["mlp"])]
    assert all(r.predicted_s > 0 and r.error == pytest.approx(r.predicted_s / r.measured.median - 1) for r in full.rows)
    assert hw.name == "hw"



def test_dispatch_is_measured_on_the_host_clock_and_written_to_the_file(monkeypatch):
    """The host cost per engine-counted launch of an eager transformer layer: microseconds (pytorch/pytorch#41383
    and #82793 report 4-7 us per op), and what the written file gives the engine."""
    assert T._layer_launches() == (17, 37)  # forward: 2 layernorms, attention 10, 2 linears, gelu, 2 adds
    forward, backward = T.dispatch_times(torch, "cpu", layers=4, rounds=3)
    assert 1e-7 < forward < 1e-3 and 1e-7 < backward < 1e-3
    from dlperf.calibrate import calibration as C

    cal = C.Calibration("torch", "cpu", "test CPU", 2.0**33, True, [], [], None, [], {}, "now", 1.0, 0.0,
                        dispatch=(forward, backward), sms=None)
    lines = hwfile._host_lines(cal)
    assert len(lines) == 1 and "dispatch: {forward:" in lines[0]
    cal.sms = 108
    assert hwfile._host_lines(cal)[0].startswith("  sms: 108")
