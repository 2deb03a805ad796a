"""Megatron's FusedScaleMaskSoftmax dispatch (`softmax: megatron`, dlperf/ops/dense.py): its fused kernel where
is_kernel_available allows it, PyTorch ops (fp32 casts, scale, mask, softmax) where it does not."""

from pathlib import Path

import pytest

from dlperf.engine.layers import Use
from dlperf.engine.stage import use_kernels
from dlperf.engine.step import StepModel
from dlperf.engine.symbolic import step_time_expr
from dlperf.ops import OPS
from dlperf.ops.base import Layer
from dlperf.ops.dense import _batches_per_block, megatron_fused_softmax
from dlperf.plan import Plan
from dlperf.spec.model import load_model
from dlperf.validate import DATA_DIR, load_dataset

GPT = Path(__file__).resolve().parents[1] / "models" / "gpt.yaml"


def _attention(**attrs) -> Layer:
    rule = OPS["attention"]
    full = dict(rule.attrs)
    full.update(head_dim=64, kv_heads=attrs["heads"], out=1024, kv_seq=1024)
    full.update(attrs)
    in_shape = (1024, 1024)
    return Layer("attention", tuple(sorted(full.items())), in_shape, rule.shape(in_shape, full), "attention",
                 rule.params(in_shape, full))


def test_batches_per_block_is_megatrons_get_batch_per_block():
    # scaled_masked_softmax.h: 128 threads, warps of min(32, 2^ceil(log2 sk)), 2 rows a warp up to 128 columns
    assert [_batches_per_block(sk) for sk in (16, 64, 128, 129, 1024, 4096)] == [16, 8, 8, 4, 4, 4]


@pytest.mark.parametrize("batch, heads, sq, sk, e, causal, fused", [
    (1, 2, 1024, 1024, 2, True, False),     # vTrain's TP 8 at micro-batch 1: 2 score rows, not a multiple of 4
    (2, 2, 1024, 1024, 2, True, True),
    (1, 4, 1024, 1024, 2, True, True),
    (2, 3, 2048, 2048, 2, True, False),     # 48 heads on 16 ranks at micro-batch 2: 6 rows
    (1, 16, 8192, 8192, 2, True, False),    # sk above 4096
    (1, 16, 16, 16, 2, True, False),        # sk not above 16
    (1, 16, 1024, 1024, 4, True, False),    # fp32 input
    (1, 12, 64, 64, 2, True, False),        # 12 rows, but 8 a block at sk 64
    (1, 12, 64, 64, 2, False, True),        # the padding-mask kernel tests sq instead
    (1, 2, 64, 64, 2, False, False),        # ... after b x heads % 4, which it refuses here
])
def test_fused_softmax_rule_follows_is_kernel_available(batch, heads, sq, sk, e, causal, fused):
    assert megatron_fused_softmax(batch, heads, sq, sk, e, causal) is fused


def _fused_before_july_2023(batch: int, heads: int, sq: int, sk: int, e: int) -> bool:
    """FusedScaleMaskSoftmax.forward's test in Megatron-DeepSpeed before its July 2023 rebase
    (microsoft/Megatron-DeepSpeed @7491937e megatron/model/fused_softmax.py lines 132-137: custom_kernel_constraint,
    the test vTrain's own copy keeps, VIA-Research/vTrain @f8dda847 src/model/fused_softmax.py lines 129-134):
    16 < sk <= 2048, sq % 4 == 0, b x heads-per-rank % 4 == 0 and fp16/bf16 input; no batches_per_block test."""
    return e == 2 and 16 < sk <= 2048 and sq % 4 == 0 and (batch * heads) % 4 == 0


def test_vtrain_multi_node_shapes_fuse_under_either_megatron_deepspeed():
    # Which Megatron-DeepSpeed vTrain's multi-node runs used is not published; at their shapes (sequence 2048,
    # micro-batch 2-64, 2-48 heads per rank) the older forward() test and is_kernel_available agree, and only the
    # 18.4B model at TP 16 micro-batch 2 (48 / 16 = 3 heads x 2 = 6 score rows) falls back to PyTorch's softmax.
    rows = [r for r in load_dataset([DATA_DIR / "vtrain2024.yaml"]) if r.source == "vtrain-multi-node"]
    refused = []
    for row in rows:
        heads, seq, tp, mb = row.sets["heads"], row.sets["seq"], row.plan.tp, row.plan.micro_batch
        now = megatron_fused_softmax(mb, heads // tp, seq, seq, 2, True)
        assert now is _fused_before_july_2023(mb, heads // tp, seq, seq, 2), row.id
        if not now:
            refused.append(row.id)
    assert len(rows) == 109
    assert refused == ["vtrain-mn-L41-18.4b-g256-tp16-dp16-pp1-mb2-gb1024"]


def _kernels(layer: Layer, batch: int, tp: int, e: int = 2) -> list:
    return use_kernels(Use(layer, 1, True), batch, e, None, "fp16" if e == 2 else "fp32", tp)


def test_fallback_replaces_only_the_softmax_and_adds_launches():
    layer = _attention(heads=16, causal=True, dropout=0.1, softmax="megatron")
    fused = _kernels(layer, 2, 8)
    assert fused == list(OPS["attention"].kernels(layer, 2, 2))       # 4 rows: the fused kernel
    torch = _kernels(layer, 1, 8)
    names = [k.name for k in torch]
    assert "softmax_torch_steps" in names and names.count("softmax") == 1
    steps = torch[names.index("softmax_torch_steps")]
    assert steps.phase_launches == (4, 4)    # fp32 cast, scale, masked_fill_, fp16 cast; their autograd steps
    assert [k.name for k in _kernels(layer, 1, 8, e=4)].count("softmax_torch_steps") == 1
    assert [k for k in _kernels(layer, 1, 8, e=4) if k.name == "softmax_torch_steps"][0].phase_launches == (2, 2)
    plain = _attention(heads=16, causal=True, dropout=0.1)                 # softmax: fused (the default)
    assert _kernels(plain, 1, 8) == list(OPS["attention"].kernels(plain, 1, 2))


def _gpt(tmp_path: Path, softmax: str, **overrides):
    path = tmp_path / f"gpt-{softmax}.yaml"
    path.write_text(GPT.read_text().replace("softmax: megatron", f"softmax: {softmax}"))
    return load_model(str(path), {"hidden": 1024, "heads": 16, "layers": 4, "seq": 1024, **overrides})


@pytest.mark.parametrize("tp, micro_batch, heads", [(8, 1, 16), (8, 2, 16), (4, 1, 16), (2, 1, 6), (1, 1, 2),
                                                    (4, 3, 16), (8, 3, 24)])
def test_megatron_softmax_never_makes_a_plan_faster(tmp_path, a100, tp, micro_batch, heads):
    plan = Plan(devices=8, tp=tp, global_batch=8 // tp * micro_batch * 2, micro_batch=micro_batch,
                recompute="full", dtype="fp16", optimizer="adam")
    hidden = 64 * heads
    fused = StepModel(_gpt(tmp_path, "fused", heads=heads, hidden=hidden), a100).predict(plan).step_time_s
    megatron = StepModel(_gpt(tmp_path, "megatron", heads=heads, hidden=hidden), a100).predict(plan).step_time_s
    assert megatron >= fused
    same = megatron_fused_softmax(micro_batch, heads // tp, 1024, 1024, 2, True)
    assert (megatron == fused) is same


def test_closed_form_keeps_the_fused_softmax(tmp_path, a100):
    # 2 heads: B = 1 would fall back, but B is a symbol in the closed form
    assert step_time_expr(_gpt(tmp_path, "megatron", heads=2), a100, "fp16") is not None
