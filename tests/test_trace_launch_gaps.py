"""benchmarks/trace_launch_gaps.py: the host time per launch that spec/hardware.py's BACKWARD_HOST_RATIO is read
from. A synthetic trace with known intervals checks the split by pass, the sync filter and the skipped files."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("trace_launch_gaps", ROOT / "benchmarks" / "trace_launch_gaps.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gaps = _module()


def _launch(ts: float, tid: int = 1) -> dict:
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 3, "tid": tid}


def _trace() -> list[dict]:
    """Forward: launches 20 us apart, then a 5 ms sync; backward (inside autograd node evaluations): 30 us apart."""
    forward = [_launch(20.0 * i) for i in range(5)]                       # 0 .. 80
    backward_start = 80.0 + 5000.0
    backward = [_launch(backward_start + 30.0 * i) for i in range(4)]     # 5080 .. 5170
    node = {"cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "ts": backward_start - 1,
            "dur": 200.0, "tid": 1}
    other_thread = [_launch(7.0 * i, tid=2) for i in range(3)]           # forward intervals of 7 us
    return forward + backward + [node] + other_thread


def test_intervals_split_by_pass_and_drop_syncs():
    out = gaps.launch_intervals(_trace())
    assert sorted(out["forward"]) == [7.0, 7.0, 20.0, 20.0, 20.0, 20.0]  # the 5 ms sync is not dispatch
    assert out["backward"] == [30.0, 30.0, 30.0]


def test_main_reports_the_ratio_and_skips_copies_and_inference(tmp_path, capsys):
    training = {"deviceProperties": [{"name": "Test GPU"}], "traceEvents": _trace()}
    inference = {"traceEvents": [_launch(0.0), _launch(10.0)]}
    paths = []
    for name, body in (("a", training), ("b", training), ("c", inference)):
        path = tmp_path / f"{name}.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump(body, f)
        paths.append(str(path))
    gaps.main(paths)
    printed = capsys.readouterr().out
    assert "a copy of a trace above: skipped" in printed
    assert "no training step" in printed
    # forward median of [7, 7, 20, 20, 20, 20] is 20; backward 30
    assert "backward/forward 1.50" in printed
    assert "median backward/forward over 1 distinct traces: 1.50" in printed
