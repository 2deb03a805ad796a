"""Fit Hockney curves to the public per-shape GEMM and convolution timings in dlperf/data/kernels/.

For each (device, dtype, kernel class) the points are (work, seconds) and the curve is Hockney's line under a
roofline, t = t0 + max(work / r_inf, bytes / (memory_bandwidth x 0.9)) (Hockney & Jesshope 1988, section
1.3.3; the max is the roofline dlperf's engine applies, so bandwidth-bound GEMV-like shapes do not pull r_inf
down), fitted by least squares on log time, i.e. on relative error, with dlperf.calibrate.fit's golden-section
search (fit_roofline). Printed per curve: peak = r_inf / the datasheet dense peak of that dtype (from
hardware/*.yaml), startup = t0, the number of points and the median and maximum |relative error| of the curve
on its own points, for three choices of work:

- plain: FLOPs.
- best-tile: the work the GPU schedules under tile and wave quantization (NVIDIA, "Matrix Multiplication
  Background User's Guide", DU-09799-001, "Tile Quantization" and "Wave Quantization"): the output is cut into
  tm x tn tiles, one thread block each, run in waves of one block per SM, a partial wave costing a full one:
  ceil(tiles / SMs) * SMs * 2 * tm * tn * K with tiles = batch * ceil(M/tm) * ceil(N/tn); each shape takes the
  guide's tile with the least such work (no tile assumed slower: a parameter-free lower bound).
- engine: FLOPs x dlperf.engine.device.wave_quantization with the hardware files' 256x128 tile and split-K,
  i.e. what the engine charges.

A convolution is costed as its implicit GEMM (Chetlur et al. 2014, cuDNN, section 3): forward M = N*P*Q,
N = K, K = C*R*S; backward-data M = N*H*W, N = C, K = K*R*S; backward-filter M = K, N = C*R*S, K = N*P*Q.

    python benchmarks/fit_kernel_curves.py            # table of all curves
    python benchmarks/fit_kernel_curves.py --yaml     # the efficiency snippets per device
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlperf.calibrate.fit import golden_min
from dlperf.engine.device import wave_quantization
from dlperf.spec.hardware import Efficiency, load_hardware

DATA = Path(__file__).resolve().parents[1] / "dlperf" / "data" / "kernels"

# SM counts: V100 80 (Volta whitepaper), A100 108 (Ampere whitepaper / DU-09799-001), H100 SXM and H200 132
# (Hopper whitepaper; ml-engineering training/performance/README.md "132 on H100/H200").
# Titan Xp 30 (GP102 fully enabled: 3840 CUDA cores / 128 per Pascal SM, like the Tesla P40).
# B200 148: XLA's own device description of the GPU its sm_100_B200 table names (openxla/xla
# xla/service/gpu/gpu_device_info_for_tests.cc @ad6eaee1, TestGpuDeviceInfo::B200SXMDeviceInfo: name "NVIDIA B200",
# core_count 148); Chips and Cheese, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling" (2025), on a Verda 8x B200
# instance: "B200 enables 74 SMs per die, giving 148 SMs across the GPU".
SMS = {"V100": 80, "A100": 108, "H100": 132, "H200": 132, "TitanXp": 30, "B200": 148}


@dataclass(frozen=True)
class Curve:
    """One curve: the files it is fitted on and what it is."""

    device: str       # GPU family (SM count key)
    hardware: str     # dlperf hardware file whose datasheet peak divides r_inf
    dtype: str        # dlperf dtype name in that file's peak_flops
    kind: str         # "matmul" or "conv"
    files: tuple[str, ...]
    bandwidth: float | None = None  # DRAM bytes/s of the measured part when it is not the hardware file's
    peak: float | None = None  # datasheet FLOP/s of the measured part when it is not the hardware file's

    @property
    def name(self) -> str:
        src = self.files[0].split("-")[0]
        return f"{self.device} {self.dtype} {self.kind} ({src})"


# xla-h100-fp8.csv is recorded but not fitted: its best shapes read 2593 TFLOP/s, 1.31x H100's dense FP8
# peak of 1979, so its times cannot be full FP8 GEMMs as counted (2*b*m*n*k); Azure's cuBLASLt FP8 is used.
CURVES = (
    Curve("V100", "dgx1-v100", "fp16", "matmul", ("deepbench-v100-fp16-gemm.csv",)),
    Curve("V100", "dgx1-v100", "fp32", "matmul", ("deepbench-v100-fp32-gemm.csv",)),
    Curve("V100", "dgx1-v100", "fp16", "conv", ("deepbench-v100-fp16-conv.csv",)),
    Curve("V100", "dgx1-v100", "fp32", "conv", ("deepbench-v100-fp32-conv.csv",)),
    Curve("A100", "dgx-a100", "fp16", "matmul", ("azure-a100-fp16.csv",)),
    # A100 80GB PCIe stands in for the SXM4 part (same 108 SMs and 19.5 TFLOP/s FP32); its own 1935 GB/s
    # (A100 datasheet, 80GB PCIe column) sets the roofline.
    Curve("A100", "dgx-a100", "fp32", "matmul", ("neusight-a100pcie-fp32.csv",), bandwidth=1935e9),
    Curve("H100", "dgx-h100", "bf16", "matmul", ("xla-h100-bf16.csv",)),
    Curve("H100", "dgx-h100", "tf32", "matmul", ("xla-h100-tf32.csv",)),
    Curve("H100", "dgx-h100", "fp32", "matmul", ("neusight-h100-fp32.csv",)),
    Curve("H100", "dgx-h100", "fp8", "matmul", ("azure-h100-fp8.csv",)),
    Curve("H200", "hgx-h200", "fp8", "matmul", ("azure-h200-fp8.csv",)),
    # XLA's B200 table (sm_100_B200): unlike H100's its FP8 reads a plausible 0.729 of the dense FP8 peak at best,
    # and 1.89-2.16x its own BF16 rate on the shapes of >= 2^36 multiply-adds (tensor cores: 2x).
    Curve("B200", "dgx-b200", "bf16", "matmul", ("xla-b200-bf16.csv",)),
    Curve("B200", "dgx-b200", "tf32", "matmul", ("xla-b200-tf32.csv",)),
    Curve("B200", "dgx-b200", "fp8", "matmul", ("xla-b200-fp8.csv",)),
    # Titan Xp stands in for the Tesla P40: both GP102 with 30 SMs / 3840 CUDA cores (NVIDIA TITAN Xp product
    # page: 3840 cores, 1582 MHz boost, 11.4 Gbps GDDR5X on 384 bits = 547.7 GB/s; P40 datasheet: 3840 cores,
    # 346 GB/s). r_inf is taken as a fraction of the Titan Xp's own 3840 x 2 x 1582 MHz = 12.15 TFLOP/s, so on
    # the P40 it scales with the P40's boost clock (1531 MHz, 11.76 TFLOP/s, datasheet "12 TeraFLOPS").
    Curve("TitanXp", "p40-pcie", "fp32", "conv", ("deepbench-titanxp-fp32-conv.csv",), bandwidth=547.7e9,
          peak=3840 * 2 * 1582e6),
)


@dataclass(frozen=True)
class Point:
    """One timed kernel: its implicit-GEMM shape (batch, m, n, k) and seconds."""

    batch: int
    m: int
    n: int
    k: int
    seconds: float
    m_out: int = 0  # output rows that get tiled when they differ from m (backward-data of a strided conv)
    io: tuple[int, int] = (0, 0)  # (input, output) elements moved when not the GEMM's (a conv's tensors)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """(the '#' header lines, the rows as dicts)."""
    lines = path.read_text().splitlines()
    header = [line[1:].strip() for line in lines if line.startswith("#")]
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    return header, rows


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None  # DeepBench marks untimed passes 'N/A*'
    return value if value > 0 and math.isfinite(value) else None


def gemm_points(rows: list[dict[str, str]]) -> list[Point]:
    """GEMM rows with either time_ms (DeepBench) or tflops (XLA, Azure; time = 2*b*m*n*k / rate)."""
    out = []
    for r in rows:
        b, m, n, k = int(r.get("batch") or 1), int(r["m"]), int(r["n"]), int(r["k"])
        if "time_ms" in r:
            t = _number(r["time_ms"])
            seconds = t * 1e-3 if t else None
        else:
            rate = _number(r["tflops"])
            seconds = 2.0 * b * m * n * k / (rate * 1e12) if rate else None
        if seconds:
            out.append(Point(b, m, n, k, seconds))
    return out


def conv_points(rows: list[dict[str, str]]) -> list[Point]:
    """Forward, backward-data and backward-filter of every DeepBench convolution row, as implicit GEMMs.

    Every pass does the convolution's 2*N*K*P*Q*C*R*S FLOPs (as DeepBench counts them); backward-data writes
    N*H*W rows (more than N*P*Q when strided), which only matters for the quantized variant's tiles."""
    out = []
    for r in rows:
        n, c, k, s, rr = (int(r[x]) for x in ("n", "c", "k", "s", "r"))
        # the Titan Xp sheet prints some output sizes as halves (78.5): DeepBench's own FLOP count uses them
        npq, nhw = round(n * float(r["p"]) * float(r["q"])), n * int(r["w"]) * int(r["h"])
        x, w, y = nhw * c, k * c * rr * s, npq * k  # input, filter and output elements
        passes = (("fwd_ms", npq, k, c * rr * s, npq, (x + w, y)),
                  ("bwd_data_ms", npq, c, k * rr * s, nhw, (y + w, x)),
                  ("bwd_filter_ms", k, c * rr * s, npq, k, (x + y, w)))
        for col, gm, gn, gk, rows_out, io in passes:
            t = _number(r[col])
            if t:
                out.append(Point(1, gm, gn, gk, t * 1e-3, rows_out, io))
    return out


def load(curve: Curve) -> list[Point]:
    points: list[Point] = []
    for name in curve.files:
        _, rows = read_csv(DATA / name)
        points += conv_points(rows) if curve.kind == "conv" else gemm_points(rows)
    return points


# Thread-block tiles cuBLAS chooses among (DU-09799-001, "Tile Quantization": 256x128 and 128x256 the most
# efficient, then 128x128, 256x64, 64x256, 128x64, 64x128, 64x64).
TILES = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64))
# The engine's own rule (hardware/*.yaml matmul `tile`, Efficiency.tile_overhead_k default), scored as a third model.
ENGINE_TILE = (256, 128)
ENGINE_TILE_OVERHEAD_K = Efficiency(1.0).tile_overhead_k  # the engine default (spec/hardware.py)
# Bytes per element of (inputs, output): fp8 GEMMs here write bf16 (XLA's f8e4m3fn x f8e4m3fn -> bf16);
# XLA's f32 table ("tf32") moves f32.
ELEMENT_BYTES = {"fp32": (4, 4), "tf32": (4, 4), "fp16": (2, 2), "bf16": (2, 2), "fp8": (1, 2)}


def scheduled_flops(p: Point, sms: int, tile: tuple[int, int]) -> float:
    """Work the GPU schedules for one tile shape under tile and wave quantization (module doc)."""
    tm, tn = tile
    tiles = p.batch * math.ceil((p.m_out or p.m) / tm) * math.ceil(p.n / tn)
    return math.ceil(tiles / sms) * sms * 2.0 * tm * tn * p.k


def quantized_flops(p: Point, sms: int) -> float:
    """Least scheduled work over the guide's tiles (the first, i.e. largest, wins ties), in FLOPs.

    No tile is assumed slower than another, so this is the smallest quantization loss cuBLAS could reach:
    a parameter-free lower bound, not its heuristic."""
    return min(scheduled_flops(p, sms, t) for t in TILES)


def gemm_bytes(p: Point, dtype: str) -> float:
    """Least DRAM traffic: read both operands and write the result once."""
    inp, out = ELEMENT_BYTES[dtype]
    if p.io != (0, 0):
        return p.io[0] * inp + p.io[1] * out
    return p.batch * ((p.m * p.k + p.k * p.n) * inp + (p.m_out or p.m) * p.n * out)


# Achieved fraction of datasheet DRAM bandwidth for the roofline term: dlperf's default memory efficiency (0.9,
# STREAM-like copies on V100/A100, Jia et al. 2018/2019; see dlperf/spec/hardware.py), fixed here so that a
# hardware file gaining its own memory curve does not move these compute fits. BabelStream Triad agrees within
# 0.07: A100-80GB 1.70 of 2.039 TB/s = 0.83, H100 2.97 of 3.35 = 0.89, H200 4.15 of 4.8 = 0.86 (azure-*.csv).
MEMORY_EFFICIENCY = 0.9

# Golden-section steps: 0.618^30 ~ 5e-7 of the bracket, i.e. r_inf to ~1e-5 and t0 to ~1e-11 s (fit.py's 64
# steps give 1e-14, far more than three-digit figures need; the test refits ~8000 points three ways).
SEARCH_STEPS = 30


@dataclass(frozen=True)
class Fit:
    """t = t0 + max(work / rate, memory time), with its error on the fitted points."""

    t0: float
    rate: float
    median_rel: float
    max_rel: float
    points: int
    memory_bound: int  # points where the memory time wins under the fit
    best_rate: float   # the highest measured work / time among the points


def _predict(work: np.ndarray, mem_s: np.ndarray, t0: float, x: float) -> np.ndarray:
    return t0 + np.maximum(work * x, mem_s)


def fit_roofline(work: np.ndarray, mem_s: np.ndarray, times: np.ndarray, max_rate: float) -> Fit:
    """Least squares on log time (as dlperf.calibrate.fit.fit_line) of t0 + max(work * x, mem_s).

    Profile search like fit_line's: for each t0 in [0, min t] the best log x by golden section. With
    mem_s = 0 this is exactly Hockney's line (fit_line); the max() adds the roofline the engine applies
    (dlperf/engine/device.py: max(FLOPs / (peak eff), bytes / (bandwidth eff))), so GEMV-like GEMMs that
    are bandwidth-bound do not drag r_inf down. r_inf is capped at `max_rate` (the datasheet peak): with a
    roofline a fit could otherwise call every point memory-bound and send r_inf to infinity."""
    log_t = np.log(times)
    per_unit = times / work
    lo, hi = -math.log(max_rate), max(-math.log(max_rate), math.log(per_unit.max())) + 2.0

    def cost(t0: float, u: float) -> float:
        return float(((np.log(_predict(work, mem_s, t0, math.exp(u))) - log_t) ** 2).sum())

    def best_u(t0: float) -> float:
        return golden_min(lambda u: cost(t0, u), lo, hi, SEARCH_STEPS)

    t0 = golden_min(lambda c: cost(c, best_u(c)), 0.0, float(times.min()), SEARCH_STEPS)
    x = math.exp(best_u(t0))
    rel = np.abs(_predict(work, mem_s, t0, x) - times) / times
    return Fit(t0, 1.0 / x, float(np.median(rel)), float(rel.max()), len(times),
               int((mem_s > work * x).sum()), float((work / times).max()))


@dataclass(frozen=True)
class Result:
    curve: Curve
    peak_flops: float   # datasheet dense FLOP/s of the dtype
    plain: Fit          # work = FLOPs
    quantized: Fit      # work = tile- and wave-quantized FLOPs, best tile of the guide's list
    engine: Fit         # work = FLOPs x dlperf.engine.device.wave_quantization (256x128, split-K, tile overhead)

    def efficiency(self, fit: Fit) -> float:
        return fit.rate / self.peak_flops


def fit_curve(curve: Curve) -> Result:
    points = load(curve)
    device = load_hardware(curve.hardware).device
    bandwidth = (curve.bandwidth or device.memory_bandwidth) * MEMORY_EFFICIENCY
    times = np.array([p.seconds for p in points])
    flops = np.array([p.flops for p in points])
    mem_s = np.array([gemm_bytes(p, curve.dtype) for p in points]) / bandwidth
    qflops = np.array([quantized_flops(p, SMS[curve.device]) for p in points])
    eflops = flops * np.array([wave_quantization(p.batch, p.m_out or p.m, p.n, p.k, SMS[curve.device],
                                                 ENGINE_TILE, ENGINE_TILE_OVERHEAD_K) for p in points])
    peak = curve.peak or device.peak_flops[curve.dtype]
    return Result(curve, peak, *(fit_roofline(w, mem_s, times, peak) for w in (flops, qflops, eflops)))


def table(results: list[Result]) -> str:
    head = (f"{'curve':32} {'pts':>4} {'mem':>4} {'best':>5} | {'peak':>5} {'t0 us':>6} {'med':>6} {'max':>6} | "
            f"{'peak':>5} {'med':>6} {'max':>6} | {'peak':>5} {'t0 us':>6} {'med':>6} {'max':>6}")
    lines = ["pts: points, mem: memory-bound under the plain fit, best: best measured FLOP/s / peak",
             f"{'':49}| plain Hockney + roofline    | best-tile quant.   | engine quant. (256x128, split-K)",
             head, "-" * len(head)]
    for r in results:
        p, q, e = r.plain, r.quantized, r.engine
        lines.append(
            f"{r.curve.name:32} {p.points:4d} {p.memory_bound:4d} {p.best_rate / r.peak_flops:5.3f} | "
            f"{r.efficiency(p):5.3f} {p.t0 * 1e6:6.1f} {p.median_rel:6.3f} {p.max_rel:6.3f} | "
            f"{r.efficiency(q):5.3f} {q.median_rel:6.3f} {q.max_rel:6.3f} | "
            f"{r.efficiency(e):5.3f} {e.t0 * 1e6:6.1f} {e.median_rel:6.3f} {e.max_rel:6.3f}")
    return "\n".join(lines)


SOURCES = {
    "deepbench": "baidu-research/DeepBench results/train/DeepBench_NV_V100.xlsx @30c51150 (V100 DGX-1, "
                 "CUDA 10.1, cuDNN 7.6.2)",
    "deepbench-titanxp": "baidu-research/DeepBench results/train/DeepBench_NV_TitanXp.xlsx @f48528cf (Titan Xp, "
                         "CUDA 8.0, cuDNN 6.0)",
    "azure": "Azure/AI-benchmarking-guide Azure_Results/ @8fd0c6e1 (cuBLASLt)",
    "neusight": "sitar-lab/NeuSight scripts/asplos/data/dataset/test/{linear,bmm}.csv @6945927d (torch 2.1, "
                "CUDA 12.1, TF32 off)",
    "xla": "openxla/xla xla/service/gpu/model/default_matmul_perf_table.txtpb @ad6eaee1 (H100, CUPTI kernel times)",
    "xla-b200": "openxla/xla xla/service/gpu/model/default_matmul_perf_table.txtpb @ad6eaee1 (B200, device key "
                "sm_100_B200, CUPTI kernel times)",
}


def source_of(file: str) -> str:
    """The SOURCES entry of a CSV: the longest key its name starts with."""
    return SOURCES[max((k for k in SOURCES if file.startswith(k)), key=len)]


# Which fitted curve each hardware file gets: (kind, dtype or None for the default) -> curve name, note.
ASSIGN = {
    "dgx1-v100 / dgx2-v100 (V100-SXM2)": {
        ("matmul", None): ("V100 fp16 matmul (deepbench)", "; t0 includes back-to-back launch gaps"),
        ("matmul", "fp32"): ("V100 fp32 matmul (deepbench)", "; t0 includes back-to-back launch gaps"),
        ("conv", None): ("V100 fp16 conv (deepbench)", "; batch 4-32 layers, pessimistic for large batches"),
        ("conv", "fp32"): ("V100 fp32 conv (deepbench)", "; batch 4-32 layers"),
    },
    "dgx-a100 (A100-SXM4-80GB)": {
        ("matmul", None): ("A100 fp16 matmul (azure)", "; FP16 (BF16 runs on the same tensor cores at the same "
                           "peak); only 8 shapes"),
        ("matmul", "fp32"): ("A100 fp32 matmul (neusight)", "; measured on an A100 80GB PCIe; t0 includes eager "
                             "PyTorch dispatch and launch"),
    },
    "dgx-h100 (H100-SXM)": {
        ("matmul", None): ("H100 bf16 matmul (xla)", "; t0 excludes the launch"),
        ("matmul", "tf32"): ("H100 tf32 matmul (xla)", "; XLA's f32 dot at default precision (TF32)"),
        ("matmul", "fp32"): ("H100 fp32 matmul (neusight)", "; torch.nn.Linear and torch.bmm; t0 includes eager "
                             "PyTorch dispatch and launch"),
        ("matmul", "fp8"): ("H100 fp8 matmul (azure)", "; 9 shapes, CUDA 12.6"),
    },
    "hgx-h200": {
        ("matmul", None): ("H100 bf16 matmul (xla)", "; the H100 curve: same SMs and clocks "
                           "(ml-engineering MAMF table: 'H200 is the same')"),
        ("matmul", "fp8"): ("H200 fp8 matmul (azure)", "; 9 shapes, CUDA 12.6"),
        ("matmul", "fp32"): ("H100 fp32 matmul (neusight)", "; the H100 curve (same SMs and clocks); t0 includes "
                             "eager PyTorch dispatch and launch"),
    },
    "dgx-b200 (B200-SXM)": {
        ("matmul", None): ("B200 bf16 matmul (xla)", "; t0 excludes the launch"),
        ("matmul", "tf32"): ("B200 tf32 matmul (xla)", "; XLA's f32 dot at default precision (TF32)"),
        ("matmul", "fp8"): ("B200 fp8 matmul (xla)", "; e4m3 x e4m3 -> bf16; t0 excludes the launch"),
    },
    "p40-pcie (Tesla P40, GP102)": {
        ("conv", None): ("TitanXp fp32 conv (deepbench)", "; Titan Xp: GP102 with the P40's 30 SMs, r_inf as a "
                         "fraction of its own 12.15 TFLOP/s; batch 4-32 layers, per direct FLOP of cuDNN's chosen "
                         "algorithm (implicit GEMM, Winograd, FFT)"),
    },
}


# Per-dtype curves that run on tensor cores, whose GEMMs tile as the 16-bit ones do (NVIDIA DU-09799-001): they
# carry the engine's tile and the fit under its quantization; fp32 on CUDA cores (SIMT tiles are at most 128x128,
# the NeuSight kernel names say) and convolutions keep the plain fit and no tile.
TENSOR_CORE_DTYPES = ("tf32", "fp8")
TILE_YAML = f"[{ENGINE_TILE[0]}, {ENGINE_TILE[1]}]"  # the engine's tile as a hardware file writes it


def _entry(r: Result, note: str, quantized: bool) -> tuple[str, str, str]:
    """(peak, startup, source) of one curve. A tensor-core curve (the class's default matmul curve, and the tf32
    and fp8 ones) is the fit under the engine's own quantization, because the hardware file's `tile` makes the
    engine apply it on top (a plain fit would charge the quantization loss twice, and fits these tables worse);
    fp32 (CUDA cores) and conv curves have no tile, so they take the plain fit."""
    p, where = (r.engine if quantized else r.plain), source_of(r.curve.files[0])
    how = "Hockney+roofline fit under the engine's 256x128/split-K quantization" if quantized else \
        "Hockney+roofline fit"
    src = (f"{r.curve.name}: {how} of {p.points} kernel timings, {where}"
           f"; r_inf {p.rate / 1e12:.1f} of {r.peak_flops / 1e12:.4g} TFLOP/s; median |rel err| {p.median_rel:.3f}, "
           f"max {p.max_rel:.3f}{note} (benchmarks/fit_kernel_curves.py)")
    return f"{r.efficiency(p):.3f}", f"{p.t0 * 1e6:.1f} us", src


def snippets(results: list[Result]) -> str:
    by_name = {r.curve.name: r for r in results}
    out = []
    for hw, assign in ASSIGN.items():
        lines = [f"# {hw}", "efficiency:"]
        for kind in ("matmul", "conv"):
            if (kind, None) not in assign:
                continue
            name, note = assign[(kind, None)]
            peak, startup, src = _entry(by_name[name], note, kind == "matmul")
            tile = [f"    tile: {TILE_YAML}"] if kind == "matmul" else []
            lines += [f"  {kind}:", *tile, f"    peak: {peak}", f"    startup: {startup}", f'    source: "{src}"']
            dtypes = [(d, v) for (k, d), v in assign.items() if k == kind and d]
            if dtypes:
                lines.append("    dtypes:")
            for dtype, (name, note) in dtypes:
                tiled = kind == "matmul" and dtype in TENSOR_CORE_DTYPES
                peak, startup, src = _entry(by_name[name], note, tiled)
                tile = f"tile: {TILE_YAML}, " if tiled else ""
                lines.append(f'      {dtype}: {{{tile}peak: {peak}, startup: {startup}, source: "{src}"}}')
        out.append("\n".join(lines))
    return "\n\n".join(out)


def engine_check(results: list[Result]) -> str:
    """Each matmul curve's points timed by the engine itself (dlperf.engine.device.phase_time: its roofline, its
    quantization, its launch latency) on the hardware file with the snippet in place; signed error > 0 = slower
    than measured. Shows what the snippets do once merged, including the launch the engine adds on top."""
    from dlperf.builtins import data_dir
    from dlperf.engine.device import phase_time
    from dlperf.spec.hardware import hardware_from_dict
    from dlperf.spec.yamlio import load_yaml_file, load_yaml_text

    texts = {c.split("\n", 1)[0].lstrip("# ").split()[0]: c.split("\n", 1)[1] for c in snippets(results).split("\n\n")}
    lines = [f"{'curve':32} {'median |rel|':>12} {'median signed':>13}"]
    for r in results:
        c = r.curve
        if c.kind != "matmul":
            continue
        data = load_yaml_file(data_dir("hardware") / f"{c.hardware}.yaml")
        data["device"]["efficiency"] = load_yaml_text(texts[c.hardware], "snippet")["efficiency"]
        device = hardware_from_dict(data, "snippet").device
        eff = device.eff("matmul", c.dtype)
        rel = []
        for p in load(c):
            q = (wave_quantization(p.batch, p.m, p.n, p.k, device.sms, eff.tile, eff.tile_overhead_k)
                 if eff.tile else 1.0)
            t = phase_time(p.flops, gemm_bytes(p, c.dtype), 1, "matmul", device, c.dtype, q)
            rel.append((t - p.seconds) / p.seconds)
        err = np.array(rel)
        lines.append(f"{c.name:32} {np.median(np.abs(err)):12.3f} {np.median(err):+13.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yaml", action="store_true", help="print the hardware-file snippets instead")
    parser.add_argument("--engine", action="store_true", help="time the points with the engine and the snippets")
    args = parser.parse_args()
    results = [fit_curve(c) for c in CURVES]
    print(snippets(results) if args.yaml else engine_check(results) if args.engine else table(results))


if __name__ == "__main__":
    main()
