"""TensorFlow's tf.nn.dropout (op attribute random_tensor, model switch tf_dropout in bert-large): a RandomUniform
kernel of its own writes the uniform numbers as float32 and the dropout reads them back, 4 + 4 bytes per element
forward (NVIDIA/tensorflow r1.15.2+nv20.06 nn_ops.py dropout_v2; XLA does not auto-cluster stateful random ops,
compilability_check_util.cc), where PyTorch draws them inside the dropout kernel."""

from __future__ import annotations

import functools

import pytest

from dlperf.engine.device import startup_time
from dlperf.engine.step import StepModel
from dlperf.ops import OPS
from dlperf.ops.elementwise import RANDOM_TENSOR_BYTES
from dlperf.plan import Plan
from dlperf.spec.model import load_model
from dlperf.validate import load_dataset
from tests.test_grad_passes import _hw

TF1 = {"seq": 128, "mlm_positions": 20}


@functools.cache
def _bert(tf_dropout: bool):
    return load_model("bert-large", {**TF1, "tf_dropout": tf_dropout})


def _kernels(model, op: str) -> dict[str, tuple]:
    """name -> (kernel, use count) of the model's `op` layers, at micro-batch 1 in fp16."""
    out: dict[str, tuple] = {}
    for layer, count in model.layers():
        if layer.op == op:
            for kernel in OPS[op].kernels(layer, 1, 2):
                key = f"{layer.name}/{kernel.name}"
                out[key] = (kernel, out.get(key, (kernel, 0))[1] + count)
    return out


def test_the_random_tensor_is_float32_under_amp_too():
    assert RANDOM_TENSOR_BYTES == 4  # random_uniform(dtype=x.dtype) on the fp32 graph; AMP paints no random op


@pytest.mark.parametrize("op", ["dropout", "attention"])
def test_each_dropout_element_costs_a_written_and_a_read_float32_forward_only(op):
    plain, tf = _kernels(_bert(False), op), _kernels(_bert(True), op)
    draws = {k: v for k, v in tf.items() if k.endswith("random_uniform")}
    assert draws and set(tf) - set(plain) == set(draws)
    for name, (kernel, _) in draws.items():
        layer = name.split("/")[0]
        consumer = f"{layer}/attn_dropout" if op == "attention" else f"{layer}/dropout"
        n = kernel.cost.fwd_bytes / RANDOM_TENSOR_BYTES  # elements drawn
        before, after = plain[consumer][0].cost, tf[consumer][0].cost
        assert after.fwd_bytes - before.fwd_bytes == RANDOM_TENSOR_BYTES * n  # the dropout reads them back
        assert after.bwd_bytes == before.bwd_bytes and kernel.cost.bwd_bytes == 0
        assert kernel.phase_launches == (1, 0)


def test_bert_large_draws_for_its_73_dropouts():
    # embeddings + 24 x (attention probabilities, attention output, FFN output): modeling.py's dropout() sites
    draws = {**_kernels(_bert(True), "dropout"), **_kernels(_bert(True), "attention")}
    assert sum(c for k, (_, c) in draws.items() if k.endswith("random_uniform")) == 1 + 3 * 24


def test_the_forward_grows_by_the_drawn_bytes_over_the_memory_rate():
    hw, b, s, h, heads, layers = _hw(), 64, 128, 1024, 16, 24
    plan = Plan(devices=1, global_batch=b, micro_batch=b, dtype="fp16", optimizer="adam")
    plain = StepModel(_bert(False), hw).predict(plan).breakdown_s
    tf = StepModel(_bert(True), hw).predict(plan).breakdown_s
    elements = b * (s * h * (1 + 2 * layers) + heads * s * s * layers)
    eff = hw.device.eff("memory")
    bw = hw.device.memory_bandwidth * eff.peak
    draws = 1 + 3 * layers  # one RandomUniform launch each, with the memory curve's startup
    per_draw = startup_time(eff, hw.device.memory_bandwidth) + hw.device.launch_latency
    expected = 2 * RANDOM_TENSOR_BYTES * elements / bw + draws * per_draw
    assert tf["compute/forward"] - plain["compute/forward"] == pytest.approx(expected, rel=1e-6)
    assert tf["compute/backward"] == plain["compute/backward"]


def test_only_the_tensorflow_bert_rows_draw_apart():
    rows = load_dataset()
    tf1 = [r for r in rows if r.source == "dle-bert-tf1"]
    assert len(tf1) == 21 and all(r.sets.get("tf_dropout") is True for r in tf1)
    assert not any(r.sets.get("tf_dropout") for r in rows if r.source != "dle-bert-tf1")
