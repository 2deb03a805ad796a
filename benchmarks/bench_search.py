"""Search speed: `dlperf search gpt3-175b dgx-a100 --gpus 1024 --global-batch 1536`, measured honestly.

Prints plans/s of the memoized search path, the plans/s of calling dlperf.engine.predict one plan at a time on
a sample of the same plans (same process), their ratio, and the whole-process time of the CLI command; then the
same for `dlperf search deepseek-v3 h800 --gpus 2048 --global-batch 15360` (issue 14: 38,560 plans,
28,008 since recompute selective is folded into none where every attention is fused).

    .venv/bin/python benchmarks/bench_search.py [--sample 60]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=60, help="plans timed through the one-at-a-time predict loop")
    args = parser.parse_args()

    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model

    model, hw = load_model("gpt3-175b"), load_hardware("dgx-a100")
    loop_rate = search_rate(model, hw, 1024, 1536, args.sample)
    grid_rate(model, hw, loop_rate)
    whole_process("gpt3-175b", "dgx-a100", 1024, 1536)
    search_rate(load_model("deepseek-v3"), load_hardware("h800"), 2048, 15360, args.sample)
    whole_process("deepseek-v3", "h800", 2048, 15360)


def search_rate(model: object, hw: object, devices: int, batch: int, sample_size: int) -> float:
    """Time the search path, then dlperf.engine.predict one plan at a time on a sample of its fitting plans;
    print both rates and their ratio, return the predict loop's plans/s."""
    from dlperf.engine import predict
    from dlperf.search import search

    start = time.perf_counter()
    result = search(model, hw, devices, batch)
    fast_s = time.perf_counter() - start
    fast_rate = result.considered / fast_s
    print(f"{model.name} on {devices}: search path: {result.considered} plans ({result.feasible} fit) in "
          f"{fast_s:.2f} s -> {fast_rate:,.0f} plans/s")

    plans = [ev.plan for ev in result.ranked]
    sample = random.Random(0).sample(plans, min(sample_size, len(plans)))
    start = time.perf_counter()
    for plan in sample:
        predict(model, hw, plan)
    loop_s = time.perf_counter() - start
    loop_rate = len(sample) / loop_s
    print(f"{model.name} on {devices}: predict loop: {len(sample)} plans in {loop_s:.2f} s -> "
          f"{loop_rate:,.0f} plans/s")
    print(f"{model.name} on {devices}: speed-up of the search path over the predict loop: "
          f"{fast_rate / loop_rate:.1f}x")
    return loop_rate


def whole_process(model: str, hw: str, devices: int, batch: int) -> None:
    """Wall time of the CLI command, start-up and printing included."""
    exe = Path(sys.executable).with_name("dlperf")
    cmd = [str(exe), "search", model, hw, "--gpus", str(devices), "--global-batch", str(batch)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    print(f"whole process `{' '.join(cmd[1:])}`: {time.perf_counter() - start:.2f} s")


def grid_rate(model: object, hw: object, loop_rate: float) -> None:
    """The vectorised path: one plan structure (t8 p16, micro-batch 1, interleaved, full recompute), a million
    (global batch, virtual stages) points evaluated as numpy arrays by StepModel.grid."""
    import numpy as np

    from dlperf.engine.step import StepModel
    from dlperf.plan import Plan

    engine = StepModel(model, hw)
    base = Plan(devices=1024, tp=8, pp=16, global_batch=1536, micro_batch=1, recompute="full",
                schedule="interleaved", virtual_stages=2)
    engine.grid(base, np.array([1536]))  # warm the per-structure cache, as search does once per structure
    n = 1_000_000
    batches = 128 * np.arange(1, n + 1) % (128 * 4096) + 128
    vs = np.resize(np.array([1, 2, 3, 6]), n)
    start = time.perf_counter()
    out = engine.grid(base, batches, vs)
    grid_s = time.perf_counter() - start
    valid = int(np.count_nonzero(~np.isnan(out["step_time_s"])))
    print(f"vectorised grid: {n:,} plans ({valid:,} valid) in {grid_s:.3f} s -> {n / grid_s:,.0f} plans/s "
          f"({n / grid_s / loop_rate:,.0f}x the predict loop)")


if __name__ == "__main__":
    main()
