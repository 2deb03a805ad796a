"""Extract public per-shape GEMM/convolution microbenchmarks into dlperf/data/kernels/*.csv.

Run once by hand against local git mirrors of the sources; the CSVs it writes are committed, so nothing at
test or run time needs the mirrors. Every CSV starts with `#` lines naming the repository, path, commit, GPU
and software, then one header row. Numbers are copied as the source prints them (XLA's FLOP/s are divided by
1e12 exactly, as decimal strings, so no digit changes); nothing is rescaled or filtered except where the
header says so.

    python benchmarks/extract_kernel_tables.py --xla /work/.mirror/ROCm+xla/repo \
        --deepbench /work/.mirror/baidu-research+DeepBench/repo \
        --azure /work/.mirror/Azure+AI-benchmarking-guide/repo \
        --mlengineering /work/.mirror/stas00+ml-engineering/repo --neusight /work/.mirror/sitar-lab+NeuSight/repo

Needs `openpyxl` for DeepBench's .xlsx (not a dlperf dependency).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "dlperf" / "data" / "kernels"

# OpenXLA's default GEMM performance table. The commit is upstream openxla/xla's "[NFC] Convert performance
# tables into embedded textproto" (read here from a mirror of ROCm/xla, which carries openxla's history).
XLA_COMMIT = "ad6eaee1b2f13931e3ceb26dc50bf3ac6b425496"
XLA_PATH = "xla/service/gpu/model/default_matmul_perf_table.txtpb"
XLA_DTYPES = {"bf16": "bf16xbf16->bf16", "tf32": "f32xf32->f32", "fp8": "f8e4m3fnxf8e4m3fn->bf16"}


@dataclass(frozen=True)
class XlaDevice:
    """One device key of the XLA table: the file tag, the GPU it names and what its f32 dots ran on."""

    key: str
    tag: str
    title: str
    gpu: str
    tf32: str


XLA_DEVICES = (
    XlaDevice("sm_90", "h100", "H100", "H100 80GB HBM3 (SXM; XLA's hlo_op_profiles_data.h names its sm_90 device so)",
              "f32xf32->f32 runs on TF32 tensor cores under XLA's default precision: 4096^3 reaches 402 TFLOP/s, "
              "6x the 67 TFLOP/s FP32 SIMT peak"),
    # sm_100 keys carry the last word of the CUDA device name (hlo_op_profiles.cc GetDeviceSpecificProfileName;
    # hlo_op_profiles_test.cc: "NVIDIA B200" -> sm_100_B200, "NVIDIA GB200" -> sm_100_GB200). The values are
    # those of 71feeddf7c "[XLA:GPU] Update latency hiding scheduler cost models for B200/H100 FP8 matmul"
    # (2025-10-21; key "sm_100" then, which replaced 1088d5ab75's "Update GEMM cost model for B200"), renamed
    # sm_100_B200 by e97611c4c4 (PR #36518, "distinguish B200 and GB200"); all 1875 numbers checked equal.
    XlaDevice("sm_100_B200", "b200", "B200",
              "NVIDIA B200 (compute capability 10.0, CUDA device name 'NVIDIA B200': XLA's hlo_op_profiles.cc "
              "GetDeviceSpecificProfileName and hlo_op_profiles_test.cc GetProfileSm100; a GB200 would be "
              "sm_100_GB200); values as measured in 71feeddf7c (2025-10-21, key sm_100 then)",
              "f32xf32->f32 runs on TF32 tensor cores under XLA's default precision: 4096^3 reaches 758 TFLOP/s "
              "(870 at batch 4), 9.5x the 80 TFLOP/s FP32 SIMT peak"),
)
DEEPBENCH_COMMIT = "30c51150869ee217f150ef5f31dc69241ed23b49"  # 2019-10-07 V100 refresh (CUDA 10.1)
DEEPBENCH_PATH = "results/train/DeepBench_NV_V100.xlsx"
# Pascal GP102 with all 30 SMs / 3840 CUDA cores enabled, like the Tesla P40 (hardware/p40-pcie.yaml)
DEEPBENCH_XP_COMMIT = "f48528cfdcbfd5793d911a1f44b593bcad095bb7"  # 2018-05-21, CUDA 8.0.88, cuDNN 6.0.21
DEEPBENCH_XP_PATH = "results/train/DeepBench_NV_TitanXp.xlsx"
AZURE_COMMIT = "8fd0c6e1bd0f853ef8f0500a3640a7d80a2a92ef"
MLENG_COMMIT = "744d01e18b79512572f64a6bbd8b5f4a725203a7"
NEUSIGHT_COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"
NEUSIGHT_DIR = "scripts/asplos/data/dataset/test"
# NeuSight device name -> (file tag, what it stands in for in dlperf)
NEUSIGHT_DEVICES = {
    "NVIDIA A100 80GB PCIe": ("a100pcie", "A100 80GB PCIe: 108 SMs, 19.5 TFLOP/s FP32 like the SXM4 part; "
                              "1935 GB/s HBM2e (datasheet) instead of 2039; 300 W instead of 400 W"),
    "NVIDIA H100 80GB HBM3": ("h100", "H100 80GB HBM3 = H100 SXM5 (NeuSight device_configs: 132 SMs, "
                              "66908 GFLOP/s FP32, 3430 GB/s)"),
}


def git_show(repo: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout


def write_csv(name: str, header: list[str], columns: list[str], rows: Iterable[list[object]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / name, "w", newline="") as f:
        for line in header:
            f.write(f"# {line}\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rows)
    print(f"wrote {OUT / name}")


def tera(value: str) -> str:
    """An integer FLOP/s string as TFLOP/s, by moving the decimal point (exact)."""
    digits = value.rjust(13, "0")
    whole, frac = digits[:-12], digits[-12:].rstrip("0")
    return f"{int(whole)}.{frac}" if frac else str(int(whole))


# --- OpenXLA -------------------------------------------------------------------------------------------

def xla_entries(text: str, device_key: str) -> list[dict[str, str]]:
    """The `entries { b m n k flops {...} }` blocks under one device key of a GemmPerfTable textproto."""
    start = text.index(f'key: "{device_key}"')
    nxt = text.find("\nentries {", start)  # the next device's top-level block, if any
    block = text[start: nxt if nxt > 0 else len(text)]
    entries = []
    for chunk in block.split("entries {")[1:]:
        entry = dict(re.findall(r"\b([bmnk]): (\d+)", chunk))
        entry.update(re.findall(r'flops \{ key: "([^"]+)" value: (\d+) \}', chunk))
        entries.append(entry)
    return entries


def xla_header(device: XlaDevice, dtype: str, key: str) -> list[str]:
    """The `#` lines of one xla-<gpu>-<dtype>.csv."""
    return [
        f"OpenXLA default matmul performance table, {device.title} (device key {device.key}), {key}",
        f"source: openxla/xla {XLA_PATH} @ {XLA_COMMIT} (2026-07-10)",
        "generator: xla/tools/matmul_perf_table_gen.cc: median CUPTI kernel time of 5 profiled runs; "
        "flops = 2*b*m*n*k / time",
        f"GPU: {device.gpu}; software: XLA at that commit (cuBLAS / Triton as XLA picks)",
        device.tf32 if dtype == "tf32" else
        "fp8: e4m3fn x e4m3fn -> bf16 (the table also has e4m3fn x e5m2 and e5m2 x e4m3fn, not copied)"
        if dtype == "fp8" else "bf16 x bf16 -> bf16",
        "tflops = the table's `flops` value / 1e12 (decimal point moved, no rounding)",
    ]


def extract_xla(repo: Path) -> None:
    text = git_show(repo, XLA_COMMIT, XLA_PATH).decode()
    for device in XLA_DEVICES:
        entries = xla_entries(text, device.key)
        for dtype, key in XLA_DTYPES.items():
            rows = [[e["b"], e["m"], e["n"], e["k"], tera(e[key])] for e in entries]
            write_csv(f"xla-{device.tag}-{dtype}.csv", xla_header(device, dtype, key),
                      ["batch", "m", "n", "k", "tflops"], rows)


# --- DeepBench -----------------------------------------------------------------------------------------

DEEPBENCH_SHEETS = {"fp32": "Results FP32", "fp16": "Results - FP16 ip, Mixed math"}


def _trim(row: tuple[object, ...]) -> list[object]:
    out = list(row)
    while out and out[-1] is None:
        out.pop()
    return out


def deepbench_sections(ws: object) -> dict[str, list[list[object]]]:
    """Rows of the sheet grouped under the section title in column A ('Dense Matrix Multiplication', ...)."""
    sections: dict[str, list[list[object]]] = {}
    current = ""
    for row in ws.iter_rows(values_only=True):  # type: ignore[attr-defined]
        r = _trim(row)
        if r and isinstance(r[0], str):
            current = r[0].strip()
            sections[current] = []
        elif current and len(r) > 2:
            sections[current].append(r)
    return sections


def _check_tflops(flops: float, time_ms: object, sheet_tflops: object, what: str) -> None:
    """The FLOP count used downstream must reproduce the sheet's own TERAFLOPS column."""
    if isinstance(time_ms, (int, float)) and isinstance(sheet_tflops, (int, float)):
        ours = flops / (time_ms * 1e-3) / 1e12
        if abs(ours / sheet_tflops - 1) > 1e-9:
            raise SystemExit(f"{what}: 2*... FLOPs give {ours} TFLOP/s, the sheet {sheet_tflops}")


def extract_deepbench(repo: Path) -> None:
    import openpyxl  # only needed here

    wb = openpyxl.load_workbook(io.BytesIO(git_show(repo, DEEPBENCH_COMMIT, DEEPBENCH_PATH)), data_only=True)
    specs = {r[0]: r[1] for r in wb["Specs"].iter_rows(values_only=True) if r[0]}
    base = [
        f"source: baidu-research/DeepBench {DEEPBENCH_PATH} @ {DEEPBENCH_COMMIT} (2019-10-07 refresh)",
        f"GPU: {specs.get('GPU Model')} ({specs.get('NVIDIA DGX-1', 'NVIDIA DGX-1') or 'NVIDIA DGX-1'} = V100-SXM2); "
        f"CUDA {specs.get('CUDA Version')}, cuDNN {specs.get('Cudnn Version')}, driver {specs.get('Nvidia Driver')}",
    ]
    for dtype, sheet in DEEPBENCH_SHEETS.items():
        sec = deepbench_sections(wb[sheet])
        what = f"sheet '{sheet}'"
        gemm = [r for r in sec["Dense Matrix Multiplication"] if isinstance(r[2], int)]
        for r in gemm:
            _check_tflops(2 * r[2] * r[3] * r[4], r[8], r[9], f"{sheet} GEMM {r[2:5]}")
        write_csv(f"deepbench-v100-{dtype}-gemm.csv",
                  [f"DeepBench V100 dense GEMM, {what} (cublasGemmEx)", *base,
                   "columns as the sheet: application, M, N, K, A/B transpose, Time (msec); "
                   "FLOPs = 2*M*N*K (checked: / time equals the sheet's TERAFLOPS column to 1e-9)"],
                  ["application", "m", "n", "k", "a_t", "b_t", "time_ms"],
                  [[r[1], r[2], r[3], r[4], r[5], r[6], r[8]] for r in gemm])
        conv = [r for r in sec["Convolution"] if isinstance(r[2], int)]
        for r in conv:
            c, n, k, s_, r_ = r[4:9]
            for t, tf in zip(r[13:16], r[20:23], strict=True):
                _check_tflops(2 * n * k * r[17] * r[18] * c * r_ * s_, t, tf, f"{sheet} conv {r[2:13]}")
        write_csv(f"deepbench-v100-{dtype}-conv.csv",
                  [f"DeepBench V100 convolutions, {what} (cuDNN, algorithm as the sheet's 'Forward Algorithm')",
                   *base,
                   "columns as the sheet: W, H, C, N, K, S (filter width), R (filter height), pad_w, pad_h, "
                   "stride_w, stride_h, output P, Q, Forward / wrt Inputs / wrt Parameters (msec)",
                   "FLOPs per pass = 2*N*K*P*Q*C*R*S (checked: / time equals the sheet's three TERAFLOPS columns "
                   "to 1e-9)"],
                  CONV_COLUMNS, [_conv_row(r) for r in conv])


CONV_COLUMNS = ["application", "w", "h", "c", "n", "k", "s", "r", "pad_w", "pad_h", "stride_w", "stride_h",
                "p", "q", "fwd_ms", "bwd_data_ms", "bwd_filter_ms", "algorithm"]


def _conv_row(r: tuple) -> list:
    """A DeepBench convolution row in CONV_COLUMNS order (the sheets keep P, Q after the three timings)."""
    return [r[1] or "", *r[2:13], r[17], r[18], r[13], r[14], r[15], r[23] if len(r) > 23 else ""]


def extract_deepbench_titanxp(repo: Path) -> None:
    """The Titan Xp FP32 sheet ('FP32'): same column layout as the V100 sheet; convolutions only (the GEMMs
    are not used by any hardware file yet)."""
    import openpyxl  # only needed here

    wb = openpyxl.load_workbook(io.BytesIO(git_show(repo, DEEPBENCH_XP_COMMIT, DEEPBENCH_XP_PATH)), data_only=True)
    specs = {r[0]: r[1] for r in wb["Specs"].iter_rows(values_only=True) if r[0]}
    conv = [r for r in deepbench_sections(wb["FP32"])["Convolution"] if isinstance(r[2], int)]
    for r in conv:
        c, n, k, s_, r_ = r[4:9]
        for t, tf in zip(r[13:16], r[20:23], strict=True):
            _check_tflops(2 * n * k * r[17] * r[18] * c * r_ * s_, t, tf, f"TitanXp conv {r[2:13]}")
    write_csv("deepbench-titanxp-fp32-conv.csv",
              ["DeepBench Titan Xp convolutions, sheet 'FP32' (cuDNN, algorithm as the sheet's 'Forward Algorithm')",
               f"source: baidu-research/DeepBench {DEEPBENCH_XP_PATH} @ {DEEPBENCH_XP_COMMIT} (2018-05-21)",
               f"GPU: {specs.get('GPU Model')} (GP102, 30 SMs, 3840 CUDA cores); CUDA {specs.get('CUDA Version')}, "
               f"cuDNN {specs.get('Cudnn Version')}, driver {specs.get('Nvidia Driver')}",
               "columns as the sheet: W, H, C, N, K, S (filter width), R (filter height), pad_w, pad_h, "
               "stride_w, stride_h, output P, Q, Forward / wrt Inputs / wrt Parameters (msec); the sheet leaves "
               "the application column empty",
               "FLOPs per pass = 2*N*K*P*Q*C*R*S (checked: / time equals the sheet's three TERAFLOPS columns "
               "to 1e-9)"],
              CONV_COLUMNS, [_conv_row(r) for r in conv])


# --- Azure AI-benchmarking-guide ------------------------------------------------------------------------

AZURE = {
    "a100": ("ND_A100_v4_results.md", "fp16", AZURE_COMMIT),
    "h100": ("ND_H100_v5_results.md", "fp8", AZURE_COMMIT),
    "h200": ("ND_H200_v5_results.md", "fp8", AZURE_COMMIT),
    # published after AZURE_COMMIT; it has no HBM bandwidth table
    "gb200": ("ND_GB200_v6_results.md", "fp8", "2a370be6de9586d365feed77e014a73f25198f4d"),
}


def _md_rows(text: str, after: str) -> list[list[str]]:
    """Numeric rows of the first markdown table after the heading `after`."""
    rows, seen = [], False
    for line in text[text.index(after):].splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.strip().startswith("|") and cells and re.fullmatch(r"[\d.]+", cells[-1] or "x"):
            rows.append(cells)
            seen = True
        elif seen and not line.strip():
            break
    return rows


def extract_azure(repo: Path) -> None:
    for gpu, (name, dtype, commit) in AZURE.items():
        path = f"Azure_Results/{name}"
        try:
            text = git_show(repo, commit, path).decode()
        except subprocess.CalledProcessError:  # a mirror older than the file's commit: say so, extract the rest
            print(f"skipped azure-{gpu}-{dtype}.csv: {path} is not at {commit} in {repo} (fetch a newer mirror)")
            continue
        system = dict(re.findall(r"^\|\s*(GPU|CUDA|PyTorch|NVIDIA Driver)\s*\|\s*([^|]+?)\s*\|", text, re.M))
        header = [
            f"Azure AI-benchmarking-guide cuBLASLt GEMM, {dtype.upper()}, random init, 10,000 warm-up iterations",
            f"source: Azure/AI-benchmarking-guide {path} @ {commit}",
            f"GPU: {system.get('GPU')}; CUDA {system.get('CUDA')}, driver {system.get('NVIDIA Driver')}, "
            f"PyTorch {system.get('PyTorch')}",
        ]
        rows = [r[:4] for r in _md_rows(text, "### GEMM CuBLASLt")]
        write_csv(f"azure-{gpu}-{dtype}.csv", header, ["m", "n", "k", "tflops"], rows)
        if "### HBM Bandwidth" not in text:
            continue
        bw = _md_rows(text, "### HBM Bandwidth")
        write_csv(f"azure-{gpu}-babelstream.csv",
                  [f"Azure AI-benchmarking-guide HBM bandwidth (BabelStream kernels), {system.get('GPU')}",
                   f"source: Azure/AI-benchmarking-guide {path} @ {commit}"],
                  ["kernel", "tb_per_s"], [[r[0], r[1]] for r in bw])


# --- ml-engineering MAMF -------------------------------------------------------------------------------

def extract_mamf(repo: Path) -> None:
    path = "compute/accelerator/README.md"
    text = git_show(repo, MLENG_COMMIT, path).decode()
    rows = []
    for dtype, title in (("bf16", "**BF16**:"), ("fp8", "**FP8 (`float8_e4m3fn`)**:")):
        for line in text[text.index(title):].splitlines()[3:]:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not line.startswith("|") or not cells[0]:
                break
            if cells[0].startswith("NVIDIA") and cells[1]:
                rows.append([cells[0], dtype, cells[1], cells[2], cells[4], cells[5]])
    write_csv("mamf-ceilings.csv",
              ["Maximum Achievable Matmul FLOPS (best shape of a brute-force search; an upper bound, "
               "not a typical shape): mean of 100 iterations after 50 warm-up",
               f"source: stas00/ml-engineering {path} @ {MLENG_COMMIT}, section 'Maximum Achievable Matmul "
               "FLOPS comparison table'"],
              ["accelerator", "dtype", "mamf_tflops", "theory_tflops", "best_shape_mxnxk", "torch"], rows)


# --- NeuSight -------------------------------------------------------------------------------------------

def extract_neusight(repo: Path) -> None:
    """FP32 (SIMT: TF32 off) torch.nn.Linear and torch.bmm timings of NeuSight's test set."""
    rows: dict[str, list[list[object]]] = {d: [] for d in NEUSIGHT_DEVICES}
    meta: dict[str, tuple[str, str, str]] = {}
    for op in ("linear", "bmm"):
        path = f"{NEUSIGHT_DIR}/{op}.csv"
        for r in csv.DictReader(io.StringIO(git_show(repo, NEUSIGHT_COMMIT, path).decode())):
            if r["Device"] in rows:
                # NeuSight's (B, M, N, K): input (B, M, N) times (N, K), N contracted -> our m=M, n=K, k=N.
                rows[r["Device"]].append([op, r["B"], r["M"], r["K"], r["N"], r["Latency"],
                                          r["Kernels"].strip(";").replace(";", " + ")])
                meta[r["Device"]] = (r["Torch Version"], r["CUDA Version"], r["CUDNN Version"])
    for device, (tag, note) in NEUSIGHT_DEVICES.items():
        torch_v, cuda_v, cudnn_v = meta[device]
        write_csv(f"neusight-{tag}-fp32.csv",
                  ["NeuSight test set: FP32 torch.nn.Linear (bias=True) and torch.bmm, TF32 off (SIMT sgemm kernels)",
                   f"source: sitar-lab/NeuSight {NEUSIGHT_DIR}/{{linear,bmm}}.csv @ {NEUSIGHT_COMMIT}",
                   f"GPU: {note}; torch {torch_v}, {cuda_v}, cuDNN {cudnn_v}",
                   "timing (neusight/Dataset/collect.py): CUDA events around one call (launch included), mean of the "
                   "5 fastest of 25 calls, in ms",
                   "columns: NeuSight's B, M, N, K with N the contracted dimension, written as batch=B, m=M, n=K, "
                   "k=N; FLOPs = 2*B*M*N*K; time_ms = its Latency; kernels = its Kernels"],
                  ["op", "batch", "m", "n", "k", "time_ms", "kernels"], rows[device])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--xla", type=Path)
    p.add_argument("--deepbench", type=Path)
    p.add_argument("--azure", type=Path)
    p.add_argument("--mlengineering", type=Path)
    p.add_argument("--neusight", type=Path)
    a = p.parse_args()
    if a.xla:
        extract_xla(a.xla)
    if a.deepbench:
        extract_deepbench(a.deepbench)
        extract_deepbench_titanxp(a.deepbench)
    if a.azure:
        extract_azure(a.azure)
    if a.mlengineering:
        extract_mamf(a.mlengineering)
    if a.neusight:
        extract_neusight(a.neusight)


if __name__ == "__main__":
    main()
