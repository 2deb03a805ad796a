"""Predictions against published measurements: a sourced dataset, its loader, and the error report.

A dataset file (YAML) has `sources:` (name -> citation) and `rows:`. Each row names a model (built-in name or
path, plus `set:` overrides), a hardware file, the full plan, the measured figure with its unit, tags, the
strength of the evidence and where in its source the figure is printed. The built-in dataset lives in
dlperf/data/validation/*.yaml, so it ships in the wheel; a user can pass their own file in the same format.

Absolute units compare one prediction with one measurement. Ratio units (speedup, scaling_efficiency) compare
the ratio of two predictions, this row and its `baseline:` row, with the measured ratio.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dlperf.errors import DlperfError, SpecError
from dlperf.plan import Plan
from dlperf.plan import validate as validate_plan
from dlperf.spec.yamlio import check_keys, field_name, line_of, load_yaml_file

DATA_DIR = Path(__file__).resolve().parent / "data" / "validation"

# unit -> what it is compared with. tflops_per_gpu is the published convention of Megatron-LM (Narayanan et al.
# 2021 Sec. 5.1, eq. 3: 96*B*s*l*h^2*(...) counts the matrix multiplications, the recomputed forward pass
# included), i.e. matrix FLOP/s per device.
ABSOLUTE_UNITS = {
    "iteration_time_s": "step_time_s",
    "samples_per_s": "throughput_samples_per_s",
    "tflops_per_gpu": "matrix_tflops_per_device",
    "mfu": "mfu",
}
# speedup = throughput(row) / throughput(baseline). scaling_efficiency = per-device FLOP rate of the row over
# that of the baseline (a fraction): for one model this is the per-device throughput ratio (strong or weak
# scaling), and across models it is the weak-scaling definition Megatron-LM's tables use.
RATIO_UNITS = {
    "speedup": "throughput_samples_per_s",
    "scaling_efficiency": "matrix_tflops_per_device",
}
UNITS = (*ABSOLUTE_UNITS, *RATIO_UNITS)
EVIDENCE = ("verified", "secondary", "unverified")
TOP_KEYS = ("sources", "rows")
SOURCE_KEYS = ("citation",)
ROW_KEYS = ("id", "source", "where", "evidence", "tags", "model", "set", "hardware", "plan", "measured",
            "baseline", "note")
ROW_REQUIRED = ("id", "source", "where", "evidence", "model", "hardware", "plan", "measured")
MEASURED_KEYS = ("value", "unit")
PLAN_FIELDS = {f.name: f for f in fields(Plan)}
_BOOL_FIELDS = ("sequence_parallel", "overlap", "hybrid_fc")
_STR_FIELDS = ("schedule", "recompute", "compression", "consistency", "dtype", "optimizer", "grad_dtype")


@dataclass(frozen=True)
class Row:
    """One published measurement and the configuration it was taken on."""

    id: str
    source: str
    citation: str
    where: str
    evidence: str
    tags: tuple[str, ...]
    model: str
    sets: dict[str, int]
    hardware: str
    plan: Plan
    value: float
    unit: str
    baseline: str | None = None
    note: str = ""
    file: str = ""
    line: int = 0

    @property
    def is_ratio(self) -> bool:
        return self.unit in RATIO_UNITS


@dataclass
class Result:
    row: Row
    predicted: float
    notes: list[str] = field(default_factory=list)

    @property
    def error_pct(self) -> float:
        """Signed error: (predicted - measured) / measured, in percent."""
        return (self.predicted - self.row.value) / self.row.value * 100.0


# ----------------------------------------------------------------------------------------------- loading


def default_files() -> list[Path]:
    return sorted(DATA_DIR.glob("*.yaml"))


def load_dataset(paths: Iterable[str | Path] | None = None) -> list[Row]:
    """Load and check dataset files (the built-in ones when `paths` is None); ids are unique across files
    and every `baseline:` names a row with an absolute unit."""
    files = [Path(p) for p in paths] if paths else default_files()
    rows: list[Row] = []
    for path in files:
        rows.extend(load_file(path))
    _check_links(rows)
    return rows


def load_file(path: str | Path) -> list[Row]:
    file = str(path)
    data = load_yaml_file(Path(path))
    check_keys(data, TOP_KEYS, file, "", required=TOP_KEYS)
    sources = _sources(data["sources"], file)
    items = data["rows"]
    if not isinstance(items, list) or not items:
        raise SpecError(expected="a non-empty list of rows", found=items, file=file, line=line_of(data, "rows"),
                        field="rows")
    return [_row(item, sources, file, f"rows[{i}]") for i, item in enumerate(items)]


def _sources(node: Any, file: str) -> dict[str, str]:
    if not isinstance(node, dict) or not node:
        raise SpecError(expected="a mapping of source name to {citation: ...}", found=node, file=file,
                        line=line_of(node), field="sources")
    out = {}
    for name, entry in node.items():
        where = f"sources.{name}"
        check_keys(entry, SOURCE_KEYS, file, where, required=SOURCE_KEYS)
        citation = entry["citation"]
        if not isinstance(citation, str) or not citation.strip():
            raise SpecError(expected="a citation (paper + table/figure, or repository + file + commit)",
                            found=citation, file=file, line=line_of(entry, "citation"), field=f"{where}.citation")
        out[str(name)] = citation.strip()
    return out


def _fail(node: Any, key: str, where: str, file: str, expected: str, message: str = "") -> SpecError:
    value = node.get(key) if isinstance(node, dict) else None
    return SpecError(message, expected=expected, found=value, file=file, line=line_of(node, key),
                     field=field_name(where, key))


def _text(node: dict, key: str, where: str, file: str) -> str:
    value = node[key]
    if not isinstance(value, str) or not value.strip():
        raise _fail(node, key, where, file, "a non-empty string")
    return value.strip()


def _row(node: Any, sources: dict[str, str], file: str, where: str) -> Row:
    check_keys(node, ROW_KEYS, file, where, required=ROW_REQUIRED)
    row_id = _text(node, "id", where, file)
    where = f"rows[{row_id}]"
    source = _text(node, "source", where, file)
    if source not in sources:
        raise _fail(node, "source", where, file, "a name listed under sources: (" + ", ".join(sources) + ")")
    evidence = node["evidence"]
    if evidence not in EVIDENCE:
        raise _fail(node, "evidence", where, file, "one of " + ", ".join(EVIDENCE))
    tags = node.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise _fail(node, "tags", where, file, "a list of tag names")
    value, unit = _measured(node, where, file)
    baseline = node.get("baseline")
    if unit in RATIO_UNITS and not isinstance(baseline, str):
        raise _fail(node, "baseline" if "baseline" in node else "measured", where, file,
                    f"a baseline: row id (unit {unit} is a ratio of two predictions)")
    if unit in ABSOLUTE_UNITS and baseline is not None:
        raise _fail(node, "baseline", where, file, f"no baseline for the absolute unit {unit}")
    note = node.get("note", "")
    if not isinstance(note, str):
        raise _fail(node, "note", where, file, "a string")
    return Row(
        id=row_id, source=source, citation=sources[source], where=_text(node, "where", where, file),
        evidence=evidence, tags=tuple(tags), model=_text(node, "model", where, file),
        sets=_sets(node, where, file), hardware=_text(node, "hardware", where, file),
        plan=_plan(node, where, file), value=value, unit=unit, baseline=baseline, note=note,
        file=file, line=line_of(node) or 0,
    )


def _measured(node: dict, where: str, file: str) -> tuple[float, str]:
    measured = node["measured"]
    inner = field_name(where, "measured")
    check_keys(measured, MEASURED_KEYS, file, inner, required=MEASURED_KEYS)
    value, unit = measured["value"], measured["unit"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise _fail(measured, "value", inner, file, "a positive number")
    if unit not in UNITS:
        raise _fail(measured, "unit", inner, file, "one of " + ", ".join(UNITS))
    return float(value), unit


def _sets(node: dict, where: str, file: str) -> dict[str, int]:
    sets = node.get("set") or {}
    if not isinstance(sets, dict):
        raise _fail(node, "set", where, file, "a mapping of model parameter to positive integer")
    for key, value in sets.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _fail(sets, key, field_name(where, "set"), file, "a positive integer")
    return {str(k): v for k, v in sets.items()}


def _plan(node: dict, where: str, file: str) -> Plan:
    raw = node["plan"]
    inner = field_name(where, "plan")
    check_keys(raw, PLAN_FIELDS, file, inner, required=("devices", "global_batch"))
    for key, value in raw.items():
        if key in _BOOL_FIELDS:
            ok = isinstance(value, bool) or (value is None and key == "overlap")
            expected = "true or false"
        elif key in _STR_FIELDS:
            ok, expected = isinstance(value, str), "a name"
        else:
            nullable = value is None and key in ("dp", "micro_batch")
            ok = nullable or (isinstance(value, int) and not isinstance(value, bool))
            expected = "an integer"
        if not ok:
            raise _fail(raw, key, inner, file, expected)
    plan = Plan(**dict(raw))
    try:
        return validate_plan(plan)
    except DlperfError as err:
        raise err.located(file=file, line=line_of(node, "plan"), field=inner) from None


def _check_links(rows: Sequence[Row]) -> None:
    by_id: dict[str, Row] = {}
    for row in rows:
        if row.id in by_id:
            first = by_id[row.id]
            raise SpecError(f"duplicate row id (first at {first.file}:{first.line})", file=row.file, line=row.line,
                            field=f"rows[{row.id}].id")
        by_id[row.id] = row
    for row in rows:
        if row.baseline is None:
            continue
        base = by_id.get(row.baseline)
        if base is None or base.is_ratio:
            raise SpecError(expected="the id of a row with an absolute unit", found=row.baseline, file=row.file,
                            line=row.line, field=f"rows[{row.id}].baseline")


def select(rows: Sequence[Row], sources: Sequence[str] = (), tags: Sequence[str] = ()) -> list[Row]:
    """Rows from any of `sources` (all when empty) carrying every tag in `tags`."""
    return [r for r in rows if (not sources or r.source in sources) and all(t in r.tags for t in tags)]


# ----------------------------------------------------------------------------------------------- evaluation


def evaluate(rows: Sequence[Row], universe: Sequence[Row] | None = None) -> list[Result]:
    """Predict every row. Ratio rows also predict their baseline, looked up in `universe` (default: `rows`)."""
    by_id = {r.id: r for r in (universe if universe is not None else rows)}
    cache: dict[str, Any] = {}

    def prediction(row: Row) -> Any:
        if row.id not in cache:
            cache[row.id] = _predict(row)
        return cache[row.id]

    results = []
    for row in rows:
        pred = prediction(row)
        if row.is_ratio:
            metric = RATIO_UNITS[row.unit]
            base = prediction(by_id[row.baseline])
            value = float(getattr(pred, metric)) / float(getattr(base, metric))
        else:
            value = float(getattr(pred, ABSOLUTE_UNITS[row.unit]))
        notes = [] if pred.fits else ["predicted memory exceeds the device"]
        results.append(Result(row, value, notes))
    return results


def _predict(row: Row) -> Any:
    from dlperf.engine import predict
    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model

    try:
        return predict(load_model(row.model, row.sets), load_hardware(row.hardware), row.plan)
    except DlperfError as err:
        raise err.located(file=row.file, line=row.line, field=f"rows[{row.id}]") from None


def result_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    return [{
        "id": r.row.id, "source": r.row.source, "unit": r.row.unit, "measured": r.row.value,
        "predicted": r.predicted, "error_pct": r.error_pct, "evidence": r.row.evidence,
        "tags": ",".join(r.row.tags),
    } for r in results]


def summary(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Per source (in first-seen order) and overall: count, mean/median/max absolute % error, mean signed %."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.row.source, []).append(r)
    out = [_stats(name, group) for name, group in groups.items()]
    if results:
        out.append(_stats("overall", list(results)))
    return out


def _stats(name: str, results: Sequence[Result]) -> dict[str, Any]:
    errors = [r.error_pct for r in results]
    absolute = [abs(e) for e in errors]
    return {
        "source": name, "count": len(errors), "mean_abs_error_pct": statistics.fmean(absolute),
        "median_abs_error_pct": statistics.median(absolute), "max_abs_error_pct": max(absolute),
        "mean_signed_error_pct": statistics.fmean(errors),
    }


def mean_abs_error(results: Sequence[Result]) -> float:
    return statistics.fmean(abs(r.error_pct) for r in results)


# ----------------------------------------------------------------------------------------------- plot


def parity_plot(results: Sequence[Result], path: str) -> None:
    """Predicted vs measured, log-log, one panel per unit, with the ideal line and +-10% / +-25% bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = list(dict.fromkeys(r.row.unit for r in results))
    fig, axes = plt.subplots(1, len(units), figsize=(5 * len(units), 4.6), squeeze=False)
    for ax, unit in zip(axes[0], units, strict=True):
        chosen = [r for r in results if r.row.unit == unit]
        lo = min(min(r.row.value, r.predicted) for r in chosen) / 1.5
        hi = max(max(r.row.value, r.predicted) for r in chosen) * 1.5
        xs = [lo, hi]
        ax.plot(xs, xs, color="black", linewidth=1, label="predicted = measured")
        for band, alpha in ((0.25, 0.12), (0.10, 0.22)):
            ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], color="tab:blue",
                            alpha=alpha, linewidth=0, label=f"±{band:.0%}")
        for source in dict.fromkeys(r.row.source for r in chosen):
            points = [r for r in chosen if r.row.source == source]
            ax.scatter([r.row.value for r in points], [r.predicted for r in points], s=18, label=source)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.set_title(unit)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    from dlperf.plot import save_figure

    save_figure(fig, path, 120)
