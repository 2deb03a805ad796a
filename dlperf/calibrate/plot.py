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


def plot_calibration(cal: Calibration, path: str | Path | None = None, comm: Any = None) -> Any:
    """A figure of every fitted curve with the measured points (by family) it was fitted to; written to `path`
    (PNG/SVG/PDF) when given. Returns the matplotlib Figure."""
    panels = _panels(cal)
    if comm is not None:
        panels += [(f"gloo {op}", None, f) for op, f in comm.fits.items()]
    if not panels:
        raise CalibrationError("nothing was fitted, so there is nothing to plot")
    fig, axes = panel_grid(len(panels), 5.2, 3.8)
    for ax, (title, points, fit) in zip(axes, panels, strict=True):
        _panel(ax, title, points, fit, cal.dram_floor)
    fig.suptitle(f"dlperf calibrate: {cal.device_name} ({cal.backend}, {cal.environment.get('threads')} threads)")
    if path is not None:
        save(fig, path)
    return fig


def panel_grid(count: int, width: float, height: float, columns: int = 3) -> tuple[Any, list[Any]]:
    """A figure with `count` panels, at most `columns` per row; a last row that is not full is centred, so no
    empty frame is left where a panel would be."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CalibrationError("--plot needs matplotlib (pip install matplotlib)") from None
    cols = max(1, min(columns, count))
    rows = -(-count // cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    grid = fig.add_gridspec(rows, 2 * cols)  # half-column steps, so that a short last row can be centred
    axes = []
    for i in range(count):
        row, col = divmod(i, cols)
        in_row = min(cols, count - row * cols)
        start = 2 * col + (cols - in_row)
        axes.append(fig.add_subplot(grid[row, start:start + 2]))
    return fig, axes


def save(fig: Any, path: str | Path) -> Path:
    """Write a figure; a path that cannot be written is a one-line CalibrationError."""
    target = Path(path)
    try:
        fig.savefig(target, dpi=110)
    except (OSError, ValueError) as err:
        raise CalibrationError(f"cannot write plot {target}: {err}") from None
    return target


def _panel(ax: Any, title: str, points: list[Any] | None, fit: Any, floor: float) -> None:
    from matplotlib.ticker import NullFormatter

    if points is None:  # a communication fit: fit carries its own sizes and medians
        sizes, times = np.array(fit.sizes), np.array(fit.medians)
        ax.loglog(sizes, times * 1e6, "o", ms=4, label="measured")
        grid = np.geomspace(sizes.min(), sizes.max(), 100)
        ax.loglog(grid, fit.fit.time(grid) * 1e6, "-", color="k",
                  label=f"alpha {fit.alpha * 1e6:.3g} us, {fit.bandwidth / 1e9:.3g} GB/s")
        ax.xaxis.set_minor_formatter(NullFormatter())
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
    ax.xaxis.set_minor_formatter(NullFormatter())  # decades labelled, not 2x10^6, 3x10^6, ... on top of each other
    ax.set_xlabel("bytes moved" if memory else "FLOPs per call")
    ax.set_ylabel(unit)
    ax.set_title(f"{title}: R^2 {fit.r2:.3f} (log t), {fit.r2_rate:.3f} (rate); "
                 f"median |res| {100 * fit.median_rel:.0f}%", fontsize=8)
    ax.legend(fontsize=6)
