"""Are vTrain's single-node "ground truth" iteration times measurements, or its simulator's arithmetic?

dlperf scores the 1,440 rows of VIA-Research/vTrain data/ground_truth_single.csv @f8dda847 as measured training
runs (source vtrain-single-node, dlperf/data/validation/vtrain2024.yaml). Three checks of those rows:

1. Bilinearity. Within one plan (hidden, tp, dp, pp, micro-batch), a real iteration time jitters from run to run;
   every plan with dp = 1 (64 plans, 640 rows, all 80 tp 8 rows among them) fits time = A + B x layers + n x
   (C + D x layers), n the micro-batches, to the nanosecond over its 4 layer counts x 4 batch sizes. Plans with
   dp > 1 deviate only by check 2's term, which is not linear in layers (rounded to whole MiB).
2. The data-parallel term. vTrain's simulator (src/predictor.py @f8dda847) prices a data-parallel gradient
   all-reduce as compute_comm_time(size, dp): the all-reduce table trace/a100/AR_GPU{dp}_1M_1024M_LUT looked up at
   round(size / MiB), or above 1 GiB the size over the 1 GiB row's bus bandwidth, where size is the parameter bytes
   of a pipeline stage by vTrain's own count (vTrain.model_params: 2 bytes each, vocab // tp rows of embedding and
   output layer, learned position embedding of max_length rows, layer norms and biases). A row with dp > 1 minus
   its dp = 1 twin (same model, tp, pp, micro-batch and micro-batches per rank) equals that number to the
   nanosecond for every such pair: the rows carry the simulator's table lookup, MiB rounding included.
3. The pipeline dimension. With dp = 1, D (the seconds per layer per micro-batch) of a plan with pp stages is
   D of its pp = 1 twin over pp, to 9 digits, in all 18 plans that have a twin with a determined fit (tp 2 and 4
   at pp 2, tp 2 at pp 4; micro-batch 1-4): one per-layer figure per (hidden, tp, micro-batch) reused by every
   pipeline split, where measured runs would jitter from run to run and differ between splits.

So at least the data-parallel dimension of that file is computed by vTrain's model, and the exact bilinearity says
the rest is composed from per-layer components too: its rows are not independent measured iterations.

    .venv/bin/python benchmarks/vtrain_ground_truth_check.py VTRAIN_GIT_DIR

VTRAIN_GIT_DIR: a clone of VIA-Research/vTrain (its .git directory, or a bare mirror) at f8dda847.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "dlperf" / "data" / "validation" / "vtrain2024.yaml"
SOURCE = "vtrain-single-node"
MIB = 1024 * 1024
VOCAB = 50257      # vTrainConfig's default (src/config.py), which no validation config overrides
BYTES = 2          # ParamInfo's default element size (src/predictor.py)
EXACT_NS = 2.0     # the CSV prints times to the nanosecond (ms with 6 decimals)

Plan = tuple[int, int, int, int, int, int]  # hidden, tp, dp, pp, micro_batch, seq


def load_rows(path: Path = DATA) -> list[dict[str, int | float]]:
    """The vtrain-single-node table of vtrain2024.yaml as dicts of its columns (ms as a float)."""
    doc = yaml.safe_load(path.read_text())
    for table in doc["tables"]:
        if table["template"]["source"] == SOURCE:
            columns = table["columns"]
            return [{c: float(v) if c == "ms" else v for c, v in zip(columns, row, strict=True)}
                    for row in table["rows"]]
    raise SystemExit(f"{path}: no table with source {SOURCE}")


def bilinear_residuals(rows: list[dict]) -> dict[Plan, float]:
    """Per plan, the largest |ms - fit| of ms = A + B layers + n (C + D layers), least squares (n: micro-batches
    per data-parallel rank)."""
    groups: dict[Plan, list[tuple[int, int, float]]] = defaultdict(list)
    for r in rows:
        plan = (r["hidden"], r["tp"], r["dp"], r["pp"], r["micro_batch"], r["seq"])
        groups[plan].append((r["layers"], r["global_batch"] // (r["dp"] * r["micro_batch"]), r["ms"]))
    out = {}
    for plan, points in groups.items():
        x = np.array([[1.0, layers, n, n * layers] for layers, n, _ in points])
        y = np.array([ms for *_, ms in points])
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        out[plan] = float(np.abs(x @ coef - y).max())
    return out


def per_layer_ratios(rows: list[dict]) -> list[float]:
    """For dp = 1 plans with pp > 1 whose pp = 1 twin exists: pp x D(plan) / D(twin), D the coefficient of
    n x layers in the bilinear fit (only plans whose fit is determined, i.e. with at least 2 layer counts and 2
    batch sizes)."""
    coef: dict[Plan, float] = {}
    groups: dict[Plan, list[tuple[int, int, float]]] = defaultdict(list)
    for r in rows:
        if r["dp"] == 1:
            plan = (r["hidden"], r["tp"], 1, r["pp"], r["micro_batch"], r["seq"])
            groups[plan].append((r["layers"], r["global_batch"] // r["micro_batch"], r["ms"]))
    for plan, points in groups.items():
        x = np.array([[1.0, layers, n, n * layers] for layers, n, _ in points])
        if np.linalg.matrix_rank(x) == 4:
            coef[plan] = float(np.linalg.lstsq(x, np.array([ms for *_, ms in points]), rcond=None)[0][3])
    return [plan[3] * d / coef[(plan[0], plan[1], 1, 1, plan[4], plan[5])] for plan, d in coef.items()
            if plan[3] > 1 and (plan[0], plan[1], 1, 1, plan[4], plan[5]) in coef]


def read_luts(git_dir: str) -> dict[int, dict[int, tuple[int, float]]]:
    """vTrain's A100 all-reduce tables: GPUs -> size in MiB -> (time ns, bus bandwidth GB/s), as
    vTrain.get_allreduce_LUT reads them (out-of-place columns)."""
    luts = {}
    for gpus in range(2, 9):
        text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:trace/a100/AR_GPU{gpus}_1M_1024M_LUT"],
                              capture_output=True, text=True, check=True).stdout
        luts[gpus] = {int(f[0]) // MIB: (int(f[-2]), float(f[-1]))
                      for f in (line.strip().split(",") for line in text.splitlines()[1:] if line.strip())}
    return luts


def comm_time_ns(size: int, gpus: int, luts: dict[int, dict[int, tuple[int, float]]]) -> float:
    """vTrain.compute_comm_time (src/predictor.py @f8dda847) for gpus <= 8."""
    size_mb = round(size / 1024 / 1024)
    if size_mb in luts[gpus]:
        return luts[gpus][size_mb][0]
    return size_mb / (luts[gpus][1024][1] * 1024) * 1e9


def stage_param_bytes(hidden: int, layers: int, tp: int, pp: int, seq: int) -> list[int]:
    """Parameter bytes per pipeline stage by vTrain.model_params and create_layer_graph's balance (the first
    stage holds the embeddings, the last the output layer)."""
    h = hidden
    embed = (VOCAB // tp) * h + seq * h
    layer = 4 * h + 3 * h * (h // tp) + 3 * h // tp + h * (h // tp) + h + h * (4 * h // tp) + 4 * h // tp \
        + 4 * h * (h // tp) + h
    logit = (VOCAB // tp) * h
    per = layers // pp
    if pp == 1:
        return [BYTES * (embed + per * layer + logit)]
    return [BYTES * (embed + per * layer)] + [BYTES * per * layer] * (pp - 2) + [BYTES * (per * layer + logit)]


def dp_matches(rows: list[dict], luts: dict) -> tuple[int, int]:
    """(rows whose time minus their dp = 1 twin's equals vTrain's all-reduce time of a stage's parameters, rows
    with a twin)."""
    index = {(r["hidden"], r["layers"], r["tp"], r["dp"], r["pp"], r["micro_batch"],
              r["global_batch"] // r["dp"]): r["ms"] for r in rows}
    matched = paired = 0
    for r in rows:
        if r["dp"] == 1:
            continue
        twin = index.get((r["hidden"], r["layers"], r["tp"], 1, r["pp"], r["micro_batch"],
                          r["global_batch"] // r["dp"]))
        if twin is None:
            continue
        paired += 1
        diff_ns = (r["ms"] - twin) * 1e6
        sizes = stage_param_bytes(r["hidden"], r["layers"], r["tp"], r["pp"], r["seq"])
        matched += any(abs(diff_ns - comm_time_ns(s, r["dp"], luts)) < EXACT_NS for s in sizes)
    return matched, paired


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[-3].strip())
    rows = load_rows()
    residuals = bilinear_residuals(rows)
    for label, keep in (("dp = 1", lambda dp: dp == 1), ("dp > 1", lambda dp: dp > 1)):
        part = [v for plan, v in residuals.items() if keep(plan[2])]
        exact = sum(v < EXACT_NS / 1e6 for v in part)
        print(f"plans with {label}: {exact} of {len(part)} fit A + B layers + n (C + D layers) to within "
              f"{EXACT_NS:g} ns (worst residual {max(part):.6f} ms)")
    ratios = per_layer_ratios(rows)
    print(f"dp = 1, pp > 1: {len(ratios)} plans, pp x D / D(pp = 1) from {min(ratios):.9f} to {max(ratios):.9f}")
    matched, paired = dp_matches(rows, read_luts(argv[1]))
    print(f"{matched} of {paired} rows with dp > 1: time - time of the dp = 1 twin == vTrain's compute_comm_time "
          f"(stage parameter bytes, dp) within {EXACT_NS:g} ns")


if __name__ == "__main__":
    main(sys.argv)
