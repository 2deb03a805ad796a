"""Per-micro-batch passes over the gradient (dlperf.engine.grad_passes, plan.grad_passes): each named pass adds
its bytes per parameter over the achieved memory bandwidth, plus one launch, to every micro-batch."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from dlperf.engine.grad_passes import GRAD_PASSES
from dlperf.engine.step import StepModel
from dlperf.errors import PlanError
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from dlperf.validate import load_dataset

TF1_AMP = ("amp-casts", "unscale", "finite-check", "global-norm", "clip")


@functools.cache
def _model():
    return load_model("bert-large", {"seq": 128, "mlm_positions": 20})


@functools.cache
def _hw():
    return load_hardware("a100-40gb")


def _plan(**kw) -> Plan:
    base = dict(devices=1, global_batch=256, micro_batch=64, dtype="fp16", optimizer="adam", grad_dtype="fp32")
    return Plan(**{**base, **kw})


def _accumulation(plan: Plan) -> float:
    result = StepModel(_model(), _hw()).predict(plan)
    return result.breakdown_s["compute/grad_accumulation"]


def test_no_passes_is_the_default_and_adds_nothing():
    assert Plan().grad_passes == ()
    assert _accumulation(_plan()) == _accumulation(_plan(grad_passes=()))


def test_each_pass_adds_its_bytes_over_the_memory_rate_every_micro_batch():
    hw, micro_batches = _hw(), 4
    bw = hw.device.memory_bandwidth * hw.device.eff("memory").peak
    params = float(_model().total_params)
    # TF1 AMP: 12 (casts, fp32 weights to fp16 and back) + 8 + 6 + 4 + 8 bytes per parameter with fp32 gradients
    assert sum(GRAD_PASSES[n].nbytes(4, 2) for n in TF1_AMP) == 38
    added = _accumulation(_plan(grad_passes=TF1_AMP)) - _accumulation(_plan())
    expected = micro_batches * (38 * params / bw + len(TF1_AMP) * hw.device.launch_latency)
    assert added == pytest.approx(expected, rel=1e-9)


def test_passes_scale_with_the_gradient_dtype():
    # unscale reads and writes the gradient: twice the bytes for fp32 gradients as for fp16 ones
    fp32 = _accumulation(_plan(grad_passes=("unscale",))) - _accumulation(_plan())
    fp16 = _accumulation(_plan(grad_dtype="fp16", grad_passes=("unscale",))) - _accumulation(_plan(grad_dtype="fp16"))
    launch = 4 * _hw().device.launch_latency
    assert fp32 - launch == pytest.approx(2 * (fp16 - launch), rel=1e-9)


@pytest.mark.parametrize("passes", [("clip", "sharpen"), ("clip", "clip"), "clip"])
def test_a_bad_pass_list_is_a_one_line_plan_error(passes):
    with pytest.raises(PlanError, match="grad_passes") as err:
        validate(replace(_plan(), grad_passes=passes))
    assert "\n" not in str(err.value)


def test_tf1_bert_rows_name_what_optimization_py_runs():
    rows = [r for r in load_dataset() if r.source == "dle-bert-tf1"]
    assert len(rows) == 21
    for row in rows:
        amp = row.plan.dtype == "fp16"
        assert row.plan.grad_passes == (TF1_AMP if amp else ("global-norm", "clip")), row.id
        assert (row.plan.grad_dtype, row.plan.compression) == (("fp32", "fp16") if amp else (None, "none")), row.id


def test_the_dle_resnet_autocast_rows_cast_their_weights_every_micro_batch():
    """DeepLearningExamples ConvNets @7bdfc81d training.py:191 enters torch.cuda.amp.autocast once per iteration
    (micro-batch) only under AMP, and autocast.__exit__ drops its cache of fp16 weight casts: the AMP rows cast
    the weights in every micro-batch (amp-casts); the TF32 and FP32 rows run no autocast and cast nothing."""
    rows = [r for r in load_dataset() if r.source == "dle-resnet50"]
    assert len(rows) == 8
    for row in rows:
        assert row.plan.grad_passes == (("amp-casts",) if row.plan.dtype == "fp16" else ()), row.id


def test_the_weight_casts_cost_12_bytes_per_parameter_per_resnet_micro_batch():
    """ResNet-50 AMP, 8 micro-batches of 256 on one A100: fp32 -> fp16 (read 4, write 2) and the gradient back
    (read 2, write 4) over every parameter, plus one launch, in each micro-batch."""
    model, hw = load_model("resnet50"), load_hardware("dgx-a100")
    plan = Plan(devices=1, global_batch=2048, micro_batch=256, dtype="fp16", optimizer="momentum",
                grad_dtype="fp32")

    def accumulation(p: Plan) -> float:
        return StepModel(model, hw).predict(p).breakdown_s["compute/grad_accumulation"]

    bw = hw.device.memory_bandwidth * hw.device.eff("memory").peak
    added = accumulation(replace(plan, grad_passes=("amp-casts",))) - accumulation(plan)
    expected = 8 * (12 * float(model.total_params) / bw + hw.device.launch_latency)
    assert added == pytest.approx(expected, rel=1e-9)
