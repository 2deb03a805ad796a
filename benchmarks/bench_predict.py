"""Whole-process wall time and peak memory of `dlperf predict` / `dlperf show`, and a 1000-layer synthetic model.

Run: python benchmarks/bench_predict.py   (prints figures; a baseline `python -c pass` is timed in the same run)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYNTHETIC = """\
name: synthetic-1000
source: "benchmark: 1000 distinct linear layers (no repeat), so nothing is deduplicated"
input: [64, 256]
layers:
{layers}
  - {{op: cross_entropy}}
"""


# Bytecode caching as a normal install has it (pip compiles .pyc files; some sandboxes set
# PYTHONDONTWRITEBYTECODE, which would make every run recompile the package).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(args: list[str]) -> tuple[float, float]:
    """Median wall seconds of 3 runs (after one warm-up) and peak RSS (MiB) of the child processes."""
    subprocess.run(args, check=True, capture_output=True, env=ENV)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True, env=ENV)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return sorted(times)[1], peak


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.yaml"
        widths = [256 + 8 * (i % 50) for i in range(1001)]
        lines = "\n".join(f"  - {{op: linear, out: {widths[i + 1]}}}" for i in range(1000))
        path.write_text(SYNTHETIC.format(layers=lines))
        cases = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "dlperf show resnet50": [sys.executable, "-m", "dlperf", "show", "resnet50"],
            "dlperf predict gpt3-175b dgx-a100 --global-batch 1": [
                sys.executable, "-m", "dlperf", "predict", "gpt3-175b", "dgx-a100", "--global-batch", "1"],
            "dlperf predict gpt3-175b (1024 GPUs, t8 p16)": [
                sys.executable, "-m", "dlperf", "predict", "gpt3-175b", "dgx-a100", "--gpus", "1024", "--tp", "8",
                "--pp", "16", "--global-batch", "1536", "--micro-batch", "1", "--recompute", "full"],
            "dlperf predict synthetic 1000 layers": [
                sys.executable, "-m", "dlperf", "predict", str(path), "dgx-a100", "--global-batch", "8"],
        }
        base = None
        for name, args in cases.items():
            wall, peak = timed(args)
            base = base or wall
            print(f"{name:55s} {wall * 1000:8.0f} ms  ({wall / base:4.1f}x baseline)  peak RSS so far {peak:6.0f} MiB")


if __name__ == "__main__":
    main()
