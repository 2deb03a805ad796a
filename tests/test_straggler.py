"""The slowest of N synchronising devices (dlperf.engine.straggler) and device.speed_spread."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.engine import predict
from dlperf.engine.straggler import expected_max_normal, straggler_factor
from dlperf.errors import SpecError
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model


def test_blom_matches_the_exact_expected_maxima():
    """Blom's approximation against the exact E[max of N standard normals] (Harter 1961 tables: 0.5642 for 2,
    1.4236 for 8, 2.3338 for 64) to within 0.03; one device has no slower peer."""
    assert expected_max_normal(1) == 0
    for n, exact in ((2, 0.5642), (8, 1.4236), (64, 2.3338)):
        assert expected_max_normal(n) == pytest.approx(exact, abs=0.03)


@given(st.floats(0, 0.5), st.integers(1, 4096), st.integers(1, 4096))
@settings(max_examples=60, deadline=None)
def test_more_devices_never_pace_faster(sigma, n, extra):
    """A larger synchronising group's slowest device is never faster, and no spread means no slowdown."""
    assert straggler_factor(sigma, n + extra) >= straggler_factor(sigma, n) >= 1.0
    assert straggler_factor(0.0, n) == 1.0


def test_the_spread_slows_compute_by_the_factor_and_the_breakdown_sums():
    """On 8 data-parallel V100s the kernels of the step take 1 + sigma z_8 the median device's time, filed under
    compute/straggler; a smaller spread (faster hardware in this term) is never slower."""
    model, hw = load_model("gpt"), load_hardware("dgx1-v100")
    plan = Plan(devices=8, global_batch=64)
    even = predict(model, replace(hw, device=replace(hw.device, speed_spread=0.0)), plan)
    spread = predict(model, hw, plan)
    kernels = sum(even.breakdown_s[k] for k in ("compute/forward", "compute/backward", "compute/recompute"))
    extra = (straggler_factor(hw.device.speed_spread, 8) - 1) * kernels
    assert hw.device.speed_spread > 0
    assert spread.breakdown_s["compute/straggler"] == pytest.approx(extra, rel=1e-9)
    assert spread.step_time_s > even.step_time_s
    assert sum(spread.breakdown_s.values()) == pytest.approx(spread.step_time_s, rel=1e-12)


def test_a_speed_spread_must_be_a_fraction(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("extends: dgx-a100\nname: odd\ndevice:\n  speed_spread: 1.5\n")
    with pytest.raises(SpecError, match="speed_spread"):
        load_hardware(str(path))


def test_dualpipe_ranks_run_at_the_slowest_pace_too():
    """DualPipe prices its ranks' chunks at the slowest device's pace as well, and its breakdown still sums."""
    model, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    plan = Plan(devices=64, tp=1, pp=4, ep=8, global_batch=256, micro_batch=1, schedule="dualpipe")
    even_hw = replace(hw, device=replace(hw.device, speed_spread=0.0))
    spread = replace(hw, device=replace(hw.device, speed_spread=0.02))
    even, slow = predict(model, even_hw, plan), predict(model, spread, plan)
    assert even.breakdown_s["compute/straggler"] == 0 < slow.breakdown_s["compute/straggler"]
    assert slow.step_time_s > even.step_time_s
    assert sum(slow.breakdown_s.values()) == pytest.approx(slow.step_time_s, rel=1e-9)


STAND_IN = ("dgx-h100", "h800", "hgx-h200", "dgx-b200", "gb200-nvl72", "dgx-gb300", "dgx-b300", "dgx2-v100")


@pytest.mark.parametrize("name", STAND_IN)
def test_power_limited_parts_carry_v100s_measured_spread(name):
    """No fleet measurement exists for these parts; each carries V100-SXM2's measured robust sigma (dgx1-v100,
    1.71%, the smaller of the two published fleet figures), the mechanism being power management at the power
    limit, which their long GEMMs reach (their matmul curves' sources)."""
    assert load_hardware(name).device.speed_spread == load_hardware("dgx1-v100").device.speed_spread == 0.0171


@pytest.mark.parametrize("name", ["dgx-a100", "a100-40gb", "jean-zay-a100", "a100-800g"])
def test_a100_sxm_carries_no_spread(name):
    """A100 SXM4 runs its long GEMMs at the same rate past 5, 10 and 20 ms (not power-limited), and the A100 fleet
    figure is of the 250 W PCIe part: no spread is carried over."""
    assert load_hardware(name).device.speed_spread == 0.0
