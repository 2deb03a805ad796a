"""Host time per kernel launch on real GPU hosts, read from published PyTorch (Kineto) traces of eager training.

While a pass is host-bound the CPU issues one kernel after another, so the interval between consecutive
cudaLaunchKernel calls of one thread is the host time per kernel (Python, dispatcher, autograd, CUDA allocator,
the launch call). This script splits those intervals by pass: a launch inside an autograd
`evaluate_function` belongs to backward, any other to forward (the optimizer's few launches are among them).
Intervals of 1 ms or more are syncs or data loading, not dispatch, and are left out.

The traces are test data of facebookresearch/HolisticTraceAnalysis (tests/data/, @f4d0062c), recorded on V100 and
A100 hosts; `fetch` the repository and pass the .json.gz files:

    .venv/bin/python benchmarks/trace_launch_gaps.py path/to/*.json.gz

A profiled run pays the profiler's own cost per operator, so the absolute intervals are upper bounds; their
backward/forward ratio is what spec/hardware.py uses (DEFAULT_DISPATCH).
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import statistics
import sys
from collections import defaultdict
from typing import Any

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")
MAX_GAP_US = 1000.0


def backward_spans(events: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float]]]:
    """Per thread, the (start, end) of every autograd node evaluation, sorted."""
    spans: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and "dur" in e and "autograd::engine::evaluate_function" in e["name"]:
            spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    return {tid: sorted(s) for tid, s in spans.items()}


def launch_intervals(events: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Intervals (us) between consecutive launches of one thread, keyed by the pass of the later launch."""
    launches: dict[Any, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cuda_runtime" and e.get("name") in LAUNCHES:
            launches[e["tid"]].append(e["ts"])
    spans = backward_spans(events)
    out: dict[str, list[float]] = {"forward": [], "backward": []}
    for tid, times in launches.items():
        times.sort()
        tid_spans = spans.get(tid, [])
        starts = [s for s, _ in tid_spans]
        for before, at in zip(times, times[1:], strict=False):
            if at - before >= MAX_GAP_US:
                continue
            i = bisect.bisect_right(starts, at) - 1
            inside = i >= 0 and tid_spans[i][0] <= at <= tid_spans[i][1]
            out["backward" if inside else "forward"].append(at - before)
    return out


def main(paths: list[str]) -> None:
    ratios, seen = [], set()
    for path in paths:
        with gzip.open(path) as f:
            raw = f.read()
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:  # the repository keeps some traces under two names
            print(f"{path.rsplit('/', 1)[-1][:48]:48s} a copy of a trace above: skipped")
            continue
        seen.add(digest)
        trace = json.loads(raw)
        gpu = (trace.get("deviceProperties") or [{}])[0].get("name", "?")
        gaps = launch_intervals(trace.get("traceEvents", []) if isinstance(trace, dict) else [])
        if not gaps["forward"] or not gaps["backward"]:
            print(f"{path.rsplit('/', 1)[-1][:48]:48s} {gpu:24s} no training step (a pass has no launches): skipped")
            continue
        fwd, bwd = (statistics.median(gaps[k]) for k in ("forward", "backward"))
        ratios.append(bwd / fwd)
        print(f"{path.rsplit('/', 1)[-1][:48]:48s} {gpu:24s} forward {fwd:5.1f} us (n={len(gaps['forward'])}), "
              f"backward {bwd:5.1f} us (n={len(gaps['backward'])}), backward/forward {bwd / fwd:.2f}")
    print(f"median backward/forward over {len(ratios)} distinct traces: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
