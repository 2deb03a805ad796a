"""DeepSeek-V3's memory-saving recipe, term by term (arXiv:2412.19437 Sec. 3.2.3 and 3.3; deepseek-ai/profile-data
@4496024 train.json, the profile of its own training framework at the pre-training settings):

- BF16 Adam moments beside FP32 master weights (`moment_dtype`), FP32 gradients (`grad_dtype`);
- one cached FP8 copy of each weight, transposed before the GEMMs that read the other layout (`fp8_weight_transpose:
  per_use`);
- the latents of MLA kept in BF16 when their RMSNorms are recomputed (the up-projections' inputs are rebuilt);
- a norm's output rebuilt for every layer that reads it, the gate and up projections of a SwiGLU MLP included;
- the published plan's fullest rank, pinned per term and per token of a MoE layer.
"""

from __future__ import annotations

import pytest

from dlperf.engine.memory import optimizer_bytes
from dlperf.engine.step import StepModel, optimizer_traffic
from dlperf.errors import PlanError
from dlperf.ops.base import Kernel
from dlperf.ops.fp8 import FP8, fp8_kernels, weight_cast_bytes, weight_copy_bytes
from dlperf.ops.recompute import E5M6, FP8_TILED, freed_bytes, norm_consumers
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

GiB = 2**30
HIDDEN, VOCAB = 4096, 128256
LAYER = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * 1024 + 3 * HIDDEN * 14336 + 2 * HIDDEN  # a llama3-8b layer's parameters


@pytest.fixture(scope="module")
def llama():
    return load_model("llama3-8b", {"layers": 4, "seq": 1024})


def _memory(model, plan: Plan, hw: str = "dgx-h100") -> dict:
    return StepModel(model, load_hardware(hw)).predict(plan).memory


@pytest.mark.parametrize(("optimizer", "moments"), [("adam", 2), ("momentum", 1)])
def test_bf16_moments_are_2_bytes_each_beside_the_fp32_master_weights(llama, optimizer, moments):
    params, dp = llama.total_params, 8
    plan = Plan(devices=dp, global_batch=dp, zero=1, dtype="bf16", optimizer=optimizer)
    fp32 = _memory(llama, plan)
    bf16 = _memory(llama, plan.with_(moment_dtype="bf16"))
    assert fp32["optimizer"] == pytest.approx((4 + 4 * moments) * params / dp)
    assert bf16["optimizer"] == pytest.approx((4 + 2 * moments) * params / dp)
    assert {k: bf16[k] for k in ("weights", "gradients")} == {k: fp32[k] for k in ("weights", "gradients")}
    assert optimizer_bytes(optimizer, "fp32", "bf16") == 2 * moments  # no master copy in fp32 training


def test_deepseek_states_per_parameter(llama):
    """Sec. 3.3.3: bf16 weights, fp32 gradients, fp32 master weights and bf16 moments (sharded by ZeRO-1) and, per
    the profile, one FP8 copy of each FP8 layer's weight: 2 + 4 + 8/dp + 1 bytes."""
    params, dp = llama.total_params, 8
    plan = Plan(devices=dp, global_batch=dp, zero=1, dtype="fp8", moment_dtype="bf16", grad_dtype="fp32",
                fp8_weight_transpose="per_use")
    memory = _memory(llama, plan)
    fp8_params = params - 2 * VOCAB * HIDDEN - HIDDEN  # the embedding, final norm and head stay bf16
    assert memory["weights"] == pytest.approx(2 * params)
    assert memory["gradients"] == pytest.approx(4 * params)
    assert memory["optimizer"] == pytest.approx(8 * params / dp)
    assert memory["fp8_weights"] == pytest.approx(1 * fp8_params)


def test_the_update_moves_fewer_bytes_with_bf16_moments():
    adam, momentum = Plan(), Plan(optimizer="momentum")
    assert (optimizer_traffic(adam), optimizer_traffic(adam.with_(moment_dtype="bf16"))) == (28, 20)
    assert (optimizer_traffic(momentum), optimizer_traffic(momentum.with_(moment_dtype="bf16"))) == (20, 16)
    assert optimizer_traffic(Plan(optimizer="sgd")) == 12


def test_bf16_moments_never_slower_never_more_memory(llama):
    step = StepModel(llama, load_hardware("dgx-h100"))
    plan = Plan(devices=8, global_batch=8, zero=1, dtype="bf16")
    fp32, bf16 = step.predict(plan), step.predict(plan.with_(moment_dtype="bf16"))
    assert bf16.breakdown_s["optimizer"] < fp32.breakdown_s["optimizer"]
    assert bf16.step_time_s <= fp32.step_time_s and bf16.memory["total"] < fp32.memory["total"]


@pytest.mark.parametrize(("changes", "words"), [
    ({"optimizer": "sgd", "moment_dtype": "bf16"}, "plain SGD keeps none"),
    ({"moment_dtype": "fp16"}, "moment_dtype"),
    ({"dtype": "mxfp8", "fp8_weight_transpose": "per_use"}, "--dtype fp8"),
    ({"dtype": "bf16", "fp8_weight_transpose": "per_use"}, "--dtype fp8"),
    ({"dtype": "fp8", "fp8_weight_transpose": "lazy"}, "fp8_weight_transpose"),
])
def test_rules(changes, words):
    with pytest.raises(PlanError, match=words):
        validate(Plan(devices=8, global_batch=8).with_(**changes))


@pytest.mark.parametrize("args, words", [
    (["--moment-dtype", "bf16", "--optimizer", "sgd"], "plain SGD keeps none"),
    (["--fp8-weight-transpose", "per_use", "--dtype", "bf16"], "--dtype fp8"),
])
def test_cli_bad_input_one_line_exit_2(capsys, args, words):
    from dlperf.cli import main

    with pytest.raises(SystemExit) as bad:
        main(["predict", "llama3-8b", "dgx-h100", "--gpus", "8", "--global-batch", "8", *args])
    assert bad.value.code == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_one_fp8_copy_per_weight_with_per_use_transposes(llama):
    """Four stages of a 4-layer Llama: the fullest holds one layer's FP8 weights, twice over when the transpose is
    cached, once when it is made per GEMM."""
    plan = Plan(devices=4, pp=4, global_batch=4, dtype="fp8")
    cached = _memory(llama, plan)
    per_use = _memory(llama, plan.with_(fp8_weight_transpose="per_use"))
    assert cached["fp8_weights"] == pytest.approx(2 * FP8 * LAYER)
    assert per_use["fp8_weights"] == pytest.approx(FP8 * LAYER)
    assert weight_copy_bytes("fp8", "per_use") == 1 and weight_copy_bytes("fp8") == 2
    assert weight_cast_bytes("fp8", "per_use") == 2 + 1 and weight_cast_bytes("fp8") == 2 + 2


def test_per_use_transpose_kernels_follow_the_profile():
    """One transpose per weight GEMM and micro-batch, reading and writing each FP8 weight byte: forward for the
    routed experts' grouped GEMMs, backward (before the data-gradient GEMM) for every other weight."""
    from dlperf.cost import Cost

    dense = Kernel("fc1", "matmul", Cost(fwd_flops=1.0), weight_gemm=(64, 128, 256))
    experts = Kernel("experts_fc1", "matmul", Cost(fwd_flops=1.0), weight_gemm=(64, 128, 256), weight_groups=4,
                     expert=True)
    cached = fp8_kernels([dense, experts], 2)
    per_use = fp8_kernels([dense, experts], 2, transpose="per_use")
    added = [k for k in per_use if k not in cached]
    assert [k.name for k in added] == ["fc1_fp8_weight_transpose", "experts_fc1_fp8_weight_transpose"]
    (dense_t, expert_t) = added
    assert (dense_t.cost.fwd_bytes, dense_t.cost.bwd_bytes) == (0, 2 * 128 * 256)
    assert (dense_t.launches, dense_t.bwd_launches) == (0, 1)
    assert (expert_t.cost.fwd_bytes, expert_t.cost.bwd_bytes) == (2 * 4 * 128 * 256, 0)
    assert (expert_t.launches, expert_t.bwd_launches) == (1, 0) and not expert_t.expert


def test_per_use_transposes_cost_time_and_save_memory(llama):
    step = StepModel(llama, load_hardware("dgx-h100"))
    plan = Plan(devices=8, global_batch=8, zero=1, dtype="fp8")
    cached, per_use = step.predict(plan), step.predict(plan.with_(fp8_weight_transpose="per_use"))
    assert per_use.breakdown_s["compute/backward"] > cached.breakdown_s["compute/backward"]
    assert per_use.breakdown_s["optimizer"] < cached.breakdown_s["optimizer"]  # the per-step cast writes one copy
    assert per_use.memory["fp8_weights"] == pytest.approx(cached.memory["fp8_weights"] / 2)


@pytest.fixture(scope="module")
def deepseek():
    return load_model("deepseek-v3", {"layers": 6, "dense_layers": 2, "seq": 1024})


def test_latents_stay_16_bit_when_their_norms_are_recomputed(deepseek):
    """FP8 caching keeps the up-projections' inputs, the latents, in FP8; with the latent RMSNorms recomputed those
    inputs are rebuilt and the norms' own inputs, the latents, stay BF16 (the profile's attention backward reruns
    the 1536- and 512-wide RMSNorms on BF16 inputs)."""
    mla = next(layer for layer, _ in deepseek.counted() if layer.op == "mla")
    s, d, h = 1024, 7168, 128
    latents = 1536 + 512

    def fp8_saves(modules: frozenset) -> float:
        return freed_bytes(mla, 2, modules, True, True) - freed_bytes(mla, 2, modules, False, True)

    assert fp8_saves(frozenset()) == pytest.approx(s * ((2 - FP8_TILED) * (d + latents) + (2 - E5M6) * h * 128))
    assert fp8_saves(frozenset({"layernorm"})) == pytest.approx(s * (2 - E5M6) * h * 128)  # O alone
    assert freed_bytes(mla, 2, frozenset({"layernorm"}), True, True) == pytest.approx(
        s * (2 * d + (2 - E5M6) * h * 128))


def test_swiglu_projections_after_a_norm_keep_no_input_when_it_reruns(deepseek):
    """The dense layers' gate and up projections open the branches after the pre-MLP RMSNorm: with the norm
    recomputed neither keeps its (FP8) input."""
    consumers = {layer.name for layer in norm_consumers(deepseek.root)}
    assert {"gate_proj", "up_proj", "mla", "moe"} <= consumers
    gate = next(layer for layer, _ in deepseek.counted() if layer.name == "gate_proj")
    assert freed_bytes(gate, 2, frozenset({"layernorm"}), True, True, FP8) == pytest.approx(1024 * 7168 * FP8)
    assert freed_bytes(gate, 2, frozenset({"layernorm"}), True, False, FP8) == 0


@pytest.fixture(scope="module")
def report_row():
    from dlperf import validate as V

    return {r.id: r for r in V.load_dataset()}["deepseek-v3-h800-pretraining"]


def test_report_recipe_per_token_of_a_moe_layer(report_row):
    """A middle DualPipe stage of the published plan holds 4 MoE layers; per token and layer it keeps:
    attention: the layer input (2 x 7168, RMSNorm recomputed), the q and kv latents (2 x (1536 + 512), BF16) and the
    rope key (2 x 64), the output projection's input in E5M6 (1.5 x 128 x 128) and the log-sum-exp (4 x 128);
    MoE: its input (2 x 7168), fp32 router scores (4 x 256), per routed copy the dispatched token and the SwiGLU input
    in FP8 with 1x128 scales ((7168 + 2 x 2048) x 1.03125) and its fp32 routing weight (4), and the shared expert's
    SwiGLU input (2 x 2048 x 1.03125)."""
    model = load_model(report_row.model, report_row.sets)
    step = StepModel(model, load_hardware(report_row.hardware))
    stages = step.stages(report_row.plan, "fp8", 2)[0]
    attention = 2 * 7168 + 2 * (1536 + 512) + 2 * 64 + E5M6 * 128 * 128 + 4 * 128
    moe = 2 * 7168 + 4 * 256 + 8 * ((7168 + 2 * 2048) * FP8_TILED + 4) + 2 * 2048 * FP8_TILED
    assert (attention, moe) == (43_648, 112_544)
    assert stages[1].saved_bytes == pytest.approx(4 * 4096 * (attention + moe))


def test_report_plan_fullest_rank(report_row):
    """The published plan (2048 H800, PP 16 DualPipe, EP 64, ZeRO-1, FP8): the fullest rank is pipeline rank 0
    (stages 0 and 15: the embedding, three dense layers and the output head among them). Per term: bf16 weights,
    fp32 gradients (twice the weights' bytes), the FP8 copies, 16 in-flight micro-batches through stage 0 and 1
    through stage 15; 79.4 GiB in all, 0.3 GiB over the 79.1 GiB an H800 exposes (hardware/h800.yaml)."""
    model = load_model(report_row.model, report_row.sets)
    step = StepModel(model, load_hardware(report_row.hardware))
    prediction = step.predict(report_row.plan)
    memory = prediction.memory
    stages = step.stages(report_row.plan, "fp8", 2)[0]
    rank0 = stages[0] + stages[-1]
    assert memory["weights"] == pytest.approx(2 * rank0.params)
    assert memory["gradients"] == pytest.approx(4 * rank0.params)
    assert memory["fp8_weights"] == pytest.approx(FP8 * rank0.fp8_params)
    assert memory["activations"] == pytest.approx(16 * stages[0].saved_bytes + stages[-1].saved_bytes)
    assert {k: round(memory[k] / GiB, 2) for k in memory} == {
        "weights": 9.19, "gradients": 18.38, "optimizer": 1.11, "fp8_weights": 2.87, "activations": 43.07,
        "buffers": 0.05, "reserved": 4.73, "total": 79.41}
    assert not prediction.fits
