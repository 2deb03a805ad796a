"""Rendering rows of results as an aligned text table, JSON or CSV (one code path for every command)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

FORMATS = ("table", "json", "csv")


# One human formatting rule for every table (JSON and CSV stay plain SI numbers): a column's name says its
# kind. Seconds (`*_s`) read as "366.2 us"; fractions of one (share, MFU, efficiency) as "40.5%"; `*_pct` are
# already percent; bytes and FLOPs get binary / decimal prefixes.
FRACTION_COLUMNS = ("share", "mfu", "efficiency", "spread")


def column_kind(column: str) -> str | None:
    """How a table shows a numeric column: 'time', 'fraction', 'percent', 'bytes', 'flops' or None (plain)."""
    name = column.lower()
    if (name.endswith("_s") and not name.endswith("_per_s")) or name == "seconds":
        return "time"
    if name in FRACTION_COLUMNS or name.endswith("_fraction"):
        return "fraction"
    if name.endswith("_pct"):
        return "percent"
    if name.endswith("_bytes"):
        return "bytes"
    if name.endswith("_flops"):
        return "flops"
    return None


def _human(value: float, kind: str) -> str:
    from dlperf.units import format_quantity

    if kind == "fraction":
        return f"{100 * value:.1f}%"
    if kind == "percent":
        return f"{value:.1f}%"
    return format_quantity(value, kind)


def _cell(value: Any, kind: str | None = None) -> str:
    if kind and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return _human(float(value), kind)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):  # never print a NaN or infinite figure: it is "no value"
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


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, title: str = "",
          kinds: dict[str, str] | None = None) -> str:
    """An aligned plain-text table; numbers right-aligned and shown by their column's kind (column_kind, or
    `kinds` for columns whose names do not say it)."""
    if not rows:
        return title
    columns = list(columns or rows[0].keys())
    kind = {c: (kinds or {}).get(c) or column_kind(c) for c in columns}
    cells = [[_cell(row.get(c), kind[c]) for c in columns] for row in rows]
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
    """JSON that any parser reads: a non-finite float (which json.dumps would write as NaN or Infinity, not
    JSON) becomes null, like the "-" of a table."""
    return json.dumps(_finite(data), indent=2, default=_jsonable, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return _finite(value.to_dict())
    if hasattr(value, "tolist"):
        return _finite(value.tolist())
    return value


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict") or hasattr(value, "tolist"):
        return _finite(value)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return str(value)
    return number if math.isfinite(number) else None


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


def render(rows: Sequence[dict[str, Any]], fmt: str, columns: Sequence[str] | None = None, title: str = "",
           kinds: dict[str, str] | None = None) -> str:
    """Rows as `fmt` (table | json | csv); only the table is formatted for people."""
    if fmt == "json":
        return to_json(list(rows))
    if fmt == "csv":
        return to_csv(rows, columns)
    return table(rows, columns, title, kinds)
