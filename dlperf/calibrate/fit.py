"""Least-squares fits of the model's constants: Hockney's (r_inf, n_1/2) and alpha-beta, with goodness of fit.

Hockney & Jesshope, "Parallel Computers 2" (1988), section 1.3.3: a pipelined operation on n units takes
t(n) = t0 + n / r_inf, so the achieved rate is r(n) = r_inf * n / (n + n_1/2) with n_1/2 = t0 * r_inf, the
size at which half the asymptotic rate is reached. It is the same straight line as a message's
alpha + n * beta (alpha = t0, beta = 1 / r_inf), so one fit serves kernels and collectives.

The fit minimises squared *log* residuals, sum((log(t0 + n/r) - log t)^2): measured sizes span several
decades and timing noise is multiplicative, so an absolute least-squares fit would let the largest kernel
decide everything, and a relative one, ((t0 + n/r) - t) / t, punishes over-predicting a time (unbounded)
more than under-predicting it (at most -1) and so leans toward the fastest shapes. The log fit is solved
exactly as a profile: for each t0 the best log r is a 1-D search, and t0 itself in [0, min t] another.
Goodness of fit, three ways: `r2` is R^2 of log(time), the coefficient of determination of the quantity the
fit minimises; `r2_rate` is R^2 of the
achieved rate n / t, the stricter view that also asks whether the *shape* of the saturating curve is right;
and the median and maximum relative residual of time say how far off a prediction from the curve can be.
(R^2 of raw times is left out: it is close to 1 for any straight line through data that spans decades.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dlperf.errors import CalibrationError


@dataclass(frozen=True)
class LineFit:
    """t(n) = t0 + n / rate, fitted to `points` (size, seconds) pairs."""

    t0: float
    rate: float
    r2: float            # R^2 of log(time)
    r2_rate: float       # R^2 of achieved rate size / time
    median_rel: float
    max_rel: float
    points: int
    best_rate: float  # the highest measured n / t among the fitted points

    @property
    def half(self) -> float:
        """Hockney's n_1/2 = t0 * r_inf (same unit as the size)."""
        return self.t0 * self.rate

    @property
    def beta(self) -> float:
        return 1.0 / self.rate

    def time(self, size: float | np.ndarray) -> float | np.ndarray:
        return self.t0 + np.asarray(size, dtype=float) / self.rate

    def to_dict(self) -> dict[str, float | int]:
        return {
            "t0_s": self.t0, "rate": self.rate, "half": self.half, "r2": self.r2, "r2_rate": self.r2_rate,
            "median_rel_residual": self.median_rel, "max_rel_residual": self.max_rel, "points": self.points,
            "best_measured_rate": self.best_rate,
        }


GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
SEARCH_STEPS = 64  # golden-section steps: the bracket shrinks by 0.618^64 ~ 4e-14


def golden_min(f: Callable[[float], float], lo: float, hi: float, steps: int = SEARCH_STEPS) -> float:
    """Argmin of a unimodal f on [lo, hi] by golden-section search; the endpoints are candidates too."""
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    return min((lo, hi, (a + b) / 2), key=f)


def _log_cost(sizes: np.ndarray, log_t: np.ndarray, t0: float, x: float) -> float:
    return float(((np.log(t0 + sizes * x) - log_t) ** 2).sum())


def _best_x(sizes: np.ndarray, times: np.ndarray, log_t: np.ndarray, t0: float) -> float:
    """For a fixed intercept, the slope x = 1/rate minimising the log cost (searched in log x)."""
    per_unit = times / sizes
    lo, hi = math.log(per_unit.min()) - 12.0, math.log(per_unit.max()) + 2.0
    return math.exp(golden_min(lambda u: _log_cost(sizes, log_t, t0, math.exp(u)), lo, hi))


def _solve_log(sizes: np.ndarray, times: np.ndarray, t0: float | None) -> tuple[float, float]:
    """(t0, x) minimising sum (log(t0 + n x) - log t)^2 with 0 <= t0 <= min t (or t0 fixed)."""
    log_t = np.log(times)
    if t0 is not None:
        return t0, _best_x(sizes, times, log_t, t0)
    profile = lambda c: _log_cost(sizes, log_t, c, _best_x(sizes, times, log_t, c))  # noqa: E731
    best_t0 = golden_min(profile, 0.0, float(times.min()))
    return best_t0, _best_x(sizes, times, log_t, best_t0)


def r_squared(measured: np.ndarray, fitted: np.ndarray) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot (1.0 when the data have no spread and fit exactly)."""
    ss_res = float(((measured - fitted) ** 2).sum())
    ss_tot = float(((measured - measured.mean()) ** 2).sum())
    if ss_tot == 0.0:
        return 1.0 if ss_res <= 1e-24 * max(1.0, float((measured**2).sum())) else 0.0
    return 1.0 - ss_res / ss_tot


def fit_line(sizes: list[float] | np.ndarray, times: list[float] | np.ndarray, what: str = "fit",
             t0: float | None = None) -> LineFit:
    """Fit t = t0 + n / rate with t0 >= 0 and rate > 0 (log least squares; see module doc).

    n_1/2 is capped at the largest measured size (see below).
    With `t0` given, only the rate is fitted (used where the sizes are all large and the intercept would be
    noise, e.g. DRAM bandwidth from working sets far beyond the caches)."""
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if n.shape != t.shape or n.ndim != 1:
        raise CalibrationError(f"{what}: sizes and times differ in shape ({n.shape} vs {t.shape})")
    keep = np.isfinite(n) & np.isfinite(t) & (n > 0) & (t > 0)
    n, t = n[keep], t[keep]
    need = 1 if t0 is not None else 2
    if len(np.unique(n)) < need:
        raise CalibrationError(f"{what}: need at least {need} distinct sizes to fit, got {len(np.unique(n))}")
    fixed = t0 is not None
    t0, x = _solve_log(n, t, t0)
    if not fixed and t0 > n.max() * x:
        # n_1/2 beyond the largest size: the data never show the curve saturating, and r_inf would be an
        # extrapolation (flat times under interference give t0 ~ t and an absurd rate). Cap n_1/2 = max n,
        # i.e. t = x (n_max + n), whose log fit is closed-form: log x = mean(log t - log(n_max + n)).
        x = float(np.exp(np.mean(np.log(t) - np.log(n.max() + n))))
        t0 = n.max() * x
    if x <= 0 or not math.isfinite(x):
        raise CalibrationError(f"{what}: no positive rate fits the measurements")
    return line_stats(n, t, t0, x)


def line_stats(n: np.ndarray, t: np.ndarray, t0: float, x: float) -> LineFit:
    """Goodness of the line t = t0 + n x on the points (n, t)."""
    fitted = t0 + n * x
    rel = np.abs(fitted - t) / t
    return LineFit(
        t0=t0, rate=1.0 / x, r2=r_squared(np.log(t), np.log(fitted)), r2_rate=r_squared(n / t, n / fitted),
        median_rel=float(np.median(rel)),
        max_rel=float(rel.max()), points=len(n), best_rate=float((n / t).max()),
    )


def _clean(sizes: list[float] | np.ndarray, times: list[float] | np.ndarray, what: str) -> tuple[np.ndarray, ...]:
    n, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if n.shape != t.shape or n.ndim != 1:
        raise CalibrationError(f"{what}: sizes and times differ in shape ({n.shape} vs {t.shape})")
    keep = np.isfinite(n) & np.isfinite(t) & (n > 0) & (t > 0)
    order = np.argsort(n[keep])
    return n[keep][order], t[keep][order]


def fit_alpha_beta(sizes: list[float] | np.ndarray, times: list[float] | np.ndarray, what: str = "fit",
                   small: int = 4, large_span: float = 64.0) -> LineFit:
    """alpha-beta (t = alpha + n beta) the way ping-pong benchmarks read it.

    alpha is the shortest (median) time among the `small` smallest messages (latency-bound; scheduler hiccups
    only ever add time); beta is fitted, with that alpha fixed, to the messages within `large_span` of the
    largest (bandwidth-bound). Small collectives over loopback are erratic (a wake-up can double one), and a
    single least-squares line through all sizes would let them bend beta. Goodness is reported on all points.
    """
    n, t = _clean(sizes, times, what)
    if len(np.unique(n)) < small + 1:
        raise CalibrationError(f"{what}: need at least {small + 1} distinct message sizes, got {len(np.unique(n))}")
    alpha = float(t[:small].min())
    big = n >= n.max() / large_span
    tail = fit_line(n[big], t[big], what, t0=alpha) if (t[big] > alpha).any() else fit_line(n[big], t[big], what)
    return line_stats(n, t, tail.t0, 1.0 / tail.rate)
