"""The CPU input pipeline (dlperf.engine.input): a producer whose rate, workers x host speed / per-sample CPU
seconds, caps the step only when it is slower than the GPU; synthetic data (the default) changes nothing."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from dlperf.engine.input import INPUT_COSTS, MEASURED_VM_SPEED, effective_workers, loader_rate, sample_seconds
from dlperf.engine.step import StepModel
from dlperf.errors import PlanError, SpecError
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import FRAMEWORK_HOST, load_hardware
from dlperf.spec.model import load_model

OPS = ("jpeg-decode-pillow", "rrc224-flip-pillow", "fast-collate")


@functools.cache
def _resnet():
    return load_model("resnet50")


@functools.cache
def _hw(name: str = "dgx-a100"):
    return load_hardware(name)


def _plan(devices: int = 1, workers: int = 16, batch: int = 256, **kw) -> Plan:
    return Plan(devices=devices, global_batch=batch * devices, micro_batch=batch, dtype="fp16",
                optimizer="momentum", data_backend="cpu", loader_workers=workers, input_ops=OPS, **kw)


def _predict(plan: Plan, hw=None):
    return StepModel(_resnet(), hw or _hw()).predict(plan)


def test_synthetic_data_is_the_default_and_prices_nothing():
    plan = _plan()
    gpu = _predict(replace(plan, data_backend="synthetic", loader_workers=0, input_ops=()))
    assert Plan().data_backend == "synthetic"
    assert "input/cpu" not in gpu.breakdown_s


def test_the_cap_binds_only_when_the_loader_is_slower_than_the_gpu():
    """The GPU's step for 256 samples against the loader's: a step never waits when the loader keeps up, and
    with one worker it lasts exactly the loader's time for its samples."""
    synthetic = _predict(replace(_plan(), data_backend="synthetic", loader_workers=0, input_ops=())).step_time_s
    fast = _predict(_plan(workers=64))
    assert loader_rate(_plan(workers=64), _hw()) * synthetic > 256
    assert fast.step_time_s == pytest.approx(synthetic)
    assert fast.breakdown_s["input/cpu"] == 0.0
    assert not any(n.startswith("input-bound") for n in fast.notes)
    slow = _predict(_plan(workers=1))
    loader = 256 * sample_seconds(_plan()) / _hw().device.host_speed
    assert loader > synthetic
    assert slow.step_time_s == pytest.approx(loader)
    assert slow.breakdown_s["input/cpu"] == pytest.approx(loader - synthetic)
    assert any(n.startswith("input-bound") and "EPYC 7742" in n for n in slow.notes)


@pytest.mark.parametrize("devices", [1, 8])
def test_more_workers_or_a_faster_host_is_never_slower(devices: int):
    faster_host = replace(_hw(), device=replace(_hw().device, host_speed=2 * _hw().device.host_speed))
    steps = [_predict(_plan(devices, w)).step_time_s for w in (1, 2, 4, 8, 16, 32)]
    assert all(a >= b for a, b in zip(steps, steps[1:], strict=False))
    assert steps[0] > steps[-1]
    for w in (1, 4, 16):
        assert _predict(_plan(devices, w), faster_host).step_time_s <= _predict(_plan(devices, w)).step_time_s


def test_the_nodes_cores_bound_the_workers():
    """DGX A100: 128 cores for 8 training processes leave 15 per process, whatever the plan asks beyond that; one
    process on the node may use 16. A file without cores takes the plan's workers as given."""
    assert effective_workers(_plan(8, 16), _hw()) == 15
    assert effective_workers(_plan(8, 64), _hw()) == 15
    assert effective_workers(_plan(1, 16), _hw()) == 16
    no_cores = replace(_hw(), device=replace(_hw().device, host_cores=0))
    assert effective_workers(_plan(8, 64), no_cores) == 64


def test_the_dle_resnet_rows_run_the_loader_dle_configured():
    """NVIDIA DeepLearningExamples @7bdfc81d (the commit that published the ResNet-50 table) configs.yml:
    DGXA100 workers 16, DGX1V 8; resnet_params data_backend pytorch. fast_collate allocates its batch in the run's
    memory_format (dataloaders.py:320-336): the AMP rows (nhwc) collate into a channels_last batch, the TF32/FP32
    rows (nchw) into a contiguous one."""
    from dlperf.validate import load_dataset

    rows = [r for r in load_dataset() if r.source == "dle-resnet50"]
    assert len(rows) == 8
    for row in rows:
        collate = "fast-collate-nhwc" if row.plan.memory_format == "nhwc" else "fast-collate"
        assert row.plan.data_backend == "cpu" and row.plan.input_ops == (*OPS[:2], collate)
        assert row.plan.loader_workers == (16 if row.hardware == "dgx-a100" else 8)
    assert {r.plan.memory_format for r in rows} == {"nhwc", "nchw"}


@pytest.mark.parametrize(("changes", "match"), [
    ({"data_backend": "dali"}, "data_backend"),
    ({"loader_workers": -1}, "loader_workers"),
    ({"loader_workers": 2.5}, "loader_workers"),
    ({"loader_workers": True}, "loader_workers"),
    ({"input_ops": ("jpeg-decode-pillow", "sharpen")}, "input_ops"),
    ({"input_ops": "jpeg-decode-pillow"}, "input_ops"),
    ({"loader_workers": 0}, "loader_workers >= 1"),
    ({"input_ops": ()}, "input_ops"),
    ({"input_ops": ("fast-collate", "fast-collate")}, "input_ops"),
    ({"data_backend": "synthetic"}, "need data_backend cpu"),
])
def test_a_bad_input_pipeline_is_a_one_line_plan_error(changes: dict, match: str):
    with pytest.raises(PlanError, match=match) as err:
        validate(replace(_plan(), **changes))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cores", ["0", "-4", "2.5", "many", "true"])
def test_bad_host_cores_name_their_field(tmp_path, cores: str):
    path = tmp_path / "odd.yaml"
    path.write_text(f"extends: dgx-a100\nname: odd\ndevice:\n  host: {{cpu: x, speed: 1, cores: {cores}}}\n")
    with pytest.raises(SpecError) as err:
        load_hardware(str(path))
    assert "device.host.cores" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cores", [4, 8])
def test_a_node_with_no_core_to_spare_is_refused_in_one_line(run, tmp_path, cores: int):
    """8 training processes on 8 (or 4) cores leave the loader none: it was accepted, and the step came out
    infinite, with a 'nan%' note."""
    path = tmp_path / "few.yaml"
    path.write_text(f"extends: dgx-a100\nname: few\ndevice:\n  host:\n    cores: {cores}\n")
    code, out, err = run("predict", "resnet50", str(path), "--gpus", "8", "--global-batch", "256",
                         "--data-backend", "cpu", "--loader-workers", "8", "--input-ops", "fast-collate")
    assert code == 2 and not out
    assert err.startswith(f"Error: {path}:5: device.host.cores: expected more than the node's 8 devices")
    assert err.count("\n") == 1


def test_dgx_a100_has_the_datasheets_128_cores():
    assert _hw().device.host_cores == 128
    assert _hw("a100-40gb").device.host_cores == 128  # extends dgx-a100
    assert _hw("jean-zay-a100").device.host_cores == 64  # its own 2x EPYC 7543, not the file it extends


def test_every_input_cost_names_its_source():
    """Decode: imread_benchmark's Pillow figure on a Zen 4 EPYC 9B14 (the reference generation); augment and
    collate: benchmarks/input_ops.py, converted by that machine's speed from benchmarks/host_ops.py."""
    decode = INPUT_COSTS["jpeg-decode-pillow"]
    assert decode.seconds == pytest.approx(1 / 536.55)
    assert "ternaus/imread_benchmark" in decode.source and "EPYC 9B14" in decode.source
    assert pytest.approx(FRAMEWORK_HOST[0] / 32.2e-6) == MEASURED_VM_SPEED
    for name in ("rrc224-flip-pillow", "fast-collate", "fast-collate-nhwc"):
        assert "benchmarks/input_ops.py" in INPUT_COSTS[name].source
    assert INPUT_COSTS["rrc224-flip-pillow"].seconds == pytest.approx(1208e-6 * MEASURED_VM_SPEED)
    assert INPUT_COSTS["fast-collate"].seconds == pytest.approx(182.5e-6 * MEASURED_VM_SPEED)
    assert INPUT_COSTS["fast-collate-nhwc"].seconds == pytest.approx((182.5e-6 + 422.0e-6) * MEASURED_VM_SPEED)
    assert INPUT_COSTS["fast-collate-nhwc"].seconds > INPUT_COSTS["fast-collate"].seconds

