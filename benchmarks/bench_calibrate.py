"""Wall time of `dlperf calibrate --quick` and the figures it must get right: the fitted fp32 GEMM rate against the
best measured one (and its R^2), and the fitted memory bandwidth against a plain numpy copy timed here.

    .venv/bin/python benchmarks/bench_calibrate.py [--full] [--backend auto|numpy|torch] [--threads N] [--check N]

--check N then runs `dlperf calibrate --check --quick` N times (torch needed) and prints every row's error and
each run's median: the proof that a calibrated file predicts real training steps. It is a benchmark, not a test,
because it times real steps and a shared 2-core machine makes single runs noisy.

The command runs as a user would run it (a fresh process, JSON output), so the wall time includes start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def numpy_copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 9) -> float:
    """B/s of np.copyto between two arrays of `nbytes` (read + write counted, as STREAM does)."""
    a, b = np.ones(nbytes // 8), np.empty(nbytes // 8)
    np.copyto(b, a)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="time the full sweep instead of --quick")
    parser.add_argument("--backend", default="auto", help="auto | numpy | torch")
    parser.add_argument("--threads", type=int, default=None, help="threads for the calibration")
    parser.add_argument("--check", type=int, default=0, help="also run `calibrate --check --quick` N times")
    args = parser.parse_args()
    if args.check:
        check_runs(args.check)
        return

    before = numpy_copy_bandwidth()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.yaml"
        cmd = [sys.executable, "-m", "dlperf", "calibrate", "--backend", args.backend, "-o", str(out),
               "--format", "json"] + ([] if args.full else ["--quick"])
        cmd += ["--threads", str(args.threads)] if args.threads else []
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"calibrate failed ({proc.returncode}): {proc.stderr.strip()}")
        from dlperf.spec.hardware import load_hardware

        hw = load_hardware(out)
    after = numpy_copy_bandwidth()
    rows = {r["constant"]: r for r in json.loads(proc.stdout)}
    fits = hw.calibration["fits"]
    gemm, copy = fits["matmul fp32"], fits["memory copy"]
    numpy_copy = (before + after) / 2
    bandwidth = hw.device.memory_bandwidth
    print(f"dlperf calibrate {'(full)' if args.full else '--quick'}: {wall:.1f} s wall on {os.cpu_count()} cores, "
          f"backend {hw.calibration['backend']}, {hw.calibration['threads']} threads, "
          f"load average at start {hw.calibration.get('load_average_1min_at_start')}")
    print(f"  fp32 GEMM r_inf {gemm['rate']}, best measured {gemm['best_measured']} "
          f"(fit / best = {hw.device.peak('fp32') / _rate(rows['matmul fp32']['best measured']):.3f}); "
          f"R^2 {gemm['r2']} (log t), {rows['matmul fp32']['R^2 (rate)']:.3f} (rate); "
          f"median |residual| {100 * gemm['median_rel_residual']:.1f}%")
    print(f"  memory bandwidth {bandwidth / 1e9:.2f} GB/s (copy fit R^2 {copy['r2']}); plain numpy copy of 256 MiB "
          f"{numpy_copy / 1e9:.2f} GB/s (before {before / 1e9:.2f}, after {after / 1e9:.2f}); "
          f"ratio {bandwidth / numpy_copy:.3f}")


def check_runs(n: int) -> None:
    """Run the calibration check n times; print each row's error and each run's median |error|."""
    medians = []
    for run in range(n):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "dlperf", "calibrate", "--check", "--quick", "-o", str(Path(tmp) / "c.yaml")]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [line for line in proc.stdout.splitlines()
                 if line.startswith(("mlp ", "cnn ", "transformer ", "--check"))]
        print(f"run {run + 1} (exit {proc.returncode}, load {os.getloadavg()[0]:.2f}):")
        print("\n".join("  " + line for line in lines))
        medians += [float(line.split()[-1].rstrip("%")) for line in lines if line.startswith("--check")]
    if medians:
        print(f"median |error| per run: {', '.join(f'{m:.1f}%' for m in medians)}")


def _rate(text: str) -> float:
    from dlperf.units import parse_quantity

    return parse_quantity(text, "flop_rate")


if __name__ == "__main__":
    main()
