"""The cross-entropy implementations (`impl: fused | torch | megatron | te`) as the engine runs them: time ordering,
the vocabulary split, Megatron's three allreduces, no recomputation, and the one-line error for a bad value."""

import pytest

from dlperf.engine.layers import tp_uses
from dlperf.engine.stage import stage_cost
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model, model_from_dict

HW = load_hardware("dgx-a100")
VOCAB, SEQ = 50304, 1024


def _model(impl: str, dtype: str = "bf16"):
    return model_from_dict({
        "name": "lm-head", "input": ["seq", "hidden"], "dtype": dtype,
        "params": {"seq": SEQ, "hidden": 1024, "vocab": VOCAB},
        "layers": [{"op": "linear", "out": "vocab", "bias": False}, {"op": "cross_entropy", "impl": impl}],
    }, "<test>", {})


def _loss_use(impl: str, dtype: str = "bf16"):
    uses = tp_uses(_model(impl, dtype))
    return [u for u in uses if u.layer.op == "cross_entropy"]


def _loss_seconds(impl: str, tp: int = 1, dtype: str = "bf16", recompute: str = "none"):
    """Device seconds of the loss per micro-batch of 4 sequences (forward + backward + recompute)."""
    e = 2 if dtype == "bf16" else 4
    cost = stage_cost(_loss_use(impl, dtype), 4, e, HW, dtype, tp, False, recompute, lambda op, nbytes: 0.0)
    return cost.forward + cost.backward + cost.recompute


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_megatron_loss_is_slowest_and_the_fused_kernel_fastest(dtype):
    fused, torch_, megatron = (_loss_seconds(impl, dtype=dtype) for impl in ("fused", "torch", "megatron"))
    assert megatron > torch_ > fused > 0


def test_te_loss_costs_one_pass_and_a_few_launches_more_than_the_generic_fused_kernel():
    """TE's Triton loss makes 5 model-dtype passes over the logits (3 forward, 2 backward) where `fused` counts
    4, and stays well below the fp32 losses in a bf16 model."""
    fused, te, torch_ = (_loss_seconds(impl) for impl in ("fused", "te", "torch"))
    assert torch_ > te > fused


@pytest.mark.parametrize("impl", ["fused", "torch", "megatron", "te"])
def test_per_rank_logit_work_halves_when_tp_doubles(impl):
    """t(tp) = fixed + split / tp: the fixed part (launches, Megatron's per-token kernels) stays, the part over
    the [tokens, vocab/tp] logits halves with every doubling."""
    t2, t4, t8 = (_loss_seconds(impl, tp) for tp in (2, 4, 8))
    assert (t2 - t4) == pytest.approx(2 * (t4 - t8), rel=1e-9)
    assert t2 - t4 > 0


def test_megatron_issues_three_allreduces_of_one_fp32_value_per_token():
    (megatron,) = _loss_use("megatron")
    (fused,) = _loss_use("fused")
    rows = SEQ
    assert megatron.sharded and megatron.comm == (("fwd", "allreduce", 2 * rows),) * 3  # 2 bf16 elements = 4 B
    assert fused.comm == (("fwd", "allreduce", 2 * rows),)                               # as before


def test_full_recomputation_does_not_rerun_the_loss():
    assert _loss_seconds("megatron", recompute="full") == _loss_seconds("megatron", recompute="none")


def test_built_in_models_name_their_training_stacks_loss():
    impl = {name: dict(load_model(name).layers()[-1][0].attrs)["impl"]
            for name in ("gpt", "gpt3-175b", "gpt2-xl", "bert-large", "mpt", "llama3-8b", "deepseek-v3", "resnet50",
                         "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b")}
    assert impl == {"gpt": "megatron", "gpt3-175b": "megatron", "gpt2-xl": "megatron", "bert-large": "torch",
                    "mpt": "fused", "llama3-8b": "fused", "deepseek-v3": "te", "resnet50": "torch",
                    "qwen3-30b-a3b": "te", "qwen3-235b-a22b": "te", "gpt-oss-120b": "te"}


def test_an_unknown_impl_is_one_clear_line(run, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ninput: [8]\nlayers:\n  - {op: linear, out: 4}\n  - {op: cross_entropy, impl: megatorn}\n")
    code, out, err = run("show", str(path))
    assert code == 2 and err.count("\n") == 1, err
    assert "m.yaml:5" in err and "impl" in err and "fused, torch, megatron, te" in err and "megatorn" in err


def test_predict_splits_the_loss_over_the_tp_group_and_prices_its_allreduces():
    """The stage is priced as a list of top-level nodes: the loss must still see the output layer's vocabulary
    split (before, each node was walked from a replicated input and the loss ran whole on every rank)."""
    from dlperf.engine import predict
    from dlperf.plan import Plan

    model = load_model("gpt", {"hidden": 1024, "layers": 4, "heads": 16, "seq": 1024, "vocab": 50257})
    def loss(tp):
        r = predict(model, HW, Plan(devices=tp, tp=tp, global_batch=4, micro_batch=1))
        return r.per_type_s["cross_entropy"], r.breakdown_s["comm/tp"]
    (t1, c1), (t2, c2), (t4, c4), (t8, _) = (loss(tp) for tp in (1, 2, 4, 8))
    assert t1 > t2 > t4 > t8 and (t2 - t4) == pytest.approx(2 * (t4 - t8), rel=1e-9)
    assert c1 == 0 and c2 > 0
