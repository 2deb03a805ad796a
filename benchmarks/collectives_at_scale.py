"""Published multi-node nccl-tests figures at 16-1024 GPUs against dlperf's collective pricing (microbenchmarks, never
training runs): per (collective, GPUs, size) the published time and busbw, dlperf's on the hardware files named, and
the ratio published / dlperf of the times (> 1: dlperf is too fast). Each point carries its source.

1. Tables (dlperf/data/nccl_tests/aws-p5-*): all_gather_perf and all_reduce_perf on AWS p5.48xlarge (8x H100 per
   node, 32x 100 Gb/s EFA v2, NCCL 2.27.7 through aws-ofi-nccl 1.16.3), 2-32 nodes, 32 MiB - 8 GiB. Priced on
   dgx-h100 (NCCL's tuner model with InfiniBand's network hop, which the transport reports no latency for) and on
   aws-p5 (the same model plus the 75 us aws-ofi-nccl reports for p5, which NCCL's tuner adds to each network hop).
2. Single points from NVIDIA/nccl issues (InfiniBand or RoCE H100 clusters, 8 NICs of 400 Gb/s per node), priced on
   dgx-h100. They are users' reports: the setup or the size is not fully stated (each point says what is missing),
   so they are printed, not tested.

    .venv/bin/python benchmarks/collectives_at_scale.py [--hardware dgx-h100 aws-p5]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from dlperf.comm import Group, best_algorithm, collective_time
from dlperf.comm.collectives import bus_factor
from dlperf.spec.hardware import load_hardware

TABLES = Path(__file__).resolve().parent.parent / "dlperf" / "data" / "nccl_tests"
GiB = 2**30


@dataclass(frozen=True)
class Point:
    """One published figure: nccl-tests' size (B) and its time (s) on `gpus` ranks, 8 per node."""

    op: str
    gpus: int
    size: float
    time: float
    source: str


def table_points(prefix: str = "aws-p5-") -> list[Point]:
    """Every row of the nccl_tests tables whose name starts with `prefix`, with the table's source."""
    out = []
    for path in sorted(TABLES.glob(f"{prefix}*.yaml")):
        table = yaml.safe_load(path.read_text())
        source = " ".join(str(table["source"]).split())
        for size, time_us, *_ in table["rows"]:
            out.append(Point(table["op"], int(table["gpus"]), float(size), float(time_us) * 1e-6,
                             f"{table['name']}: {source}"))
    return sorted(out, key=lambda p: (p.op, p.gpus, p.size))


def from_busbw(op: str, gpus: int, size: float, busbw: float) -> float:
    """nccl-tests' time from its busbw (GB/s): size / (busbw / bus factor)."""
    return size / (busbw * 1e9 / bus_factor(op, gpus))


# Reports in NVIDIA/nccl issues, H100 nodes of 8 GPUs with 8x 400 Gb/s NICs. Not tables: what each leaves unstated is
# in its source string.
ISSUE_POINTS = [
    Point("allgather", 256, 2 * GiB, from_busbw("allgather", 256, 2 * GiB, 200.0),
          "NVIDIA/nccl#1218 (title: all_gather_perf 'only achieves 200GBps bandwidth for 2G message size for 32 (256 "
          "GPUS) H100 nodes'; RoCE, nccl-tests -g 8 (one process per node), NCCL_MIN/MAX_NCHANNELS=16, "
          "NCCL_IB_QPS_PER_CONNECTION=1; NCCL version not stated)"),
    *(Point("reduce_scatter", 8 * nodes, 8 * GiB, from_busbw("reduce_scatter", 8 * nodes, 8 * GiB, busbw),
            f"NVIDIA/nccl#1229 (reduce-scatter bus BW on {nodes} H100 nodes, one of '360,345,320,300,280,260' at "
            "4/8/16/32/64/128 nodes; size, fabric and NCCL version not stated: taken at 8 GiB)")
      for nodes, busbw in ((4, 360.0), (8, 345.0), (16, 320.0), (32, 300.0), (64, 280.0), (128, 260.0))),
]


def priced(point: Point, hardware: str) -> tuple[float, str]:
    hw = load_hardware(hardware)
    group = Group(point.gpus)
    return float(collective_time(point.op, point.size, group, hw)), best_algorithm(point.op, point.size, group, hw)


def busbw(op: str, gpus: int, size: float, time: float) -> float:
    return size / time * bus_factor(op, gpus) / 1e9


def show(points: list[Point], hardware: list[str], title: str) -> dict[str, list[float]]:
    """Print one line per point; return each hardware's log ratios (published / dlperf time)."""
    print(f"\n{title}")
    head = f"{'collective':14s} {'GPUs':>5s} {'size':>9s} {'published':>20s}"
    for name in hardware:
        head += f" {'dlperf ' + name:>24s} {'algorithm':>11s} {'ratio':>6s}"
    print(head + "  source")
    logs: dict[str, list[float]] = {name: [] for name in hardware}
    source = None
    for p in points:
        line = (f"{p.op:14s} {p.gpus:5d} {p.size / 2**20:6.0f}MiB {p.time * 1e6:9.0f}us "
                f"{busbw(p.op, p.gpus, p.size, p.time):6.1f}GB/s")
        for name in hardware:
            t, algo = priced(p, name)
            logs[name].append(float(np.log(p.time / t)))
            line += f" {t * 1e6:10.0f}us {busbw(p.op, p.gpus, p.size, t):6.1f}GB/s {algo[5:]:>11s} {p.time / t:6.2f}"
        if p.source != source:
            line += f"  [{p.source}]"
            source = p.source
        print(line)
    return logs


def summary(logs: dict[str, list[float]]) -> None:
    for name, values in logs.items():
        ratios = np.exp(values)
        print(f"  {name}: published / dlperf time: median {np.median(ratios):.2f}, geometric mean "
              f"{np.exp(np.mean(values)):.2f}, range {ratios.min():.2f}..{ratios.max():.2f}, mean |dlperf / "
              f"published - 1| {np.mean(np.abs(1 / ratios - 1)):.1%} over {len(values)} points")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", nargs="+", default=["dgx-h100", "aws-p5"],
                        help="hardware files to price the AWS p5 tables on (names or YAML paths)")
    args = parser.parse_args()

    points = table_points()
    for op in sorted({p.op for p in points}):
        mine = [p for p in points if p.op == op]
        logs = show(mine, args.hardware, f"AWS p5.48xlarge nccl-tests, {op} (ratio: published / dlperf time)")
        summary(logs)
        for gpus in sorted({p.gpus for p in mine}):
            sub = [p for p in mine if p.gpus == gpus]
            cells = []
            for name in args.hardware:
                r = [p.time / priced(p, name)[0] for p in sub]
                cells.append(f"{name} median ratio {np.median(r):.2f}")
            print(f"    {gpus:4d} GPUs: " + ", ".join(cells))
    logs = show(ISSUE_POINTS, ["dgx-h100"], "Single reports from NVIDIA/nccl issues (InfiniBand/RoCE), on dgx-h100")
    summary(logs)


if __name__ == "__main__":
    main()
