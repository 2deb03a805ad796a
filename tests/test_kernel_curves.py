"""The public kernel microbenchmarks in dlperf/data/kernels/ and the curves fitted to them.

Each curve is refitted here (benchmarks/fit_kernel_curves.py, ~1 s for all) and must reproduce what
dlperf/data/kernels/FITTED.md publishes: the efficiency to 0.005 and the startup time to 0.1 us, and its
median |relative error| on its own points must stay within the figure measured when FITTED.md was written
(`python benchmarks/fit_kernel_curves.py`), rounded up to the next 0.01. A changed CSV, fit or hardware peak
that moves a curve fails here instead of silently changing a published figure.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "dlperf" / "data" / "kernels"


def _fit_module():
    spec = importlib.util.spec_from_file_location("fit_kernel_curves", ROOT / "benchmarks" / "fit_kernel_curves.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


fit = _fit_module()

# curve -> (peak = r_inf / datasheet peak, startup t0 in us, median |rel err| tolerance). Measured medians:
# 0.072, 0.139, 0.346, 0.326, 0.105, 0.183, 0.071, 0.213, 0.149, 0.042, 0.029, 0.105, 0.140, 0.141, 0.344
# (FITTED.md).
EXPECTED = {
    "V100 fp16 matmul (deepbench)": (0.800, 8.0, 0.08),
    "V100 fp32 matmul (deepbench)": (0.764, 10.0, 0.14),
    "V100 fp16 conv (deepbench)": (0.346, 12.0, 0.35),
    "V100 fp32 conv (deepbench)": (0.917, 30.0, 0.33),
    "A100 fp16 matmul (azure)": (0.733, 9.9, 0.11),
    "A100 fp32 matmul (neusight)": (0.771, 34.3, 0.19),
    "H100 bf16 matmul (xla)": (0.752, 5.0, 0.08),
    "H100 tf32 matmul (xla)": (0.491, 5.6, 0.22),
    "H100 fp32 matmul (neusight)": (0.633, 24.1, 0.15),
    "H100 fp8 matmul (azure)": (0.686, 6.6, 0.05),
    "H200 fp8 matmul (azure)": (0.682, 6.4, 0.03),
    "B200 bf16 matmul (xla)": (0.551, 4.9, 0.11),
    "B200 tf32 matmul (xla)": (0.566, 5.8, 0.15),
    "B200 fp8 matmul (xla)": (0.540, 4.8, 0.15),
    "TitanXp fp32 conv (deepbench)": (0.678, 35.0, 0.35),
}


# The tensor-core matmul curves (the default ones, and the tf32 and fp8 ones) are published as fitted under the
# engine's own quantization (FITTED.md says why): curve -> (peak, startup us, median tolerance); measured medians
# 0.065, 0.021, 0.045, 0.151, 0.035, 0.036, 0.046, 0.051, 0.101.
ENGINE_EXPECTED = {
    "V100 fp16 matmul (deepbench)": (0.880, 3.2, 0.07),
    "A100 fp16 matmul (azure)": (0.829, 0.6, 0.03),
    "H100 bf16 matmul (xla)": (0.843, 4.9, 0.05),
    "H100 tf32 matmul (xla)": (0.616, 5.4, 0.16),
    "H100 fp8 matmul (azure)": (0.709, 4.9, 0.04),
    "H200 fp8 matmul (azure)": (0.682, 4.4, 0.04),
    "B200 bf16 matmul (xla)": (0.681, 4.9, 0.05),
    "B200 tf32 matmul (xla)": (0.714, 5.8, 0.06),
    "B200 fp8 matmul (xla)": (0.619, 4.8, 0.11),
}


@pytest.fixture(scope="module")
def results() -> dict:
    return {r.curve.name: r for r in (fit.fit_curve(c) for c in fit.CURVES)}


def test_every_curve_is_expected(results: dict) -> None:
    assert set(results) == set(EXPECTED)


FITS = [(name, "plain") for name in sorted(EXPECTED)] + [(name, "engine") for name in sorted(ENGINE_EXPECTED)]


@pytest.mark.parametrize("name,model", FITS)
def test_fitted_curve_matches_published_figures(results: dict, name: str, model: str) -> None:
    """The plain Hockney fit and, for the default matmul curves, the fit under the engine's quantization."""
    peak, startup_us, tolerance = (EXPECTED if model == "plain" else ENGINE_EXPECTED)[name]
    r = results[name]
    fitted = getattr(r, model)
    assert r.efficiency(fitted) == pytest.approx(peak, abs=0.005)
    assert fitted.t0 * 1e6 == pytest.approx(startup_us, abs=0.1)
    assert fitted.median_rel <= tolerance


def test_curve_formula_by_hand() -> None:
    """The model the fit scores, written out: t = t0 + max(FLOPs / r_inf, bytes / bandwidth)."""
    r = fit.fit_curve(fit.CURVES[0])  # V100 fp16 DeepBench GEMMs
    points = fit.load(fit.CURVES[0])
    bandwidth = 900e9 * fit.MEMORY_EFFICIENCY  # dgx1-v100 memory_bandwidth
    rel = sorted(abs(r.plain.t0 + max(p.flops / r.plain.rate, 2 * (p.m * p.k + p.k * p.n + p.m * p.n) / bandwidth)
                     - p.seconds) / p.seconds for p in points)
    assert rel[len(rel) // 2] <= EXPECTED[fit.CURVES[0].name][2]


def test_quantized_models_are_computed_for_every_curve(results: dict) -> None:
    for r in results.values():
        for f in (r.quantized, r.engine):
            assert 0 < r.efficiency(f) <= 1.0 + 1e-9
            assert f.points == r.plain.points


def test_wave_quantization_counts_a_partial_wave_as_full() -> None:
    # 1024^3 on A100 (108 SMs): best tile 64x64 -> 256 tiles -> 3 waves = 324 tile slots.
    p = fit.Point(1, 1024, 1024, 1024, 1.0)
    assert fit.quantized_flops(p, 108) == 324 * 2 * 64 * 64 * 1024
    # 4096^3 on H100 (132 SMs) with 256x128 tiles: 512 tiles -> 4 waves = 528 slots.
    assert fit.scheduled_flops(fit.Point(1, 4096, 4096, 4096, 1.0), 132, (256, 128)) == 528 * 2 * 256 * 128 * 4096


@pytest.mark.parametrize("path", sorted(DATA.glob("*.csv")), ids=lambda p: p.name)
def test_every_csv_names_its_source(path: Path) -> None:
    header, rows = fit.read_csv(path)
    sources = [line for line in header if line.startswith("source:")]
    assert sources, f"{path.name}: no '# source:' line"
    # a repository file at a commit, or a paper's figure or table by its arXiv id (a published measurement that
    # lives in no repository, e.g. FlashAttention-3's per-length FlashAttention-2 rates)
    located = re.search(r"\S+/\S+ \S+ @ ?[0-9a-f]{40}", sources[0]) or re.search(
        r"arXiv:\d{4}\.\d{4,5}\).*(figure|table)", sources[0], re.IGNORECASE)
    assert located, f"{path.name}: source needs repo, path, commit (or arXiv id and figure/table)"
    assert rows, f"{path.name}: no rows"


@pytest.mark.parametrize("curve", [c for c in fit.CURVES if c.kind == "matmul"], ids=lambda c: c.name)
def test_no_gemm_beats_the_datasheet_peak(curve) -> None:
    """A GEMM timing faster than the dense peak would be a unit or transcription error (convolutions may:
    Winograd/FFT do fewer FLOPs than the direct count). xla-h100-fp8.csv fails this and is not fitted."""
    peak = fit.load_hardware(curve.hardware).device.peak_flops[curve.dtype]
    assert max(p.flops / p.seconds for p in fit.load(curve)) <= peak


def _published(text: str, name: str, peak: float, startup_us: float) -> bool:
    """A snippet entry of FITTED.md, inline ({peak: .., startup: .., source: "name...) or as a block."""
    inline = rf'peak: {peak:.3f}, startup: {startup_us:.1f} us, source: "{re.escape(name)}'
    block = rf'peak: {peak:.3f}\n\s+startup: {startup_us:.1f} us\n\s+source: "{re.escape(name)}'
    return bool(re.search(inline, text) or re.search(block, text))


def test_fitted_md_lists_the_published_figures() -> None:
    text = (DATA / "FITTED.md").read_text()
    for name, (peak, startup_us, _) in ENGINE_EXPECTED.items():
        assert _published(text, name, peak, startup_us), name
    plain = {n: v for n, v in EXPECTED.items() if n not in ENGINE_EXPECTED}
    for name, (peak, startup_us, _) in plain.items():
        assert _published(text, name, peak, startup_us), name


SNIPPET_HARDWARE = ("dgx1-v100", "dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200")  # FITTED.md's snippets, by first name


def _snippets() -> dict[str, str]:
    """FITTED.md's yaml block, split at its '# <hardware name> ...' comment lines."""
    block = (DATA / "FITTED.md").read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    out: dict[str, str] = {}
    for chunk in block.split("\n\n"):
        head, body = chunk.split("\n", 1)
        out[head.lstrip("# ").split()[0]] = body
    return out


@pytest.mark.parametrize("name", sorted(SNIPPET_HARDWARE))
def test_snippet_loads_into_its_hardware_file(name: str) -> None:
    """Each snippet, put in place of its hardware file's `efficiency`, loads and yields the published curves."""
    from dlperf.builtins import data_dir
    from dlperf.spec.hardware import hardware_from_dict
    from dlperf.spec.yamlio import load_yaml_file, load_yaml_text

    data = load_yaml_file(data_dir("hardware") / f"{name}.yaml")
    snippet = load_yaml_text(_snippets()[name], "FITTED.md")
    data["device"]["efficiency"] = snippet["efficiency"]
    device = hardware_from_dict(data, "FITTED.md").device
    matmul, published = device.eff("matmul"), snippet["efficiency"]["matmul"]
    assert matmul.peak == published["peak"] and matmul.tile == (256, 128)
    assert matmul.startup == pytest.approx(float(published["startup"].split()[0]) * 1e-6)
    for dtype, curve in snippet["efficiency"]["matmul"].get("dtypes", {}).items():
        tile = (256, 128) if dtype in fit.TENSOR_CORE_DTYPES else None  # fp32 runs on CUDA cores, SIMT tiles
        assert device.eff("matmul", dtype).peak == curve["peak"] and device.eff("matmul", dtype).tile == tile


def _mamf(accelerator: str, dtype: str) -> float:
    """The stas00/ml-engineering MAMF row (dlperf/data/kernels/mamf-ceilings.csv), in FLOP/s."""
    _, rows = fit.read_csv(DATA / "mamf-ceilings.csv")
    return next(float(r["mamf_tflops"]) * 1e12 for r in rows if r["accelerator"] == accelerator and r["dtype"] == dtype)


# dgx-b200's matmul curves: dtype (None = the default curve) -> (fitted curve, fit, MAMF dtype or None when no row)
B200_CURVES = {None: ("B200 bf16 matmul (xla)", "engine", "bf16"), "tf32": ("B200 tf32 matmul (xla)", "engine", None),
               "fp8": ("B200 fp8 matmul (xla)", "engine", "fp8")}


@pytest.mark.parametrize("dtype", list(B200_CURVES), ids=lambda d: d or "default")
def test_dgx_b200_carries_the_xla_fit_capped_at_mamf(results: dict, dtype: str | None) -> None:
    """hardware/dgx-b200.yaml prices GEMMs with the fit to XLA's B200 table under H100's rule: every tensor-core
    curve (default, tf32, fp8) the fit under the engine's quantization, with its tile (BF16's rate: the sustained
    one, below this burst fit); r_inf capped at the B200
    MAMF row where there is one; startup = the fitted t0 (CUPTI kernel times, no launch in them)."""
    name, model, mamf_dtype = B200_CURVES[dtype]
    r = results[name]
    fitted = getattr(r, model)
    rate = min(fitted.rate, _mamf("NVIDIA B200 SXM", mamf_dtype)) if mamf_dtype else fitted.rate
    curve = fit.load_hardware("dgx-b200").device.eff("matmul", dtype)
    if dtype is None:  # BF16 runs at its sustained rate (test_hardware_zoo test_b200_bf16_gemm_is_the_sustained_fit),
        assert curve.peak < rate / r.peak_flops  # below this burst fit; its startup and tile are the fit's
    else:
        assert curve.peak == pytest.approx(rate / r.peak_flops, abs=5e-4)
    assert curve.startup == pytest.approx(fitted.t0, abs=0.05e-6)
    assert curve.tile == ((256, 128) if model == "engine" else None)
