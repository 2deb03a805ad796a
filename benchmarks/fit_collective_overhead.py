"""The fixed time per collective call that NCCL's tuning model leaves out, from published nccl-tests tables.

NCCL's tuner (src/graph/tuning.cc, which dlperf.comm.nccl follows) prices an algorithm's latency and bandwidth
to choose among algorithms; a measured nccl-tests iteration also pays the kernel launch and the start-up of the
collective on every rank. Every table in dlperf/data/nccl_tests/ measures more than the model at small sizes,
by a roughly constant amount. This script prints the median of (measured - modelled) over the rows up to 4 MiB,
for tables within one node (NVLink/NVSwitch) and across nodes, with the model's own overhead term switched off:
dlperf.comm.nccl.CALL_OVERHEAD is the smaller of the two (one constant for every collective, so that a group
spread over more nodes never starts faster). Kernel microbenchmarks only, never a
training run.

    .venv/bin/python benchmarks/fit_collective_overhead.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from dlperf.comm import Group, collective_time
from dlperf.comm import nccl as N
from dlperf.spec.hardware import load_hardware

TABLES = Path(__file__).resolve().parent.parent / "dlperf" / "data" / "nccl_tests"
UP_TO = 4 * 2**20  # bytes: where the fixed term dominates
# vTrain's all-reduce tables were measured on the machines of the vTrain training runs `dlperf validate` scores:
# held out of the fit, so that neither those runs nor their own cluster's microbenchmarks set the constant.
HELD_OUT = "vtrain-"


def gaps() -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"one node": [], "across nodes": []}
    for path in sorted(TABLES.glob("*.yaml")):
        table = yaml.safe_load(path.read_text())
        if table["name"].startswith(HELD_OUT):
            continue
        hw = load_hardware(table["hardware"])
        where = "one node" if table["nodes"] == 1 else "across nodes"
        rows = [r for r in table["rows"] if r[0] <= UP_TO]
        diffs = [r[1] * 1e-6 - float(collective_time(table["op"], float(r[0]), Group(int(table["gpus"])), hw))
                 for r in rows]
        print(f"{table['name']:34s} {len(rows):3d} rows <= 4 MiB, median gap {statistics.median(diffs) * 1e6:6.1f} us")
        out[where] += diffs
    return out


def main() -> None:
    saved = N.CALL_OVERHEAD
    N.CALL_OVERHEAD = 0.0
    try:
        found = gaps()
        for where, diffs in found.items():
            print(f"{where}: median gap {statistics.median(diffs) * 1e6:.1f} us over {len(diffs)} rows")
        constant = min(statistics.median(diffs) for diffs in found.values())
        print(f"constant (the smaller median): {constant * 1e6:.1f} us")
    finally:
        N.CALL_OVERHEAD = saved


if __name__ == "__main__":
    main()
