"""How many allreduce time evaluations per second: one vectorized call on a numpy array of sizes versus a
Python loop of scalar calls, in the same process.

    .venv/bin/python benchmarks/bench_comm.py [--sizes 1000000] [--gpus 64] [--hardware dgx-a100]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dlperf.comm import Group, collective_time
from dlperf.spec.hardware import load_hardware


def rate(fn, count: int) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return count / (time.perf_counter() - start), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, default=1_000_000, help="length of the size array")
    parser.add_argument("--loop", type=int, default=20_000, help="scalar calls timed for the baseline")
    parser.add_argument("--gpus", type=int, default=64, help="group size (64 = 8 DGX nodes)")
    parser.add_argument("--hardware", default="dgx-a100", help="hardware name or YAML path")
    args = parser.parse_args()

    hw, group = load_hardware(args.hardware), Group(args.gpus)
    sizes = np.geomspace(1.0, 2.0**34, args.sizes)
    collective_time("allreduce", sizes[:10], group, hw)  # warm the placement cache
    vec_rate, vec = rate(lambda: collective_time("allreduce", sizes, group, hw), len(sizes))
    subset = sizes[:: max(1, len(sizes) // args.loop)][: args.loop]
    loop_rate, loop = rate(lambda: [collective_time("allreduce", float(s), group, hw) for s in subset], len(subset))
    step = max(1, len(sizes) // args.loop)
    np.testing.assert_allclose(np.asarray(loop), vec[::step][: len(subset)], rtol=1e-12)
    print(f"allreduce auto, {args.gpus} GPUs on {hw.name}")
    print(f"vectorized: {vec_rate:,.0f} evaluations/s ({len(sizes):,} sizes in one call)")
    print(f"python loop: {loop_rate:,.0f} evaluations/s ({len(subset):,} scalar calls)")
    print(f"speed-up: {vec_rate / loop_rate:,.0f}x")


if __name__ == "__main__":
    main()
