"""Calibration without torch: timing, fits, the numpy kernels, the hardware file it writes and its atomic write."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dlperf.calibrate import backend_numpy as B
from dlperf.calibrate import calibration as C
from dlperf.calibrate import hwfile, network, probes
from dlperf.calibrate.fit import fit_line, golden_min, r_squared
from dlperf.calibrate.probes import Point, Series
from dlperf.calibrate.timing import Timing, TimingConfig, host_sampler, inner_calls, summarize, time_kernel
from dlperf.errors import CalibrationError
from dlperf.spec.hardware import load_hardware

# ---------------------------------------------------------------------------------------------------- timing


def test_summarize_quartiles_and_spread():
    t = summarize([3.0, 1.0, 2.0, 4.0], inner=2)
    # inclusive quartiles of 1, 2, 3, 4: 1.75, 2.5, 3.25
    assert (t.median, t.p25, t.p75, t.minimum, t.maximum) == (2.5, 1.75, 3.25, 1.0, 4.0)
    assert t.spread == pytest.approx(1.5 / 2.5)
    assert (t.repeats, t.inner) == (4, 2)


def test_inner_calls_reaches_the_sample_floor():
    config = TimingConfig(min_sample_s=2e-3, max_inner=1000)
    assert inner_calls(1e-4, config) == 20
    assert inner_calls(1.0, config) == 1
    assert inner_calls(0.0, config) == 1000
    assert inner_calls(1e-9, config) == 1000


class FakeClock:
    """A clock that only moves when the kernel runs: each call costs `cost` seconds."""

    def __init__(self, cost: float) -> None:
        self.now, self.cost, self.calls = 0.0, cost, 0

    def __call__(self) -> float:
        return self.now

    def kernel(self) -> None:
        self.now += self.cost
        self.calls += 1


def test_time_kernel_warms_up_and_repeats_with_syncs():
    clock = FakeClock(1e-4)
    syncs = []
    sampler = host_sampler(sync=lambda: syncs.append(1), clock=clock)
    t = time_kernel(clock.kernel, TimingConfig(warmup=3, repeats=5, min_sample_s=1e-3), sampler)
    assert t.median == pytest.approx(1e-4) and t.spread == pytest.approx(0.0, abs=1e-9)
    assert t.inner == 10 and t.repeats == 5
    assert clock.calls == 3 + 5 * 10          # 3 single-call warm-ups, then 5 samples of 10 calls
    assert len(syncs) == 2 * (3 + 5)          # before and after every sample


# ------------------------------------------------------------------------------------------------------- fit


def test_fit_recovers_exact_hockney_line():
    n = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    fit = fit_line(n, 2e-6 + n / 1e9)
    assert fit.t0 == pytest.approx(2e-6, rel=1e-9)
    assert fit.rate == pytest.approx(1e9, rel=1e-9)
    assert fit.half == pytest.approx(2000.0, rel=1e-8)           # n_1/2 = t0 * r_inf
    assert fit.r2 == pytest.approx(1.0) and fit.r2_rate == pytest.approx(1.0)
    assert fit.max_rel < 1e-9
    assert fit.best_rate == pytest.approx(1e7 / (2e-6 + 1e-2))


def test_fit_clamps_a_negative_intercept_to_zero():
    n = np.array([1e4, 1e5, 1e6])
    fit = fit_line(n, n / 1e9 - 5e-7)   # a line through these points would cross zero above n = 0
    assert fit.t0 == 0.0
    assert 0.9e9 < fit.rate < 1e9 / 0.95


def test_fit_with_fixed_intercept_fits_only_the_rate():
    n = np.array([1e8, 2e8, 4e8])
    fit = fit_line(n, 1e-6 + n / 2e10, t0=1e-6)
    assert fit.t0 == 1e-6 and fit.rate == pytest.approx(2e10, rel=1e-9)
    one = fit_line([1e8], [0.01], t0=0.0)  # one size is enough when t0 is given
    assert one.rate == pytest.approx(1e10)


def test_fit_log_residuals_are_symmetric():
    # a point measured 2x slow and one 2x fast around t = n / r are balanced: the log fit keeps r
    n = np.array([1e6, 1e6, 1e7, 1e7])
    t = np.array([2e-3, 0.5e-3, 2e-2, 0.5e-2])
    assert fit_line(n, t, t0=0.0).rate == pytest.approx(1e9, rel=1e-7)  # a flat minimum: ~sqrt(eps)


def test_fit_refuses_too_little_data():
    with pytest.raises(CalibrationError, match="at least 2 distinct sizes"):
        fit_line([1e3, 1e3], [1e-6, 2e-6], "matmul fp32")
    with pytest.raises(CalibrationError, match="differ in shape"):
        fit_line([1.0, 2.0], [1.0])


def test_r_squared_by_hand():
    assert r_squared(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])) == pytest.approx(0.5)
    assert r_squared(np.array([2.0, 2.0]), np.array([2.0, 2.0])) == 1.0


def test_golden_min_finds_a_parabola_minimum_and_endpoints():
    assert golden_min(lambda x: (x - 0.3) ** 2, 0.0, 1.0) == pytest.approx(0.3, abs=1e-9)
    assert golden_min(lambda x: x, 0.0, 1.0) == 0.0


@settings(max_examples=40, deadline=None)
@given(t0=st.one_of(st.just(0.0), st.floats(1e-7, 1e-3)), rate=st.floats(1e6, 1e13),
       decades=st.integers(2, 6))
def test_fit_recovers_any_exact_line(t0, rate, decades):
    n = np.geomspace(1e3, 1e3 * 10**decades, 8)
    assume(t0 * rate < 0.5 * n.max())  # within the cap on n_1/2 (tested on its own below)
    fit = fit_line(n, t0 + n / rate)
    assert fit.rate == pytest.approx(rate, rel=1e-6)
    assert fit.t0 == pytest.approx(t0, rel=1e-5, abs=1e-6 * float((t0 + n / rate).min()))
    assert fit.max_rel < 1e-6


# ---------------------------------------------------------------------------------------------------- probes


def test_conv_shapes_follow_the_survey_formulas():
    s = next(x for x in probes.CONV_SHAPES if x.name == "resnet-3x3-64")
    assert s.out_size == 56
    assert s.flops(1) == 2 * 64 * 56 * 56 * 64 * 9
    stem = next(x for x in probes.CONV_SHAPES if x.name == "resnet-stem-7x7")
    assert stem.out_size == 112                      # floor((224 + 6 - 7) / 2) + 1
    lenet = next(x for x in probes.CONV_SHAPES if x.name == "lenet-5x5-6-16")
    assert lenet.out_size == 10 and lenet.flops(2) == 2 * 2 * 16 * 100 * 6 * 25
    assert probes.gemm_flops(2, 3, 4, 5) == 240


def _direct_conv(x, w, stride, pad):
    n, c, h, _ = x.shape
    co, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - k) // stride + 1
    out = np.zeros((n, co, ho, ho))
    for i in range(ho):
        for j in range(ho):
            patch = xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = np.einsum("nckl,ockl->no", patch, w)
    return out


@pytest.mark.parametrize(("stride", "pad"), [(1, 0), (1, 1), (2, 1)])
def test_im2col_convolution_matches_direct(stride, pad):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 7, 7)), rng.standard_normal((4, 3, 3, 3))
    np.testing.assert_allclose(B.conv2d_im2col(x, w, stride, pad), _direct_conv(x, w, stride, pad), rtol=1e-12)


def test_numpy_kernels_compute_what_they_claim():
    gemm = B._gemm(3, 4, 5, "fp32")
    assert gemm().shape == (3, 5)
    batched = B._gemm(3, 4, 5, "fp64", batch=2)
    assert batched().shape == (2, 3, 5)
    assert B._memory("sum", 8 * 16)() == 16.0
    series = B.all_series(quick=True)
    assert {s.cls for s in series} == {"launch", "matmul", "conv", "memory"}
    assert all(list(p.size for p in s.points) == sorted(p.size for p in s.points) for s in series)


# ---------------------------------------------------------------------------------------------------- runner


class Fixed:
    """A kernel that takes a known time, read by `fixed_sampler` instead of running anything."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self) -> None:
        return None


def fixed_sampler(fn, inner):
    return fn.seconds


def _series(cls, family, dtype, sizes, time_of):
    return Series(cls, family, dtype, tuple(Point(float(n), f"n={n}", lambda n=n: Fixed(time_of(n))) for n in sizes))


def test_run_series_stops_before_a_call_would_pass_the_cap():
    series = [_series("matmul", "square", "fp32", [1e6, 1e7, 1e8, 1e9], lambda n: n / 1e9)]
    calls = []
    samples, skipped = C.run_series(series, TimingConfig(warmup=1, repeats=3), fixed_sampler, cap_s=0.5,
                                    progress=lambda done, total, what: calls.append((done, total)))
    assert [s.size for s in samples] == [1e6, 1e7, 1e8]         # 1e9 would take 1 s > 0.5 s
    assert "stopped after n=100000000.0" in skipped[0]
    assert calls[-1] == (3, 3)   # the skipped point leaves the count


def test_later_sweeps_keep_each_compute_points_fastest_median():
    slow_then_fast = iter([2e-3, 1e-3, 1.5e-3])  # the machine was slow during the first sweep
    copy_times = iter([4e-3, 1e-3])
    series = [Series("matmul", "square", "fp32", (Point(1e6, "gemm", lambda: Fixed(next(slow_then_fast))),)),
              Series("memory", "copy", "fp32", (Point(1e6, "copy", lambda: Fixed(next(copy_times))),))]
    calls, hooks = [], []
    samples, _ = C.run_series(series, TimingConfig(warmup=1, repeats=3), fixed_sampler, cap_s=1.0,
                              progress=lambda done, total, what: calls.append((done, total)), passes=3,
                              between_sweeps=hooks.append)
    assert hooks == [1, 2, 3]                    # after every sweep: where --check times its training steps
    gemm, copy = samples
    assert gemm.timing.median == 1e-3            # the second sweep's, the fastest of three
    assert copy.timing.median == 4e-3            # memory points are swept once (its retry rule aside)
    assert calls[-1] == (4, 4)                   # 1 + 1 points, then 2 more sweeps of the GEMM


def test_a_call_of_several_kernels_is_timed_per_kernel():
    # one call runs the three GEMMs of a linear layer: 3 ms per call is 1 ms per kernel of 1e6 FLOPs; the cap
    # estimate for the next point counts the whole call (3 x 2e9 / 1e9 FLOP/s = 6 s > 5 s), so it stops there
    series = [Series("matmul", "linear", "fp32", tuple(
        Point(size, f"n={size}", lambda size=size: Fixed(3 * size / 1e9), kernels=3) for size in (1e6, 2e9)))]
    samples, skipped = C.run_series(series, TimingConfig(warmup=1, repeats=3), fixed_sampler, cap_s=5.0)
    assert [s.timing.median for s in samples] == [pytest.approx(1e-3)] and samples[0].rate == pytest.approx(1e9)
    assert "take ~6 s per call" in skipped[0]


def test_run_series_is_not_stopped_by_one_slow_outlier():
    # the 1e7 point is 100x slow (a descheduled thread); the next size is estimated from the best rate so far
    series = [_series("memory", "copy", "fp64", [1e6, 1e7, 1e8], lambda n: 1.0 if n == 1e7 else n / 1e9)]
    samples, skipped = C.run_series(series, TimingConfig(warmup=1, repeats=3), fixed_sampler, cap_s=0.5)
    assert [s.size for s in samples] == [1e6, 1e7, 1e8] and not skipped


# ------------------------------------------------------------------------------------------ synthetic fits


LAUNCH = 2e-6
RATES = {"fp32": 2e11, "fp64": 1e11}
T0 = {"matmul": 5e-6, "conv": 4e-5}
CONV_RATE = 1e11
COPY_BW, ELEMENTWISE_BW = 2e10, 1.5e10


def synthetic_calibration(conv_rate: float = CONV_RATE) -> C.Calibration:
    """Exact Hockney data: every fit is known in advance."""
    samples = [C.Sample("launch", "tiny", "fp64", 1.0, "1", summarize([LAUNCH], 1))]
    for dtype, rate in RATES.items():
        for family in ("square", "linear", "batched"):
            samples += [C.Sample("matmul", family, dtype, n, f"{n:g}", summarize([T0["matmul"] + n / rate], 1))
                        for n in np.geomspace(1e4, 1e10, 7)]
    samples += [C.Sample("conv", "cifar", "fp32", n, f"{n:g}", summarize([T0["conv"] + n / conv_rate], 1))
                for n in np.geomspace(1e6, 1e10, 5)]
    for family, bw in (("copy", COPY_BW), ("scale", ELEMENTWISE_BW), ("triad", ELEMENTWISE_BW)):
        samples += [C.Sample("memory", family, "fp32", n, f"{n:g}", summarize([LAUNCH + n / bw], 1))
                    for n in (2.0**k for k in range(12, 31))]
    floor = 2.0**28
    notes: list[str] = []
    fits = C.fit_all(samples, floor, notes, LAUNCH)
    env = {"device": "cpu", "threads": 2, "cpu": "test CPU", "libraries": {"numpy": np.__version__}}
    return C.Calibration("numpy", "cpu", "test CPU", 8 * 2.0**30, True, samples, fits, samples[0].timing, [],
                         env, "2026-01-01T00:00:00+00:00", 1.0, floor, notes)


def test_fit_all_names_and_values():
    cal = synthetic_calibration()
    assert [f.name for f in cal.fits if f.used] == [
        "matmul fp32", "matmul fp64", "conv fp32", "memory copy", "memory elementwise"]
    assert cal.fit("matmul fp32").rate == pytest.approx(2e11, rel=1e-8)
    assert cal.fit("matmul fp32").points == 5  # the linear family at >= 1 MFLOP; square and batched are details
    assert cal.fit("matmul fp64 batched").rate == pytest.approx(1e11, rel=1e-8)
    assert cal.fit("memory copy").rate == pytest.approx(COPY_BW, rel=1e-9)
    assert cal.fit("memory elementwise").points == 2 * 3        # 2^28, 2^29, 2^30 for scale and triad
    assert cal.dtypes == ["fp32", "fp64"]
    with pytest.raises(CalibrationError, match="no fit named"):
        cal.fit("matmul fp8")


def test_device_constants_map_fits_onto_the_loader_curves():
    c = hwfile.device_constants(synthetic_calibration())
    assert c.peak_flops == pytest.approx({"fp32": 2e11, "fp64": 1e11}, rel=1e-8)
    assert c.efficiency["matmul"].peak == 1.0
    # half = (t0 - launch) * top * peak: the engine's launch term is not counted twice
    assert c.efficiency["matmul"].half == pytest.approx((5e-6 - LAUNCH) * 2e11, rel=1e-6)
    assert c.efficiency["conv"].peak == pytest.approx(0.5, rel=1e-8)
    assert c.efficiency["conv"].half == pytest.approx((4e-5 - LAUNCH) * 2e11 * 0.5, rel=1e-6)
    assert c.memory_bandwidth == pytest.approx(COPY_BW, rel=1e-9)
    assert c.efficiency["memory"].peak == pytest.approx(0.75, rel=1e-9)
    assert c.efficiency["memory"].half == 0.0
    assert c.launch_latency == LAUNCH


def test_faster_conv_scales_peak_flops_so_efficiencies_stay_below_one():
    c = hwfile.device_constants(synthetic_calibration(conv_rate=4e11))
    assert c.peak_flops["fp32"] == pytest.approx(4e11, rel=1e-8)
    assert c.efficiency["matmul"].peak == pytest.approx(0.5, rel=1e-8)
    assert c.efficiency["conv"].peak == pytest.approx(1.0, rel=1e-8)


def test_written_file_loads_and_the_engine_reproduces_the_measured_times(tmp_path):
    from dlperf.engine.device import phase_time

    cal = synthetic_calibration()
    path = tmp_path / "mine.yaml"
    hw = hwfile.write_hardware(path, cal, "mine", network.template_levels("cpu-local"))
    loaded = load_hardware(path)
    assert loaded.name == "mine" and hw.name == "mine"
    assert loaded.device.peak("fp32") == pytest.approx(2e11, rel=1e-4)   # 5 significant digits in the file
    assert loaded.device.memory_bandwidth == pytest.approx(COPY_BW, rel=1e-4)
    assert loaded.calibration["fits"]["matmul fp32"]["written"] is True
    assert loaded.calibration["threads"] == 2
    for flops in (1e5, 1e8, 1e10):  # launch + t0 + n / r_inf: exactly what was measured
        t = phase_time(flops, 0.0, 1, "matmul", loaded.device, "fp32")
        assert t == pytest.approx(T0["matmul"] + flops / 2e11, rel=2e-4)
    t = phase_time(0.0, 2.0**30, 1, "relu", loaded.device, "fp32")
    assert t == pytest.approx(LAUNCH + 2.0**30 / ELEMENTWISE_BW, rel=2e-4)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_network_template_is_copied_level_by_level(tmp_path):
    cal = synthetic_calibration()
    path = tmp_path / "dgx.yaml"
    hwfile.write_hardware(path, cal, "cpu-in-a-dgx", network.template_levels("dgx-a100"))
    ours, theirs = load_hardware(path).network, load_hardware("dgx-a100").network
    assert [lv.name for lv in ours] == [lv.name for lv in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert a.size == b.size and a.links_per_domain == b.links_per_domain and a.efficiency == b.efficiency
        assert a.bandwidth == pytest.approx(b.bandwidth, rel=1e-4) and a.latency == pytest.approx(b.latency, rel=1e-4)


def test_atomic_write_leaves_the_old_file_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "hw.yaml"
    path.write_text("old\n")

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(CalibrationError, match="No space left"):
        hwfile.write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["hw.yaml"]


def test_a_file_that_would_not_load_is_never_written(tmp_path):
    path = tmp_path / "bad.yaml"
    with pytest.raises(CalibrationError, match="does not load"):
        hwfile.check_text("name: x\ndevice: {}\nnetwork: []\n", str(path))
    assert not path.exists()


def test_write_refuses_a_path_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CalibrationError, match="cannot write"):
        hwfile.write_atomic(blocker / "hw.yaml", "x")


def test_missing_fits_are_refused():
    cal = synthetic_calibration()
    cal.fits = [f for f in cal.fits if f.name != "memory copy"]
    with pytest.raises(CalibrationError, match="memory copy"):
        hwfile.device_constants(cal)


# --------------------------------------------------------------------------------------------- end to end


@pytest.fixture
def tiny_sweep(monkeypatch):
    """Shrink the --quick tables so that a real numpy calibration takes about a second."""
    monkeypatch.setattr(probes, "SQUARE_QUICK", (16, 32, 64))
    monkeypatch.setattr(probes, "LINEAR_ROWS_QUICK", (64, 128))
    monkeypatch.setattr(probes, "BATCHED_QUICK", (16, 32))
    monkeypatch.setattr(probes, "CONV_QUICK", ("cifar-3x3-32", "lenet-5x5-6-16"))
    monkeypatch.setattr(probes, "CONV_BATCH_QUICK", (1, 2))
    monkeypatch.setattr(probes, "MEMORY_QUICK", tuple(2**k for k in range(12, 19)))
    monkeypatch.setattr(C, "QUICK", TimingConfig(warmup=1, repeats=3, min_sample_s=2e-4))


def test_real_numpy_calibration_end_to_end(tiny_sweep, tmp_path):
    cal = C.calibrate("numpy", "cpu", quick=True, threads=1)
    assert cal.backend == "numpy" and cal.environment["threads"] == 1
    assert {f.name for f in cal.fits if f.used} == {
        "matmul fp32", "matmul fp64", "conv fp32", "memory copy", "memory elementwise"}
    assert all(math.isfinite(f.fit.rate) and f.fit.rate > 0 for f in cal.fits)
    assert cal.launch is not None and 0 < cal.launch.median < 1e-3
    assert any("im2col" in note for note in cal.notes)
    hw = hwfile.write_hardware(tmp_path / "np.yaml", cal, "np", network.template_levels("cpu-local"))
    assert set(hw.device.peak_flops) == {"fp32", "fp64"}


def test_choose_backend_refusals(monkeypatch):
    with pytest.raises(CalibrationError, match="needs --backend torch"):
        C.choose_backend("numpy", "cuda")
    with pytest.raises(CalibrationError, match="unknown backend"):
        C.choose_backend("jax", "cpu")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)   # torch missing
    assert C.choose_backend("auto", "cpu") == "numpy"
    with pytest.raises(CalibrationError, match="not installed"):
        C.calibrate("torch", "cpu")


def test_threads_only_on_the_cpu():
    with pytest.raises(CalibrationError, match="--threads"):
        C.calibrate("numpy", "cpu", threads=0)


def test_timing_type_is_exported():
    assert Timing(1.0, 1.0, 1.0, 1.0, 1.0, 1, 1).spread == 0.0


def test_half_size_is_capped_at_the_largest_measured_size():
    # times that barely grow with size (a contended machine): the free fit would put nearly all the time in t0
    n = np.array([1e6, 1e7, 1e8])
    t = np.array([8.0e-3, 8.1e-3, 8.5e-3])
    fit = fit_line(n, t)
    assert fit.half == pytest.approx(1e8, rel=1e-9)
    assert fit.rate == pytest.approx(float(np.exp(np.mean(np.log(n.max() + n) - np.log(t)))), rel=1e-12)


def test_disturbed_points_are_retimed_and_the_fastest_kept():
    from dlperf.calibrate.timing import Timing as Tm

    clean = Tm(1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 5, 1)
    noisy = Tm(1e-3, 0.8e-3, 1.2e-3, 0.8e-3, 1.2e-3, 5, 1)
    assert not C.disturbed(clean, 1e9, 1.5e9, "matmul")
    assert C.disturbed(noisy, 1e9, 0.0, "memory")                  # 40% spread
    assert C.disturbed(clean, 1e9, 2.5e9, "conv")                  # < half the rate of a smaller conv
    assert not C.disturbed(clean, 1e9, 2.5e9, "memory")            # leaving the cache is a real drop
    times = iter([0.02, 0.011, 0.010])  # the first two attempts are slow: > 2x slower than best_smaller allows

    class Slow:
        def __init__(self):
            self.seconds = next(times)

        def __call__(self):
            return None

    series = Series("matmul", "square", "fp32", (Point(1e7, "n", Slow),))
    sample = C.measure_point(series, series.points[0], TimingConfig(warmup=1, repeats=3), fixed_sampler, 2.1e9)
    assert sample.retries == 2 and sample.timing.median == 0.010


def test_alpha_beta_fit_ignores_erratic_small_messages():
    from dlperf.calibrate.fit import fit_alpha_beta

    n = np.array([4.0 ** k for k in range(1, 13)])          # 4 B .. 16 MiB
    t = 200e-6 + n / 1e9
    t[[1, 3, 5]] *= np.array([3.0, 2.5, 4.0])               # wake-up hiccups on some small messages
    fit = fit_alpha_beta(n, t, "allreduce")
    assert fit.t0 == pytest.approx(200e-6 + 4e-9)            # min of ~200, 600, 200, 500 us
    # beta from the messages within 64x of the largest, with that alpha: close to the true 1 GB/s
    assert fit.rate == pytest.approx(1e9, rel=1e-4)
    assert fit.points == 12
    with pytest.raises(CalibrationError, match="at least 5 distinct message sizes"):
        fit_alpha_beta(n[:4], t[:4])


def test_check_keeps_the_fastest_round_per_model(monkeypatch):
    from dlperf.calibrate import check

    script = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}
    order = []

    def fake_time_kernel(step, config):
        order.append(step)
        return summarize([next(script[step])], 1)

    monkeypatch.setattr(check, "time_kernel", fake_time_kernel)
    rounds = check.StepRounds({"a": "a", "b": "b"}, quick=True)
    for sweep in (1, 2, 3):
        rounds(sweep)
    best = rounds.best
    assert best["a"].median == 1.0 and best["b"].median == 4.0
    assert order == ["a", "b"] * 3          # round-robin, so a slow spell hits one round of each, not one model
