"""A `{block: ..., precision: bf16}` call keeps the layers built inside it out of an FP8 or FP4 recipe
(Megatron-Bridge's keep_mtp_spec_in_bf16): they are distinct from the equal layers built elsewhere, their GEMMs
run in bf16, they cache no FP8 weight copies and their weights are neither cast nor gathered in FP8."""

from __future__ import annotations

import pytest

from dlperf.engine.layers import tp_uses
from dlperf.engine.stage import StageCost, use_kernels
from dlperf.engine.step import StepModel, _fp8_gather_bytes
from dlperf.errors import SpecError
from dlperf.ops.fp8 import FP8_GEMM, OPERAND_BYTES, fp8_layers, kernel_dtype
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import model_from_dict

S, D, F, V = 256, 512, 2048, 1000
BLOCK_PARAMS = 2 * D * F + D  # up, down (no biases) and the norm


def _model(second: dict | None = None, params: dict | None = None):
    """An embedding, two calls of one MLP block (the second with `second`'s keys), the head and the loss."""
    doc = {"name": "t", "input": ["seq"], "dtype": "bf16", "params": {"seq": S, "hidden": D, "vocab": V},
           "blocks": {"mlp": {"layers": [{"residual": [
               {"op": "rmsnorm"}, {"op": "linear", "out": F, "bias": False}, {"op": "relu"},
               {"op": "linear", "out": "hidden", "bias": False}]}]}},
           "layers": [{"op": "embedding", "vocab": "vocab", "dim": "hidden"}, {"block": "mlp"},
                      {"block": "mlp", **(second or {})}, {"op": "linear", "out": "vocab", "bias": False},
                      {"op": "cross_entropy"}]}
    return model_from_dict(doc, "t.yaml", params or {})


def test_a_bf16_block_is_distinct_and_left_out_of_the_fp8_layers() -> None:
    plain, kept = _model(), _model({"precision": "bf16"})
    linears = [layer for layer, _ in kept.counted() if layer.op == "linear" and layer.out_shape[-1] == F]
    assert [layer.precision for layer in linears] == ["", "bf16"] and linears[0] != linears[1]
    assert [n for layer, n in plain.counted() if layer.op == "linear" and layer.out_shape[-1] == F] == [2]
    inside = fp8_layers(kept.root)
    assert linears[0] in inside and linears[1] not in inside
    assert all(not layer.precision for layer in inside)
    assert kept.total_params == plain.total_params


def test_a_bf16_block_prices_its_gemms_on_the_bf16_curve_under_an_fp8_plan() -> None:
    hw, model = load_hardware("dgx-h100"), _model({"precision": "bf16"})
    inside = fp8_layers(model.root)
    for use in tp_uses(model):
        if use.layer.op != "linear" or use.layer.params != D * F:
            continue
        kernels = use_kernels(use, 1, 2, hw, "fp8", 1, use.layer in inside)
        classes = {k.cls for k in kernels}
        dtypes = {kernel_dtype(k, "fp8") for k in kernels}
        if use.layer.precision:
            assert FP8_GEMM not in classes and dtypes == {"bf16"}
        else:
            assert FP8_GEMM in classes and "fp8" in dtypes


def test_a_bf16_block_holds_no_fp8_copies_and_changes_nothing_outside_a_recipe() -> None:
    hw = load_hardware("dgx-h100")
    plan = Plan(devices=1, global_batch=2, micro_batch=1)
    plain, kept = StepModel(_model(), hw), StepModel(_model({"precision": "bf16"}), hw)
    bf16 = [m.predict(plan.with_(dtype="bf16")) for m in (plain, kept)]
    assert bf16[0].step_time_s == pytest.approx(bf16[1].step_time_s, rel=1e-12)
    assert bf16[0].memory == pytest.approx(bf16[1].memory, rel=1e-12)
    fp8 = [m.predict(plan.with_(dtype="fp8")) for m in (plain, kept)]
    copies = 2 * OPERAND_BYTES["fp8"]  # the FP8 weight and its transpose
    assert fp8[0].memory["fp8_weights"] == pytest.approx(copies * 2 * BLOCK_PARAMS)
    assert fp8[1].memory["fp8_weights"] == pytest.approx(copies * BLOCK_PARAMS)
    assert kept.fp8_share == pytest.approx(plain.fp8_share / 2)


def test_a_bf16_block_gathers_its_weights_in_bf16_under_fp8_param_gather() -> None:
    """A quarter of the stage's parameters kept in bf16: 75 one-byte FP8 weights and 25 two-byte ones."""
    stage = StageCost(params=100, bf16_params=25)
    assert _fp8_gather_bytes(stage, 100, "fp8") == pytest.approx(75 * 1 + 25 * 2)
    assert _fp8_gather_bytes(stage, 40, "nvfp4") == pytest.approx(30 * OPERAND_BYTES["nvfp4"] + 10 * 2)
    assert _fp8_gather_bytes(StageCost(params=100), 100, "fp8") == 100


@pytest.mark.parametrize("bad", ["fp8", "BF16", True, 16])
def test_a_bad_precision_is_a_one_line_spec_error(bad) -> None:
    with pytest.raises(SpecError) as err:
        _model({"precision": bad})
    assert "precision" in str(err.value) and "bf16" in str(err.value) and len(str(err.value).splitlines()) == 1
