"""Timing a kernel the careful way: warm-up, enough inner calls per sample, repeats, median and spread.

A sample times `inner` back-to-back calls and divides, so that a 2 us kernel is not drowned by the ~50 ns
resolution of the clock and the call overhead of the timer itself; `inner` is chosen from one warm call so
that a sample lasts at least `min_sample_s`. On a GPU the host clock only sees the launch, so the caller
passes a `sync` (torch.cuda.synchronize) that runs before the clock starts and before it stops, or a whole
`sampler` built on CUDA events (see backend_torch.cuda_sampler).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# One sample times `inner` calls and returns seconds per call.
Sampler = Callable[[Callable[[], object], int], float]


@dataclass(frozen=True)
class TimingConfig:
    """How hard to look: `--quick` lowers repeats and the per-sample floor."""

    warmup: int = 2
    repeats: int = 7
    min_sample_s: float = 2e-3
    max_inner: int = 100_000


QUICK = TimingConfig(warmup=1, repeats=5, min_sample_s=1e-3)
FULL = TimingConfig()


@dataclass(frozen=True)
class Timing:
    """Seconds per call over `repeats` samples of `inner` calls each."""

    median: float
    p25: float
    p75: float
    minimum: float
    maximum: float
    repeats: int
    inner: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0.05 = the middle half of samples lie within 5%)."""
        return (self.p75 - self.p25) / self.median if self.median > 0 else math.inf


def host_sampler(sync: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> Sampler:
    """Sampler on the host clock; `sync` (if any) drains the device queue before reading the clock."""

    def sample(fn: Callable[[], object], inner: int) -> float:
        if sync is not None:
            sync()
        start = clock()
        for _ in range(inner):
            fn()
        if sync is not None:
            sync()
        return (clock() - start) / inner

    return sample


def summarize(samples: list[float], inner: int) -> Timing:
    """Median, quartiles and extremes of per-call times (quartiles by linear interpolation)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    if len(ordered) >= 2:
        p25, _, p75 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        p25 = p75 = ordered[0]
    return Timing(statistics.median(ordered), p25, p75, ordered[0], ordered[-1], len(ordered), inner)


def inner_calls(first_call_s: float, config: TimingConfig) -> int:
    """How many calls make one sample last at least `min_sample_s`."""
    if first_call_s <= 0:
        return config.max_inner
    return max(1, min(config.max_inner, math.ceil(config.min_sample_s / first_call_s)))


def time_kernel(fn: Callable[[], object], config: TimingConfig = FULL, sampler: Sampler | None = None) -> Timing:
    """Warm up, size the inner loop from one timed call, then take `repeats` samples."""
    sample = sampler or host_sampler()
    first = sample(fn, 1)  # also the first warm-up: allocations, page faults, kernel selection
    for _ in range(max(0, config.warmup - 1)):
        first = min(first, sample(fn, 1))
    inner = inner_calls(first, config)
    return summarize([sample(fn, inner) for _ in range(config.repeats)], inner)


def faster(best: Timing | None, timing: Timing) -> Timing:
    """The timing with the lower median: how best-of-N re-timing keeps a point, a sweep or a round."""
    return timing if best is None or timing.median < best.median else best


def per_kernel(timing: Timing, kernels: int) -> Timing:
    """A timing of calls that each run `kernels` kernels, as seconds per kernel (the spread is unchanged)."""
    if kernels == 1:
        return timing
    k = float(kernels)
    return Timing(timing.median / k, timing.p25 / k, timing.p75 / k, timing.minimum / k, timing.maximum / k,
                  timing.repeats, timing.inner)
