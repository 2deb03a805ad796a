"""The built-in hardware zoo (hardware/*.yaml) and the loader's answers to bad hardware files.

Numbers asserted here are the datasheet figures and the published nccl-tests bus bandwidths the YAML files
cite (docs/hardware-sources.md), so a typo in a data file fails a test.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlperf.spec.hardware as hardware_module
from dlperf import builtins
from dlperf.errors import SpecError, UnitError
from dlperf.spec.hardware import load_hardware
from dlperf.spec.yamlio import load_yaml_file

EXPECTED = {"dgx1-v100", "dgx2-v100", "dgx-a100", "a100-40gb", "a100-800g", "dgx-h100", "hgx-h200", "p100-roce",
            "p40-pcie", "cpu-local", "dgx-b200", "gb200-nvl72", "dgx-gb300", "h800", "mi300x", "jean-zay-a100",
            "dgx-b300", "aws-p5"}
GiB = 2.0**30


def test_zoo_has_exactly_the_expected_builtins() -> None:
    assert set(builtins.builtin_names("hardware")) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_loads_with_name_matching_file(name: str) -> None:
    hw = load_hardware(name)
    assert hw.name == name
    assert Path(hw.path).stem == name
    assert hw.network[-1].size is None
    assert all(level.size for level in hw.network[:-1])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_file_device_and_level_cites_a_source(name: str) -> None:
    raw = load_yaml_file(builtins.data_dir("hardware") / f"{name}.yaml")
    assert raw["source"].strip()
    assert raw["description"].strip()
    assert raw["device"]["source"].strip()
    for level in raw["network"]:
        assert level["source"].strip(), level["name"]
    for curve in raw["device"].get("efficiency", {}).values():
        assert curve["source"].strip()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_efficiencies_are_fractions_below_one(name: str) -> None:
    hw = load_hardware(name)
    for level in hw.network:
        assert 0 < level.efficiency <= 1
    for curve in hw.device.efficiency.values():
        assert 0 < curve.peak < 1


# (system, dtype, peak FLOP/s) straight from the datasheets cited in the files.
PEAKS = [
    ("dgx-a100", "fp16", 312e12),
    ("dgx-a100", "bf16", 312e12),
    ("dgx-a100", "tf32", 156e12),
    ("dgx-a100", "fp32", 19.5e12),
    ("a100-40gb", "bf16", 312e12),  # the datasheet's 40GB SXM column has the 80GB part's peaks
    ("a100-40gb", "fp32", 19.5e12),
    ("dgx-h100", "bf16", 989e12),
    ("dgx-h100", "fp8", 1979e12),
    ("dgx-h100", "tf32", 494.5e12),
    ("hgx-h200", "bf16", 989e12),
    ("dgx1-v100", "fp16", 125e12),
    ("dgx1-v100", "fp32", 15.7e12),
    ("dgx2-v100", "fp16", 125e12),
    ("p100-roce", "fp16", 18.7e12),
    ("p100-roce", "fp64", 4.7e12),
    ("cpu-local", "fp32", 2 * 2.5e9 * 32),
    ("dgx-b200", "bf16", 2250e12),   # ml-engineering TFLOPS table, B200 SXM dense
    ("dgx-b200", "fp8", 4500e12),
    ("dgx-b300", "bf16", 2250e12),   # ml-engineering TFLOPS table, B300 SXM dense: B200's, not GB300's 2500
    ("dgx-b300", "fp8", 4500e12),
    ("dgx-b300", "fp64", 1.25e12),   # HGX B300: 10 TFLOPS over 8 GPUs
    ("dgx-gb300", "bf16", 2500e12),  # GB300 NVL72 per GPU, dense
    ("gb200-nvl72", "bf16", 2500e12),  # GB200 per chip, dense
    ("gb200-nvl72", "fp8", 5000e12),
    ("h800", "bf16", 989e12),        # H100 SXM compute
    ("h800", "fp8", 1979e12),
    ("mi300x", "bf16", 1307.4e12),   # AMD MI300X datasheet
    ("mi300x", "fp8", 2614.9e12),
]


@pytest.mark.parametrize(("name", "dtype", "peak"), PEAKS)
def test_datasheet_peaks(name: str, dtype: str, peak: float) -> None:
    assert load_hardware(name).device.peak(dtype) == pytest.approx(peak, rel=1e-12)


def test_volta_has_no_bf16_and_tf32_falls_back_to_fp32() -> None:
    v100 = load_hardware("dgx1-v100").device
    with pytest.raises(SpecError, match="bf16"):
        v100.peak("bf16")
    assert v100.peak("tf32") == 15.7e12


@pytest.mark.parametrize(
    ("name", "memory", "bandwidth"),
    [
        ("dgx-a100", 80 * GiB, 2039e9),
        ("a100-40gb", 40 * GiB, 1555e9),     # A100 datasheet, 40GB SXM column (HBM2)
        ("dgx-h100", 81559 * 2**20, 3.35e12),  # nvidia-smi (modal-labs/modal-client#2797)
        ("hgx-h200", 143155 * 2**20, 4.8e12),
        ("dgx1-v100", 16 * GiB, 900e9),
        ("dgx2-v100", 32 * GiB, 900e9),
        ("p100-roce", 16 * GiB, 732e9),
        ("dgx-b200", 183359 * 2**20, 8e12),  # nvidia-smi (NVIDIA/TensorRT-LLM#10278)
        ("dgx-b300", 288e9, 8e12),           # B300 SXM 288 GB HBM3e (nvidia-smi: 275040 MiB = 288.4 GB)
        ("gb200-nvl72", 189471 * 2**20, 8e12),  # nvidia-smi (aiconfigurator gb200.yaml); 576 TB/s over 72 GPUs
        ("dgx-gb300", 284208 * 2**20, 8e12),    # nvidia-smi (aiconfigurator gb300.yaml)
        ("h800", 84943110144, 3.35e12),      # cudaGetDeviceProperties totalGlobalMem (deepseek-ai/profile-data)
        ("mi300x", 192 * GiB, 5.3e12),
    ],
)
def test_memory_capacity_and_bandwidth(name: str, memory: float, bandwidth: float) -> None:
    device = load_hardware(name).device
    assert device.memory == memory
    assert device.memory_bandwidth == pytest.approx(bandwidth, rel=1e-12)


# (system, level, size, bytes/s per link per direction, links_per_domain)
LEVELS = [
    ("dgx-a100", 0, 8, 300e9, None),
    ("dgx-a100", 1, None, 25e9, None),  # 200 Gb/s HDR = 25e9 B/s
    ("a100-40gb", 0, 8, 300e9, None),
    ("a100-40gb", 1, None, 25e9, None),  # 1600 Gbps RoCE per node of 8 (llm-foundry README)
    ("dgx-h100", 0, 8, 450e9, None),
    ("dgx-h100", 1, None, 50e9, None),  # 400 Gb/s NDR
    ("hgx-h200", 0, 8, 450e9, None),
    ("hgx-h200", 1, None, 50e9, None),
    ("dgx1-v100", 0, 8, 150e9, None),  # 6 NVLink2 x 25 GB/s
    ("dgx1-v100", 1, None, 12.5e9, 4),  # 4x EDR per 8 GPUs
    ("dgx2-v100", 0, 16, 150e9, None),
    ("dgx2-v100", 1, None, 12.5e9, 8),  # 8x EDR per 16 GPUs
    ("p100-roce", 0, 4, 15.75e9, None),  # PCIe 3.0 x16
    ("p100-roce", 1, None, 3.125e9, 1),  # one 25 Gb/s NIC shared by 4 GPUs
    ("cpu-local", 0, None, 5e9, None),
    ("dgx-b200", 0, 8, 900e9, None),      # 18 NVLink5 x 50 GB/s
    ("dgx-b200", 1, None, 50e9, None),
    ("dgx-b300", 0, 8, 900e9, None),      # 18 NVLink5 x 50 GB/s
    ("dgx-b300", 1, None, 100e9, None),   # one 800 Gb/s XDR ConnectX-8 per GPU
    ("gb200-nvl72", 0, 72, 900e9, None),  # one NVLink domain of 72 GPUs
    ("gb200-nvl72", 1, None, 50e9, None),
    ("h800", 0, 8, 200e9, None),          # NVLink cut to 400 GB/s bidirectional
    ("h800", 1, None, 50e9, None),
    ("mi300x", 0, 8, 448e9, None),        # 7 xGMI links x 64 GB/s
    ("mi300x", 1, None, 50e9, None),
]


@pytest.mark.parametrize(("name", "index", "size", "bandwidth", "links"), LEVELS)
def test_network_levels(name: str, index: int, size: int | None, bandwidth: float, links: int | None) -> None:
    hw = load_hardware(name)
    level = hw.network[index]
    assert level.size == size
    assert level.bandwidth == pytest.approx(bandwidth, rel=1e-12)
    assert level.links_per_domain == links


# The efficiency times the link peak must reproduce the cited nccl-tests bus bandwidth (GB/s) within 2 %:
# the efficiencies are those measurements, not tuned numbers.
BUSBW = [
    ("dgx-a100", 0, 230.0),  # sjeaugey, NVIDIA/nccl-tests#149; 232.54 in #175; 230.77 in NVIDIA/nccl#527
    ("dgx-a100", 1, 192.0 / 8),  # 192 GB/s over 8 HDR NICs, NVIDIA/nccl#812
    ("a100-40gb", 0, 230.77),  # 8x A100-SXM4-40GB (p4dn), NVIDIA/nccl#527
    ("dgx-h100", 0, 370.0),  # ring busbw, NVIDIA/nccl-tests#212 and NVIDIA/nccl#1455
    ("dgx-h100", 1, 47.0),  # 46-48 GB/s per NDR NIC, NVIDIA/nccl-tests#290
    ("hgx-h200", 0, 367.61),  # NVLS disabled, 8x H200, ml-engineering all-reduce-8xH200.md
    ("dgx1-v100", 1, 48.0 / 4),  # 48 GB/s over 4 EDR NICs, NVIDIA/nccl-tests#29
    ("h800", 0, 160.0),  # DeepSeek-V3 report section 3.2.2: "NVLink offers a bandwidth of 160 GB/s"
    ("dgx-b200", 0, 18 * 40.1),  # NCCL SM100_NVLINK_BW 40.1 GB/s per link (NVIDIA/nccl#1807)
    ("dgx-b300", 0, 18 * 40.1),  # the same constant for sm_103 (topo.h ncclTopoNVLinkBw: compute capability >= 100)
    ("gb200-nvl72", 0, 679.61),  # NCCL_ALGO=Ring, 4 GB200, 8 GB: Azure ND_GB200_v6_results.md @2a370be6
    ("dgx-gb300", 0, 679.61),  # GB200's, carried over (same NVLink 5 links and switch trays)
    ("mi300x", 0, 7 * 48.0),  # ~48 GB/s usable per xGMI link (AMD ROCm blog)
]


@pytest.mark.parametrize(("name", "index", "busbw"), BUSBW)
def test_efficiency_reproduces_cited_busbw(name: str, index: int, busbw: float) -> None:
    level = load_hardware(name).network[index]
    assert level.bandwidth * level.efficiency / 1e9 == pytest.approx(busbw, rel=0.02)


def test_matmul_efficiency_is_the_microbenchmark_fit() -> None:
    from dlperf.engine.device import gemm_quantization, phase_time
    from dlperf.ops.dense import gemm

    """r_inf / peak of the curves fitted to per-shape GEMM tables (dlperf/data/kernels/FITTED.md), never above
    the best-shape MAMF ceiling of the same GPU (stas00/ml-engineering)."""
    a100, h100, v100 = (load_hardware(n).device for n in ("dgx-a100", "dgx-h100", "dgx1-v100"))
    assert a100.eff("matmul").peak == pytest.approx(0.829, abs=5e-4)
    # H100: the sustained fit (test_hopper_bf16_gemm_is_the_sustained_fit), below the XLA fit (0.843) and the
    # best-shape MAMF, 794.5 / 989 (hardware/dgx-h100.yaml)
    assert h100.eff("matmul").peak == pytest.approx(0.748, abs=5e-4)
    assert h100.eff("matmul").peak < min(0.843, 794.5 / 989)
    assert v100.eff("matmul").peak == pytest.approx(0.880, abs=5e-4)
    for device, mamf, shape in ((a100, 271.2e12, (1024, 10240, 5120)), (h100, 794.5e12, (2048, 2048, 13312))):
        kernel = gemm("mamf", shape[0], shape[2], shape[1], 2)  # m, k, n
        rate = kernel.cost.fwd_flops / phase_time(kernel.cost.fwd_flops, 0, 1, "matmul", device, "bf16",
                                                  gemm_quantization(kernel, device, "bf16", 1, None)[0])
        assert rate <= 1.02 * mamf  # the fitted curve never beats the best shape ever measured (MAMF)
    assert v100.eff("matmul", "fp32").peak == pytest.approx(12.0 / 15.7, abs=5e-4)


def _long_gemm_fit(gpu: str, at_least_ms: float) -> float:
    """r_inf (FLOP/s) fitted under the engine's quantization (256x128 tiles, split-K) to the aiconfigurator BF16
    kernels of one GPU that run >= `at_least_ms`: least squares on log time with time = quantized FLOPs / r_inf,
    i.e. the geometric mean of quantized FLOPs over time (the startup is nothing beside >= 5 ms)."""
    import math

    from dlperf.engine.device import wave_quantization

    sms = {"H100": 132, "H200": 132, "A100": 108}[gpu]
    logs = [math.log(2 * m * n * k * wave_quantization(1, m, n, k, sms, (256, 128)) / (float(r["latency_ms"]) * 1e-3))
            for r in _kernel_rows("aiconfigurator-hopper-a100-bf16-long.csv")
            if r["gpu"] == gpu and float(r["latency_ms"]) >= at_least_ms
            for m, n, k in [(int(r["m"]), int(r["n"]), int(r["k"]))]]
    assert len(logs) >= 20, (gpu, at_least_ms, len(logs))
    return math.exp(sum(logs) / len(logs))


def test_hopper_bf16_gemm_is_the_sustained_fit() -> None:
    """Hopper's BF16 GEMM curve is the fit to NVIDIA aiconfigurator's F.linear kernels of >= 10 ms (torch.randn
    operands, >= ~90 ms back to back: the power-limited state training runs in), refitted here so the files cannot
    drift from it: H100 739.9 TFLOP/s = 0.748 (H800: the H100's), H200 its own 714.9 = 0.723. The H100 rate
    falls with kernel length up to ~10 ms and then holds; the A100's (400 W) does not fall, and its fit lies within
    3% above dgx-a100's Azure fit (10,000 warm-up calls), so the method reads a sustained rate, if anything high."""
    peak = 989e12
    h100, h200 = _long_gemm_fit("H100", 10.0), _long_gemm_fit("H200", 10.0)
    assert h100 / 1e12 == pytest.approx(739.9, abs=0.1) and h200 / 1e12 == pytest.approx(714.9, abs=0.1)
    for name, rate in (("dgx-h100", h100), ("h800", h100), ("hgx-h200", h200)):
        curve = load_hardware(name).device.eff("matmul", "bf16")
        assert curve.peak == pytest.approx(rate / peak, abs=5e-4), name
        assert curve.peak < 794.5e12 / peak < 0.843  # below the best-shape MAMF and the single-kernel XLA fit
        assert curve.startup == pytest.approx(4.9e-6)  # the XLA fit's t0
    for gpu in ("H100", "H200"):  # the power limit: >= 5 ms reads faster; past 10 ms it falls 2% at most
        longer = _long_gemm_fit(gpu, 20.0) / _long_gemm_fit(gpu, 10.0)
        assert _long_gemm_fit(gpu, 5.0) > _long_gemm_fit(gpu, 10.0) and 0.98 < longer <= 1.0, gpu
    a100, azure = _long_gemm_fit("A100", 10.0), load_hardware("dgx-a100").device.eff("matmul").peak * 312e12
    assert 1.0 < a100 / azure < 1.03 and 0.98 < _long_gemm_fit("A100", 20.0) / _long_gemm_fit("A100", 5.0) < 1.0


def test_fp8_and_flash_attention_efficiencies_match_their_sources() -> None:
    h100 = load_hardware("dgx-h100").device
    assert h100.eff("matmul_fp8") == h100.eff("matmul", "fp8") != h100.eff("matmul")  # an FP8 recipe's GEMMs
    # cuDNN fused attention: the fit to NVIDIA's H200 table (test_hopper_fused_attention_is_the_fit_to_cudnns_...)
    fused = h100.eff("attention_fa3")
    assert fused.peak == pytest.approx(0.641, abs=5e-4) and fused.seq_half == 353
    # FA2 on H100: Dao 2023 4.1's "up to 335 TFLOP/s" is the 16k end of the curve fitted to FA3's figures
    assert h100.eff("attention").at(1) * 16384 / (16384 + h100.eff("attention").seq_half) == pytest.approx(
        335 / 989, rel=0.01)
    a100 = load_hardware("dgx-a100").device
    # FA2 on A100: the curve fitted to FlashAttention-2's own A100 bars (test_flash_causal.py checks every bar)
    assert (a100.eff("attention").peak, a100.eff("attention").seq_half) == (0.657, 189)
    assert a100.eff("attention_fa3") == a100.eff("attention")  # FA3-class kernels need Hopper
    assert load_hardware("mi300x").device.eff("matmul").peak == pytest.approx(668.4 / 1307.4, abs=5e-4)
    # no FP8 or FlashAttention figure of its own: the GEMM's curve, startup time included
    v100 = load_hardware("dgx1-v100").device
    assert v100.eff("attention") == v100.eff("attention_fa3") == v100.eff("matmul") == v100.eff("matmul_fp8")
    assert h100.eff("attention").startup == h100.eff("matmul").startup  # stated in the file: the GEMM's t0


def test_prices_are_aws_list_prices_per_gpu() -> None:
    assert load_hardware("dgx-a100").price_per_device_hour == pytest.approx(27.44705 / 8, abs=1e-4)
    assert load_hardware("dgx-h100").price_per_device_hour == pytest.approx(55.04 / 8, abs=1e-4)
    assert load_hardware("hgx-h200").price_per_device_hour == pytest.approx(63.296 / 8, abs=1e-4)
    assert load_hardware("dgx1-v100").price_per_device_hour is None


# --- the minimal form and bad inputs ----------------------------------------------------------------------

MINIMAL = [
    "name: mini",
    'source: "..."',
    "device: {name: A100-SXM4-80GB, peak_flops: {fp32: '19.5 TFLOP/s', bf16: '312 TFLOP/s'},"
    " memory: '80 GiB', memory_bandwidth: '2039 GB/s'}",
    "network:",
    "  - {name: nvswitch, size: 8, bandwidth: 300 GB/s, latency: 3 us}",
    "  - {name: infiniband-hdr, bandwidth: 200 Gb/s, latency: 5 us}",
]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "hw.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _with_line(index: int, text: str) -> list[str]:
    lines = list(MINIMAL)
    lines[index] = text
    return lines


def test_docstring_minimal_form_loads(tmp_path: Path) -> None:
    """The example in hardware.py's docstring, with its two schematic placeholders filled in."""
    doc = hardware_module.__doc__ or ""
    block = doc.split("Minimal form (accepted as it stands):", 1)[1].split("`size`", 1)[0]
    lines = [line[4:] for line in block.strip("\n").splitlines() if line.strip()]
    text = "\n".join(lines).replace("{name, ", "{name: A100-SXM4-80GB, ").replace("{dtype: ", "{fp32: ")
    path = tmp_path / "doc.yaml"
    path.write_text(text + "\n", encoding="utf-8")
    hw = load_hardware(path)
    assert hw.name == "dgx-a100"
    assert hw.device.memory == 80 * GiB
    assert [(level.name, level.size, level.bandwidth) for level in hw.network] == [
        ("nvswitch", 8, 300e9),
        ("infiniband-hdr", None, 25e9),
    ]


def test_minimal_form_loads_with_defaults(tmp_path: Path) -> None:
    hw = load_hardware(_write(tmp_path, MINIMAL))
    assert hw.device.peak("bf16") == 312e12
    assert hw.network[0].latency == pytest.approx(3e-6)
    assert hw.network[1].bandwidth == 25e9
    assert hw.network[1].efficiency == 1.0
    assert hw.network[1].links_per_domain is None
    assert hw.price_per_device_hour is None
    assert hw.devices_per_node == 8


def _error(tmp_path: Path, lines: list[str]) -> SpecError:
    path = _write(tmp_path, lines)
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    return info.value


# (what is wrong, line index to replace, replacement, error type, "line: field" prefix, text in the message)
BAD = [
    (
        "unknown key",
        4,
        "  - {name: nvswitch, size: 8, bandwith: 300 GB/s, latency: 3 us}",
        SpecError,
        "5: network[0].bandwith",
        "did you mean 'bandwidth'?",
    ),
    (
        "bad unit",
        4,
        "  - {name: nvswitch, size: 8, bandwidth: 300 GBs, latency: 3 us}",
        UnitError,
        "5: network[0].bandwidth",
        "found '300 GBs'",
    ),
    (
        "missing level field",
        5,
        "  - {name: infiniband-hdr, bandwidth: 200 Gb/s}",
        SpecError,
        "6: network[1]",
        "missing required key 'latency'",
    ),
    (
        "missing device field",
        2,
        "device: {name: A100, peak_flops: {fp32: '19.5 TFLOP/s'}, memory: '80 GiB'}",
        SpecError,
        "3: device",
        "missing required key 'memory_bandwidth'",
    ),
    (
        "zero size",
        4,
        "  - {name: nvswitch, size: 0, bandwidth: 300 GB/s, latency: 3 us}",
        SpecError,
        "5: network[0].size",
        "expected a positive integer, found 0",
    ),
    (
        "negative size",
        4,
        "  - {name: nvswitch, size: -8, bandwidth: 300 GB/s, latency: 3 us}",
        SpecError,
        "5: network[0].size",
        "expected a positive integer, found -8",
    ),
    (
        "bytes where a rate is expected",
        4,
        "  - {name: nvswitch, size: 8, bandwidth: 300 GB, latency: 3 us}",
        UnitError,
        "5: network[0].bandwidth",
        "found '300 GB'",
    ),
]


@pytest.mark.parametrize(("what", "index", "line", "kind", "where", "text"), BAD, ids=[case[0] for case in BAD])
def test_bad_input_gives_located_error(
    tmp_path: Path, what: str, index: int, line: str, kind: type, where: str, text: str
) -> None:
    error = _error(tmp_path, _with_line(index, line))
    assert type(error) is kind, what
    message = str(error)
    assert message.startswith(f"{tmp_path / 'hw.yaml'}:{where}: "), message
    assert text in message


def test_size_not_a_multiple_of_inner_level(tmp_path: Path) -> None:
    lines = [*MINIMAL[:5], "  - {name: rack, size: 12, bandwidth: 100 GB/s, latency: 5 us}", MINIMAL[5]]
    message = str(_error(tmp_path, lines))
    assert message.startswith(f"{tmp_path / 'hw.yaml'}:6: network[1].size: ")
    assert "expected a multiple of the inner level's size 8, found 12" in message


def test_unknown_builtin_suggests_closest() -> None:
    with pytest.raises(SpecError, match=re.escape("did you mean 'dgx-a100'?")):
        load_hardware("dgx-a10")


def test_bits_and_bytes(tmp_path: Path) -> None:
    """'200 Gb/s' is bits: 25e9 B/s, the same as '25 GB/s'; mixing them up is an 8x error."""
    bits = load_hardware(_write(tmp_path, MINIMAL)).network[1].bandwidth
    lines = _with_line(5, "  - {name: infiniband-hdr, bandwidth: 25 GB/s, latency: 5 us}")
    byte_form = load_hardware(_write(tmp_path, lines)).network[1].bandwidth
    assert bits == byte_form == 25e9


@settings(max_examples=25, deadline=None)
@given(gbits=st.integers(min_value=1, max_value=3200))
def test_any_gbit_rate_is_an_eighth_in_bytes(tmp_path_factory: pytest.TempPathFactory, gbits: int) -> None:
    lines = _with_line(5, f"  - {{name: net, bandwidth: {gbits} Gb/s, latency: 5 us}}")
    path = tmp_path_factory.mktemp("bits") / "hw.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert load_hardware(path).network[1].bandwidth == pytest.approx(gbits * 1e9 / 8, rel=1e-12)


# Hardware file -> (dtype -> the stas00/ml-engineering MAMF row of its GPU, dlperf/data/kernels/mamf-ceilings.csv).
# H200 and H800 are the H100 SXM die ("H200 is the same" in the BF16 table); H200 has its own FP8 row.
MAMF_ROWS = {
    "dgx-a100": {"bf16": "NVIDIA A100 SXM"},
    "a100-40gb": {"bf16": "NVIDIA A100 SXM"},
    "a100-800g": {"bf16": "NVIDIA A100 SXM"},
    "jean-zay-a100": {"bf16": "NVIDIA A100 SXM"},
    "dgx-h100": {"bf16": "NVIDIA H100 SXM", "fp8": "NVIDIA H100 SXM"},
    "h800": {"bf16": "NVIDIA H100 SXM", "fp8": "NVIDIA H100 SXM"},
    "hgx-h200": {"bf16": "NVIDIA H100 SXM", "fp8": "NVIDIA H200 SXM"},
    "dgx-b200": {"bf16": "NVIDIA B200 SXM", "fp8": "NVIDIA B200 SXM"},
    "dgx-b300": {"bf16": "NVIDIA B300 SXM", "fp8": "NVIDIA B300 SXM"},  # B200's curves, under B300's own MAMF
    "gb200-nvl72": {"bf16": "NVIDIA GB200 SXM", "fp8": "NVIDIA GB200 SXM"},
}  # dgx-gb300: no MAMF row; its cap is GB200's scaled by a measured ratio (test_gb300_gemm_curves_...)


def _mamf(accelerator: str, dtype: str) -> float:
    import csv

    import dlperf

    path = Path(dlperf.__file__).parent / "data" / "kernels" / "mamf-ceilings.csv"
    rows = csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#"))
    return next(float(r["mamf_tflops"]) * 1e12 for r in rows if r["accelerator"] == accelerator and r["dtype"] == dtype)


@pytest.mark.parametrize("name", sorted(MAMF_ROWS))
def test_no_gemm_beats_the_sustained_mamf(name: str) -> None:
    """A matmul curve's asymptote r_inf = peak x datasheet never exceeds the Maximum Achievable Matmul FLOPS of
    its GPU: the best shape of a brute-force search, timed over 100 back-to-back iterations, bounds every shape,
    and the curve's rate only falls below r_inf (startup time, tile and wave quantization)."""
    device = load_hardware(name).device
    for dtype, accelerator in MAMF_ROWS[name].items():
        r_inf = device.eff("matmul", dtype).peak * device.peak(dtype)
        rounding = 5e-4 * device.peak(dtype)  # `peak` is written to 3 decimals
        assert r_inf <= _mamf(accelerator, dtype) + rounding, (name, dtype, r_inf / 1e12)


def _kernel_rows(name: str) -> list[dict[str, str]]:
    import csv

    import dlperf

    path = Path(dlperf.__file__).parent / "data" / "kernels" / name
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


def _cudnn_row(seq: int, mask: str = "no_mask", gpu: str = "gb200") -> dict[str, str]:
    rows = _kernel_rows(f"cudnn-{gpu}-sdpa-bf16.csv")
    return next(r for r in rows if r["attn_mask"] == mask and int(r["seq"]) == seq)


def _pass_rate(row: dict[str, str]) -> float:
    """FLOP/s over a training pass: forward FLOPs 1 + backward 2.5, each at its measured rate."""
    return 3.5 / (1 / (float(row["fwd_tflops"]) * 1e12) + 2.5 / (float(row["bwd_tflops"]) * 1e12))


def _fit_seq_curve(gpu: str) -> tuple[float, float]:
    """(r_inf, seq_half) fitted to a cuDNN table's no-mask rows at 2k-32k (`_fit_rows`)."""
    return _fit_rows([_cudnn_row(s, gpu=gpu) for s in (2048, 4096, 8192, 16384, 32768)])


def _fit_rows(rows: list[dict[str, str]]) -> tuple[float, float]:
    """(r_inf, seq_half) of r(s) = r_inf * s / (s + seq_half) fitted to per-length pass rates by least squares on
    log rate (seq_half on a 1-token grid, r_inf in closed form for each)."""
    import numpy as np

    seqs, log_rates = np.array([float(r["seq"]) for r in rows]), np.log([_pass_rate(r) for r in rows])

    def fit(seq_half: float) -> tuple[float, float]:  # (squared log error, log r_inf) at this seq_half
        log_shape = np.log(seqs / (seqs + seq_half))
        log_r_inf = float(np.mean(log_rates - log_shape))
        return float(((log_r_inf + log_shape - log_rates) ** 2).sum()), log_r_inf

    seq_half = min(np.arange(0.0, 4000.0), key=lambda h: fit(h)[0])
    return float(np.exp(fit(seq_half)[1])), float(seq_half)


def _fit_causal_rows(rows: list[dict[str, str]], heads: int) -> tuple[float, float, Any, Any]:
    """(r_inf, seq_half, seqs, executed rates) of r(s) = r_inf * s / (s + seq_half) fitted to a causal-only cuDNN
    table (top_left rows, `heads` query heads, head dim 128) over the FLOPs dlperf executes for a causal kernel:
    the full score work x dlperf.ops.dense.causal_fraction, forward + 2.5x backward, by least squares on log
    rate (seq_half on a 1-token grid to 6000, r_inf in closed form for each), as dgx-b200's curve is fitted."""
    import numpy as np

    from dlperf.ops.dense import causal_fraction

    seqs = np.array([float(r["seq"]) for r in rows])
    seconds = np.array([(float(r["fwd_time_ms"]) + float(r["bwd_time_ms"])) * 1e-3 for r in rows])
    executed = 3.5 * 4 * heads * seqs ** 2 * 128 * np.array([float(causal_fraction(s)) for s in seqs]) / seconds

    def fit(seq_half: float) -> tuple[float, float]:
        log_shape = np.log(seqs / (seqs + seq_half))
        log_r_inf = float(np.mean(np.log(executed) - log_shape))
        return float(((log_r_inf + log_shape - np.log(executed)) ** 2).sum()), log_r_inf

    seq_half = min(np.arange(0.0, 6000.0), key=lambda h: fit(h)[0])
    return float(np.exp(fit(seq_half)[1])), float(seq_half), seqs, executed


# Every curve a hardware file gives per cuDNN version (efficiency.attention_fa3.by_cudnn), with the table it is
# fitted to (dlperf/data/kernels), the GPU whose BF16 peak it is a fraction of, and how: "no_mask", the five no-mask
# lengths 2k-32k (_fit_rows, as the default GB200/GB300 curves); "causal", a causal-only table's 4k-32k over the
# executed FLOPs (_fit_causal_rows, as dgx-b200's), with its query heads. dgx-b300 carries dgx-gb300's.
# B200 and GB200 are one die (GB100): a version measured on one alone is carried to the other at the measured rate
# times the B200/GB200 matrix speed ratio (1.0738, gb200-nvl72.yaml), a fraction of its own peak (the last element:
# the factor from the measured GPU's peak fraction to this one's).
B200_TO_GB200 = 2250 * 1.0738 / 2500
BY_CUDNN = {
    "dgx-b200": {"9.10.2": ("cudnn-b200-9.10.2-sdpa-bf16.csv", "dgx-b200", "causal", 128, 1.0),
                 "9.13.1": ("cudnn-b200-sdpa-bf16.csv", "dgx-b200", "causal", 128, 1.0),
                 "9.17.0": ("cudnn-gb200-9.17.0-sdpa-bf16.csv", "gb200-nvl72", "causal", 128, 1 / B200_TO_GB200),
                 "9.18.1": ("cudnn-gb200-9.18.1-sdpa-bf16.csv", "gb200-nvl72", "no_mask", 64, 1 / B200_TO_GB200),
                 "9.19.1": ("cudnn-gb200-sdpa-bf16.csv", "gb200-nvl72", "no_mask", 64, 1 / B200_TO_GB200)},
    "gb200-nvl72": {"9.10.2": ("cudnn-b200-9.10.2-sdpa-bf16.csv", "dgx-b200", "causal", 128, B200_TO_GB200),
                    "9.13.1": ("cudnn-b200-sdpa-bf16.csv", "dgx-b200", "causal", 128, B200_TO_GB200),
                    "9.17.0": ("cudnn-gb200-9.17.0-sdpa-bf16.csv", "gb200-nvl72", "causal", 128, 1.0),
                    "9.18.1": ("cudnn-gb200-9.18.1-sdpa-bf16.csv", "gb200-nvl72", "no_mask", 64, 1.0),
                    "9.19.1": ("cudnn-gb200-sdpa-bf16.csv", "gb200-nvl72", "no_mask", 64, 1.0)},
    "dgx-gb300": {"9.13.1": ("cudnn-gb300-9.13.1-sdpa-bf16.csv", "dgx-gb300", "causal", 128, 1.0),
                  "9.17.0": ("cudnn-gb300-9.17.0-sdpa-bf16.csv", "dgx-gb300", "causal", 128, 1.0),
                  "9.18.1": ("cudnn-gb300-9.18.1-sdpa-bf16.csv", "dgx-gb300", "no_mask", 64, 1.0),
                  "9.19.1": ("cudnn-gb300-sdpa-bf16.csv", "dgx-gb300", "no_mask", 64, 1.0)},
}
BY_CUDNN["dgx-b300"] = BY_CUDNN["dgx-gb300"]


def _refit(table: str, measured_on: str, how: str, heads: int) -> tuple[float, float]:
    """(peak fraction, seq_half) of the Hockney curve fitted to one cuDNN table (BY_CUDNN)."""
    rows = _kernel_rows(table)
    if how == "no_mask":
        r_inf, seq_half = _fit_rows([r for r in rows if r["attn_mask"] == "no_mask"
                                     and int(r["seq"]) in (2048, 4096, 8192, 16384, 32768)])
    else:
        causal = [r for r in rows if r["attn_mask"] == "top_left" and int(r["seq"]) in (4096, 8192, 16384, 32768)]
        r_inf, seq_half, _, _ = _fit_causal_rows(causal, heads)
    return r_inf / load_hardware(measured_on).device.peak("bf16"), seq_half


@pytest.mark.parametrize("name", sorted(BY_CUDNN))
def test_every_by_cudnn_curve_is_the_fit_to_its_table(name: str) -> None:
    """Each fused-attention curve a file gives per cuDNN version is refitted from the table it names (so the
    files cannot drift from the tables), every version the file lists is one this test knows (a new curve needs
    its table here), the file's default curve is its newest measured version's, and each table's header says
    the version it is filed under."""
    import dlperf

    device = load_hardware(name).device
    curves = {text: curve for _, text, curve in device.cudnn_curves}
    assert curves.keys() == BY_CUDNN[name].keys()
    for version, (table, measured_on, how, heads, carried) in BY_CUDNN[name].items():
        peak, seq_half = _refit(table, measured_on, how, heads)
        curve = curves[version]
        assert curve.peak == pytest.approx(peak * carried, abs=5e-4), (version, peak)
        assert curve.seq_half == pytest.approx(seq_half, abs=1), (version, seq_half)
        assert table in curve.source
        header = (Path(dlperf.__file__).parent / "data" / "kernels" / table).read_text().split("\nattn_mask")[0]
        assert version in header and f"{heads} query heads" in header
    newest = device.cudnn_curves[-1][2]
    default = device.eff("attention_fa3", "bf16")
    assert (default.peak, default.seq_half) == (newest.peak, newest.seq_half) or name == "dgx-b200"
    if name == "dgx-b200":  # B200's default is 9.13.1, the newest table measured on B200 itself
        assert (default.peak, default.seq_half) == (curves["9.13.1"].peak, curves["9.13.1"].seq_half)


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_causal_and_no_mask_fits_agree_where_a_table_has_both(gpu: str) -> None:
    """The causal-only tables (cuDNN 9.13.1 and 9.17.0) are fitted over the FLOPs dlperf executes for a causal
    kernel, the later ones over their no-mask rows; on the tables that have both (9.18.1, 9.19.1) the two fits
    price 8k within 2%, so the versions' curves compare like for like."""
    for table in (f"cudnn-{gpu}-9.18.1-sdpa-bf16.csv", f"cudnn-{gpu}-sdpa-bf16.csv"):
        on = {"gb200": "gb200-nvl72", "gb300": "dgx-gb300"}[gpu]
        no_mask, causal = _refit(table, on, "no_mask", 64), _refit(table, on, "causal", 64)
        at_8k = [p * 8192 / (8192 + h) for p, h in (no_mask, causal)]
        assert at_8k[1] == pytest.approx(at_8k[0], rel=0.02), table


@pytest.mark.parametrize("name, measured_on", [("gb200-nvl72", "gb200"), ("dgx-gb300", "gb300"),
                                               ("dgx-b300", "gb300")])
def test_blackwell_fused_attention_is_the_fit_to_cudnns_measured_lengths(name: str, measured_on: str) -> None:
    """Blackwell's fused-attention curve is a Hockney curve in the key length fitted to cuDNN's measured rates over
    a training pass at 2k-32k (backward = 2.5x the forward FLOPs), as a fraction of peak: GB200's and GB300's own
    tables; B300 carries GB300's fraction over (Blackwell Ultra's exponential units); B200 has its own table
    (test_b200_fused_attention_is_the_fit_to_its_own_cudnn_table). Refitted from the tables, so the files cannot
    drift from them."""
    row = _cudnn_row(8192, gpu=measured_on)
    seconds = (float(row["fwd_time_ms"]) + float(row["bwd_time_ms"])) * 1e-3
    assert 3.5 * 4 * 64 * 8192 ** 2 * 128 / seconds == pytest.approx(_pass_rate(row), rel=2e-3)  # times agree
    r_inf, seq_half = _fit_seq_curve(measured_on)
    peak = load_hardware({"gb200": "gb200-nvl72", "gb300": "dgx-gb300"}[measured_on]).device.peak("bf16")
    curve = load_hardware(name).device.eff("attention_fa3", "bf16")
    assert curve.peak == pytest.approx(r_inf / peak, abs=5e-4) and curve.seq_half == pytest.approx(seq_half, abs=1)
    at_8k = curve.peak * peak * 8192 / (8192 + curve.seq_half)
    assert at_8k == pytest.approx(_pass_rate(row), rel=0.03)  # the fit stays within 3% of the measured 8k rate
    # not a GEMM-rate curve: under the same part's burst GEMM rate (OpenXLA's B200 fit, 1532.5 TFLOP/s, times the
    # measured B200/part ratio; both tables time kernels in isolation, as cuDNN's does) + 5% of peak
    burst_gemm = 1532.5e12 * _b200_over(BLACKWELL_RATIO_COLUMN[name], "bf16")
    assert curve.peak < burst_gemm / peak + 0.05


def test_b200_fused_attention_is_the_fit_to_its_own_cudnn_table() -> None:
    """B200's fused-attention curve is fitted to NVIDIA's B200 measurement (cudnn-b200-sdpa-bf16.csv: cuDNN 9.13.1,
    causal, 4k-32k), over the FLOPs dlperf executes for a causal kernel (full score work x causal_fraction), not
    carried over from GB200's cuDNN 9.19.1 table; at every length the curve is no more than 3% faster than measured
    (and no more than 3.1% slower), and at 8k it prices the kernel no faster than B200 measured."""
    import numpy as np

    rows = [r for r in _kernel_rows("cudnn-b200-sdpa-bf16.csv") if int(r["seq"]) in (4096, 8192, 16384, 32768)]
    # the table's own FLOPs (causal counted as half) reproduce its rates
    assert 4 * 128 * 8192 ** 2 * 128 / 2 / (float(rows[1]["fwd_time_ms"]) * 1e-3) == pytest.approx(
        float(rows[1]["fwd_tflops"]) * 1e12, rel=2e-3)
    r_inf, seq_half, seqs, executed = _fit_causal_rows(rows, heads=128)
    device = load_hardware("dgx-b200").device
    curve = device.eff("attention_fa3", "bf16")
    peak = device.peak("bf16")
    assert curve.peak == pytest.approx(r_inf / peak, abs=5e-4)
    assert curve.seq_half == pytest.approx(seq_half, abs=1)
    priced = curve.peak * peak * seqs / (seqs + curve.seq_half)
    assert np.all(priced / executed < 1.03) and np.all(priced / executed > 0.969)
    assert priced[1] <= executed[1]  # 8k: not faster than measured
    gb200 = load_hardware("gb200-nvl72").device.eff("attention_fa3", "bf16")
    assert curve.peak * 8192 / (8192 + curve.seq_half) < 0.85 * gb200.peak * 8192 / (8192 + gb200.seq_half)


def _gb200_azure_fp8_fit():
    """The plain Hockney + roofline fit to Azure's GB200 cuBLASLt FP8 table (benchmarks/fit_kernel_curves.py)."""
    import importlib.util
    import sys

    import numpy as np

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("fit_kernel_curves", root / "benchmarks" / "fit_kernel_curves.py")
    fit = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fit
    spec.loader.exec_module(fit)
    device = load_hardware("gb200-nvl72").device
    points = fit.load(fit.Curve("GB200", "gb200-nvl72", "fp8", "matmul", ("azure-gb200-fp8.csv",)))
    memory = np.array([fit.gemm_bytes(p, "fp8") for p in points]) / (device.memory_bandwidth * fit.MEMORY_EFFICIENCY)
    return fit.fit_roofline(np.array([p.flops for p in points]), memory, np.array([p.seconds for p in points]),
                            device.peak("fp8"))


def test_gb200_fp8_rate_agrees_with_azures_sustained_table() -> None:
    """A cross-check held out of GB200's curves (which are B200's times a measured ratio, next test): the plain
    Hockney + roofline fit to Azure's sustained GB200 cuBLASLt FP8 table (10,000 warm-up iterations) lands within
    2% of the rate the file prices, and both are under GB200's FP8 MAMF row."""
    result = _gb200_azure_fp8_fit()
    device = load_hardware("gb200-nvl72").device
    rate = device.eff("matmul", "fp8").peak * device.peak("fp8")
    assert result.rate == pytest.approx(rate, rel=0.02)
    assert max(rate, result.rate) < _mamf("NVIDIA GB200 SXM", "fp8")
    assert result.median_rel < 0.06


BLACKWELL_RATIO_COLUMN = {"gb200-nvl72": "gb200_ms", "dgx-gb300": "gb300_ms", "dgx-b300": "b300_ms"}


def _b200_over(column: str, dtype: str) -> float:
    """Median per-shape B200/part time ratio in NVIDIA aiconfigurator's matched tables, over the shapes whose B200
    kernel runs >= 5 ms (power-limited, as a training run is)."""
    import statistics

    rows = [r for r in _kernel_rows("aiconfigurator-blackwell-gemm.csv") if r["dtype"] == dtype]
    assert rows and all(float(r["b200_ms"]) >= 5.0 for r in rows)
    return statistics.median(float(r["b200_ms"]) / float(r[column]) for r in rows)


def _b200_long_fit(at_least_ms: float) -> float:
    """r_inf (FLOP/s) of B200's BF16 kernels in aiconfigurator's table that run >= `at_least_ms`, fitted under the
    engine's quantization as _long_gemm_fit fits Hopper's (148 SMs, 256x128 tiles, split-K)."""
    import math

    from dlperf.engine.device import wave_quantization

    logs = [math.log(2 * m * n * k * wave_quantization(1, m, n, k, 148, (256, 128)) / (float(r["b200_ms"]) * 1e-3))
            for r in _kernel_rows("aiconfigurator-blackwell-gemm.csv")
            if r["dtype"] == "bf16" and float(r["b200_ms"]) >= at_least_ms
            for m, n, k in [(int(r["m"]), int(r["n"]), int(r["k"]))]]
    assert len(logs) >= 20, (at_least_ms, len(logs))
    return math.exp(sum(logs) / len(logs))


def test_b200_bf16_gemm_is_the_sustained_fit() -> None:
    """B200's BF16 GEMM curve is the fit to aiconfigurator's F.linear kernels of >= 10 ms, as Hopper's is
    (test_hopper_bf16_gemm_is_the_sustained_fit): 1376.7 TFLOP/s = 0.612, below OpenXLA's burst fit (0.681) and
    the best-shape MAMF (0.776); the rate falls with run length, as a power limit makes it. The startup is the XLA
    fit's, and the curve's SM count is B200's 148."""
    b200 = load_hardware("dgx-b200").device
    assert b200.sms == 148
    rate = _b200_long_fit(10.0)
    assert rate / 1e12 == pytest.approx(1376.7, abs=0.1)
    curve = b200.eff("matmul", "bf16")
    assert curve.peak == pytest.approx(rate / b200.peak("bf16"), abs=5e-4)
    assert curve.peak < 0.681 < 1745e12 / b200.peak("bf16")
    assert curve.startup == pytest.approx(4.9e-6)
    assert _b200_long_fit(5.0) > rate > _b200_long_fit(20.0)


@pytest.mark.parametrize("name", sorted(BLACKWELL_RATIO_COLUMN))
def test_blackwell_gemm_curves_are_b200s_times_the_measured_ratio(name: str) -> None:
    """GB200, GB300 and B300 have no per-shape kernel-time table of their own: each dtype's curve is dgx-b200's
    (OpenXLA's B200 table fitted under the engine's tile quantization: tile, startup and r_inf together) times the
    median B200/part time ratio aiconfigurator measured on the same shapes with the same software (TF32: BF16's
    ratio), so the four files cannot drift apart. MXFP8 takes the FP8 curve."""
    b200, part = load_hardware("dgx-b200").device, load_hardware(name).device
    for dtype in ("bf16", "tf32", "fp8", "nvfp4"):
        if dtype not in part.peak_flops:
            continue
        ratio = _b200_over(BLACKWELL_RATIO_COLUMN[name], "bf16" if dtype == "tf32" else dtype)
        ours, anchor = part.eff("matmul", dtype), b200.eff("matmul", dtype)
        assert ours.peak * part.peak(dtype) == pytest.approx(anchor.peak * b200.peak(dtype) * ratio, rel=2e-3), dtype
        assert (ours.tile, ours.startup) == (anchor.tile, anchor.startup), dtype
    assert part.eff("matmul", "mxfp8").peak == part.eff("matmul", "fp8").peak
    # the power limits order the parts as the table does: GB300 (1400 W) > GB200 (1200 W), B300 (1100 W) > B200
    assert _b200_over("gb300_ms", "bf16") > _b200_over("gb200_ms", "bf16") > 1.0
    assert _b200_over("b300_ms", "fp8") > 1.0


@pytest.mark.parametrize("name", ["hgx-h200", "dgx-h100", "h800"])
def test_hopper_fused_attention_is_the_fit_to_cudnns_h200_table(name: str) -> None:
    """Hopper's cuDNN fused-attention curve is the Hockney fit in the key length to NVIDIA's H200 table over a
    training pass at 2k-32k (head dim 128, no mask), as the Blackwell curves are: refitted here, so the files
    cannot drift from it. H100 and H800 carry it over (the H200's GH100 die, SMs and BF16 peak). Every measured
    length within 2.5% of the fit but 32k (4.2%: the measured backward drops from 612 to 572 TFLOP/s there)."""
    rows = [_cudnn_row(s, gpu="h200") for s in (2048, 4096, 8192, 16384, 32768)]
    r_inf, seq_half = _fit_rows(rows)
    device, h200 = load_hardware(name).device, load_hardware("hgx-h200").device
    assert (device.sms, device.peak("bf16")) == (h200.sms, h200.peak("bf16")) == (132, 989e12)
    curve = device.eff("attention_fa3", "bf16")
    assert curve.peak == pytest.approx(r_inf / 989e12, abs=5e-4) and curve.seq_half == pytest.approx(seq_half, abs=1)
    for row in rows:
        s = float(row["seq"])
        fitted = curve.peak * 989e12 * s / (s + curve.seq_half)
        assert fitted == pytest.approx(_pass_rate(row), rel=0.042 if s == 32768 else 0.025), s
        # why pass-weighted: the backward runs 13-21% below the forward at every length (0.796-0.872), so a
        # forward figure (FlashAttention-3's 661 TFLOP/s, the curve this replaced) prices the backward fast
        assert 0.79 < float(row["bwd_tflops"]) / float(row["fwd_tflops"]) < 0.88
    assert curve.startup == device.eff("matmul", "bf16").startup  # the GEMM's t0, as stated in the files


def test_hopper_fused_attention_is_compute_bound_so_h200s_bandwidth_does_not_carry() -> None:
    """The carry-over to H100/H800 rests on the kernel not being HBM-bound: at the table's shortest length (2k,
    the least work per byte) the forward moves Q and O (64 heads) and K and V (8 heads), BF16, in 0.217 ms, a
    tenth of the 3.35 TB/s of the H100 and H800, which the H200's 4.8 TB/s would not change."""
    row = _cudnn_row(2048, gpu="h200")
    bytes_moved = 2 * 2048 * 128 * (64 + 8 + 8 + 64)
    rate = bytes_moved / (float(row["fwd_time_ms"]) * 1e-3)
    for name in ("dgx-h100", "h800"):
        assert rate < 0.12 * load_hardware(name).device.memory_bandwidth


@pytest.mark.parametrize("name", ["dgx-h100", "hgx-h200", "h800"])
def test_hopper_flash_attention_2_is_the_fit_to_its_measured_lengths(name: str) -> None:
    """FlashAttention-2's curve on the H100 die is the Hockney fit in the key length to the FA3 paper's
    FlashAttention-2 rates over a training pass at 512-16k (head dim 128, no mask), as a fraction of 989 TFLOP/s:
    refitted from the table, so the files cannot drift from it. Short sequences run well below the 16k rate."""
    rows = _kernel_rows("fa3paper-h100-fa2-fp16.csv")
    r_inf, seq_half = _fit_rows(rows)
    curve = load_hardware(name).device.eff("attention", "bf16")
    assert curve.peak == pytest.approx(r_inf / 989e12, abs=5e-4) and curve.seq_half == pytest.approx(seq_half, abs=1)
    for row in rows:  # the fit stays within 2% of every measured length
        s = float(row["seq"])
        assert curve.peak * 989e12 * s / (s + curve.seq_half) == pytest.approx(_pass_rate(row), rel=0.02)
