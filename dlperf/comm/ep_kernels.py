"""Bandwidths DeepEP's and HybridEP's own microbenchmarks publish for their dispatch and combine kernels
(dlperf/data/ep_kernels/deepep.yaml: each table's source, workload and what its bandwidth divides).

`bandwidth` picks, for one plan, the row of the table for the dispatcher, the device and the link its expert
group crosses (nvlink inside one NVLink domain, rdma across), whose EP size and then SM count lie closest to the
plan's (ties to the fewer SMs); None where no table covers the case, so the caller keeps its own pricing."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent.parent / "data" / "ep_kernels" / "deepep.yaml"
COLUMNS = ("dispatch_fp8", "dispatch_bf16", "combine")  # the rows' figures after [ranks, SMs]
GB = 1e9


@dataclass(frozen=True)
class Row:
    dispatcher: str
    device: str   # the device name's prefix (H800, H100, B200, GB200)
    link: str     # nvlink | rdma
    ranks: int
    sms: int
    figures: dict[str, float | None]  # COLUMNS -> bytes/s


@cache
def rows() -> tuple[Row, ...]:
    """Every published row of dlperf/data/ep_kernels/deepep.yaml, in bytes/s."""
    doc = yaml.safe_load(DATA.read_text())
    return tuple(
        Row(table["dispatcher"], table["device"], table["link"], ranks, sms,
            {col: None if gbs is None else gbs * GB for col, gbs in zip(COLUMNS, figures, strict=True)})
        for table in doc["tables"] for ranks, sms, *figures in table["rows"])


def _covers(row: Row, dispatcher: str, device: str, link: str) -> bool:
    """The device name starts with the table's device (B200 is not GB200's prefix, nor GB200 B200's)."""
    return row.dispatcher == dispatcher and device.upper().startswith(row.device) and row.link == link


def covers_device(dispatcher: str, device: str) -> bool:
    """Whether any published row prices `dispatcher` on this device (over either link)."""
    return any(_covers(r, dispatcher, device, r.link) for r in rows())


def bandwidth(dispatcher: str, device: str, link: str, ranks: int, sms: int, column: str) -> float | None:
    """Bytes/s of one `column` transfer (COLUMNS) from the closest published row, or None."""
    candidates = [r for r in rows() if _covers(r, dispatcher, device, link) and r.figures[column] is not None]
    if not candidates:
        return None
    best = min(candidates, key=lambda r: (abs(r.ranks - ranks), abs(r.sms - sms), r.sms))
    return best.figures[column]
