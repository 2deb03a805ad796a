"""Predictions against published measurements: a sourced dataset, its loader, and the error report.

A dataset file (YAML) has `sources:` (name -> citation) and `rows:`. Each row names a model (built-in name or
path, plus `set:` overrides), a hardware file, the full plan, the measured figure with its unit, tags, the
strength of the evidence and where in its source the figure is printed. The built-in dataset lives in
dlperf/data/validation/*.yaml, so it ships in the wheel; a user can pass their own file in the same format.

Absolute units compare one prediction with one measurement. Ratio units (speedup, scaling_efficiency) compare
the ratio of two predictions, this row and its `baseline:` row, with the measured ratio.

A row with `pending:` (feature name -> why) is a published measurement of something dlperf does not model yet
(FP8, MoE, context parallelism, a model not built in): it is loaded, listed and checked for its citation, but not
predicted or scored, and its plan may use keys the Plan does not have yet. Removing `pending:` turns it on.

A long table of runs that differ only in a few numbers can be written compactly under `tables:` (next to or
instead of `rows:`): each table has `columns:` (names), a `template:` (one row, whose strings may name columns
as `{name}`) and `rows:` (one list of cells per run). A string that is exactly `{name}` takes the cell itself (a
number stays a number); a longer string gets the cell written into it. Each table row becomes one row, checked
as if it had been written out, and errors point at its line. Expanding is budgeted like YAML aliases:
at most yamlio.MAX_NODES nodes and MAX_TABLE_CHARS characters of text per file, each cell a number, a
boolean, null or a string of at most MAX_CELL_CHARS characters.

Plan ranking: rows measured on the same source, model (and `set:`), hardware, device count, global batch and
absolute unit, with different plans, form a group (or the rows sharing an explicit `group:` name do); the Spearman
rank correlation between measured and predicted within each group says whether dlperf orders alternative plans
the way the hardware did, which is what plan search relies on.

A row whose `evidence` is `simulated` quotes another model's output, not a measurement: it is predicted and
summarised with its source, but the overall figures (mean error, Spearman median, --max-error) cover
measurements only.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dlperf.errors import DlperfError, SpecError
from dlperf.plan import Plan
from dlperf.plan import validate as validate_plan
from dlperf.spec.yamlio import MAX_NODES, LineDict, LineList, check_keys, field_name, line_of, load_yaml_file

DATA_DIR = Path(__file__).resolve().parent / "data" / "validation"

# unit -> what it is compared with. tflops_per_gpu is the published convention of Megatron-LM (Narayanan et al.
# 2021 Sec. 5.1, eq. 3: 96*B*s*l*h^2*(...) counts the matrix multiplications, the recomputed forward pass
# included), i.e. matrix FLOP/s per device.
ABSOLUTE_UNITS = {
    "iteration_time_s": "step_time_s",
    "samples_per_s": "throughput_samples_per_s",
    "tflops_per_gpu": "matrix_tflops_per_device",
    "mfu": "mfu",
    "tokens_per_s": "throughput_samples_per_s",   # x the sequence length (the model's input length)
    "tokens_per_s_per_device": "throughput_samples_per_s",   # x the sequence length / devices
}
PER_TOKEN_UNITS = ("tokens_per_s", "tokens_per_s_per_device")
# speedup = throughput(row) / throughput(baseline). scaling_efficiency = per-device FLOP rate of the row over
# that of the baseline (a fraction): for one model this is the per-device throughput ratio (strong or weak
# scaling), and across models it is the weak-scaling definition Megatron-LM's tables use.
RATIO_UNITS = {
    "speedup": "throughput_samples_per_s",
    "scaling_efficiency": "matrix_tflops_per_device",
}
UNITS = (*ABSOLUTE_UNITS, *RATIO_UNITS)
# `simulated`: the published figure is another model's output (a simulator's prediction), not a measurement.
# Such rows are predicted and compared per source, but left out of the overall error, the overall Spearman
# median and --max-error: agreeing with another model is not accuracy.
EVIDENCE = ("verified", "secondary", "unverified", "simulated")
TOP_KEYS = ("sources", "rows", "tables")
TABLE_KEYS = ("columns", "template", "rows")
MAX_CELL_CHARS = 200  # a table cell that is text: an id part, a label
MAX_TABLE_CHARS = 4 * 2**20  # text of all expanded table rows of one file (as much as one file may hold)
MAX_TEMPLATE_DEPTH = 4  # row -> plan/set/measured/tags -> value: deeper is not a row
MAX_TEMPLATE_TEXT = 2000  # one template string (a note, a `where`): bounds what one substitution builds
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SOURCE_KEYS = ("citation",)
ROW_KEYS = ("id", "source", "where", "evidence", "tags", "model", "set", "hardware", "plan", "measured",
            "baseline", "note", "group", "pending")
ROW_REQUIRED = ("id", "source", "where", "evidence", "model", "hardware", "plan", "measured")
MEASURED_KEYS = ("value", "unit")
PLAN_FIELDS = {f.name: f for f in fields(Plan)}
_BOOL_FIELDS = ("sequence_parallel", "overlap", "hybrid_fc", "tp_overlap", "fp8_param_gather", "ep_overlap",
                "fp8_activations", "p2p_overlap")
_STR_FIELDS = ("schedule", "recompute", "compression", "consistency", "dtype", "optimizer", "grad_dtype",
               "cp_algorithm", "zero_impl", "dp_impl", "ep_dispatcher", "memory_format", "data_backend",
               "fp8_scaling", "mx_swizzle", "optimizer_impl", "moment_dtype", "fp8_weight_transpose")
_NAME_LIST_FIELDS = ("recompute_modules", "input_ops", "grad_passes", "cuda_graphs")
_FLOAT_FIELDS = ("moe_imbalance",)


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
    group: str | None = None

    @property
    def is_ratio(self) -> bool:
        return self.unit in RATIO_UNITS

    @property
    def is_measurement(self) -> bool:
        """False for a figure another model computed (evidence `simulated`)."""
        return self.evidence != "simulated"


@dataclass(frozen=True)
class Pending:
    """A published measurement dlperf cannot predict yet: listed with what it waits for, never scored."""

    id: str
    source: str
    citation: str
    where: str
    evidence: str
    model: str
    sets: dict[str, int]
    hardware: str
    plan: dict[str, Any]
    value: float
    unit: str
    waits_for: dict[str, str]
    tags: tuple[str, ...] = ()
    note: str = ""
    file: str = ""
    line: int = 0


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
    and every `baseline:` names a row with an absolute unit. Rows marked `pending:` are left out (see
    load_pending)."""
    return load_all(paths)[0]


def load_pending(paths: Iterable[str | Path] | None = None) -> list[Pending]:
    """The `pending:` rows of the same files: checked like the others, but not predicted."""
    return load_all(paths)[1]


def load_all(paths: Iterable[str | Path] | None = None) -> tuple[list[Row], list[Pending]]:
    files = [Path(p) for p in paths] if paths else default_files()
    rows: list[Row] = []
    pending: list[Pending] = []
    for path in files:
        scored, waiting = _load_file(path)
        rows.extend(scored)
        pending.extend(waiting)
    _check_links(rows, pending)
    return rows, pending


def load_file(path: str | Path) -> list[Row]:
    return _load_file(path)[0]


def _load_file(path: str | Path) -> tuple[list[Row], list[Pending]]:
    file = str(path)
    data = load_yaml_file(Path(path))
    check_keys(data, TOP_KEYS, file, "", required=("sources",) if isinstance(data, dict) and "tables" in data
               else ("sources", "rows"))
    sources = _sources(data["sources"], file)
    items = data.get("rows")
    if "rows" in data and (not isinstance(items, list) or not items):
        raise SpecError(expected="a non-empty list of rows", found=items, file=file, line=line_of(data, "rows"),
                        field="rows")
    named = [(item, f"rows[{i}]") for i, item in enumerate(items or [])]
    if "tables" in data:
        named.extend(_tables(data, file))
    rows: list[Row] = []
    pending: list[Pending] = []
    for item, where in named:
        if isinstance(item, dict) and "pending" in item:
            pending.append(_pending(item, sources, file, where))
        else:
            rows.append(_row(item, sources, file, where))
    return rows, pending


# ----------------------------------------------------------------------------------------------- tables


@dataclass
class _Budget:
    """What expanding the tables of one file may still build: YAML nodes and characters of text."""

    nodes: int = MAX_NODES
    chars: int = MAX_TABLE_CHARS


def _tables(data: dict, file: str) -> list[tuple[Any, str]]:
    """Every table row as a row mapping, with its location name (`tables[i].rows[k]`)."""
    tables = data["tables"]
    if not isinstance(tables, list) or not tables:
        raise SpecError(expected="a non-empty list of tables (columns, template, rows)", found=tables, file=file,
                        line=line_of(data, "tables"), field="tables")
    budget = _Budget()
    out: list[tuple[Any, str]] = []
    for t, table in enumerate(tables):
        out.extend(_expand_table(table, file, f"tables[{t}]", budget))
    return out


def _expand_table(table: Any, file: str, where: str, budget: _Budget) -> list[tuple[Any, str]]:
    check_keys(table, TABLE_KEYS, file, where, required=TABLE_KEYS)
    columns = _columns(table, file, where)
    template = table["template"]
    if not isinstance(template, dict) or not template:
        raise _fail(table, "template", where, file, "a mapping: one row whose strings may name columns as {name}")
    nodes = _check_template(template, columns, file, field_name(where, "template"), 1, line_of(table, "template"))
    cells = table["rows"]
    if not isinstance(cells, list) or not cells:
        raise _fail(table, "rows", where, file, "a non-empty list of rows, one list of cells each")
    budget.nodes -= nodes * len(cells)
    if budget.nodes < 0:
        raise _fail(table, "rows", where, file, f"tables that expand to at most {MAX_NODES:,} YAML nodes per file",
                    f"{len(cells):,} rows of a {nodes}-node template are too many")
    out = []
    for k, values in enumerate(cells):
        inner, line = f"{where}.rows[{k}]", line_of(cells, k)
        if not isinstance(values, list) or len(values) != len(columns):
            raise SpecError(expected=f"a list of {len(columns)} cells ({', '.join(columns)})", found=values,
                            file=file, line=line, field=inner)
        for name, value in zip(columns, values, strict=True):
            _check_cell(value, file, line, field_name(inner, name))
        out.append((_fill(template, dict(zip(columns, values, strict=True)), line, budget, file, inner), inner))
    return out


def _columns(table: dict, file: str, where: str) -> list[str]:
    columns = table["columns"]
    ok = isinstance(columns, list) and columns and all(
        isinstance(c, str) and _PLACEHOLDER.fullmatch("{" + c + "}") for c in columns)
    if not ok or len(set(columns)) != len(columns):
        raise _fail(table, "columns", where, file, "a non-empty list of distinct names (letters, digits, _)")
    return list(columns)


def _check_template(node: Any, columns: Sequence[str], file: str, where: str, depth: int, line: int | None) -> int:
    """Every {name} in a template string names a column; returns the template's node count."""
    line = line_of(node) or line
    if depth > MAX_TEMPLATE_DEPTH:
        raise SpecError(expected=f"a row template nested at most {MAX_TEMPLATE_DEPTH} deep", found="deeper",
                        file=file, line=line, field=where)
    if isinstance(node, dict):
        return 1 + sum(1 + _check_template(v, columns, file, field_name(where, str(k)), depth + 1,
                                           line_of(node, k)) for k, v in node.items())
    if isinstance(node, list):
        return 1 + sum(_check_template(v, columns, file, f"{where}[{i}]", depth + 1, line_of(node, i))
                       for i, v in enumerate(node))
    if isinstance(node, str):
        if len(node) > MAX_TEMPLATE_TEXT:
            raise SpecError(expected=f"a template text of at most {MAX_TEMPLATE_TEXT} characters",
                            found=f"{len(node):,} characters", file=file, line=line, field=where)
        for name in _PLACEHOLDER.findall(node):
            if name not in columns:
                raise SpecError(f"unknown column {{{name}}}", expected="one of " + ", ".join(columns),
                                file=file, line=line, field=where)
    return 1


def _check_cell(value: Any, file: str, line: int | None, where: str) -> None:
    if isinstance(value, str):
        ok = len(value) <= MAX_CELL_CHARS
    elif isinstance(value, int) and not isinstance(value, bool):
        ok = abs(value) <= 10**30  # the measured-value bound; also keeps str() of it short
    else:
        ok = value is None or isinstance(value, (bool, float))
    if not ok:
        raise SpecError(expected=f"a number (at most 1e30), true/false, null or a text of at most {MAX_CELL_CHARS}"
                        " characters", found=value, file=file, line=line, field=where)


def _fill(node: Any, cells: dict[str, Any], line: int | None, budget: _Budget, file: str, where: str) -> Any:
    """The template with its placeholders replaced; every mapping and list reports the table row's line."""
    if isinstance(node, dict):
        out: Any = LineDict((k, _fill(v, cells, line, budget, file, where)) for k, v in node.items())
        out.key_lines = dict.fromkeys(out, line or 0)
    elif isinstance(node, list):
        out = LineList(_fill(v, cells, line, budget, file, where) for v in node)
        out.item_lines = [line or 0] * len(out)
    elif isinstance(node, str):
        whole = _PLACEHOLDER.fullmatch(node)
        out = cells[whole.group(1)] if whole else _PLACEHOLDER.sub(lambda m: _text_of(cells[m.group(1)]), node)
        budget.chars -= len(out) if isinstance(out, str) else 0
        if budget.chars < 0:
            raise SpecError(expected=f"tables that expand to at most {MAX_TABLE_CHARS:,} characters of text per file",
                            found="more", file=file, line=line, field=where)
        return out
    else:
        return node
    out.line = line or 0
    return out


def _text_of(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


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


def _common(node: Any, sources: dict[str, str], file: str, where: str) -> tuple[str, str, str]:
    """Checks shared by scored and pending rows; returns (id, source, the row's location name)."""
    check_keys(node, ROW_KEYS, file, where, required=ROW_REQUIRED)
    row_id = _text(node, "id", where, file)
    where = f"rows[{row_id}]"
    source = _text(node, "source", where, file)
    if source not in sources:
        raise _fail(node, "source", where, file, "a name listed under sources: (" + ", ".join(sources) + ")")
    if node["evidence"] not in EVIDENCE:
        raise _fail(node, "evidence", where, file, "one of " + ", ".join(EVIDENCE))
    note = node.get("note", "")
    if not isinstance(note, str):
        raise _fail(node, "note", where, file, "a string")
    return row_id, source, where


def _tags(node: dict, where: str, file: str) -> tuple[str, ...]:
    tags = node.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise _fail(node, "tags", where, file, "a list of tag names")
    return tuple(tags)


def _pending(node: Any, sources: dict[str, str], file: str, where: str) -> Pending:
    row_id, source, where = _common(node, sources, file, where)
    waits = node["pending"]
    if not isinstance(waits, dict) or not waits or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in waits.items()):
        raise _fail(node, "pending", where, file, "a mapping of missing feature to the reason, e.g. {fp8: \"...\"}")
    plan = node["plan"]
    if not isinstance(plan, dict):
        raise _fail(node, "plan", where, file, "a mapping of plan fields")
    value, unit = _measured(node, where, file)
    return Pending(
        id=row_id, source=source, citation=sources[source], where=_text(node, "where", where, file),
        evidence=node["evidence"], model=_text(node, "model", where, file), sets=_sets(node, where, file),
        hardware=_text(node, "hardware", where, file), plan=dict(plan), value=value, unit=unit,
        waits_for={str(k): v.strip() for k, v in waits.items()}, tags=_tags(node, where, file),
        note=node.get("note", ""), file=file, line=line_of(node) or 0,
    )


def _row(node: Any, sources: dict[str, str], file: str, where: str) -> Row:
    row_id, source, where = _common(node, sources, file, where)
    evidence = node["evidence"]
    tags = _tags(node, where, file)
    value, unit = _measured(node, where, file)
    baseline = node.get("baseline")
    if unit in RATIO_UNITS and not isinstance(baseline, str):
        raise _fail(node, "baseline" if "baseline" in node else "measured", where, file,
                    f"a baseline: row id (unit {unit} is a ratio of two predictions)")
    if unit in ABSOLUTE_UNITS and baseline is not None:
        raise _fail(node, "baseline", where, file, f"no baseline for the absolute unit {unit}")
    group = node.get("group")
    if group is not None and (not isinstance(group, str) or not group.strip() or unit in RATIO_UNITS):
        raise _fail(node, "group", where, file, "a group name (on a row with an absolute unit)")
    return Row(
        id=row_id, source=source, citation=sources[source], where=_text(node, "where", where, file),
        evidence=evidence, tags=tuple(tags), model=_text(node, "model", where, file),
        sets=_sets(node, where, file), hardware=_text(node, "hardware", where, file),
        plan=_plan(node, where, file), value=value, unit=unit, baseline=baseline, note=node.get("note", ""),
        file=file, line=line_of(node) or 0, group=group.strip() if group else None,
    )


def _measured(node: dict, where: str, file: str) -> tuple[float, str]:
    measured = node["measured"]
    inner = field_name(where, "measured")
    check_keys(measured, MEASURED_KEYS, file, inner, required=MEASURED_KEYS)
    value, unit = measured["value"], measured["unit"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < _as_float(value) <= 1e30:
        raise _fail(measured, "value", inner, file, "a positive number (finite, at most 1e30)")
    if unit not in UNITS:
        raise _fail(measured, "unit", inner, file, "one of " + ", ".join(UNITS))
    return float(value), unit


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits
        return math.inf


def _sets(node: dict, where: str, file: str) -> dict[str, int]:
    sets = node.get("set") or {}
    if not isinstance(sets, dict):
        raise _fail(node, "set", where, file, "a mapping of model parameter to positive integer")
    for key, value in sets.items():
        if isinstance(value, bool):  # a switch (flash, triton_attention): the model loader checks it is one
            continue
        if not isinstance(value, int) or not 1 <= value <= 2**53:
            raise _fail(sets, key, field_name(where, "set"), file, "a positive integer (at most 2**53) or true/false")
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
        elif key == "cudnn":  # YAML reads 9.13 as a number: say what a version looks like (dlperf.plan.cudnn_version)
            ok, expected = isinstance(value, str), 'a cuDNN version string, major.minor.patch, such as "9.13.1"'
        elif key in _FLOAT_FIELDS:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            expected = "a number"
        elif key in _NAME_LIST_FIELDS:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            expected = "a list of names"
        else:
            nullable = value is None and key in ("dp", "micro_batch")
            ok = nullable or (isinstance(value, int) and not isinstance(value, bool))
            expected = "an integer"
        if not ok:
            raise _fail(raw, key, inner, file, expected)
    plan = Plan(**{k: tuple(v) if k in _NAME_LIST_FIELDS else v for k, v in raw.items()})
    try:
        return validate_plan(plan)
    except DlperfError as err:
        raise err.located(file=file, line=line_of(node, "plan"), field=inner) from None


def _check_links(rows: Sequence[Row], pending: Sequence[Pending] = ()) -> None:
    by_id: dict[str, Row | Pending] = {}
    for row in [*rows, *pending]:
        if row.id in by_id:
            first = by_id[row.id]
            raise SpecError(f"duplicate row id (first at {first.file}:{first.line})", file=row.file, line=row.line,
                            field=f"rows[{row.id}].id")
        by_id[row.id] = row
    for row in rows:
        if row.baseline is None:
            continue
        base = by_id.get(row.baseline)
        if not isinstance(base, Row) or base.is_ratio:
            raise SpecError(expected="the id of a row with an absolute unit", found=row.baseline, file=row.file,
                            line=row.line, field=f"rows[{row.id}].baseline")


def select(rows: Sequence[Any], sources: Sequence[str] = (), tags: Sequence[str] = ()) -> list[Any]:
    """Rows (scored or pending) from any of `sources` (all when empty) carrying every tag in `tags`."""
    return [r for r in rows if (not sources or r.source in sources) and all(t in r.tags for t in tags)]


# ----------------------------------------------------------------------------------------------- evaluation


def evaluate(rows: Sequence[Row], universe: Sequence[Row] | None = None) -> list[Result]:
    """Predict every row. Ratio rows also predict their baseline, looked up in `universe` (default: `rows`)."""
    by_id = {r.id: r for r in (universe if universe is not None else rows)}
    cache: dict[str, Any] = {}
    specs: dict[tuple[Any, ...], Any] = {}  # parsed model and hardware files, shared by the rows naming them

    def prediction(row: Row) -> Any:
        if row.id not in cache:
            cache[row.id] = _predict(row, specs)
        return cache[row.id][0]

    results = []
    for row in rows:
        pred = prediction(row)
        if row.is_ratio:
            metric = RATIO_UNITS[row.unit]
            base = prediction(by_id[row.baseline])
            value = float(getattr(pred, metric)) / float(getattr(base, metric))
        else:
            value = float(getattr(pred, ABSOLUTE_UNITS[row.unit]))
            if row.unit in PER_TOKEN_UNITS:
                value *= cache[row.id][1]
            if row.unit == "tokens_per_s_per_device":
                value /= row.plan.devices
        notes = [] if pred.fits else [UNFIT_NOTE]
        results.append(Result(row, value, notes))
    return results


def _predict(row: Row, specs: dict[tuple[Any, ...], Any] | None = None) -> tuple[Any, int]:
    """The prediction and the tokens per sample: a sequence model's input length (per-token units need one).
    `specs` keeps the model and hardware specs (frozen) already read, so that 1,000 rows on one hardware file
    parse it once."""
    from dlperf.engine import predict
    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model

    specs = {} if specs is None else specs
    loaded = []
    loaders = ((("model", row.model, tuple(sorted(row.sets.items()))), lambda: load_model(row.model, row.sets)),
               (("hardware", row.hardware), lambda: load_hardware(row.hardware)))
    for key, load in loaders:
        try:
            if key not in specs:
                specs[key] = load()
            loaded.append(specs[key])
        except DlperfError as err:
            # the row is where the bad name is; the inner message keeps the model's own file and line, if any
            raise DlperfError(str(err), file=row.file, line=row.line, field=f"rows[{row.id}].{key[0]}") from None
    try:
        model, hardware = loaded
        if row.unit in PER_TOKEN_UNITS and len(model.input_shape) != 1:
            raise SpecError(f"unit {row.unit} needs a sequence model", expected="a model whose input is [seq]",
                            found=list(model.input_shape))
        tokens = int(model.input_shape[0]) if len(model.input_shape) == 1 else 1
        return predict(model, hardware, row.plan), tokens
    except DlperfError as err:
        raise err.located(file=row.file, line=row.line, field=f"rows[{row.id}]") from None


def result_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    return [{
        "id": r.row.id, "source": r.row.source, "unit": r.row.unit, "measured": r.row.value,
        "predicted": r.predicted, "error_pct": r.error_pct, "evidence": r.row.evidence,
        "tags": ",".join(r.row.tags),
    } for r in results]


def measurements(results: Sequence[Result]) -> list[Result]:
    """The results whose figure was measured (not another model's output, see EVIDENCE)."""
    return [r for r in results if r.row.is_measurement]


def gated(results: Sequence[Result]) -> list[Result]:
    """What --max-error and --plot take: the measured rows, or all when none is measured (a simulated source
    chosen alone is still gated and drawn on itself)."""
    return measurements(results) or list(results)


def summary(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Per source (in first-seen order) and overall: count, mean/median/max absolute % error, mean signed %,
    the number of plan groups and the median within-group Spearman rank correlation (None without groups).
    A source whose figures are simulated is summarised on its own line (`measured` False) and left out of
    the overall, which covers measurements only."""
    by_source: dict[str, list[Result]] = {}
    for r in results:
        by_source.setdefault(r.row.source, []).append(r)
    ranked = plan_groups(results)
    out = [_stats(name, chosen, [g for g in ranked if g["source"] == name]) for name, chosen in by_source.items()]
    measured = measurements(results)
    if measured:
        out.append(_stats("overall", measured, [g for g in ranked if g["measured"]]))
    return out


def _stats(name: str, results: Sequence[Result], ranked: Sequence[dict[str, Any]]) -> dict[str, Any]:
    errors = [r.error_pct for r in results]
    absolute = [abs(e) for e in errors]
    rhos = [g["spearman"] for g in ranked if g["spearman"] is not None]
    return {
        "source": name, "measured": all(r.row.is_measurement for r in results), "count": len(errors),
        "mean_abs_error_pct": statistics.fmean(absolute),
        "median_abs_error_pct": statistics.median(absolute), "max_abs_error_pct": max(absolute),
        "mean_signed_error_pct": statistics.fmean(errors), "groups": len(rhos),
        "spearman_median": statistics.median(rhos) if rhos else None,
    }


# ----------------------------------------------------------------------------------------------- plan ranking


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n in ascending order; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho with ties: the Pearson correlation of average ranks (Spearman 1904; the tie-corrected form,
    e.g. Kendall & Gibbons, Rank Correlation Methods, ch. 3). None when either side has no spread: then there
    is no ordering to compare."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs equal lengths, got {len(xs)} and {len(ys)}")
    if len(xs) < 2:
        return None
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def group_key(row: Row) -> tuple[Any, ...]:
    """Rows that are alternative plans for one job: same source, model and `set:`, hardware, device count,
    global batch and unit; or an explicit `group:` name within the source (and unit)."""
    if row.group is not None:
        return (row.source, row.group, row.unit)
    return (row.source, row.model, tuple(sorted(row.sets.items())), row.hardware, row.plan.devices,
            row.plan.global_batch, row.unit)


def plan_groups(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Every group of two or more absolute-unit rows with its Spearman rho between measured and predicted.

    rho is None when the measurements are all equal (nothing to rank); when only the predictions are all
    equal, rho is 0: dlperf cannot tell the plans apart, which is a miss, not a pass."""
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for r in results:
        if not r.row.is_ratio:
            groups.setdefault(group_key(r.row), []).append(r)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        measured = [m.row.value for m in members]
        predicted = [m.predicted for m in members]
        rho = spearman(measured, predicted)
        if rho is None and len(set(measured)) > 1:
            rho = 0.0
        out.append({"source": members[0].row.source, "ids": [m.row.id for m in members], "count": len(members),
                    "unit": members[0].row.unit, "varies": _varies([m.row.plan for m in members]),
                    "spearman": rho, "measured": all(m.row.is_measurement for m in members)})
    return out


# Plan fields that set the arithmetic precision. A group that varies them compares dtypes (AMP against TF32, a
# 2-8x peak difference that any model ranks right), so the layout summary leaves it out.
PRECISION_FIELDS = ("dtype", "grad_dtype")


def _varies(plans: Sequence[Plan]) -> list[str]:
    """The plan fields (after defaults are resolved) that differ within a group."""
    resolved = [p.to_dict() for p in plans]
    return [name for name in resolved[0] if len({str(r[name]) for r in resolved}) > 1]


# Plan fields that name the software a run used, not a choice of plan: rows that differ only in them are the same
# plan measured on two releases, not alternatives to rank.
SOFTWARE_FIELDS = ("cudnn",)


def is_layout_group(group: dict[str, Any]) -> bool:
    """Alternative plans at one precision: they differ in parallel layout, micro-batch, recomputation, ..."""
    choices = [name for name in group["varies"] if name not in SOFTWARE_FIELDS]
    return bool(choices) and not any(name in PRECISION_FIELDS for name in choices)


def median_spearman(results: Sequence[Result], layout_only: bool = False) -> float | None:
    """Median within-group Spearman over the plan groups of measured rows (or only the groups at one
    precision)."""
    rhos = [g["spearman"] for g in plan_groups(measurements(results))
            if g["spearman"] is not None and (not layout_only or is_layout_group(g))]
    return statistics.median(rhos) if rhos else None


def pending_rows(pending: Sequence[Pending]) -> list[dict[str, Any]]:
    return [{
        "id": p.id, "source": p.source, "model": p.model, "hardware": p.hardware, "unit": p.unit,
        "measured": p.value, "waits_for": ",".join(p.waits_for), "evidence": p.evidence,
    } for p in pending]


UNFIT_NOTE = "predicted memory exceeds the device"


def predicted_unfit(results: Sequence[Result]) -> list[Result]:
    """Rows whose published plan ran but whose predicted memory exceeds the device: the memory model over-counts
    there (a search would have refused the plan), whatever the time error says."""
    return [r for r in results if UNFIT_NOTE in r.notes]


def unfit_line(results: Sequence[Result]) -> str:
    """One line saying how many published plans dlperf predicts not to fit, by source ('' when none)."""
    unfit = predicted_unfit(results)
    if not unfit:
        return ""
    by_source = Counter(r.row.source for r in unfit)
    parts = ", ".join(f"{source} {n}" for source, n in by_source.most_common())
    return (f"memory: {len(unfit)} published plans (they ran) are predicted NOT to fit in device memory ({parts}): "
            f"the memory model over-counts there")


def unscorable(results: Sequence[Result]) -> list[Result]:
    """Rows whose error is not a finite number (a NaN or infinite prediction): a gate must count them as
    failures, since they would otherwise drop out of the mean unseen."""
    return [r for r in results if not math.isfinite(r.error_pct)]


def mean_abs_error(results: Sequence[Result]) -> float:
    """Over the rows --max-error gates (`gated`)."""
    return statistics.fmean(abs(r.error_pct) for r in gated(results))


def simulated_line(results: Sequence[Result]) -> str:
    """One line naming the rows left out of the overall figures because they are not measurements ('' when
    none)."""
    simulated = Counter(r.row.source for r in results if not r.row.is_measurement)
    if not simulated:
        return ""
    parts = ", ".join(f"{source} {n:,}" for source, n in simulated.items())
    return (f"left out of overall: {sum(simulated.values()):,} rows whose figure is another model's output, not a "
            f"measurement (evidence: simulated): {parts}")


# ----------------------------------------------------------------------------------------------- plot


def parity_plot(results: Sequence[Result], path: str | None = None) -> Any:
    """Predicted vs measured, log-log, one panel per unit (dlperf.plot.parity_chart); returns the Figure and
    writes it to `path` when given. Simulated rows are not measurements: they are drawn only when nothing
    measured was chosen (`gated`)."""
    from dlperf.plot import parity_chart

    return parity_chart(gated(results), path)
