"""Search speed: `dlperf search gpt3-175b dgx-a100 --gpus 1024 --global-batch 1536`, measured honestly.

Prints plans/s of the memoized search path, the plans/s of calling dlperf.engine.predict one plan at a time on
a sample of the same plans (same process), their ratio, and the whole-process time of the CLI command.

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

    from dlperf.engine import predict
    from dlperf.search import search
    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model

    model, hw = load_model("gpt3-175b"), load_hardware("dgx-a100")
    start = time.perf_counter()
    result = search(model, hw, 1024, 1536)
    fast_s = time.perf_counter() - start
    fast_rate = result.considered / fast_s
    print(f"search path: {result.considered} plans ({result.feasible} fit) in {fast_s:.2f} s "
          f"-> {fast_rate:,.0f} plans/s")

    plans = [ev.plan for ev in result.ranked]
    sample = random.Random(0).sample(plans, min(args.sample, len(plans)))
    start = time.perf_counter()
    for plan in sample:
        predict(model, hw, plan)
    loop_s = time.perf_counter() - start
    loop_rate = len(sample) / loop_s
    print(f"predict loop: {len(sample)} plans in {loop_s:.2f} s -> {loop_rate:,.0f} plans/s")
    print(f"speed-up of the search path over the predict loop: {fast_rate / loop_rate:.1f}x")

    exe = Path(sys.executable).with_name("dlperf")
    cmd = [str(exe), "search", "gpt3-175b", "dgx-a100", "--gpus", "1024", "--global-batch", "1536"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    print(f"whole process `{' '.join(cmd[1:])}`: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
