"""Run the kernel series, fit the constants, and keep everything in one Calibration record.

Which points feed which fit:
- matmul <dtype>: the linear-layer GEMM triples (forward, data and weight gradient; probes.LINEAR_ROWS_*) of that
  dtype in one Hockney curve (the engine sizes a GEMM by its FLOPs alone): the shapes and layouts of linear
  layers in training, which carry most of a network's FLOPs. Square GEMMs (the classic benchmark, faster
  at the top: one untransposed A B) and batched GEMMs (attention's QK^T and PV, a different kernel that runs
  ~20% slower on CPUs) are fitted and reported beside it but do not pull the curve: attention's batched
  products are a few percent of a transformer's FLOPs at ordinary sequence lengths (4 s d versus 24 d^2 per
  token and layer).
  Kernels under 1 MFLOP are reported but not fitted, for matmul and conv alike: they last a few
  microseconds, where the engine's time is mostly the launch term, and CPU BLAS runs them on a different
  path (no packing, one thread) whose rate does not follow the large kernels' Hockney curve.
- conv: every convolution shape, forward and (torch) backward, in fp32.
- memory copy: STREAM copy at working sets beyond the last-level cache: the device's memory bandwidth, the
  figure STREAM and vendors quote (memcpy streams with non-temporal stores);
- memory elementwise: STREAM scale, add, triad and the element-wise layers ReLU, GELU, tanh and softmax at the
  same sizes: what a network's memory-bound layers achieve (regular stores pay write-allocate; GELU, tanh
  and softmax also pay for exp/erf), written as efficiency.memory = elementwise / copy.
  Smaller sizes run from cache and are reported but not fitted (the loader's curve cannot rise and fall).
- launch: the median time of a one-element op.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlperf.calibrate import timing as T
from dlperf.calibrate.environment import cache_sizes, describe, limit_threads, torch_module
from dlperf.calibrate.fit import LineFit, fit_line
from dlperf.calibrate.probes import Series
from dlperf.calibrate.timing import FULL, QUICK, Sampler, Timing, TimingConfig, host_sampler, time_kernel
from dlperf.errors import CalibrationError

BACKENDS = ("auto", "numpy", "torch")
DEVICES = ("cpu", "cuda")
# Kernels that behave like a network's element-wise layers (regular stores; some with exp/erf)
ELEMENTWISE = ("scale", "add", "triad", "relu", "gelu", "tanh", "softmax")
# GEMM families of the written matmul curve, and the smallest GEMM/convolution it is fitted to (module doc)
MATMUL_FAMILIES = ("linear",)
MIN_FIT_FLOPS = 1e6
# Re-timing of disturbed points (see `disturbed`).
RETRIES = 2
RETRY_SPREAD = 0.25
SLOW_FRACTION = 0.5
# Sweeps over the GEMM and convolution points, each point keeping its fastest median (best of PASSES, as
# `calibrate --check` keeps each training step's fastest round). On a shared 2-core VM the multi-threaded
# compute kernels drift by 20-40% over seconds-long windows with a tight spread inside each point (e.g. a
# 8192x256x256 GEMM at 142 GFLOP/s in one sweep, 234 in the next), which re-timing a point at once cannot
# see; sweeps spread over the run can (--check: CHECK_PASSES, one round of its steps after each). Memory
# kernels are swept once: their bandwidth stayed within 10% across runs (20.4-22.3 GB/s), and one sweep of
# them takes about as long as one of the compute kernels.
PASSES = {True: 3, False: 5}
CHECK_PASSES = 5  # `calibrate --check` (quick or not): more rounds of its steps, paired with more sweeps
SWEPT_AGAIN = ("matmul", "conv")
# Longest single call a sweep will run before it stops growing a series (seconds).
CALL_CAP = {True: 0.12, False: 0.6}
# Working sets at or above this multiple of the last-level cache are taken as DRAM-resident.
LLC_MULTIPLE = 2.0
MIN_DRAM_BYTES = 64 * 2**20
# 1-minute load average above which the notes warn that other work competed for the cores.
BUSY_LOAD = 0.5

Progress = Callable[[int, int, str], None]
SweepHook = Callable[[int], None]


@dataclass(frozen=True)
class Sample:
    cls: str
    family: str
    dtype: str
    size: float
    label: str
    timing: Timing
    retries: int = 0   # times it was re-timed because it looked disturbed (see `disturbed`)

    @property
    def rate(self) -> float:
        return self.size / self.timing.median

    def to_dict(self) -> dict[str, Any]:
        t = self.timing
        return {"class": self.cls, "family": self.family, "dtype": self.dtype, "size": self.size,
                "shape": self.label, "median_s": t.median, "min_s": t.minimum, "p25_s": t.p25, "p75_s": t.p75,
                "spread": t.spread, "repeats": t.repeats, "inner": t.inner, "rate": self.rate,
                "retries": self.retries}


@dataclass(frozen=True)
class NamedFit:
    name: str            # 'matmul fp32', 'conv fp32', 'memory', or a detail such as 'matmul fp32 square'
    cls: str
    dtype: str
    fit: LineFit
    used: bool           # written to the hardware file (True) or reported for information


@dataclass
class Calibration:
    backend: str
    device: str
    device_name: str
    device_memory: float
    quick: bool
    samples: list[Sample]
    fits: list[NamedFit]
    launch: Timing | None
    skipped: list[str]
    environment: dict[str, Any]
    started: str
    seconds: float
    dram_floor: float
    notes: list[str] = field(default_factory=list)
    dispatch: tuple[float, float] | None = None   # host seconds per forward / backward kernel (torch only)
    sms: int | None = None                        # streaming multiprocessors (CUDA only)

    def fit(self, name: str) -> LineFit:
        for item in self.fits:
            if item.name == name:
                return item.fit
        raise CalibrationError(f"no fit named {name!r} (measured: {', '.join(f.name for f in self.fits)})")

    def has(self, name: str) -> bool:
        return any(item.name == name for item in self.fits)

    def points_for(self, named: NamedFit) -> list[Sample]:
        """The samples shown beside a fit (all sizes, also those below the DRAM floor for memory fits)."""
        same = [s for s in self.samples if s.cls == named.cls and s.dtype == named.dtype]
        if named.cls == "matmul" and named.used:
            return [s for s in same if s.family in MATMUL_FAMILIES]  # (sizes under MIN_FIT_FLOPS shown too)
        if named.cls != "memory":
            return same
        family = named.name.removeprefix("memory ")
        return [s for s in same if s.family == family or (family == "elementwise" and s.family in ELEMENTWISE)]

    @property
    def dtypes(self) -> list[str]:
        return [f.dtype for f in self.fits if f.used and f.cls == "matmul"]


def choose_backend(backend: str, device: str) -> str:
    if backend not in BACKENDS:
        raise CalibrationError(f"unknown backend {backend!r}", expected=" | ".join(BACKENDS))
    if device not in DEVICES:
        raise CalibrationError(f"unknown device {device!r}", expected=" | ".join(DEVICES))
    if backend == "auto":
        backend = "torch" if device == "cuda" or torch_module() is not None else "numpy"
    if backend == "numpy" and device == "cuda":
        raise CalibrationError("--device cuda needs --backend torch (numpy runs on the CPU only)")
    return backend


def disturbed(timing: Timing, rate: float, best_smaller: float, cls: str) -> bool:
    """A measurement that other work on the machine probably spoiled: its samples disagree (spread above
    RETRY_SPREAD), or a GEMM/convolution ran at under SLOW_FRACTION of the rate a *smaller* one of the same
    family reached (on a saturating curve, a larger kernel does not get several times slower per FLOP; a
    descheduled OpenMP thread makes it so). Memory kernels are exempt: leaving the cache is a real drop."""
    if timing.spread > RETRY_SPREAD:
        return True
    return cls in ("matmul", "conv") and best_smaller > 0 and rate < SLOW_FRACTION * best_smaller


def time_point(point: Any, config: TimingConfig, sampler: Sampler) -> Timing:
    """Seconds per kernel of one point, its operands allocated for the timing and dropped after it."""
    return T.per_kernel(time_kernel(point.make(), config, sampler), point.kernels)


def measure_point(s: Series, point: Any, config: TimingConfig, sampler: Sampler, best_smaller: float) -> Sample:
    """Time one point; re-time it up to RETRIES times while it looks disturbed, keeping the fastest median."""
    best: Timing | None = None
    attempt = 0
    for attempt in range(1 + RETRIES):  # noqa: B007 - the count is kept
        timing = time_point(point, config, sampler)
        best = T.faster(best, timing)
        if not disturbed(timing, point.size / timing.median, best_smaller, s.cls):
            break
    assert best is not None
    return Sample(s.cls, s.family, s.dtype, point.size, point.label, best, attempt)


def run_series(series: list[Series], config: TimingConfig, sampler: Sampler, cap_s: float,
               progress: Progress | None = None, passes: int = 1,
               between_sweeps: SweepHook | None = None) -> tuple[list[Sample], list[str]]:
    """Time every point of every series, in order of size; stop a series before a call would pass `cap_s`.
    The GEMM and convolution points are then re-timed in `passes - 1` further sweeps (see PASSES);
    `between_sweeps(k)` runs after sweep k (`calibrate --check` times its training steps there)."""
    total = sum(len(s.points) * (passes if s.cls in SWEPT_AGAIN else 1) for s in series)
    samples, skipped, timed = _first_pass(series, config, sampler, cap_s, progress, total)
    done = len(timed)
    total = done + (passes - 1) * sum(1 for s, _ in timed if s.cls in SWEPT_AGAIN)  # (skipped points left out)
    for sweep in range(2, passes + 1):
        if between_sweeps:
            between_sweeps(sweep - 1)
        for i, (s, point) in enumerate(timed):
            if s.cls not in SWEPT_AGAIN:
                continue
            if progress:
                progress(done, total, f"sweep {sweep}/{passes}: {s.cls} {s.family} {s.dtype} {point.label}")
            samples[i] = dataclasses.replace(samples[i], timing=T.faster(samples[i].timing,
                                                                        time_point(point, config, sampler)))
            done += 1
    if between_sweeps:
        between_sweeps(passes)
    if progress:
        progress(total, total, "done")
    return samples, skipped


def _first_pass(series: list[Series], config: TimingConfig, sampler: Sampler, cap_s: float,
                progress: Progress | None, total: int) -> tuple[list[Sample], list[str], list[tuple[Series, Any]]]:
    done, samples, skipped, timed = 0, [], [], []
    for s in series:
        last: Sample | None = None
        best_rate = 0.0  # the next call's time is estimated from the best rate so far: one slow outlier
        for point in s.points:  # (a descheduled thread) must not end the series
            call_s = point.kernels * point.size / best_rate if last is not None else 0.0
            if last is not None and call_s > cap_s:
                skipped.append(f"{s.cls} {s.family} {s.dtype}: stopped after {last.label} (the next size would "
                               f"take ~{call_s:.2g} s per call)")
                break
            if progress:
                progress(done, total, f"{s.cls} {s.family} {s.dtype} {point.label}")
            last = measure_point(s, point, config, sampler, best_rate)
            samples.append(last)
            timed.append((s, point))
            best_rate = max(best_rate, last.rate)
            done += 1
    return samples, skipped, timed


def dram_floor(samples: list[Sample]) -> float:
    """Smallest working set taken as DRAM-resident: twice the last-level cache (at least 64 MiB), but never
    above a quarter of the largest measured one, so that a short (--quick) sweep still fits its top points."""
    caches = cache_sizes()
    llc = max(caches.values()) if caches else 0.0
    largest = max((s.size for s in samples if s.cls == "memory"), default=0.0)
    return min(max(LLC_MULTIPLE * llc, MIN_DRAM_BYTES), largest / 4)


def _try_fit(name: str, cls: str, dtype: str, points: list[Sample], used: bool,
             notes: list[str], t0: float | None = None) -> NamedFit | None:
    try:
        fit = fit_line([p.size for p in points], [p.timing.median for p in points], name, t0=t0)
    except CalibrationError as err:
        notes.append(f"{name}: not fitted ({err})")
        return None
    return NamedFit(name, cls, dtype, fit, used)


def fit_all(samples: list[Sample], floor: float, notes: list[str], launch: float = 0.0) -> list[NamedFit]:
    """The fits written to the hardware file, then per-family detail fits for the report.

    The memory fits take the launch overhead as their intercept and fit only the bandwidth: their points all lie
    far beyond the caches, where a free intercept would be noise (and a large one would then be charged to
    every small memory-bound kernel)."""
    fits: list[NamedFit | None] = []
    for cls in ("matmul", "conv"):
        for dtype in dict.fromkeys(s.dtype for s in samples if s.cls == cls):
            points = [s for s in samples if s.cls == cls and s.dtype == dtype]
            main = [p for p in points if (cls != "matmul" or p.family in MATMUL_FAMILIES) and p.size >= MIN_FIT_FLOPS]
            fits.append(_try_fit(f"{cls} {dtype}", cls, dtype, main, True, notes))
            for family in dict.fromkeys(p.family for p in points):
                detail = [p for p in points if p.family == family]
                fits.append(_try_fit(f"{cls} {dtype} {family}", cls, dtype, detail, False, notes))
    memory = [s for s in samples if s.cls == "memory"]
    if memory:
        dtype = memory[0].dtype
        dram = [s for s in memory if s.size >= floor]
        copy = [s for s in dram if s.family == "copy"]
        fits.append(_try_fit("memory copy", "memory", dtype, copy, True, notes, t0=launch))
        elementwise = [s for s in dram if s.family in ELEMENTWISE]
        fits.append(_try_fit("memory elementwise", "memory", dtype, elementwise, True, notes, t0=launch))
        for family in dict.fromkeys(s.family for s in memory if s.family != "copy"):
            detail = [s for s in dram if s.family == family]
            fits.append(_try_fit(f"memory {family}", "memory", dtype, detail, False, notes, t0=launch))
    return [f for f in fits if f is not None]


def _series_for(backend: str, device: str, quick: bool, kinds: tuple[str, ...]) -> tuple[list[Series], Sampler]:
    if backend == "numpy":
        from dlperf.calibrate import backend_numpy as B

        series = B.all_series(quick)
        return [s for s in series if s.cls in kinds], host_sampler()
    from dlperf.calibrate import backend_torch as T

    torch = T.load_torch(device)
    return [s for s in T.all_series(torch, device, quick) if s.cls in kinds], T.sampler(torch, device)


def _device_info(backend: str, device: str) -> tuple[str, float]:
    if backend == "numpy":
        from dlperf.calibrate.environment import cpu_model, physical_memory

        return cpu_model(), physical_memory()
    from dlperf.calibrate import backend_torch as T

    torch = T.load_torch(device)
    return T.device_name(torch, device), T.device_memory(torch, device)


def calibrate(backend: str = "auto", device: str = "cpu", quick: bool = False, threads: int | None = None,
              progress: Progress | None = None,
              kinds: tuple[str, ...] = ("launch", "matmul", "conv", "memory"),
              between_sweeps: SweepHook | None = None, passes: int | None = None) -> Calibration:
    """Time the kernels of `kinds` on this machine and fit the model's constants (`between_sweeps`: see
    run_series; `passes`: sweeps over the compute kernels, PASSES by default)."""
    backend = choose_backend(backend, device)
    if threads is not None and (threads < 1 or device == "cuda"):
        raise CalibrationError("--threads", expected="a positive count, and only with --device cpu", found=threads)
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    clock = time.perf_counter()
    sweeps = passes or PASSES[quick]
    hook = _TimedHook(between_sweeps) if between_sweeps else None
    with limit_threads(threads):
        name, memory = _device_info(backend, device)
        env = describe(backend, device, name)
        series, sampler = _series_for(backend, device, quick, kinds)
        context = _torch_flags(backend)
        with context:
            samples, skipped = run_series(series, QUICK if quick else FULL, sampler, CALL_CAP[quick], progress,
                                          sweeps, hook)
    env["load_average_1min_at_start"] = round(load, 2)
    env["sweeps"] = sweeps
    notes: list[str] = []
    retried = sum(1 for s in samples if s.retries)
    if retried:
        notes.append(f"{retried} of {len(samples)} points looked disturbed by other work and were re-timed "
                     f"(up to {RETRIES} times, fastest median kept)")
    if load > BUSY_LOAD:
        notes.append(f"the machine was busy: 1-minute load average {load:.2f} when measuring started; kernels that "
                     f"use several threads are slowed when other work holds a core, so re-run when idle")
    if backend == "numpy":
        notes.append("numpy backend: convolution is im2col + GEMM, no backward pass timed; bf16/fp16 not timed")
    if backend == "torch" and device == "cpu":
        notes.append("tf32 not timed: it is a CUDA tensor-core mode (the CPU runs fp32 math)")
    floor = dram_floor(samples) if any(s.cls == "memory" for s in samples) else 0.0
    launch = [s.timing for s in samples if s.cls == "launch"]
    fits = fit_all(samples, floor, notes, launch[0].median if launch else 0.0)
    dispatch, sms = _host_and_sms(backend, device) if "launch" in kinds else (None, None)
    return Calibration(
        backend=backend, device=device, device_name=name, device_memory=memory, quick=quick, samples=samples,
        fits=fits, launch=launch[0] if launch else None, skipped=skipped,
        environment=env, started=started, seconds=time.perf_counter() - clock - (hook.seconds if hook else 0.0),
        dram_floor=floor, notes=notes, dispatch=dispatch, sms=sms,
    )


def _host_and_sms(backend: str, device: str) -> tuple[tuple[float, float] | None, int | None]:
    """The eager framework's host cost per kernel and the SM count, where the backend can tell them."""
    if backend != "torch":
        return None, None  # numpy has no autograd: the engine keeps its sourced default
    from dlperf.calibrate import backend_torch as T

    torch = T.load_torch(device)
    return T.dispatch_times(torch, device), T.device_sms(torch, device)


class _TimedHook:
    """The between-sweeps hook, with the time spent in it kept apart from the calibration's own duration."""

    def __init__(self, hook: SweepHook) -> None:
        self.hook, self.seconds = hook, 0.0

    def __call__(self, sweep: int) -> None:
        start = time.perf_counter()
        self.hook(sweep)
        self.seconds += time.perf_counter() - start


def _torch_flags(backend: str) -> Any:
    import contextlib

    torch = torch_module() if backend == "torch" else None
    if torch is None:
        return contextlib.nullcontext()
    from dlperf.calibrate.backend_torch import saved_flags

    return saved_flags(torch)

