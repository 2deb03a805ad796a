"""TensorFlow 1 BERT under XLA auto-clustering and the AMP graph rewrite (op attribute `xla`, residual `fused`, model
switch tf_xla in bert-large): each sublayer's bias add + tf.nn.dropout + residual add + LayerNorm runs as XLA's fused
kernels over the float32 tensors the AMP rewrite leaves there, and the tanh GELU as one fused kernel that also writes
its float32 tanh (dlperf.ops.elementwise, section comment above xla_residual_norm_kernels). The expected bytes below
are counted tensor by tensor from that derivation, not from the rows."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from dlperf.errors import SpecError
from dlperf.ops import OPS
from dlperf.ops.elementwise import FP32_SECTION_BYTES, RANDOM_TENSOR_BYTES, XLA_SOFTMAX_KERNELS
from dlperf.spec.model import load_model, model_from_dict
from dlperf.spec.yamlio import load_yaml_text
from dlperf.validate import load_dataset

TF1 = {"seq": 128, "mlm_positions": 20, "tf_dropout": True}
BATCH, SEQ, HIDDEN = 64, 128, 1024
N, ROWS = BATCH * SEQ * HIDDEN, BATCH * SEQ  # elements of a hidden-size tensor, rows of the LayerNorm


@functools.cache
def _bert(tf_xla: bool):
    return load_model("bert-large", {**TF1, "tf_xla": tf_xla})


def _layers(model, op: str):
    return [(layer, count) for layer, count in model.counted() if layer.op == op]


def _kernels(layer, e: int) -> dict:
    return {k.name: k for k in OPS[layer.op].kernels(layer, BATCH, e)}


def _encoder_norm(model):
    (layer, count), = [(lay, c) for lay, c in _layers(model, "layernorm") if c == 48]
    return layer


def test_the_switch_is_set_on_the_21_tensorflow_bert_rows_only():
    rows = load_dataset()
    tf1 = [r for r in rows if r.source == "dle-bert-tf1"]
    assert len(tf1) == 21 and all(r.sets.get("tf_xla") is True for r in tf1)
    assert not any(r.sets.get("tf_xla") for r in rows if r.source != "dle-bert-tf1")


def test_off_by_default_nothing_changes():
    plain = _bert(False)
    assert not any(layer.get("xla", False) or layer.get("fused", False) for layer, _ in plain.counted())
    for layer, _ in plain.counted():
        for e in (2, 4):
            assert not any(k.name.startswith("xla_") for k in OPS[layer.op].kernels(layer, BATCH, e)), layer


def test_the_encoders_48_sections_24_gelus_and_24_attention_cores_switch_and_nothing_else():
    model = _bert(True)
    switched = {(layer.op, count) for layer, count in model.counted() if layer.get("xla") or layer.get("fused")}
    # per layer: two dropouts, two residual adds, two LayerNorms in the sections, one GELU, one attention core; the
    # embedding's and the MLM head's LayerNorm, GELU and dropout are not of this form and stay as they were
    assert switched == {("dropout", 48), ("add", 48), ("layernorm", 48), ("gelu", 24), ("attention", 24)}


@pytest.mark.parametrize("e", [2, 4])
def test_dropout_and_residual_add_leave_their_work_to_the_layernorm(e):
    model = _bert(True)
    (drop, _), = [(lay, c) for lay, c in _layers(model, "dropout") if lay["xla"]]
    assert list(_kernels(drop, e)) == ["random_uniform"]  # the RandomUniform, outside the cluster, stays
    (add, _), = [(lay, c) for lay, c in _layers(model, "add") if lay.get("fused", False)]
    assert OPS["add"].kernels(add, BATCH, e) == ()


@pytest.mark.parametrize(("e", "fwd_per_element", "bwd_per_element"), [
    # AMP (GEMM side fp16): forward x+mean reads GEMM out 2, random 4, residual 4, writes x 4; variance reads x 4;
    # normalize reads x 4, writes 4 (f32 residual) + 2 (copy for the next GEMM) -> 28. Backward: row sums and
    # column sums each read GEMM grad 2, residual grad 4, x 4; input grad reads the same and random 4, writes the
    # residual grad 4 and the GEMM's input grad 2 -> 10 + 10 + 20 = 40
    (2, 2 + 4 + 4 + 4 + 4 + 4 + 4 + 2, 3 * (2 + 4 + 4) + 4 + 4 + 2),
    # TF32 (everything fp32): no copy for the next GEMM -> 28 and 12 + 12 + 24 = 48
    (4, 4 + 4 + 4 + 4 + 4 + 4 + 4, 3 * (4 + 4 + 4) + 4 + 4 + 4),
])
def test_layernorm_section_bytes_count_each_tensor_once_per_kernel(e, fwd_per_element, bwd_per_element):
    kernels = _kernels(_encoder_norm(_bert(True)), e)
    f = FP32_SECTION_BYTES
    row_terms = f * ROWS + 2 * f * ROWS + 2 * f * ROWS + 2 * f * ROWS  # mean, variance, inverse deviation per row
    assert sum(k.cost.fwd_bytes for k in kernels.values()) == fwd_per_element * N + row_terms
    assert sum(k.cost.bwd_bytes for k in kernels.values()) == bwd_per_element * N
    assert RANDOM_TENSOR_BYTES == 4 and f == 4


def test_layernorm_section_runs_four_forward_and_three_backward_kernels():
    kernels = _kernels(_encoder_norm(_bert(True)), 2)
    launches = [k.phase_launches for k in kernels.values()]
    assert sum(fwd for fwd, _ in launches) == 4  # x+mean, variance, inverse deviation, normalize (profile)
    assert sum(bwd for _, bwd in launches) == 3  # row sums, column sums, input gradient: one reduction kind each
    assert all(fwd + bwd == 1 for fwd, bwd in launches)


@pytest.mark.parametrize("e", [2, 4])
def test_gelu_writes_its_float32_tanh_and_reads_it_back(e):
    model = _bert(True)
    (gelu, count), = [(lay, c) for lay, c in _layers(model, "gelu") if lay["xla"]]
    n = 4 * N  # FFN width 4H
    kernels = _kernels(gelu, e)
    main, extra = kernels["xla_gelu"], kernels["xla_gelu_bias_grad_reads"]
    # forward: read GEMM out, write GELU for the next GEMM and the fp32 tanh; backward: read the GEMM grad, the
    # GEMM out and the tanh, write the grad for the GEMM before
    assert (main.cost.fwd_bytes, main.cost.bwd_bytes) == (n * (e + e + 4), n * (e + e + 4 + e))
    assert main.phase_launches == (1, 1)
    # the bias gradient's column sum reads the same three tensors: the linear's own pass reads one (e wide)
    assert extra.cost.bwd_bytes == n * (e + 4) and extra.phase_launches == (0, 0)
    plain = OPS["gelu"].kernels(_layers(_bert(False), "gelu")[0][0], BATCH, e)[0]
    assert main.cost.fwd_flops == plain.cost.fwd_flops and main.cost.bwd_data_flops == plain.cost.bwd_data_flops


MODEL = """\
name: m
source: test
input: [8]
params: {s: false}
layers:
  - {op: embedding, vocab: 10, dim: 16}
  - residual:
      - {op: linear, out: 16}
    fused: FUSED
  - {op: layernorm}
"""


@pytest.mark.parametrize(("value", "fused"), [("true", True), ("false", False), ("s", False)])
def test_a_residual_takes_fused_as_a_boolean_or_a_switch(value, fused):
    model = model_from_dict(load_yaml_text(MODEL.replace("FUSED", value), "m.yaml"), "m.yaml", {})
    (add, _), = [(lay, c) for lay, c in model.counted() if lay.op == "add"]
    assert add.get("fused", False) is fused
    switched = model_from_dict(load_yaml_text(MODEL.replace("FUSED", "s"), "m.yaml"), "m.yaml", {"s": True})
    assert [lay.get("fused", False) for lay, _ in switched.counted() if lay.op == "add"] == [True]


def test_a_residual_refuses_a_fused_that_is_not_a_boolean():
    with pytest.raises(SpecError, match="true or false") as err:
        model_from_dict(load_yaml_text(MODEL.replace("FUSED", "3"), "m.yaml"), "m.yaml", {})
    assert "\n" not in str(err.value)


# ---- the attention core: scale, mask add, softmax and dropout between the two GEMMs (xla_softmax_kernels) ----------
HEADS = 16
SCORES, SOFTMAX_ROWS = BATCH * HEADS * SEQ * SEQ, BATCH * HEADS * SEQ


def _attention(tf_xla: bool):
    (layer, count), = _layers(_bert(tf_xla), "attention")
    assert count == 24
    return layer


def test_the_attention_core_runs_xlas_five_kernels_around_the_random_uniform():
    names = [k.name for k in OPS["attention"].kernels(_attention(True), BATCH, 2)]
    core = names[names.index("scores"):names.index("attend") + 1]
    # the RandomUniform (outside the cluster), then the forward's scores-and-max, exp-and-sum and probabilities and
    # the backward's row sum and gradient; the plain softmax and dropout kernels are gone
    assert core == ["scores", "attn_random_uniform", *XLA_SOFTMAX_KERNELS, "attend"]
    plain = [k.name for k in OPS["attention"].kernels(_attention(False), BATCH, 2)]
    assert "softmax" in plain and "attn_dropout" in plain and not set(XLA_SOFTMAX_KERNELS) & set(plain)


@pytest.mark.parametrize(("e", "fwd_per_element", "bwd_per_element"), [
    # forward: max reads the GEMM out, writes the scores (2e); exp-and-sum reads them, writes exp (2e); probabilities
    # read exp and the random tensor, write the dropped probabilities (2e + 4). Backward: the row sum and the
    # gradient each read the incoming gradient, the random tensor and exp (2e + 4), the gradient writes e
    (2, 2 * 2 + 2 * 2 + 2 * 2 + 4, 2 * (2 * 2 + 4) + 2),
    (4, 2 * 4 + 2 * 4 + 2 * 4 + 4, 2 * (2 * 4 + 4) + 4),
])
def test_attention_core_bytes_count_each_tensor_once_per_kernel(e, fwd_per_element, bwd_per_element):
    kernels = _kernels(_attention(True), e)
    core = [kernels[name] for name in XLA_SOFTMAX_KERNELS]
    f = FP32_SECTION_BYTES
    # per row: max written and read, sum written and read by the probabilities; backward the sum read twice and the
    # gradient's float32 row sum written and read
    fwd_rows, bwd_rows = e + 2 * e + e, 2 * (e + f)
    assert sum(k.cost.fwd_bytes for k in core) == fwd_per_element * SCORES + fwd_rows * SOFTMAX_ROWS
    assert sum(k.cost.bwd_bytes for k in core) == bwd_per_element * SCORES + bwd_rows * SOFTMAX_ROWS
    assert kernels["attn_random_uniform"].cost.fwd_bytes == RANDOM_TENSOR_BYTES * SCORES


def test_attention_core_runs_three_forward_and_two_backward_kernels_with_the_plain_flops():
    kernels = _kernels(_attention(True), 2)
    core = [kernels[name] for name in XLA_SOFTMAX_KERNELS]
    assert [k.phase_launches for k in core] == [(1, 0), (1, 0), (1, 0), (0, 1), (0, 1)]
    plain = _kernels(_attention(False), 2)
    fwd = plain["softmax"].cost.fwd_flops + plain["attn_dropout"].cost.fwd_flops
    bwd = plain["softmax"].cost.bwd_data_flops + plain["attn_dropout"].cost.bwd_data_flops
    assert sum(k.cost.fwd_flops for k in core) == fwd and sum(k.cost.bwd_data_flops for k in core) == bwd


def test_attention_core_without_dropout_reads_no_random_tensor():
    layer = _attention(True)
    undropped = replace(layer, attrs=tuple((k, 0.0 if k == "dropout" else v) for k, v in layer.attrs))
    dropped, plain = _kernels(layer, 2), _kernels(undropped, 2)
    assert "attn_random_uniform" not in plain
    for name in XLA_SOFTMAX_KERNELS:
        # the probabilities and both backward kernels read the random tensor for the mask, nothing else does
        extra = sum(getattr(dropped[name].cost, b) - getattr(plain[name].cost, b) for b in ("fwd_bytes", "bwd_bytes"))
        assert extra == (RANDOM_TENSOR_BYTES * SCORES if name in XLA_SOFTMAX_KERNELS[2:] else 0)
