"""This tree against a baseline commit, in the same run: `predict` cold start and the GPT-3 175B / 1024-GPU search.

Checks out the baseline (default: the last commit before issue #12's fidelity work) into a temporary git worktree,
then alternates whole-process runs of both trees (`python -m dlperf ...` with PYTHONPATH set to each tree), so
machine load affects both alike; prints the best of N for each and their ratio.

    .venv/bin/python benchmarks/bench_vs_baseline.py [--baseline REF] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "364f36b"  # main before the tile/wave-quantization, host-dispatch and NCCL work
COMMANDS = {
    "predict gpt3-175b (cold start)": ["predict", "gpt3-175b", "dgx-a100", "--gpus", "1024", "--tp", "8", "--pp",
                                       "16", "--global-batch", "1536", "--micro-batch", "1", "--recompute", "full"],
    "search gpt3-175b 1024 GPUs": ["search", "gpt3-175b", "dgx-a100", "--gpus", "1024", "--global-batch", "1536"],
}


def run_once(tree: Path, args: list[str]) -> float:
    # Bytecode is written and reused, as on a user's machine (pip compiles an installed package): with
    # PYTHONDONTWRITEBYTECODE set (some sandboxes set it) every run recompiles every module, and a larger tree
    # reads as slower than it is. The best of the rounds is kept, so the first, compiling, run does not count.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dlperf", *args], cwd=tree, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: a plan that does not fit is reported, not a failure of the tool
        raise SystemExit(f"{tree}: dlperf {' '.join(args)} failed: {done.stderr.decode()[-400:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="git ref to compare against")
    parser.add_argument("--rounds", type=int, default=5, help="alternating runs per tree (best is kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True)
        try:
            for name, command in COMMANDS.items():
                best = {"baseline": float("inf"), "this tree": float("inf")}
                for _ in range(args.rounds):
                    for label, tree in (("baseline", base), ("this tree", ROOT)):
                        best[label] = min(best[label], run_once(tree, command))
                ratio = best["this tree"] / best["baseline"]
                print(f"{name}: baseline {best['baseline']:.2f} s, this tree {best['this tree']:.2f} s, "
                      f"ratio {ratio:.2f}")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)


if __name__ == "__main__":
    main()
