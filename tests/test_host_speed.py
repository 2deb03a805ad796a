"""device.host: the CPU that runs the framework and launches the kernels, and its single-thread speed
(spec/hardware.py, HOST_REFERENCE), which divides the host seconds per launch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlperf.engine import predict
from dlperf.errors import SpecError
from dlperf.plan import Plan
from dlperf.spec.hardware import (
    DEFAULT_DISPATCH,
    FRAMEWORK_HOST,
    GRACE_HOST_SPEED,
    LAUNCH_CALL,
    load_hardware,
)
from dlperf.spec.model import load_model


@pytest.mark.parametrize(("name", "speed"), [("dgx-a100", 0.683), ("a100-800g", 0.683), ("a100-40gb", 0.683),
                                             ("jean-zay-a100", 0.885), ("dgx-h100", 0.995), ("dgx-b200", 1.047),
                                             ("gb200-nvl72", 0.362), ("dgx-gb300", 0.362), ("hgx-h200", 1.0),
                                             ("dgx-b300", 1.204)])
def test_dispatch_is_the_reference_over_the_host_speed(name: str, speed: float) -> None:
    """DGX A100's EPYC 7742 (Zen 2, 3.4 GHz) is 0.683 of the Zen 4 reference, Jean Zay's EPYC 7543 (Zen 3,
    3.7 GHz) 0.885 and overrides the file it extends; the DGX H100's and B200's Xeons measured against it 0.995 and
    1.047 (DGX B300's Xeon 6776P 1.204: the same measured floor scaled to its 4.6 GHz turbo), Grace 0.362 of the
    H100's host; a file naming no host (HGX H200) keeps the reference's figures."""
    device = load_hardware(name).device
    assert device.dispatch_forward == pytest.approx(DEFAULT_DISPATCH[0] / speed)
    assert device.dispatch_backward == pytest.approx(DEFAULT_DISPATCH[1] / speed)


@pytest.mark.parametrize("name", ["gb200-nvl72", "dgx-gb300"])
def test_the_launch_call_measured_on_grace_costs_grace_what_was_measured(name: str) -> None:
    """tritonbench#1017's 3.0 us cuLaunchKernel ran on GB200's Grace: converted to the reference by the speed the
    Grace files give (1.09 us there), a Grace host pays the measured 3.0 us again, on top of the framework's 20.1
    us at Grace's speed."""
    device = load_hardware(name).device
    assert device.host_speed == GRACE_HOST_SPEED
    assert pytest.approx(3.0e-6 * 0.362) == LAUNCH_CALL
    assert device.dispatch_forward == pytest.approx(FRAMEWORK_HOST[0] / 0.362 + 3.0e-6)


def test_a_measured_dispatch_wins_over_the_host_estimate(tmp_path) -> None:
    path = tmp_path / "measured.yaml"
    path.write_text("extends: dgx-a100\nname: measured\ndevice:\n  dispatch: {forward: 9 us, backward: 11 us}\n")
    device = load_hardware(str(path)).device
    assert (device.dispatch_forward, device.dispatch_backward) == pytest.approx((9e-6, 11e-6))
    assert "EPYC" not in device.host_cpu  # the inherited host no longer names what was measured


@pytest.mark.parametrize(("host", "field"), [
    ("{cpu: x, speed: 0}", "device.host.speed"),
    ("{cpu: x, speed: -1}", "device.host.speed"),
    ("{cpu: x, speed: 1000}", "device.host.speed"),
    ("{cpu: x, speed: 1.0e-300}", "device.host.speed"),  # was accepted: 1e295 s per launch
    ("{cpu: x, speed: 5.0e-324}", "device.host.speed"),  # was accepted: an infinite launch, a NaN step
    ("{cpu: x, speed: .nan}", "device.host.speed"),
    ("{cpu: x, speed: fast}", "device.host.speed"),
    ("{cpu: x, speed: true}", "device.host.speed"),
    ("{cpu: '', speed: 1}", "device.host.cpu"),
    ("{cpu: x, speed: 1, clock: 3}", "device.host"),
    ("fast", "device.host"),
])
def test_a_bad_host_names_its_field(tmp_path, host: str, field: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(f"extends: dgx-a100\nname: odd\ndevice:\n  host: {host}\n")
    with pytest.raises(SpecError) as err:
        load_hardware(str(path))
    assert field in str(err.value)


@pytest.mark.parametrize("plan", [
    Plan(devices=8, tp=8, global_batch=2, micro_batch=1, recompute="full"),
    Plan(devices=8, tp=2, pp=4, global_batch=8, micro_batch=1, recompute="full"),
    Plan(devices=8, dp=8, global_batch=8, micro_batch=1, zero=3, recompute="selective"),
])
def test_a_faster_host_is_never_slower_and_a_slow_one_shows_on_the_host(plan: Plan) -> None:
    """A small GPT at micro-batch 1 is host-bound on an A100: the step grows with the host's time per launch,
    and a faster CPU never makes it slower."""
    model = load_model("gpt", {"hidden": 1024, "heads": 16, "layers": 4, "seq": 1024})
    hw = load_hardware("dgx-a100")
    times = []
    for speed in (0.5, 0.683, 1.0, 2.0):
        device = replace(hw.device, dispatch_forward=DEFAULT_DISPATCH[0] / speed,
                         dispatch_backward=DEFAULT_DISPATCH[1] / speed)
        times.append(predict(model, replace(hw, device=device), plan).step_time_s)
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(times, times[1:], strict=False))
    assert times[0] > times[-1]


def test_a_host_bound_prediction_names_the_cpu_it_was_priced_for() -> None:
    """A step mostly waiting for the CPU says so and names the host; a device-bound one does not."""
    small = load_model("gpt", {"hidden": 1024, "heads": 16, "layers": 4, "seq": 1024})
    hw = load_hardware("dgx-a100")
    bound = predict(small, hw, Plan(devices=8, tp=8, global_batch=2, micro_batch=1, recompute="full"))
    assert any("host-bound" in n and "EPYC 7742" in n for n in bound.notes)
    busy = predict(load_model("gpt3-175b"), hw, Plan(devices=1024, tp=8, pp=16, global_batch=1536, micro_batch=1))
    assert not any("host-bound" in n for n in busy.notes)
