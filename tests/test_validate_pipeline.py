"""Pipeline-parallel validation rows: torchgpipe's ResNet-101 speed benchmark on 8x Tesla P40
(dlperf/data/validation/torchgpipe.yaml) and the P40 server it ran on (hardware/p40-pcie.yaml).

Figures asserted here are the ones printed in kakaobrain/torchgpipe @fe52c4dc (docs/benchmarks.rst and
benchmarks/resnet101-speed/main.py) and in NVIDIA's Tesla P40 datasheet, so a typo in either data file fails.
"""

from __future__ import annotations

import math

import pytest

from dlperf.engine import predict
from dlperf.errors import SpecError
from dlperf.spec.hardware import DEFAULT_EFFICIENCY, load_hardware
from dlperf.spec.model import load_model
from dlperf.validate import DATA_DIR, Result, evaluate, load_dataset, mean_abs_error, select

SOURCE = "torchgpipe-resnet101"
FILE = DATA_DIR / "torchgpipe.yaml"
PREFIX = "torchgpipe-resnet101-"

# main.py @fe52c4dc: experiment -> (batch size, chunks, partitions); docs/benchmarks.rst: samples/s, speedup.
BENCHMARK = {
    "baseline": (118, 1, 1, 95.862, 1.0),
    "pipeline-1": (220, 2, 1, 81.796, 0.853),
    "pipeline-2": (25000, 1667, 2, 135.539, 1.414),
    "pipeline-4": (5632, 256, 4, 265.958, 2.774),
    "pipeline-8": (5400, 150, 8, 411.662, 4.294),
}
PIPELINES = [name for name in BENCHMARK if name != "baseline"]


@pytest.fixture(scope="module")
def rows() -> dict:
    return {r.id: r for r in load_dataset([FILE])}


@pytest.fixture(scope="module")
def results() -> list[Result]:
    return evaluate(load_dataset([FILE]))


# ----------------------------------------------------------------------------------------- the hardware


def test_p40_device_figures_are_the_datasheet_ones():
    hw = load_hardware("p40-pcie")
    device = hw.device
    assert hw.name == "p40-pcie" and device.name == "Tesla-P40-24GB"
    assert device.peak("fp32") == 12e12          # "12 TeraFLOPS" single precision, boost clock
    assert device.memory == 24 * 2**30           # "24 GB" GDDR5
    assert device.memory_bandwidth == 346e9      # "346 GB/s"
    with pytest.raises(SpecError, match="fp16"):
        device.peak("fp16")                      # GP102: FP16 at 1/64 rate, not a datasheet figure


def test_p40_has_a_sourced_conv_curve_and_the_default_matmul_and_memory_curves():
    """Convolutions: DeepBench's Titan Xp FP32 cuDNN table (tests/test_conv_curve.py); no sourced P40 GEMM or
    STREAM figure was found, so matmul and memory keep dlperf's defaults."""
    device = load_hardware("p40-pcie").device
    assert set(device.efficiency) == {"conv"}
    matmul = device.eff("matmul")
    assert (matmul.peak, matmul.half, matmul.startup) == DEFAULT_EFFICIENCY["matmul"]
    assert "DeepBench_NV_TitanXp.xlsx" in device.eff("conv").source
    assert device.eff("memory").source == "dlperf default"


def test_p40_pcie_level_is_gen3_x16_at_nccls_modelled_rate():
    (pcie,) = load_hardware("p40-pcie").network
    assert (pcie.name, pcie.size, pcie.links_per_domain) == ("pcie", None, None)  # one server, outermost level
    assert pcie.bandwidth == pytest.approx(8e9 * 16 * 128 / 130 / 8, rel=1e-3)   # 15.75 GB/s per direction
    assert pcie.bandwidth * pcie.efficiency == pytest.approx(12e9, rel=0.01)     # NCCL topo.h PCI_BW 12.0
    assert pcie.latency == pytest.approx(5.7e-6)


# ----------------------------------------------------------------------------------------- the rows


def test_file_has_an_absolute_and_a_speedup_row_per_experiment(rows):
    assert {r.source for r in rows.values()} == {SOURCE}
    assert set(rows) == {PREFIX + name for name in BENCHMARK} | {f"{PREFIX}{name}-speedup" for name in PIPELINES}
    assert all(r.evidence == "verified" and "fe52c4dc" in r.where for r in rows.values())
    assert "fe52c4dcedacf50dae692385ffd9afc95eb92566" in rows[PREFIX + "baseline"].citation


@pytest.mark.parametrize("name", list(BENCHMARK))
def test_absolute_rows_carry_the_published_throughput_and_the_script_configuration(rows, name):
    batch, chunks, partitions, samples_per_s, _ = BENCHMARK[name]
    row = rows[PREFIX + name]
    assert (row.value, row.unit, row.baseline) == (samples_per_s, "samples_per_s", None)
    assert (row.model, row.sets, row.hardware) == ("resnet101", {}, "p40-pcie")
    plan = row.plan
    assert (plan.devices, plan.pp, plan.data_parallel, plan.tp) == (partitions, partitions, 1, 1)
    assert (plan.schedule, plan.dtype, plan.optimizer) == ("gpipe", "fp32", "sgd")
    assert plan.micro_batches == chunks
    # torch.chunk cuts ceil(batch / chunks) samples per micro-batch; the rows use exactly that size.
    assert plan.micro == math.ceil(batch / chunks)
    # torchgpipe's default checkpoint='except_last'; the baseline has no GPipe wrapper.
    assert plan.recompute == ("none" if name == "baseline" else "except_last")


def test_only_pipeline_2_rounds_its_batch_and_says_so(rows):
    for name in BENCHMARK:
        batch, chunks = BENCHMARK[name][:2]
        plan = rows[PREFIX + name].plan
        if batch % chunks == 0:
            assert plan.global_batch == batch
    two = rows[PREFIX + "pipeline-2"]
    assert 25000 % 1667 and math.ceil(25000 / 1667) == 15
    assert (two.plan.global_batch, two.plan.micro, two.plan.micro_batches) == (1667 * 15, 15, 1667)
    assert abs(two.plan.global_batch - 25000) / 25000 < 3e-4
    assert "25005" in two.note and "rounded" in two.note


@pytest.mark.parametrize("name", PIPELINES)
def test_speedup_rows_are_the_published_ratios_of_the_absolute_rows(rows, name):
    speedup = rows[f"{PREFIX}{name}-speedup"]
    absolute, baseline = rows[PREFIX + name], rows[PREFIX + "baseline"]
    assert (speedup.unit, speedup.baseline) == ("speedup", baseline.id)
    assert speedup.value == BENCHMARK[name][4]
    assert speedup.value == pytest.approx(absolute.value / baseline.value, abs=5e-4)   # printed to 3 decimals
    assert speedup.plan == absolute.plan and speedup.model == absolute.model


def test_tags_route_the_rows_to_the_shared_pipeline_speedup_test(rows):
    chosen = select(list(rows.values()), tags=["pipeline-speedup"])
    assert sorted(r.id for r in chosen) == sorted(f"{PREFIX}{name}-speedup" for name in PIPELINES)
    assert all(r.is_ratio for r in chosen)
    # The other accuracy groups of tests/test_validate.py do not pick these rows up.
    assert not any({"cnn-dp", "bert-dp", "llm-hybrid", "scaling"} & set(r.tags) for r in rows.values())


# ----------------------------------------------------------------------------------------- predictions


def test_speedup_prediction_is_the_ratio_of_two_engine_predictions(rows, results):
    model, hw = load_model("resnet101"), load_hardware("p40-pcie")
    by_id = {r.row.id: r for r in results}
    base = predict(model, hw, rows[PREFIX + "baseline"].plan).throughput_samples_per_s
    eight = predict(model, hw, rows[PREFIX + "pipeline-8"].plan).throughput_samples_per_s
    assert by_id[PREFIX + "baseline"].predicted == pytest.approx(base)
    assert by_id[PREFIX + "pipeline-8-speedup"].predicted == pytest.approx(eight / base)


def test_gpipe_bubble_fraction_is_at_most_pp_minus_one_over_m_plus_pp_minus_one(rows):
    # GPipe: the slowest stage idles (pp-1) stage-times out of (m + pp - 1) when the stages are equal (Huang et
    # al. 2019, section 2.3); fill and drain cross the other stages at their own pace, so unequal stages idle less.
    plan = rows[PREFIX + "pipeline-8"].plan
    b = predict(load_model("resnet101"), load_hardware("p40-pcie"), plan).breakdown_s
    busy = sum(b[k] for k in ("compute/forward", "compute/backward", "compute/recompute",
                              "compute/grad_accumulation", "overhead/host"))
    fraction = b["pipeline/bubble"] / (busy + b["pipeline/bubble"])
    assert 0.5 * 7 / (150 + 7) < fraction <= 7 / (150 + 7) * (1 + 1e-12)


def test_every_benchmark_configuration_fits_in_p40_memory(results):
    # These batch sizes ran on 24 GB cards; a prediction that does not fit contradicts the measurement.
    assert all(not r.notes for r in results), [(r.row.id, r.notes) for r in results]


# Fixed tolerance from the issue (15 % mean absolute error on pipeline speedups). A miss is a strict xfail whose
# reason names the measured error and the term of the model believed wrong.
def test_torchgpipe_speedup_rows_within_15_percent(results):
    chosen = [r for r in results if r.row.unit == "speedup"]
    assert len(chosen) == 4
    assert mean_abs_error(chosen) <= 15.0


# Issue #12's acceptance: every CNN source within 15 % mean absolute error, throughput and speedup rows together.
# The P40's conv curve comes from DeepBench's Titan Xp kernel table, never from these rows.
def test_torchgpipe_source_within_15_percent(results):
    assert len(results) == 9
    assert mean_abs_error(results) <= 15.0
