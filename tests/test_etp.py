"""Expert tensor parallelism (plan `etp`, Megatron-Core's --expert-tensor-parallel-size) and MoE parallel folding
(Liu et al. 2025, arXiv:2504.14960): the experts on a grid of their own, etp x ep x edp over the stage's
tp x dp x cp ranks. etp unset is tp, today's plan to the last bit; etp 1 runs each rank's routed copies through
unsplit experts, the ep group spanning tensor-parallel ranks (megatron/core/parallel_state.py @92c8482e:743-763)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import dlperf.comm as comm
from dlperf.engine import predict
from dlperf.engine.context import Parallel
from dlperf.engine.layers import tp_uses
from dlperf.engine.stage import kernel_split, stage_cost, use_kernels
from dlperf.engine.step import StepModel, _parallel
from dlperf.errors import PlanError
from dlperf.ops import OPS
from dlperf.ops.moe import moe_kernels, routed_expert_kernel
from dlperf.plan import Plan, validate
from dlperf.search import SearchSpace, search
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from tests.test_moe import _flat_hardware
from tests.test_monotone import CONSTANTS, faster


def _deepseek():
    return load_model("deepseek-v3", {"layers": 6, "dense_layers": 2, "seq": 1024})


def _moe(model):
    return next(layer for layer, _ in model.counted() if layer.op == "moe")


def _outcome(model, hw, plan: Plan) -> tuple:
    p = predict(model, hw, plan)
    return p.step_time_s, p.breakdown_s, p.memory, p.per_type_s


# (model, hardware, plan): tensor, expert, context and pipeline parallelism, DualPipe, ZeRO, FP8 and HybridEP
SAME = [
    ("mixtral-8x7b", "dgx-h100", Plan(devices=32, tp=2, ep=8, global_batch=64, micro_batch=1, zero=1,
                                      sequence_parallel=True, tp_overlap=True)),
    ("qwen3-30b-a3b", "dgx-h100", Plan(devices=16, tp=4, ep=2, cp=2, global_batch=16, micro_batch=1, zero=1,
                                       sequence_parallel=True, dtype="fp8", ep_dispatcher="hybridep")),
    ("deepseek", "h800", Plan(devices=64, tp=2, pp=2, ep=16, global_batch=128, micro_batch=1, schedule="dualpipe",
                              zero=1, moe_imbalance=1.0, ep_dispatcher="deepep", dtype="fp8")),
    ("llama2-7b", "dgx-a100", Plan(devices=16, tp=4, pp=2, global_batch=32, micro_batch=1, zero=3)),
]


@pytest.mark.parametrize(("name", "hw", "plan"), SAME)
def test_etp_equal_to_tp_is_the_plan_without_it_to_the_last_bit(name, hw, plan):
    """etp unset means the experts split as tp splits the dense layers (Megatron-Core's default expert tp,
    megatron/training/arguments.py @92c8482e:465-466): written out, it changes no step time, breakdown, memory or
    per-layer-type time. (tests/test_validate.py checks every validation row the same way.)"""
    model, hardware = (_deepseek() if name == "deepseek" else load_model(name)), load_hardware(hw)
    assert _outcome(model, hardware, plan.with_(etp=plan.tp)) == _outcome(model, hardware, plan)
    assert plan.with_(etp=plan.tp).expert_data_parallel == plan.expert_data_parallel


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("ep", [1, 4])
def test_expert_flops_over_the_expert_grid_are_the_unsplit_layers(dtype, ep):
    """A tensor-parallel group's tp ranks run, between them, exactly the routed experts' work of the unsplit layer
    on its tokens, folded or not: tp-split GEMMs on every routed copy (etp = tp), or whole GEMMs on each rank's own
    1/tp of the copies (etp 1); the FP8 casts that ride with the expert GEMMs too."""
    model, hw, tp, batch = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100"), 4, 2
    use = next(u for u in tp_uses(model, sp=True) if u.layer.op == "moe")
    fp8 = dtype == "fp8"

    def flops(kernels, split) -> float:
        return sum((k.cost.fwd_flops + k.bwd_flops) / split(k) for k in kernels if routed_expert_kernel(k))

    whole = flops(use_kernels(use, batch, 2, hw, dtype, 1, fp8), lambda k: 1)
    for etp in (None, 1):
        par = Parallel(ep=ep, etp=etp)
        fold = tp if etp else 1
        kernels = use_kernels(use, batch, 2, hw, dtype, tp, fp8, ep, fold=fold)
        per_rank = flops(kernels, lambda k, fold=fold, par=par: kernel_split(k, tp, True, fold, par))
        assert tp * per_rank == pytest.approx(whole, rel=1e-12)


def test_folded_experts_read_their_whole_weights_on_a_share_of_the_tokens():
    """moe_kernels(fold=f) builds the routed experts' GEMMs on 1/f of the routed rows with whole weights: the
    forward GEMM of a rank holding 8 experts reads 8 [d, 2f] matrices whatever f, and its m shrinks f-fold."""
    layer = _moe(load_model("qwen3-30b-a3b"))
    one, four = (next(k for k in moe_kernels(layer, 2, 2, 8, fold=f) if k.name == "expert_gate_up") for f in (1, 4))
    assert four.weight_gemm[0] * 4 == one.weight_gemm[0] and four.weight_gemm[1:] == one.weight_gemm[1:]
    assert four.weight_groups == one.weight_groups == 8
    assert four.cost.fwd_flops * 4 == pytest.approx(one.cost.fwd_flops, rel=1e-12)


@pytest.mark.parametrize("ep", [4, 8])
def test_folded_alltoall_volume_matches_analytic_count(ep):
    """With etp 1 each rank dispatches its own sequence-parallel shard (tokens/tp x top_k x hidden x bytes x
    (ep-1)/ep per all-to-all, four of them per layer and micro-batch) and the routing probabilities (fp32, one per
    routed copy) forward and back, over ep ranks next to each other; ep 8 over tp 2 x dp 4 is wider than dp. On a
    flat network doubling the sequence adds exactly that volume's time."""
    hw, rate = _flat_hardware()
    tp = 2
    plan = Plan(devices=8, tp=tp, ep=ep, etp=1, sequence_parallel=True, global_batch=8, micro_batch=1, zero=1,
                moe_imbalance=1.0)
    times = [predict(load_model("mixtral-8x7b", {"seq": seq}), hw, plan).breakdown_s["comm/ep"]
             for seq in (4096, 8192)]
    tokens, top_k, hidden, e = 4096, 2, 4096, 2  # the extra tokens per sample
    per_direction = tokens / tp * top_k * hidden * e * (ep - 1) / ep
    probs = [comm.collective_time("alltoall", n / tp * top_k * 4, comm.Group(ep, 1), hw) for n in (4096, 8192)]
    expected = 32 * (4 * per_direction / rate + 2 * (probs[1] - probs[0])) * plan.micro_batches
    assert times[1] - times[0] == pytest.approx(expected, rel=1e-9)


def test_ep_group_lies_expert_tp_apart_on_the_network():
    """Megatron-Core orders the expert grid tp-ep-dp with the expert tp innermost (parallel_state.py @92c8482e:527,
    755-763): at etp = tp = 2 the ep ranks are 2 apart, at etp 1 next to each other. On 8-GPU DGX H100 nodes EP 32
    at etp 1 spans 4 nodes, as EP 16 at etp 2 does; EP 4 at etp 1 stays in one node and uses 4 of its GPUs."""
    hw = load_hardware("dgx-h100")
    base = Plan(devices=256, tp=2, pp=8, global_batch=256, micro_batch=1, sequence_parallel=True)
    assert _parallel(comm, hw, base.with_(ep=32, etp=1)).ep_nodes == 4
    assert _parallel(comm, hw, base.with_(ep=16)).ep_nodes == 4
    assert _parallel(comm, hw, base.with_(ep=16, etp=1)).ep_nodes == 2
    assert _parallel(comm, hw, base.with_(ep=4, etp=1)).ep_nodes == 1


def test_folded_memory_per_device_is_experts_over_ep_times_etp():
    """Expert weights and gradients per device: experts / ep x (expert size / etp); their optimizer states shard
    over the expert-data-parallel group EDP = tp*dp*cp / (ep*etp) (parallel_state.py @92c8482e:743-752), which
    with ZeRO-1 leaves the same states per device as the dense-style split: both divide them over all tp*dp ranks."""
    model, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    experts = 32 * OPS["moe"].expert_params(_moe(model))
    base = Plan(devices=16, tp=2, global_batch=16, micro_batch=1, zero=1, sequence_parallel=True)
    split, folded = base.with_(ep=1), base.with_(ep=8, etp=1)
    assert (split.expert_data_parallel, folded.expert_data_parallel) == (8, 2)
    a, b = predict(model, hw, split).memory, predict(model, hw, folded).memory
    assert a["weights"] - b["weights"] == pytest.approx(2 * experts * (1 / 2 - 1 / 8), rel=1e-9)
    assert a["gradients"] - b["gradients"] == pytest.approx(2 * experts * (1 / 2 - 1 / 8), rel=1e-9)
    assert b["optimizer"] == pytest.approx(a["optimizer"], rel=1e-12)
    # EP 8 at etp 1 holds what EP 4 at etp = tp 2 holds: experts / 8 per device
    assert predict(model, hw, base.with_(ep=4)).memory["weights"] == pytest.approx(b["weights"], rel=1e-12)


def test_folded_experts_drop_the_layers_tensor_parallel_collectives_but_the_shared_experts():
    """The routed experts' dispatcher gathers and reduce-scatters over the expert tp group only (token_dispatcher.py
    @92c8482e:692-701, 775-782): at etp 1 a MoE layer without shared experts runs no tensor-parallel collective;
    shared experts are a dense MLP on the attention's tp group (shared_experts.py @92c8482e:52) and keep theirs."""
    hw = load_hardware("dgx-h100")
    tp = 2
    tp_time = lambda op, nbytes: comm.collective_time(op, nbytes, comm.Group(tp, 1), hw)  # noqa: E731
    for name, kept in (("mixtral-8x7b", False), ("deepseek", True)):
        model = _deepseek() if name == "deepseek" else load_model(name)
        use = next(u for u in tp_uses(model, sp=True) if u.layer.op == "moe")
        split, folded, dense_pair = (
            stage_cost([use], 1, 2, hw, "bf16", tp, True, "none", tp_time, par=Parallel(ep=1, etp=etp, ep_dispatcher=d))
            for etp, d in ((None, "alltoall"), (1, "alltoall"), (None, "hybridep")))
        assert split.tp_comm_fwd > dense_pair.tp_comm_fwd > 0  # the routed copies' gather is top_k times wider
        assert (folded.tp_comm_fwd, folded.tp_comm_bwd) == (
            (dense_pair.tp_comm_fwd, dense_pair.tp_comm_bwd) if kept else (0, 0))


def test_split_experts_gather_the_routed_copies_over_tp():
    """At expert tp = tp the all-to-all dispatcher all-gathers the routed copies and their fp32 probabilities over
    the tp group after the all-to-all and reduce-scatters the routed outputs (token_dispatcher.py @92c8482e:676-701):
    top_k times a dense layer's hidden-state pair, plus the shared experts' pair; the flex dispatchers keep the
    dense pair (they send over the tp x ep ranks themselves)."""
    from dlperf.engine.stage import _tp_collectives
    from dlperf.ops.base import numel

    for name in ("mixtral-8x7b", "deepseek"):
        model = _deepseek() if name == "deepseek" else load_model(name)
        use = next(u for u in tp_uses(model, sp=True) if u.layer.op == "moe")
        layer, dense = use.layer, use.comm
        k, tokens = layer["top_k"], numel(layer.in_shape[:-1])
        routed = _tp_collectives(use, 1, "alltoall").comm
        expected = tuple((p, op, k * n) for p, op, n in dense) + (
            ("fwd", "allgather", 2 * k * tokens), ("bwd", "reduce_scatter", 2 * k * tokens))
        assert routed == expected + (dense if layer["shared_experts"] else ())
        assert _tp_collectives(use, 1, "deepep") == _tp_collectives(use, 1, "hybridep") == use


@pytest.mark.parametrize("constant", CONSTANTS)
def test_faster_hardware_never_slower_with_folded_experts(constant):
    model, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    plan = Plan(devices=32, tp=2, ep=8, etp=1, global_batch=64, micro_batch=1, zero=1, sequence_parallel=True,
                tp_overlap=True)
    base = predict(model, hw, plan).step_time_s
    assert predict(model, faster(hw, constant, 2.0), plan).step_time_s <= base * (1 + 1e-12)


def test_memos_never_mix_folded_and_split_experts():
    """StepModel's stage, communication and memory memos key on the expert tp: one StepModel pricing the split
    plan and then the folded one (and the other way) gives what a fresh one gives."""
    model, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    split = Plan(devices=32, tp=2, ep=8, global_batch=64, micro_batch=1, zero=1, sequence_parallel=True)
    folded = split.with_(etp=1)
    for first, then in ((split, folded), (folded, split)):
        shared = StepModel(model, hw)
        shared.timeline(first)
        got, want = shared.timeline(then), StepModel(model, hw).timeline(then)
        assert (got.step_time_s, got.breakdown_s, got.memory) == (want.step_time_s, want.breakdown_s, want.memory)


@pytest.mark.parametrize(("changes", "message"), [
    ({"etp": 3}, r"etp=3 must divide tp=4"),
    ({"etp": 2}, r"etp=2: dlperf prices the experts split as the dense layers or not at all"),
    ({"etp": 0}, r"etp must be a positive integer"),
    ({"etp": 1, "ep": 16}, r"ep\*etp = 16 must divide tp\*dp\*cp = 8"),
    ({"etp": 1, "sequence_parallel": False}, r"etp=1 < tp=4 needs --sequence-parallel"),
    ({"etp": 1, "dp_impl": "post-backward"}, r"priced for a flat data-parallel group"),
])
def test_expert_grid_plan_errors(changes, message):
    plan = Plan(devices=8, tp=4, ep=2, global_batch=8, sequence_parallel=True).with_(**changes)
    with pytest.raises(PlanError, match=message):
        validate(plan)


def test_folded_experts_need_a_moe_model():
    with pytest.raises(PlanError, match="etp=1 < tp=2 splits experts apart from the dense layers: llama2-7b has no"):
        predict(load_model("llama2-7b"), load_hardware("dgx-h100"),
                Plan(devices=8, tp=2, etp=1, sequence_parallel=True, global_batch=8))


def test_ep_wider_than_dp_needs_etp():
    """EP 32 over TP 2 x DP 16, the Megatron-Bridge Qwen3-235B H100 layout: refused with the experts split as the
    dense layers (ep carved out of dp*cp), a plan at etp 1."""
    plan = Plan(devices=256, tp=2, pp=8, ep=32, global_batch=256, micro_batch=1, sequence_parallel=True)
    with pytest.raises(PlanError, match="ep=32 must divide the data-parallel degree dp=16"):
        validate(plan)
    assert validate(plan.with_(etp=1)).expert_data_parallel == 1


def test_cli_etp(run):
    """--etp 1 lets ep reach past dp (EP 16 over TP 2 x DP 8); without it the plan is refused, and without
    --sequence-parallel too, each in one line with exit code 2."""
    args = ["predict", "qwen3-30b-a3b", "dgx-h100", "--gpus", "16", "--tp", "2", "--ep", "16", "--global-batch",
            "16", "--micro-batch", "1", "--zero", "1", "--sequence-parallel"]
    code, _, err = run(*args)
    assert code == 2 and err.strip().startswith("Error: ep=16 must divide the data-parallel degree dp=8")
    code, out, err = run(*args, "--etp", "1", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["plan"]["etp"], data["plan"]["ep"], data["plan"]["dp"]) == (1, 16, 8)
    code, out, _ = run(*args, "--etp", "1")
    assert code == 0 and "dp=8 tp=2 pp=1 ep=16 etp=1" in out
    code, _, err = run(*args[:-1], "--etp", "1")
    assert code == 2
    assert err.strip().splitlines() == [
        "Error: etp=1 < tp=2 needs --sequence-parallel (Megatron-Core's MoE layer refuses tensor parallelism without "
        "it in training, moe_layer.py @92c8482e:288-292)"]


def test_search_tries_folded_experts_and_agrees_with_predict():
    """On a MoE model at tp > 1 the search tries the experts unsplit (etp 1, with sequence parallelism) beside the
    dense layers' split, ep then up to tp*dp; every plan it ranks is predict's."""
    model, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    space = SearchSpace(zero=(1,), recompute=("none",), max_micro_batch=1, schedules=("1f1b",))
    result = search(model, hw, 16, 32, space=space)
    plans = [ev.plan for ev in result.ranked]
    folded = [p for p in plans if p.etp == 1]
    assert folded and all(p.tp > 1 and p.sequence_parallel for p in folded)
    assert any(p.ep > p.data_parallel for p in folded)  # ep over the tensor-parallel ranks too
    assert not any(ev.plan.etp == 1 for ev in search(model, hw, 16, 32, space=replace(space, etp=(None,))).ranked)
    for ev in [ev for ev in result.ranked if ev.plan.etp == 1][:10]:
        assert predict(model, hw, ev.plan).step_time_s == pytest.approx(ev.step_time_s, rel=1e-9)
