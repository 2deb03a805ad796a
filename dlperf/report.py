"""Rendering rows of results as an aligned text table, JSON or CSV (one code path for every command)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

FORMATS = ("table", "json", "csv")


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, title: str = "") -> str:
    """An aligned plain-text table; numbers right-aligned."""
    if not rows:
        return title
    columns = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), (int, float)) or row.get(c) is None for row in rows) for c in columns]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True))
        return "  ".join(padded).rstrip()

    out = [title] if title else []
    out += [line(columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=_jsonable)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "tolist"):
        return value.tolist()
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row.get(c) for c in columns})
    return buffer.getvalue()


def render(rows: Sequence[dict[str, Any]], fmt: str, columns: Sequence[str] | None = None, title: str = "") -> str:
    """Rows as `fmt` (table | json | csv)."""
    if fmt == "json":
        return to_json(list(rows))
    if fmt == "csv":
        return to_csv(rows, columns)
    return table(rows, columns, title)
