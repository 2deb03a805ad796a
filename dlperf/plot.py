"""Figures: step-time breakdown bars and scaling curves (matplotlib, Agg backend; imported only when plotting).

Each function writes the figure to `path` (format from the suffix: .png, .svg, .pdf) and returns the plotted
data, so tests check the numbers rather than pixels.
"""

from __future__ import annotations

import math
from typing import Any

BREAKDOWN_COLORS = {
    "compute/forward": "#4C72B0", "compute/backward": "#55A868", "compute/recompute": "#8172B2",
    "comm/tp": "#C44E52", "comm/pp_p2p": "#DD8452", "pipeline/bubble": "#937860",
    "comm/dp_allreduce": "#DA8BC3", "optimizer": "#8C8C8C", "overhead/host": "#CCB974",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def breakdown_chart(predictions: list[Any], labels: list[str], path: str) -> dict[str, list[float]]:
    """Stacked horizontal bars of each prediction's step-time breakdown (seconds); returns {part: values}."""
    plt = _pyplot()
    parts = [k for k in BREAKDOWN_COLORS if any(p.breakdown_s.get(k, 0.0) for p in predictions)]
    parts += sorted({k for p in predictions for k, v in p.breakdown_s.items() if v and k not in parts})
    data = {k: [float(p.breakdown_s.get(k, 0.0)) for p in predictions] for k in parts}
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.5 * len(predictions)), layout="constrained")
    left = [0.0] * len(predictions)
    y = list(range(len(predictions)))
    for k in parts:
        ax.barh(y, data[k], left=left, color=BREAKDOWN_COLORS.get(k), label=k, height=0.6)
        left = [a + b for a, b in zip(left, data[k], strict=True)]
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("time per training step (s)")
    ax.set_title("Step-time breakdown")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    save_figure(fig, path, 150)
    return data


def scaling_chart(sweeps: list[Any], path: str) -> dict[str, dict[str, list[float]]]:
    """Throughput (log-log, with the ideal linear-scaling line) and parallel efficiency against device count
    for one or more dlperf.search.Sweep results. Returns, per curve label, the plotted arrays."""
    plt = _pyplot()
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    out: dict[str, dict[str, list[float]]] = {}
    for sweep in sweeps:
        rows = [r for r in sweep.rows() if r["samples_per_s"] is not None]
        if not rows:
            continue
        label = f"{sweep.model}, {sweep.strategy} ({sweep.mode})"
        if len({s.hardware for s in sweeps}) > 1:
            label = f"{sweep.hardware}: {label}"
        gpus = [float(r["gpus"]) for r in rows]
        thr = [float(r["samples_per_s"]) for r in rows]
        eff = [float(r["efficiency"]) for r in rows]
        ideal = [thr[0] * g / gpus[0] for g in gpus]
        line = ax_t.plot(gpus, thr, marker="o", label=label, zorder=3)[0]
        ax_t.plot(gpus, ideal, linestyle="--", color="black", linewidth=1, zorder=2,
                  label="_nolegend_" if out else "ideal linear scaling")
        ax_e.plot(gpus, [100 * e for e in eff], marker="o", color=line.get_color(), label=label)
        out[label] = {"gpus": gpus, "samples_per_s": thr, "ideal_samples_per_s": ideal, "efficiency": eff}
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ticks = sorted({g for curve in out.values() for g in curve["gpus"]})
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        if ticks:
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("number of GPUs")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("throughput (samples/s)")
    ax_t.set_title("Throughput")
    ax_t.legend(fontsize="small")
    ax_e.set_ylabel("parallel efficiency (%)")
    # start at 0 unless every point is above 50%, then zoom in (in 10-point steps) so small losses are visible
    lowest = min((min(c["efficiency"]) for c in out.values()), default=0.0)
    ax_e.set_ylim(0 if lowest < 0.5 else 10 * math.floor(10 * lowest - 0.5), 101)
    ax_e.axhline(100, linestyle="--", color="black", linewidth=1, label="ideal")
    ax_e.set_title("Parallel efficiency (relative to the first point)")
    if sweeps:
        first = sweeps[0]
        batch = first.points[0].global_batch if first.points else 0
        what = f"global batch {batch}" if first.mode == "strong" else f"{batch // first.points[0].devices} samples/GPU"
        where = first.hardware if len({s.hardware for s in sweeps}) == 1 else "two clusters"
        where = where if len(sweeps) <= 2 else "several clusters"
        fig.suptitle(f"{first.model} on {where}: {first.mode} scaling ({what})")
    save_figure(fig, path, 150)
    return out


def save_figure(fig: Any, path: str, dpi: int) -> None:
    """Write and close a figure; an unwritable path or unknown image type is a one-line error, not a traceback."""
    import matplotlib.pyplot as plt

    from dlperf.errors import DlperfError

    try:
        fig.savefig(path, dpi=dpi)
    except (OSError, ValueError) as err:
        raise DlperfError(f"cannot write the plot {path}: {err}".replace("\n", " ")) from None
    finally:
        plt.close(fig)
