"""CUDA graphs (plan `cuda_graphs`, dlperf.engine.cuda_graphs): a graphed scope removes exactly its kernels' host
cost and adds one dispatch per replay; an eager plan is priced as before."""

from __future__ import annotations

import pytest

from dlperf import builtins
from dlperf.engine import predict
from dlperf.engine.cuda_graphs import PREPROCESS_KERNELS, ROUTER_KERNELS, Graphs, kernel_graphed
from dlperf.engine.device import dispatch_times
from dlperf.engine.layers import tp_uses
from dlperf.engine.stage import stage_cost, use_kernels
from dlperf.errors import PlanError
from dlperf.ops.base import Kernel
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

HW = load_hardware("gb200-nvl72")


def _stage(model: str, graphs: Graphs | None, batch: int = 1, sets: dict | None = None) -> object:
    uses = tp_uses(load_model(model, {"seq": 1024} if sets is None else sets))
    return stage_cost(uses, batch, 2, HW, "bf16", 1, False, "none", lambda op, n: 0.0, graphs=graphs)


def _host(model: str, op: str, names: tuple[str, ...] | None = None) -> tuple[float, float, int]:
    """(forward, backward) eager host seconds of `op`'s kernels (only `names` when given), summed over the model's
    uses with their counts, and the op's occurrences."""
    fwd = bwd = 0.0
    count = 0
    for use in tp_uses(load_model(model, {"seq": 1024})):
        if use.layer.op != op:
            continue
        count += use.count
        for kernel in use_kernels(use, 1, 2, HW, "bf16", 1):
            if names is None or kernel.name in names:
                f, b = dispatch_times(kernel, HW.device)
                fwd, bwd = fwd + use.count * f, bwd + use.count * b
    return fwd, bwd, count


@pytest.mark.parametrize("model", builtins.builtin_names("models"))
def test_an_eager_plan_is_priced_as_before(model):
    """No scope: every stage cost field equals the one priced without the graphs argument."""
    eager = _stage(model, None, sets={})
    empty = _stage(model, Graphs(), sets={})
    assert eager.__dict__ == empty.__dict__


def test_router_scopes_remove_exactly_the_router_and_preprocess_host_and_add_two_replays_per_layer():
    """Qwen3-30B-A3B (48 MoE layers, all-to-all dispatcher): moe_router + moe_preprocess removes the router and
    first-permute kernels' host cost and the pre-MLP half of the norms and residual adds, and adds one forward
    and one backward replay per layer."""
    eager, graphed = _stage("qwen3-30b-a3b", None), _stage("qwen3-30b-a3b", Graphs(("moe_router", "moe_preprocess")))
    moe_f, moe_b, layers = _host("qwen3-30b-a3b", "moe", ROUTER_KERNELS + PREPROCESS_KERNELS)
    norm_f, norm_b, _ = _host("qwen3-30b-a3b", "rmsnorm")
    add_f, add_b, _ = _host("qwen3-30b-a3b", "add")
    final_f, final_b = dispatch_times(use_kernels(tp_uses(load_model("qwen3-30b-a3b", {"seq": 1024}))[-3], 1, 2, HW,
                                                  "bf16", 1)[0], HW.device)
    assert layers == 48
    removed_f = moe_f + (norm_f - final_f) / 2 + add_f / 2
    removed_b = moe_b + (norm_b - final_b) / 2 + add_b / 2
    assert graphed.host_fwd == pytest.approx(eager.host_fwd - removed_f + 48 * HW.device.dispatch_forward, rel=1e-12)
    assert graphed.host_bwd == pytest.approx(eager.host_bwd - removed_b + 48 * HW.device.dispatch_backward, rel=1e-12)
    assert graphed.forward == eager.forward and graphed.backward == eager.backward  # device time untouched


def test_full_iteration_leaves_one_replay_per_step():
    """Everything captured: the host issues one graph per step (spread over its micro-batches), nothing else."""
    graphed = _stage("llama3-8b", Graphs(("full_iteration",), micro_batches=4))
    assert graphed.host_fwd == pytest.approx(HW.device.dispatch_forward / 4)
    assert graphed.host_bwd == 0.0


def test_a_synchronising_kernel_is_never_graphed():
    from dlperf.cost import Cost

    use = tp_uses(load_model("qwen3-30b-a3b", {"seq": 1024}))[5]
    assert use.layer.op == "moe"
    sync = Kernel("router", "memory", Cost(), syncs=1)
    assert not kernel_graphed(Graphs(("full_iteration",)), use, sync, "alltoall")
    assert not kernel_graphed(Graphs(("moe_router",)), use, sync, "alltoall")
    assert kernel_graphed(Graphs(("moe_router",)), use, Kernel("router", "memory", Cost()), "alltoall")


def test_moe_scope_needs_drop_and_pad_and_preprocess_needs_the_router():
    use = tp_uses(load_model("qwen3-30b-a3b", {"seq": 1024}))[5]
    from dlperf.cost import Cost

    assert not kernel_graphed(Graphs(("moe",)), use, Kernel("permute", "memory", Cost()), "alltoall")  # dropless
    assert not kernel_graphed(Graphs(("moe_router", "moe_preprocess")), use, Kernel("permute", "memory", Cost()),
                              "hybridep")  # the flex dispatcher permutes inside its own dispatch
    with pytest.raises(PlanError, match="needs moe_router"):
        validate(Plan(cuda_graphs=("moe_preprocess",)))
    with pytest.raises(PlanError, match="distinct names"):
        validate(Plan(cuda_graphs=("attn", "attn")))


def test_graphs_speed_a_host_bound_step_and_never_slow_it():
    """A host-bound MoE step (micro-batch 1) gets faster as scopes widen; the eager plan is the slowest."""
    model = load_model("qwen3-30b-a3b", {"seq": 1024})
    base = Plan(devices=8, ep=8, global_batch=64, micro_batch=1, dtype="bf16")
    times = [predict(model, HW, base.with_(cuda_graphs=scopes)).step_time_s for scopes in
             ((), ("moe_router", "moe_preprocess"), ("attn", "moe_router", "moe_preprocess"), ("full_iteration",))]
    assert times == sorted(times, reverse=True) and times[-1] < times[0]


def test_search_runs_every_plan_with_the_graphs_it_is_given(run):
    """`dlperf search --cuda-graphs` prices each plan with those scopes: on a host-bound model capturing more is
    never slower, the whole iteration fastest; a bad scope is one line, exit 2, before any plan is tried."""
    import json

    tiny = ["search", "gpt", "dgx-a100", "--gpus", "8", "--global-batch", "8", "--set", "layers=4", "--set",
            "hidden=128", "--set", "heads=2", "--set", "seq=128", "--set", "vocab=1000", "--format", "json"]
    best = {}
    for scopes in ("", "attn", "full_iteration"):
        code, out, err = run(*tiny, *(["--cuda-graphs", scopes] if scopes else []))
        assert code == 0, err
        best[scopes] = json.loads(out)["plans"][0]["step_time_s"]
    assert best["full_iteration"] < best["attn"] < best[""]
    code, _, err = run(*tiny, "--cuda-graphs", "attn,bogus")
    assert code == 2 and "bogus" in err and err.count("\n") == 1


def test_a_hybrid_stack_graphs_each_layer_on_its_own() -> None:
    """Nemotron 3 Nano (23 Mamba-2, 23 MoE, 6 attention layers, each one sublayer of Megatron-Core's MambaStack)
    under its recipes' scopes attn, mamba, moe_router, moe_preprocess: every layer's norm and add is captured with
    its layer (the share was counted per attention, 2 x 6 sublayers for 52 norms, and went over 1), one replay per
    captured layer each way; "mamba" (CudaGraphScope.mamba) takes the mixers' host cost away."""
    from dlperf.engine.cuda_graphs import graphed_layers, sublayer_share

    uses = tp_uses(load_model("nemotron-3-nano", {"seq": 1024}))
    full = Graphs(("attn", "mamba", "moe_router", "moe_preprocess"))
    assert sublayer_share(full, uses) == 1.0
    assert sublayer_share(Graphs(("attn",)), uses) == pytest.approx(6 / 52)
    assert graphed_layers(full, uses) == 52 and graphed_layers(Graphs(("attn",)), uses) == 6
    sets = {"seq": 1024}
    eager, attn, graphed = (_stage("nemotron-3-nano", g, sets=sets) for g in (None, Graphs(("attn",)), full))
    assert 0 < graphed.host_fwd < attn.host_fwd < eager.host_fwd
    assert 0 < graphed.host_bwd < attn.host_bwd < eager.host_bwd
    assert graphed.forward == eager.forward and graphed.backward == eager.backward  # host cost only


def test_mamba_scope_is_a_plan_name() -> None:
    validate(Plan(cuda_graphs=("attn", "mamba")))
    with pytest.raises(PlanError, match="cuda_graphs"):
        validate(Plan(cuda_graphs=("mambas",)))
