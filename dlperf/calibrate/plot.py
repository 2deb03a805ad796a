"""Measured vs fitted: achieved rate against size per fitted curve (matplotlib imported here only, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dlperf.calibrate.calibration import Calibration
from dlperf.errors import CalibrationError


def _panels(cal: Calibration) -> list[tuple[str, list[Any], Any]]:
    """(title, samples, fit) for every fit written to the hardware file."""
    out = []
    for named in (f for f in cal.fits if f.used):
        out.append((named.name, cal.points_for(named), named.fit))
    return out


def plot_calibration(cal: Calibration, path: str | Path, comm: Any = None) -> Path:
    """Write a PNG/SVG/PDF of every fitted curve with the measured points (by family) it was fitted to."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CalibrationError("--plot needs matplotlib (pip install matplotlib)") from None
    panels = _panels(cal)
    if comm is not None:
        panels += [(f"gloo {op}", None, f) for op, f in comm.fits.items()]
    if not panels:
        raise CalibrationError("nothing was fitted, so there is nothing to plot")
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, (title, points, fit) in zip(axes.flat, panels, strict=False):
        _panel(ax, title, points, fit, cal.dram_floor)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"dlperf calibrate: {cal.device_name} ({cal.backend}, {cal.environment.get('threads')} threads)")
    fig.tight_layout()
    return save(fig, path)


def save(fig: Any, path: str | Path) -> Path:
    """Write a figure and close it; a path that cannot be written is a one-line CalibrationError."""
    import matplotlib.pyplot as plt

    target = Path(path)
    try:
        fig.savefig(target, dpi=110)
    except (OSError, ValueError) as err:
        raise CalibrationError(f"cannot write plot {target}: {err}") from None
    finally:
        plt.close(fig)
    return target


def _panel(ax: Any, title: str, points: list[Any] | None, fit: Any, floor: float) -> None:
    if points is None:  # a communication fit: fit carries its own sizes and medians
        sizes, times = np.array(fit.sizes), np.array(fit.medians)
        ax.loglog(sizes, times * 1e6, "o", ms=4, label="measured")
        grid = np.geomspace(sizes.min(), sizes.max(), 100)
        ax.loglog(grid, fit.fit.time(grid) * 1e6, "-", color="k",
                  label=f"alpha {fit.alpha * 1e6:.3g} us, {fit.bandwidth / 1e9:.3g} GB/s")
        ax.set_xlabel("message bytes")
        ax.set_ylabel("time (us)")
        ax.set_title(f"{title}: R^2 {fit.fit.r2:.3f}", fontsize=9)
        ax.legend(fontsize=7)
        return
    memory = title.startswith("memory")
    unit, scale = ("GB/s", 1e9) if memory else ("GFLOP/s", 1e9)
    for family in dict.fromkeys(p.family for p in points):
        mine = [p for p in points if p.family == family]
        ax.semilogx([p.size for p in mine], [p.rate / scale for p in mine], "o", ms=3.5, label=family)
    sizes = np.array([p.size for p in points])
    low = floor if memory and floor else sizes.min()
    grid = np.geomspace(low, sizes.max(), 200)
    ax.semilogx(grid, grid / fit.time(grid) / scale, "-", color="k", lw=1.5,
                label=f"fit: r_inf {fit.rate / scale:.4g} {unit}")
    if memory and floor:
        ax.axvline(floor, color="grey", ls=":", lw=1, label="fitted from here")
    ax.set_xlabel("bytes moved" if memory else "FLOPs per call")
    ax.set_ylabel(unit)
    ax.set_title(f"{title}: R^2 {fit.r2:.3f} (log t), {fit.r2_rate:.3f} (rate); "
                 f"median |res| {100 * fit.median_rel:.0f}%", fontsize=8)
    ax.legend(fontsize=6)
