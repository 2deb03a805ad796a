"""Figures: step-time breakdown bars, scaling curves and the validation parity plot (matplotlib, imported only
when plotting).

Each chart function returns a `matplotlib.figure.Figure` (a notebook shows it inline) and also writes it to
`path` when one is given (format from the suffix: .png, .svg, .pdf). The figures are built without pyplot, so
plotting neither switches the user's backend nor leaves figures open. The plotted numbers come from the
`*_data` functions beside each chart, so tests check numbers rather than pixels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

BREAKDOWN_COLORS = {
    "compute/forward": "#4C72B0", "compute/backward": "#55A868", "compute/recompute": "#8172B2",
    "compute/grad_accumulation": "#A6D854", "compute/straggler": "#E78AC3", "comm/tp": "#C44E52",
    "comm/ep": "#64B5CD", "comm/cp": "#8DA0CB", "comm/pp_p2p": "#DD8452", "pipeline/bubble": "#937860",
    "comm/dp_allreduce": "#DA8BC3", "comm/host_offload": "#66C2A5", "overhead/host": "#CCB974",
    "optimizer": "#8C8C8C", "overhead/metric_sync": "#B3B3B3", "input/cpu": "#FFD92F",
}
# validation units as axis labels (dlperf/validate.py UNITS)
UNIT_LABELS = {
    "iteration_time_s": "time per iteration (s)", "samples_per_s": "throughput (samples/s)",
    "tflops_per_gpu": "TFLOP/s per GPU", "scaling_efficiency": "scaling efficiency",
    "speedup": "speedup",
}


def _figure(**kwargs: Any) -> Any:
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kwargs)


def breakdown_data(predictions: Sequence[Any]) -> dict[str, list[float]]:
    """{part: seconds per prediction} for the parts that are non-zero in at least one prediction."""
    parts = [k for k in BREAKDOWN_COLORS if any(p.breakdown_s.get(k, 0.0) for p in predictions)]
    parts += sorted({k for p in predictions for k, v in p.breakdown_s.items() if v and k not in parts})
    return {k: [float(p.breakdown_s.get(k, 0.0)) for p in predictions] for k in parts}


def breakdown_chart(predictions: Sequence[Any], labels: Sequence[str], path: str | None = None) -> Any:
    """Stacked horizontal bars of each prediction's step-time breakdown (seconds)."""
    data = breakdown_data(predictions)
    fig = _figure(figsize=(8, 1.8 + 0.5 * len(predictions)))
    ax = fig.subplots()
    left = [0.0] * len(predictions)
    y = list(range(len(predictions)))
    for k, values in data.items():
        ax.barh(y, values, left=left, color=BREAKDOWN_COLORS.get(k), label=k, height=0.6)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(y, list(labels))
    ax.invert_yaxis()
    ax.set_xlabel("time per training step (s)")
    ax.set_title("Step-time breakdown")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return _maybe_save(fig, path, 150)


def _sweep_label(sweep: Any, sweeps: Sequence[Any]) -> str:
    label = f"{sweep.model}, {sweep.strategy} ({sweep.mode})"
    return f"{sweep.hardware}: {label}" if len({s.hardware for s in sweeps}) > 1 else label


def scaling_data(sweeps: Sequence[Any]) -> dict[str, dict[str, list[float]]]:
    """Per curve label: device counts, throughput, ideal linear throughput and efficiency (points that have a
    prediction)."""
    out: dict[str, dict[str, list[float]]] = {}
    for sweep in sweeps:
        rows = [r for r in sweep.rows() if r["samples_per_s"] is not None]
        if not rows:
            continue
        gpus = [float(r["gpus"]) for r in rows]
        thr = [float(r["samples_per_s"]) for r in rows]
        out[_sweep_label(sweep, sweeps)] = {
            "gpus": gpus, "samples_per_s": thr, "ideal_samples_per_s": [thr[0] * g / gpus[0] for g in gpus],
            "efficiency": [float(r["efficiency"]) for r in rows]}
    return out


def efficiency_limits(efficiencies: Sequence[float]) -> tuple[float, float]:
    """y-range (percent) of the efficiency panel: from 0, or zoomed in 10-point steps when every point is above
    50%; up to 101% or above the highest point, so that a superlinear point is never clipped."""
    lowest = min(efficiencies, default=0.0)
    highest = max(efficiencies, default=1.0)
    bottom = 0 if lowest < 0.5 else 10 * math.floor(10 * lowest - 0.5)
    top = 101.0 if highest <= 1.0 else 5.0 * math.ceil(20 * highest + 1)  # 5+ points of headroom
    return bottom, top


def scaling_chart(sweeps: Sequence[Any], path: str | None = None) -> Any:
    """Throughput (log-log, with the ideal linear-scaling line) and parallel efficiency against device count
    for one or more dlperf.search.Sweep results."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, ScalarFormatter

    data = scaling_data(sweeps)
    fig = _figure(figsize=(10, 4))
    ax_t, ax_e = fig.subplots(1, 2)
    for i, (label, curve) in enumerate(data.items()):
        line = ax_t.plot(curve["gpus"], curve["samples_per_s"], marker="o", label=label, zorder=3)[0]
        ax_t.plot(curve["gpus"], curve["ideal_samples_per_s"], linestyle="--", color="black", linewidth=1,
                  zorder=2, label="ideal linear scaling" if i == 0 else "_nolegend_")
        ax_e.plot(curve["gpus"], [100 * e for e in curve["efficiency"]], marker="o", color=line.get_color(),
                  label=label)
    ticks = sorted({g for curve in data.values() for g in curve["gpus"]})
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        if ticks:
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("number of GPUs")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    values = [v for c in data.values() for v in c["samples_per_s"] + c["ideal_samples_per_s"]]
    if values:  # plain numbers (200, 500), never 2x10^2 labels crowding each other
        ax_t.yaxis.set_major_locator(FixedLocator(log_ticks(min(values) / 1.05, max(values) * 1.05)))
        ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: plain_number(v)))
        ax_t.yaxis.set_minor_locator(NullLocator())
    ax_t.set_ylabel("throughput (samples/s)")
    ax_t.set_title("Throughput")
    ax_t.legend(fontsize="small")
    ax_e.set_ylabel("parallel efficiency (%)")
    ax_e.set_ylim(*efficiency_limits([e for c in data.values() for e in c["efficiency"]]))
    ax_e.axhline(100, linestyle="--", color="black", linewidth=1, label="ideal")
    ax_e.set_title("Parallel efficiency (relative to the first point)")
    if sweeps:
        fig.suptitle(_sweep_title(sweeps))
    return _maybe_save(fig, path, 150)


def _sweep_title(sweeps: Sequence[Any]) -> str:
    first = sweeps[0]
    batch = first.points[0].global_batch if first.points else 0
    devices = first.points[0].devices if first.points else 1
    what = f"global batch {batch}" if first.mode == "strong" else f"{batch // devices} samples/GPU"
    where = first.hardware if len({s.hardware for s in sweeps}) == 1 else "two clusters"
    where = where if len(sweeps) <= 2 else "several clusters"
    return f"{first.model} on {where}: {first.mode} scaling ({what})"


def parity_data(results: Sequence[Any]) -> dict[str, dict[str, list[Any]]]:
    """Per unit: measured, predicted and source of every validation result (dlperf.validate.Result)."""
    out: dict[str, dict[str, list[Any]]] = {}
    for r in results:
        panel = out.setdefault(r.row.unit, {"measured": [], "predicted": [], "source": []})
        panel["measured"].append(float(r.row.value))
        panel["predicted"].append(float(r.predicted))
        panel["source"].append(r.row.source)
    return out


def parity_chart(results: Sequence[Any], path: str | None = None, columns: int = 3) -> Any:
    """Predicted vs measured, log-log, one panel per unit (at most `columns` per row, one legend for all), with
    the ideal line and +-10% / +-25% bands."""
    data = parity_data(results)
    cols = max(1, min(columns, len(data)))
    rows = max(1, -(-len(data) // cols))
    fig = _figure(figsize=(4.2 * cols, 4.0 * rows + 0.8))
    axes = fig.subplots(rows, cols, squeeze=False).flat
    sources = list(dict.fromkeys(s for panel in data.values() for s in panel["source"]))
    # one (colour, marker) pair per source: ten colours, then the same colours with another marker
    colors = {s: (f"C{i % 10}", "os^Dv"[(i // 10) % 5]) for i, s in enumerate(sources)}
    handles: dict[str, Any] = {}
    for ax, (unit, panel) in zip(axes, data.items(), strict=False):
        _parity_panel(ax, unit, panel, colors, handles)
    for ax in list(fig.axes)[len(data):]:
        ax.remove()  # no empty frames where a row is not full
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(3, len(handles)),
               fontsize="small", frameon=False)
    fig.suptitle("dlperf validate: predicted vs measured")
    return _maybe_save(fig, path, 120)


def _parity_panel(ax: Any, unit: str, panel: dict[str, list[Any]], colors: dict[str, tuple[str, str]],
                  handles: dict[str, Any]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    values = panel["measured"] + panel["predicted"]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    xs = [lo, hi]
    handles.setdefault("predicted = measured", ax.plot(xs, xs, color="black", linewidth=1)[0])
    for band, alpha in ((0.25, 0.12), (0.10, 0.22)):
        area = ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], color="tab:blue",
                               alpha=alpha, linewidth=0)
        handles.setdefault(f"±{band:.0%}", area)
    for source in dict.fromkeys(panel["source"]):
        mine = [i for i, s in enumerate(panel["source"]) if s == source]
        dots = ax.scatter([panel["measured"][i] for i in mine], [panel["predicted"][i] for i in mine], s=16,
                          color=colors[source][0], marker=colors[source][1], zorder=3)
        handles.setdefault(source, dots)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ticks = log_ticks(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):  # a few ticks labelled as plain numbers, never 1.2x10^2
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: plain_number(v)))
        axis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelrotation=30)
    label = UNIT_LABELS.get(unit, unit.replace("_", " "))
    ax.set_xlabel(f"measured {label}")
    ax.set_ylabel(f"predicted {label}")
    ax.set_title(f"{label} ({len(panel['measured'])} rows)", fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)


def log_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Tick values in [lo, hi] for a log axis: powers of ten, then 1-2-5, then finer steps, whichever first
    gives at least three ticks, thinned to at most `most`."""
    ticks: list[float] = []
    for mantissas in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 8)):
        ticks = [m * 10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                 for m in mantissas if lo <= m * 10.0**k <= hi]
        if len(ticks) >= 3:
            break
    step = -(-len(ticks) // most)
    return ticks[::step]


def plain_number(value: float) -> str:
    """A tick label: 200, 5,000, 0.5 (never 2x10^2 or 1e+04)."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:g}"


def _maybe_save(fig: Any, path: str | None, dpi: int) -> Any:
    if path is not None:
        save_figure(fig, path, dpi)
    return fig


def save_figure(fig: Any, path: str, dpi: int) -> None:
    """Write a figure; an unwritable path or unknown image type is a one-line error, not a traceback."""
    from dlperf.errors import DlperfError

    try:
        fig.savefig(path, dpi=dpi)
    except (OSError, ValueError) as err:
        raise DlperfError(f"cannot write the plot {path}: {err}".replace("\n", " ")) from None
