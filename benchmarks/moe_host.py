"""Host time of Megatron-Core's own MoE layer, forward and backward, on the CPU device at the smallest widths.

dlperf prices a MoE layer's host time as (operators it counts) x (per-operator host cost of a dense Megatron layer,
benchmarks/host_ops.py). This script measures the MoE layer itself: Megatron-Core's MoELayer (TopKRouter,
MoEAlltoAllTokenDispatcher, GroupedMLP) built from the Megatron-LM source tree given by --mcore (exported from
NVIDIA/Megatron-LM @92c8482e, the commit Megatron-Bridge @97ad8cc6f pins for its Qwen3 recipes, dlperf/ops/moe.py),
with Qwen3-30B-A3B's routing settings (Megatron-Bridge models/qwen/qwen3_moe_bridge.py: moe_grouped_gemm,
moe_router_load_balancing_type aux_loss, moe_aux_loss_coeff 1e-3, moe_router_pre_softmax False,
moe_token_dispatcher_type alltoall; the performance recipes' moe_router_force_load_balancing True; router in fp32
as dlperf's ROUTER_DTYPE), 128 experts top-8, dropless, SwiGLU experts, bf16 parameters, at hidden 16 and expert
ffn 16 over a few tokens so the CPU's arithmetic is negligible: what is timed is Python, ATen dispatch and
autograd. By default with the TE fusions the rows' recipes turn on (Megatron-Bridge @97ad8cc6f:
scripts/performance/configs/qwen/qwen3_llm_pretrain.py lines 66 and 83 moe_router_fusion = True,
src/megatron/bridge/models/qwen/qwen_provider.py line 396 moe_permute_fusion: bool = True; GPT-OSS:
gpt_oss_llm_pretrain.py line 38, models/gpt_oss/gpt_oss_provider.py line 73), each TE kernel replaced by a
stand-in (install_te_stand_ins, below); --unfused runs Megatron-Core's PyTorch router and permutation instead.
One thread (torch.set_num_threads(1)); each run is the mean of --passes passes, and the script prints the
minimum and the median over --runs runs (the minimum is the floor: interference only adds time) with the
1-minute load average before and after. It also counts the ATen operators each pass issues (TorchDispatchMode),
as host_ops.py does.

    python3 -m venv /tmp/mcore-venv && /tmp/mcore-venv/bin/pip install <torch 2.13 CPU wheel> numpy packaging
    git --git-dir=<Megatron-LM mirror> archive 92c8482e megatron/core | tar -x -C /tmp/mcore-92c
    /tmp/mcore-venv/bin/python benchmarks/moe_host.py --mcore /tmp/mcore-92c [--experts 16] [--aux-loss none]

Fused path (TE stand-ins), printed on the Intel Emerald Rapids VM (family 6 model 207, 2 vCPUs shared with another
worker's pytest; spec/hardware.py speed 0.966 of the reference), Megatron-LM @92c8482e, torch 2.13.0+cpu, 32
tokens, 21 runs x 50 passes per invocation, invocations repeated over 20 minutes (most started when the 1-minute
load was below 1.5, else after waiting 60 s; loads 1.26-2.73 over them); host ms per layer, the minimum over all
invocations' minima and the median of their medians:
    128 experts, aux_loss (53 / 65 ATen ops): forward min 0.788 median 1.160, backward min 0.719 median 1.060 (18)
    16 experts, aux_loss (53 / 64 ATen ops):  forward min 0.765 median 1.099, backward min 0.674 median 0.984 (18)
    128 experts, aux none (GPT-OSS's router):  forward min 0.772 median 1.126, backward min 0.740 median 1.103 (16)
    16 experts, aux none:                      forward min 0.631 median 0.972, backward min 0.604 median 0.943 (16)
(in parentheses the number of invocations; single invocations' minima ranged 0.79-1.38 ms forward at 128 experts
with aux_loss, so the floors are good to ~5% at best: the 128- and 16-expert floors with aux_loss differ by 3%;
without the aux loss the 128-expert floor is no lower than with it, where the 16-expert one is 18% lower, so
the 128-expert aux-none floor was likely not reached). Unfused in the same session (--unfused, 3
invocations): 128 experts forward min 1.840 median 2.445,
backward min 1.515 median 2.091 (77 / 457 ATen ops); 16 experts 1.105 / 1.774, 0.915 / 1.503 (77 / 120).
Forward sections at 128 experts, aux_loss (--sections: perf_counter around the module methods, median of 500
passes, the smallest of 6 invocations, us): router 323 (gating 86, routing 181), dispatch_preprocess (permute) 93,
token_dispatch 24, dispatch_postprocess (chunk sort) 34, experts 290, combine_preprocess (chunk sort) 39,
token_combine 14, combine_postprocess (unpermute) 25; at 16 experts: 284 (77, 170), 89, 24, 33, 280, 38, 14, 24.
Of the experts' forward, the compiled SwiGLU with probabilities (activation_func_with_probs: torch.compile's
guards and call) took 110 us in the quietest of 3 later invocations (experts 280, router 312 in it).
The stand-ins issue one operator more than TE's kernels for each kernel that writes two tensors (the permute and
the chunk sort with probabilities: two gathers each way): 2 of the 53 forward and 2 of the 65 backward operators.

Unfused (--unfused; an earlier session, a more loaded VM, 7 runs x 50 passes, median):
    128 experts top-8, 32 tokens:  77 / 457 ATen ops, host ms per layer forward 2.572, backward 2.238
    128 experts top-8, 128 tokens: 77 / 457 ATen ops, forward 2.725, backward 1.915
    16 experts top-8, 32 tokens:   77 / 120 ATen ops, forward 1.320, backward 1.106
    16 experts top-8, 128 tokens:  77 / 120 ATen ops, forward 1.752, backward 1.446
(the same settings varied up to 1.5x between runs: 128 experts, 32 tokens, forward 1.81-2.75 ms, backward
1.45-2.24; 16 experts forward 1.17-2.02, backward 0.90-1.71). The unfused chunk sort splits the tokens into
experts x ep chunks and concatenates them (torch.split + torch.cat over 128 pieces; backward narrows and cat),
per-chunk host work TE's fused sort does not have: most of the unfused 128- vs 16-expert difference.

How the measurement differs from the GPU run (each shim is a difference):
- Expert parallelism 1: one process cannot run the all-to-alls, so the dispatcher's ep > 1 work (the splits'
  sums and device-to-host copies, the collectives' Python) is not in it (the chunk sorts run: 128 local experts); with
  --experts 128 the layer holds all 128 experts (--experts 16 runs the 16 per rank of EP 8 as a 16-expert layer
  with the same top-k: the same ATen operator count forward, fewer chunks in the unfused chunk sort).
- No Transformer Engine (a CPU build has none). Its fused kernels are stand-ins, each a torch.autograd.Function
  (the shape of TE's own Python: an autograd.Function around its Triton or CUDA launches, TE v2.9 @70f53666, the
  release Megatron-Bridge @97ad8cc6f pins) issuing one ATen operator per kernel TE launches, with Megatron-Core's
  call shapes (moe_utils.py @92c8482e), so the figures count Megatron-Core's Python plus one dispatch per fused
  kernel; TE's own Python around its launches (argument checks, torch.empty of its outputs, Triton's launcher)
  and the driver's launch call are not in them (dlperf adds LAUNCH_CALL per launch):
  - fused_topk_with_score_function and fused_compute_score_for_moe_aux_loss (router.py, one kernel each way):
    TopkStandIn, a softmax forward, a multiply backward, returning a balanced routing map built once per shape
    (routing_indices, the spread the recipes' forced load balancing gives);
  - fused_moe_aux_loss (one kernel each way): AuxLossStandIn, a sum forward, an expand backward;
  - moe_permute_with_probs (mask map: make_row_id_map's three Triton kernels and permute_with_mask_map forward,
    unpermute_with_mask_map backward): PermuteStandIn, three torch.empty for the map passes and two gathers
    (index_select, take) forward, two gathers backward;
  - moe_unpermute without merging probabilities (one kernel each way): UnpermuteStandIn, one index_select each way;
  - moe_sort_chunks_by_index[_with_probs] (make_chunk_sort_map + sort_chunks_by_map forward, one
    sort_chunks_by_map backward): SortChunksStandIn, an arange and one index_select per output forward, one per
    gradient backward.
  Under moe_permute_fusion the dispatcher's __init__ puts its chunk indices on "cuda" (token_dispatcher.py line
  404), so the fusion flags are set after construction (build_layer). Not stood in: the router GEMM's
  te_general_gemm (patch_router_gemm: Megatron-Core's PyTorch branch, two casts to fp32, a transpose and
  torch.mm forward where TE makes one call, and their backward). The experts are Megatron-Core's GroupedMLP
  (legacy grouped GEMM path) instead of
  TEGroupedMLP, with `grouped_gemm.ops.gmm` shimmed by GroupedGemmShim (one ATen GEMM per GEMM forward and two
  backward, as the grouped_gemm package's one C++ call, against one expert's weight): TE's per-expert C++ loop
  and GroupedLinear's per-expert Python are not in it (dlperf charges the C++ part separately,
  per_expert_gemm_host).
- torch.cuda stream shims (FakeStream): the dispatcher's side stream for its device-to-host copies, current_stream,
  the stream context and record_event/synchronize are no-ops here; on a GPU each is a small CUDA runtime call.
- torch.cuda.current_device returns "cpu" (only used to place parameters; use_cpu_initialization is set anyway).
- moe_utils.te_general_gemm defined as None (patch_router_gemm): Megatron-Core leaves it undefined without TE.
- A gloo process group of world size 1 and parallel_state initialised with tp = pp = ep = 1.
- The SwiGLU-with-probabilities is Megatron-Core's jit_fuser (torch.compile on torch >= 2.2), compiled for the
  CPU: the compiled function's guard check and call are timed, as on a GPU, but its C++ kernel stands in for a
  Triton launch.
- No CUDA launch call and no CUDA caching allocator: the backward in particular runs cheaper than on a GPU host
  (spec/hardware.py BACKWARD_HOST_RATIO).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from typing import Any

import torch
from op_count import CountOps  # benchmarks/op_count.py: run as a script, this folder is on sys.path

HIDDEN, FFN = 16, 16  # small enough that 128 experts' weight gradients (128 x 3 x 16 x 16) cost next to nothing


class GroupedGemmShim(torch.autograd.Function):
    """grouped_gemm.ops.gmm(a, b, batch_sizes, trans_b) (fanshiqing/grouped_gemm: an autograd.Function around one
    C++ grouped GEMM forward, two backward) as one ATen GEMM each against the first expert's weight: the shapes
    of the real call, but not its per-expert work. CPU torch._grouped_mm loops over the groups in C++ (an
    aten::mm, slices and an item() per expert: 80% of the layer's host time at 128 experts under the profiler),
    a cost a GPU grouped GEMM does not have in that form; dlperf prices the per-expert launches of TE's grouped
    GEMM separately (per_expert_gemm_host), so what is measured here is the operator dlperf's DEFAULT_DISPATCH
    covers: one call per GEMM and pass."""

    @staticmethod
    def forward(ctx: Any, a: Any, b: Any, batch_sizes: Any, trans_b: bool) -> Any:
        ctx.save_for_backward(a, b)
        ctx.trans_b = trans_b
        first = b[0].t() if trans_b else b[0]
        return torch.mm(a, first)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        a, b = ctx.saved_tensors
        first = b[0].t() if ctx.trans_b else b[0]
        grad_a = torch.mm(grad, first.t())
        grad_first = torch.mm(a.t(), grad)
        grad_b = (grad_first.t() if ctx.trans_b else grad_first).expand(b.shape)
        return grad_a, grad_b, None, None


class FakeStream:
    """torch.cuda.Stream / Event stand-in: every call a no-op."""

    def wait_stream(self, other: Any) -> None:
        return None

    def record_event(self) -> FakeStream:
        return self

    def synchronize(self) -> None:
        return None

    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def install_shims() -> None:
    """The shims the module docstring lists: grouped_gemm, torch.cuda streams and current_device."""
    gg = types.ModuleType("grouped_gemm")
    gg.ops = types.SimpleNamespace(gmm=lambda a, b, batch_sizes, trans_b=False: GroupedGemmShim.apply(
        a, b, batch_sizes, trans_b))
    sys.modules["grouped_gemm"] = gg
    stream = FakeStream()
    torch.cuda.Stream = lambda *a, **k: stream
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.stream = lambda s: stream
    torch.cuda.current_device = lambda: "cpu"


_INDEX_CACHE: dict[tuple, Any] = {}


def routing_indices(tokens: int, experts: int, top_k: int) -> Any:
    """A balanced routing (token t to experts (t k + j) mod E, the force-load-balancing recipes' spread) as the
    tensors the stand-ins gather with, built once per shape (during the warm-up, outside the timed passes):
    the bool [t, E] routing map, each routed row's token and flat [t x E] score index in expert order, each
    token's first row, and a row index per score (any valid one: it only shapes the probabilities' gradient)."""
    key = (tokens, experts, top_k)
    if key not in _INDEX_CACHE:
        chosen = (torch.arange(tokens)[:, None] * top_k + torch.arange(top_k)[None, :]) % experts
        routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, chosen, True)
        expert_of_pair, token_of_pair = routing_map.t().nonzero(as_tuple=True)
        first_row = torch.zeros(tokens, dtype=torch.long).scatter_reduce(
            0, token_of_pair, torch.arange(token_of_pair.numel()), "amin", include_self=False)
        row_of_score = torch.arange(tokens * experts).remainder(token_of_pair.numel()).view(tokens, experts)
        _INDEX_CACHE[key] = types.SimpleNamespace(
            routing_map=routing_map, token_of_row=token_of_pair, score_of_row=token_of_pair * experts + expert_of_pair,
            first_row=first_row, row_of_score=row_of_score)
    return _INDEX_CACHE[key]


class TopkStandIn(torch.autograd.Function):
    """TE fused_topk_with_score_function / fused_compute_score_for_moe_aux_loss (transformer_engine/pytorch/router.py
    at TE v2.9: an autograd.Function around one CUDA kernel forward, one backward): one aten softmax forward (the
    scores) and one multiply backward; the routing map is the balanced one of routing_indices (no operator)."""

    @staticmethod
    def forward(ctx: Any, logits: Any, top_k: int) -> Any:
        probs = torch.softmax(logits, dim=-1)
        routing_map = routing_indices(logits.shape[0], logits.shape[1], top_k).routing_map
        ctx.save_for_backward(probs)
        ctx.mark_non_differentiable(routing_map)
        return probs, routing_map

    @staticmethod
    def backward(ctx: Any, grad_probs: Any, grad_map: Any) -> Any:
        (probs,) = ctx.saved_tensors
        return torch.mul(grad_probs, probs), None


class AuxLossStandIn(torch.autograd.Function):
    """TE fused_moe_aux_loss (router.py at TE v2.9: one kernel each way): one aten sum forward, one expand backward."""

    @staticmethod
    def forward(ctx: Any, probs: Any) -> Any:
        ctx.shape = probs.shape
        return torch.sum(probs)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad.expand(ctx.shape)


class PermuteStandIn(torch.autograd.Function):
    """TE moe_permute_with_probs, mask map (permutation.py _moe_permute_mask_map at TE v2.9: make_row_id_map's
    three Triton kernels, then permute_with_mask_map writing tokens and probabilities in one; backward one
    unpermute_with_mask_map): three torch.empty of the row-id map's shape forward for the three map passes, then
    one gather per output (index_select for the tokens, take for the probabilities: one operator more than TE's
    one kernel); backward one gather per gradient (tokens, probabilities: again one more)."""

    @staticmethod
    def forward(ctx: Any, tokens: Any, probs: Any, routing_map: Any, top_k: int) -> Any:
        t, e = routing_map.shape
        for _ in range(3):
            row_id_map = torch.empty((t, 2 * e + 1), dtype=torch.int32)
        idx = routing_indices(t, e, top_k)
        ctx.idx = idx
        ctx.mark_non_differentiable(row_id_map)
        return tokens.index_select(0, idx.token_of_row), torch.take(probs, idx.score_of_row), row_id_map

    @staticmethod
    def backward(ctx: Any, grad_tokens: Any, grad_probs: Any, grad_map: Any) -> Any:
        idx = ctx.idx
        return grad_tokens.index_select(0, idx.first_row), torch.take(grad_probs, idx.row_of_score), None, None


class UnpermuteStandIn(torch.autograd.Function):
    """TE moe_unpermute, mask map without merging probabilities (_moe_unpermute_mask_map at TE v2.9: one
    unpermute_with_mask_map kernel forward, one permute_with_mask_map backward): one index_select each way."""

    @staticmethod
    def forward(ctx: Any, permuted: Any, idx: Any) -> Any:
        ctx.idx = idx
        return permuted.index_select(0, idx.first_row)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad.index_select(0, ctx.idx.token_of_row), None


class SortChunksStandIn(torch.autograd.Function):
    """TE moe_sort_chunks_by_index[_with_probs] (permutation.py _moe_chunk_sort at TE v2.9: make_chunk_sort_map and
    sort_chunks_by_map forward, the tokens and probabilities in one kernel; backward one sort_chunks_by_map):
    torch.arange for the map, then one index_select per output (with probabilities one more than TE); backward
    one index_select per gradient."""

    @staticmethod
    def forward(ctx: Any, tokens: Any, probs: Any) -> Any:
        chunk_map = torch.arange(tokens.shape[0])
        ctx.chunk_map = chunk_map
        ctx.has_probs = probs is not None
        sorted_probs = probs.index_select(0, chunk_map) if probs is not None else None
        return tokens.index_select(0, chunk_map), sorted_probs

    @staticmethod
    def backward(ctx: Any, grad_tokens: Any, grad_probs: Any) -> Any:
        grad_p = grad_probs.index_select(0, ctx.chunk_map) if ctx.has_probs else None
        return grad_tokens.index_select(0, ctx.chunk_map), grad_p


def install_te_stand_ins(top_k: int) -> None:
    """Megatron-Core's moe_utils names for TE's fused router and permutation kernels (imported from
    megatron/core/extensions/transformer_engine.py @92c8482e: TE's moe_permute_with_probs, moe_unpermute,
    moe_sort_chunks_by_index[_with_probs], fused_topk_with_score_function, fused_compute_score_for_moe_aux_loss,
    fused_moe_aux_loss), bound to the stand-ins above with the call shapes moe_utils.py @92c8482e uses (lines
    105, 256-266, 348, 415-423, 564, 645); HAVE_TE set so its `fused=True` branches take them."""
    from megatron.core.transformer.moe import moe_utils

    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("not on the all-to-all dispatcher's fused path")

    def unpermute(permuted: Any, row_id_map: Any, merging_probs: Any = None, restore_shape: Any = None) -> Any:
        if merging_probs is not None:
            raise NotImplementedError("merging probabilities: not on the all-to-all dispatcher's path")
        return UnpermuteStandIn.apply(permuted, routing_indices(restore_shape[0], row_id_map.shape[1] // 2, top_k))

    moe_utils.HAVE_TE = True
    moe_utils.fused_topk_with_score_function = lambda logits, topk, **kw: TopkStandIn.apply(logits, topk)
    moe_utils.fused_compute_score_for_moe_aux_loss = (
        lambda logits, topk, score_function: TopkStandIn.apply(logits, topk)[::-1])
    moe_utils.fused_moe_aux_loss = lambda probs, **kw: AuxLossStandIn.apply(probs)
    moe_utils.fused_permute_with_probs = (
        lambda tokens, probs, routing_map, num_out_tokens=None: PermuteStandIn.apply(tokens, probs, routing_map,
                                                                                     top_k))
    moe_utils.fused_unpermute = unpermute
    moe_utils.fused_sort_chunks_by_index = lambda tokens, split_sizes, sorted_idxs: SortChunksStandIn.apply(
        tokens, None)[0]
    moe_utils.fused_sort_chunks_by_index_with_probs = (
        lambda tokens, probs, split_sizes, sorted_idxs: SortChunksStandIn.apply(tokens, probs))
    moe_utils.fused_permute = unsupported


def patch_router_gemm() -> None:
    """moe_utils.py @92c8482e imports te_general_gemm under `try` and leaves the name undefined without TE
    (line 29; RouterGatingLinearFunction tests `te_general_gemm is not None`, line 971): define it as None, so the
    router GEMM takes its PyTorch branch (casts to fp32 and torch.mm) instead of TE's one general_gemm call."""
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def init_parallel() -> None:
    """A world of one process (gloo) and Megatron-Core's parallel state at tp = pp = ep = 1."""
    from megatron.core import parallel_state
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1, create_gloo_process_groups=False)


def build_layer(experts: int, top_k: int, aux_loss: str, router_dtype: str | None, force_balance: bool,
                fused: bool = True) -> Any:
    """Megatron-Core's MoELayer with GroupedMLP experts (local spec, legacy grouped GEMM) and Qwen3's routing;
    `fused`: moe_router_fusion and moe_permute_fusion on (TE's kernels, here install_te_stand_ins)."""
    import torch.nn.functional as F  # noqa: N812
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, ffn_hidden_size=FFN, moe_ffn_hidden_size=FFN, num_attention_heads=4,
        num_moe_experts=experts, moe_router_topk=top_k, moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=True, moe_use_legacy_grouped_gemm=True, moe_router_load_balancing_type=aux_loss,
        moe_aux_loss_coeff=1e-3 if aux_loss != "none" else 0.0, moe_router_pre_softmax=False,
        moe_router_dtype=router_dtype, moe_router_force_load_balancing=force_balance, moe_permute_fusion=False,
        moe_router_fusion=False, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=True, hidden_dropout=0.0,
        bias_activation_fusion=False)
    spec = get_moe_module_spec(use_te=False, num_experts=experts, moe_grouped_gemm=True,
                               moe_use_legacy_grouped_gemm=True)
    layer = build_module(spec, config=config, layer_number=1)
    layer.train()
    if fused:  # after construction: the dispatcher's __init__ puts its chunk indices on "cuda" under permute fusion
        config.moe_permute_fusion = config.moe_router_fusion = True
    return layer


def one_pass(layer: Any, x: Any) -> tuple[float, float]:
    """Host seconds of one forward and one backward of the layer (the CPU device runs synchronously)."""
    start = time.perf_counter()
    out, _ = layer(x)
    mid = time.perf_counter()
    out.backward(torch.ones_like(out))
    return mid - start, time.perf_counter() - mid


def count_ops(layer: Any, x: Any) -> tuple[int, int]:
    """ATen operators one forward and one backward issue."""
    fwd, bwd = CountOps(), CountOps()
    with fwd:
        out, _ = layer(x)
    with bwd:
        out.backward(torch.ones_like(out))
    return fwd.count, bwd.count


def measure(layer: Any, x: Any, runs: int, passes: int) -> tuple[list[float], list[float]]:
    """Per run, the mean forward and backward host seconds over passes."""
    fwds, bwds = [], []
    for _ in range(runs):
        times = [one_pass(layer, x) for _ in range(passes)]
        fwds.append(sum(t[0] for t in times) / passes)
        bwds.append(sum(t[1] for t in times) / passes)
    return fwds, bwds


SECTIONS = {"router": ("router", "forward"), "router.gating": ("router", "gating"),
            "router.routing": ("router", "routing"), "experts": ("experts", "forward"),
            "experts.swiglu_with_probs": ("experts", "activation_func_with_probs"),
            **{f"dispatcher.{m}": ("token_dispatcher", m) for m in (
                "dispatch_preprocess", "token_dispatch", "dispatch_postprocess", "combine_preprocess",
                "token_combine", "combine_postprocess")}}


def section_times(layer: Any, x: Any, passes: int) -> dict[str, float]:
    """Median forward host seconds of each SECTIONS method (perf_counter around the bound method) over passes."""
    times: dict[str, list[float]] = {name: [] for name in SECTIONS}

    def timed(name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = method(*args, **kwargs)
            times[name].append(time.perf_counter() - start)
            return result
        return call

    for name, (owner, method) in SECTIONS.items():
        module = getattr(layer, owner)
        setattr(module, method, timed(name, getattr(module, method)))
    for _ in range(passes):
        one_pass(layer, x)
    for owner, method in SECTIONS.values():
        delattr(getattr(layer, owner), method)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mcore", required=True, help="directory holding megatron/core (a Megatron-LM export)")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--aux-loss", default="aux_loss", help="moe_router_load_balancing_type")
    parser.add_argument("--router-dtype", default="fp32")
    parser.add_argument("--no-force-balance", action="store_true")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--unfused", action="store_true", help="moe_router_fusion and moe_permute_fusion off")
    parser.add_argument("--sections", action="store_true", help="also time the forward's sections")
    args = parser.parse_args()
    sys.path.insert(0, args.mcore)
    torch.set_num_threads(1)
    install_shims()
    init_parallel()
    patch_router_gemm()
    if not args.unfused:
        install_te_stand_ins(args.top_k)
    torch.manual_seed(0)
    layer = build_layer(args.experts, args.top_k, args.aux_loss, args.router_dtype or None,
                        not args.no_force_balance, not args.unfused)
    x = torch.randn(args.tokens, 1, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(5):  # warm-up: torch.compile of the SwiGLU, allocator, lazy inits
        one_pass(layer, x)
    ops = count_ops(layer, x)
    load = os.getloadavg()[0]
    fwds, bwds = measure(layer, x, args.runs, args.passes)
    fwd, bwd = statistics.median(fwds), statistics.median(bwds)
    print(f"Megatron-Core MoELayer at {args.mcore}: {args.experts} experts top-{args.top_k}, {args.tokens} tokens, "
          f"hidden {HIDDEN}, ffn {FFN}, aux {args.aux_loss}, router {args.router_dtype}, "
          f"force_balance {not args.no_force_balance}, {'unfused' if args.unfused else 'TE stand-ins'}, "
          f"torch {torch.__version__}, 1 thread")
    print(f"ATen operators per layer: forward {ops[0]}, backward {ops[1]}")
    print(f"host ms per layer: forward min {min(fwds) * 1e3:.3f} median {fwd * 1e3:.3f}, backward min "
          f"{min(bwds) * 1e3:.3f} median {bwd * 1e3:.3f} ({args.runs} runs x {args.passes} passes; load "
          f"{load:.2f} before, {os.getloadavg()[0]:.2f} after)")
    print(f"host us per ATen operator (min): forward {min(fwds) / ops[0] * 1e6:.2f}, "
          f"backward {min(bwds) / ops[1] * 1e6:.2f}")
    if args.sections:
        sections = section_times(layer, x, 10 * args.passes)
        print("forward sections, median us: " + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in sections.items()))


if __name__ == "__main__":
    main()
