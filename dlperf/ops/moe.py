"""Mixture of experts (`moe`), multi-head latent attention (`mla`) and per-head query/key norms (`qk_norm`).

MoE (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2022; Mixtral, Jiang et al. 2024;
DeepSeek-V3, arXiv:2412.19437 section 2.1.2): a router (a d x E linear, in fp32 as Megatron-Core's
`--moe-router-dtype fp32` and DeepSeek-V3's gating do), a softmax (or sigmoid) over the E expert scores and a
top-k choice, a permutation that groups each token's k copies by expert, the experts' FFNs as grouped GEMMs
(SwiGLU: gate and up in one [d, 2f] GEMM, down [f, d]), and the combine: the k outputs weighted and summed back
into token order. Shared experts (DeepSeekMoE) are a dense FFN every token runs. Parameters count every expert;
FLOPs count only the k experts each token is routed to (the activated parameters, 2 FLOPs per multiply-add).
LatentMoE (`latent`, Nemotron 3 Super): the routed experts, permutation and dispatch on a narrower latent between
two duplicated projections, the router and shared experts on the hidden width (routed_width, _latent_kernels).

MLA (DeepSeek-V2, arXiv:2405.04434 section 2.1; DeepSeek-V3 section 2.1.1): queries and keys/values go through
low-rank down-projections (with an RMSNorm on the latent), are projected back up per head, and keys/queries carry
a decoupled rotary part; the attention core has head dimension qk_nope + qk_rope for QK^T and v_head_dim for AV.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dlperf.cost import Cost
from dlperf.errors import ShapeError
from dlperf.ops.base import (
    INDEX_BYTES,
    REQUIRED,
    Kernel,
    Layer,
    OpRule,
    clog2,
    elementwise_kernel,
    need_rank,
    numel,
)
from dlperf.ops.dense import causal_speedup, gemm
from dlperf.spec.hardware import CUBLASLT_HEURISTIC, LAUNCH_CALL

ROUTER_DTYPE = "fp32"
ROUTER_BYTES = 4

# ---- moe ------------------------------------------------------------------------------------------------


def _tokens(layer: Layer, batch: Any) -> Any:
    return batch * numel(layer.in_shape[:-1])


def _matrices(layer: Layer) -> int:
    """SwiGLU experts hold three matrices (gate, up, down), GELU/ReLU experts two (Shazeer 2020)."""
    return 3 if layer["gated"] else 2


def _shared_width(layer: Layer) -> Any:
    """Total intermediate width of the shared experts (they run as one dense FFN of S x shared_ffn)."""
    return layer["shared_experts"] * (layer["shared_ffn"] or layer["ffn"])


# LatentMoE (`latent`: Nemotron 3 Super's moe_latent_size), as Megatron-Core's MoELayer runs it (NVIDIA/Megatron-LM
# @d98e8a64 megatron/core/transformer/moe/moe_layer.py): the router runs on the hidden states (route, :444-452);
# fc1_latent_proj (hidden -> latent, :279-291) and fc2_latent_proj (latent -> hidden, :292-303) are TELinear with
# parallel_mode "duplicated" and bias add_bias_linear: whole weights on every tensor-parallel rank, run on the
# tokens the rank holds (its sequence-parallel shard), no collective. preprocess applies fc1_latent_proj before
# the dispatcher's permute (:488-490), so the permutation, the dispatch and combine and the routed experts work on
# the latent width; postprocess applies fc2_latent_proj after the combine's unpermute and adds the shared experts'
# output, computed on the pre-latent hidden states (:582-596, shared_experts_compute :507-534). The latent
# projections carry no bias here (Nemotron 3 Super's add_bias_linear is false).
def routed_width(layer: Layer) -> Any:
    """The width of what the routed experts see, the dispatcher moves and the permutation and combine rewrite:
    the latent with `latent`, else the layer's input width."""
    return layer["latent"] or layer.in_shape[-1]


def _latent_kernels(layer: Layer, t: Any, e: int) -> tuple[Kernel, Kernel]:
    """fc1_latent_proj [t, d] x [d, latent] and fc2_latent_proj [t, latent] x [latent, d], duplicated under tensor
    parallelism (split=False: whole on each rank, on its sequence-parallel rows, tp_dim "m")."""
    d, w = layer.in_shape[-1], layer["latent"]
    return (replace(gemm("fc1_latent_proj", t, d, w, e, tp_dim="m"), split=False),
            replace(gemm("fc2_latent_proj", t, w, d, e, tp_dim="m"), split=False))


# Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP, --moe-grouped-gemm) runs a grouped GEMM as
# one cuBLAS GEMM per expert, launched from C++ round-robin on TE's compute streams: "launch GEMM ...
# detail::get_compute_stream(i % num_streams)" in multi_stream_cublas_gemm, transformer_engine/common/gemm/
# cublaslt_gemm.cu, with "num_compute_streams = 4" in transformer_engine/common/util/multi_stream.cpp
# (NVIDIA/TransformerEngine @d0067d0d; the CUTLASS grouped kernel is opt-in, NVTE_USE_CUTLASS_GROUPED_GEMM).
# The same path in every TE the Megatron-Bridge rows ran: release_v2.9 (@97ad8cc6f's pin), 2.14 @f031cf87
# (@74695a06d's) and 2.16 @f8a01cd5 (@63b08b397's) reach it through te_general_grouped_gemm ->
# nvte_multi_tensor_gemm, whose CUTLASS branch needs Hopper and the variable, which Megatron-Bridge's scripts and
# sources never set. A bias rides in each GEMM's cuBLAS epilogue (forward bias, and in 16-bit the bias gradient
# with the weight gradient: _GroupedLinear.backward "Grad bias is fused with wgrad GEMM"), no extra kernel.
# Checked against TE's own benchmark of this path (tests/test_moe.py TE_GROUPED_GEMM_H100).
TE_GEMM_STREAMS = 4


def grouped_gemm(name: str, m: Any, k: Any, n: Any, e: int, groups: Any, tp_dim: str) -> Kernel:
    """`groups` GEMMs [m_g, k] x [k, n] with sum(m_g) = m (one per resident expert, m_g = m / groups at even
    load): the FLOPs of one [m, k] x [k, n] GEMM, but every group's weight matrix is read (forward, and for the
    data gradient) and its gradient written (weight gradient), so weight traffic grows with the experts a device
    holds.

    The groups run as Transformer Engine runs them (TE_GEMM_STREAMS): one GEMM per expert, up to four at a time
    on four streams. Tiles are per expert: a round of four concurrent GEMMs shares the SMs, so wave quantization
    sees four [m_g, k] x [k, n] GEMMs (the weight gradient four [k, n] outputs reduced over m_g rows each, not
    one reduced over all m rows), and each of the ceil(groups / 4) rounds pays a kernel's startup and launch
    latency on the device. The host issues one framework operator per pass and direction; the per-expert
    GEMMs come from TE's C++ loop, each a cuBLASLt call of its own (per_expert_gemm_host). A single-kernel
    grouped GEMM (DeepGEMM's contiguous layout, CUTLASS grouped GEMM) is the case of as many streams as
    groups."""
    kernel = gemm(name, m, k, n, e, tp_dim=tp_dim)
    more = e * (groups - 1) * k * n
    kernel = replace(kernel, cost=replace(kernel.cost, fwd_bytes=kernel.cost.fwd_bytes + more,
                                          bwd_bytes=kernel.cost.bwd_bytes + 2 * more), weight_groups=groups)
    if not isinstance(groups, int) or groups <= 1:
        return kernel
    concurrent = min(TE_GEMM_STREAMS, groups)
    rounds = -(-groups // concurrent)
    host = per_expert_gemm_host(groups)
    return replace(kernel, gemm=(concurrent, m / groups, n, k), launches=rounds, bwd_launches=2 * rounds,
                   framework_ops=1, library_host=(host, 2 * host))


def per_expert_gemm_host(groups: int) -> float:
    """Reference-host seconds one grouped-GEMM call spends on its experts beyond the one GEMM its framework
    operator's dispatch covers (DEFAULT_DISPATCH: the operator and one launch call): every further expert is one
    more cuBLASLt call, which queries the heuristic and launches the kernel. Transformer Engine (v2.9 @70f53666,
    the same through v2.16) loops over the experts in C++: common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm
    (line 941) calls nvte_cublas_gemm_v2 per expert, and cublas_gemm builds the cuBLASLt descriptors (lines
    430-437), queries cublasLtMatmulAlgoGetHeuristic (line 722, no algorithm cache in TE), launches
    (cublasLtMatmul, line 730) and destroys the descriptors (lines 748-753) on every call. Priced: the launch call
    (LAUNCH_CALL) and the heuristic query (CUBLASLT_HEURISTIC), the parts with a published cost. Left out, with
    none found: the descriptor create/set/destroy calls, pytorch/csrc/extensions/gemm.cpp te_general_grouped_gemm's
    per-expert tensor wrappers (makeTransformerEngineTensor of A and B, at::from_blob of D, line 413 on) and
    grouped_linear.py's per-expert Python (quantizer set_usage, get_weight_workspace, update_usage, and backward's
    per-expert torch.empty for Megatron's main_grad, handle_custom_ddp_from_mcore): a lower bound. Per pass and
    direction; the backward makes two such calls (data and weight gradient)."""
    return (groups - 1) * (LAUNCH_CALL + CUBLASLT_HEURISTIC)


def _ffn_kernels(prefix: str, rows: Any, d: Any, f: Any, gated: bool, e: int, expert: bool,
                 groups: Any = 1) -> list[Kernel]:
    """An FFN over `rows` tokens: [d, 2f] gate+up GEMM, SiLU(gate) * up, [f, d] down (or up, GELU, down); the
    GEMMs grouped over `groups` experts' weights."""
    if gated:
        # SwiGLU reads [gate; up] and writes f per row; its backward reads both halves and the output gradient and
        # writes the gradient of both halves, 2f per row (torch.cat((dy_1, dy_2)) in Megatron-Core's
        # swiglu_back / geglu_back, megatron/core/fusions/fused_bias_swiglu.py, fused_bias_geglu.py @2d1fa8d3):
        # 3f read + 2f written, which elementwise_kernel's one written tensor of f counts as bwd_reads=4
        kernels = [grouped_gemm(f"{prefix}_gate_up", rows, d, 2 * f, e, groups, "n"),
                   elementwise_kernel(f"{prefix}_swiglu", rows * f, e, 5, 8, reads=2, bwd_reads=4,
                                      cls="transcendental")]
    else:
        kernels = [grouped_gemm(f"{prefix}_up", rows, d, f, e, groups, "n"),
                   elementwise_kernel(f"{prefix}_gelu", rows * f, e, 8, 12, cls="transcendental")]
    kernels.append(grouped_gemm(f"{prefix}_down", rows, f, d, e, groups, "k"))
    return [replace(k, expert=expert) for k in kernels]


# Megatron-Core's MoE layer issues more small operators than the kernels above, each one a framework operator the
# host pays DEFAULT_DISPATCH for, counted from the source at the Megatron-LM commit Megatron-Bridge's Qwen3 recipes
# pin (NVIDIA-NeMo/Megatron-Bridge @97ad8cc6f 3rdparty/Megatron-LM = NVIDIA/Megatron-LM @92c8482e, with TE
# release_v2.9 per its pyproject.toml: NVIDIA/TransformerEngine v2.9 @70f53666), for the settings those recipes
# use: TopKRouter with moe_router_fusion, aux_loss, moe_permute_fusion, the all-to-all dispatcher. Besides the
# router GEMM, the fused top-k and aux-loss scores (topk_gating: TE fused_topk_with_score_function and
# fused_compute_score_for_moe_aux_loss, one kernel each way), the permute (permute_with_mask_map; backward
# unpermute_with_mask_map), grouped GEMMs, activation and unpermute (combine: unpermute_with_mask_map; backward
# permute_with_mask_map) priced above:
# - ROW_ID_MAP: TE's fused permute (permutation.py _moe_permute_mask_map.forward) first builds its row-id map in
#   three Triton kernels (triton/permutation.py make_row_id_map, passes 1-3: per-block cumsum of the t x E map
#   into int32, global cumsum in place, the dense [t, 2E + 1] map); backward reuses the map.
# - AUX_LOSS: router.py _apply_aux_loss: routing_map.sum(dim=0), TE fused_moe_aux_loss, then
#   save_to_aux_losses_tracker's `aux_loss / coeff` and `values[layer - 1] += loss` (moe_utils.py) = 4 forward;
#   backward MoEAuxLossAutoScaler's `ones_like(aux_loss) * scale` (2), fused_moe_aux_loss_bwd (1) and the sum of
#   the two gradients reaching the logits (the top-k and the aux-loss scores both read them) = 4.
# - GRAD_ACCUMULATE: backward only, the hidden states' gradient summed over their two readers (router GEMM and
#   permute) and the router weight's gradient added into its main_grad by the DDP hook (it is no TE module) = 2.
# - the all-to-all dispatcher (token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess and
#   _maybe_dtoh_and_synchronize): routing_map.sum(dim=0), then with ep > 1 the input splits' sum, the gathered
#   counts' slice .contiguous() and three more sums (per rank, output_splits_tp, per local expert) = 6 kernels,
#   and four device-to-host copies (tokens_per_expert, input/output splits, output_splits_tp) on a side stream:
#   10 operators for the host, 6 launches on the compute stream (ep = 1: the sum and the tokens_per_expert copy,
#   2 and 1). With more than one resident expert, dispatch_postprocess and combine_preprocess sort the received
#   chunks by local expert (TE moe_sort_chunks_by_index[_with_probs]: make_chunk_sort_map + sort_chunks_by_map
#   each, and the combine's split sizes `.T.ravel()`, a copy: 5 forward; the backward reuses the maps, 2), moving
#   every routed token once each way. Experts padded to capacity (drop_and_pad) skip the counting (one torch.full
#   on the device) and sort by view, transpose and .contiguous() (tokens and probabilities, then the combine's
#   tokens: 3 copies forward, their 3 gradients' backward). The collectives (count all-gather, token and
#   probability all-to-alls) are charged in stage._add_ep_cp.
# Left out: TE's FP8 padding of each expert's rows (Fp8Padding, 3 forward and 3 backward under FP8 only) and the
# benchmark-only random logits (moe_router_force_load_balancing, 2 forward).
ROW_ID_MAP = (3, 0)
AUX_LOSS = (4, 4)
# A router without a load-balancing loss (`aux_loss: false`) runs neither AUX_LOSS nor the aux-loss scores' kernel:
# TopKRouter.routing calls compute_routing_scores_for_aux_loss and _apply_aux_loss only under
# is_aux_loss_enabled(), which is false unless moe_router_load_balancing_type names an aux-loss type with a
# positive coefficient (megatron/core/transformer/moe/router.py get_aux_loss_coeff / is_aux_loss_enabled /
# routing: NVIDIA/Megatron-LM @92c8482e lines 248-253 and 527-529, @3758b54b and @23265d2d lines 263-268 and
# 640-642, @2d1fa8d3 lines 264-284 and 641-643). Megatron-Bridge's GPT-OSS sets that type to "none"
# (src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py @97ad8cc6f line 75; models/gpt_oss/gpt_oss_bridge.py
# @0a25f911, @17a381f95, @74695a06d and @381d0b825 line 71): the fused top-k alone, one kernel each way.
GATING_LAUNCHES = {True: 2, False: 1}  # keyed by aux_loss
GRAD_ACCUMULATE = (0, 2)
DISPATCH_COUNTS = {True: (10, 6), False: (2, 1)}  # (host operators, launches) forward, keyed by ep > 1
CHUNK_SORT = (5, 2)
PADDED_COUNTS, PADDED_SORT = (1, 1), (3, 3)


def gating_launches(layer: Layer) -> int:
    """Launches of the router's fused top-k each way: with the aux-loss scores' kernel or without (GATING_LAUNCHES)."""
    return GATING_LAUNCHES[bool(layer["aux_loss"])]


def _bookkeeping(layer: Layer, t: Any, e: int, local: Any, ep: bool, dispatcher: str) -> list[Kernel]:
    """Megatron-Core's small operators around the MoE kernels (ROW_ID_MAP .. CHUNK_SORT), each with the bytes it
    moves: the t x E routing map (bool) and its int32 row-id map, fp32 probabilities, the tokens a chunk sort
    moves, the hidden-state and router-weight gradients summed."""
    n_exp, k, d, w = layer["experts"], layer["top_k"], layer.in_shape[-1], routed_width(layer)
    scores, routed = t * n_exp, t * k
    row_map = (1 + 4 + 8 + 4) * scores + 4 * t * (2 * k + 1)  # passes 1-3: bool in, int32 cumsums, dense map
    out = [Kernel("row_id_map", "memory", Cost(fwd_bytes=row_map, depth=clog2(t)),
                  launches=ROW_ID_MAP[0], bwd_launches=ROW_ID_MAP[1], split=False)]
    if layer["aux_loss"]:
        out.append(Kernel("aux_loss", "memory", Cost(fwd_bytes=(1 + ROUTER_BYTES) * scores,
                                                     bwd_bytes=4 * ROUTER_BYTES * scores, depth=clog2(t), bwd_depth=1),
                          launches=AUX_LOSS[0], bwd_launches=AUX_LOSS[1], split=False))
    out += [Kernel("grad_accumulate", "memory", Cost(bwd_bytes=3 * e * t * d + 3 * ROUTER_BYTES * d * n_exp,
                                                    bwd_depth=1),
                  launches=GRAD_ACCUMULATE[0], bwd_launches=GRAD_ACCUMULATE[1], split=False)]
    if dispatcher != "alltoall":
        return out + (_flex_metadata(layer, t, local, dispatcher) if ep else [])
    padded = bool(layer.get("capacity_factor"))
    host_ops, launches = PADDED_COUNTS if padded else DISPATCH_COUNTS[ep]
    out.append(Kernel("dispatch_counts", "memory", Cost(fwd_bytes=scores, depth=clog2(t)), launches=launches,
                      bwd_launches=0, framework_ops=host_ops, split=False))
    if not (isinstance(local, int) and local <= 1):
        # two sorts per pass, each reading and writing every routed token; the dispatch side's its probability too
        moved = 2 * (2 * e * routed * w) + 2 * ROUTER_BYTES * routed
        fwd, bwd = PADDED_SORT if padded else CHUNK_SORT
        out.append(Kernel("chunk_sort", "memory", Cost(fwd_bytes=moved, bwd_bytes=moved, depth=1, bwd_depth=1),
                          launches=fwd, bwd_launches=bwd, split=False))
    return out


# The flex dispatcher's metadata kernels, forward only (the backward reuses the handle), which the bandwidths
# DeepEP and HybridEP publish leave out (their benchmarks time dispatch with a cached handle or a precomputed
# layout: deepseek-ai/DeepEP tests/legacy/test_intranode.py `tune_args = {'x': ..., 'handle': handle, ...}`, the
# hybrid-ep branch's tests/test_hybrid_ep.py `dispatch_args = {..., 'handle': handle}`):
# - HybridEP (hybrid-ep @94a9f8f csrc/hybrid_ep/executor/executor.cu metadata_preprocess_core): the preprocessing
#   kernel reads the gathered [ep * tokens, E] bool routing map (context.routing_map_gather) and writes
#   sparse_to_dense_map [tokens * nodes, ranks per node] int32, local_expert_routing_map [tokens * ep, local] bool
#   and, with the permute Megatron-Core asks for, dense_to_expert_map [tokens * ep, local] int32; then
#   pad_tokens_per_expert: 2 launches.
# - DeepEP (Megatron-Core fused_a2a.py FusedDispatch.forward @92c8482e: buffer.get_dispatch_layout before
#   buffer.dispatch): one kernel reading the [tokens, top_k] int64 indices and writing is_token_in_rank
#   [tokens, ep] bool and the per-rank and per-expert counts (int32).
FLEX_METADATA_LAUNCHES = {"hybridep": 2, "deepep": 1}


def _flex_metadata(layer: Layer, t: Any, local: Any, dispatcher: str) -> list[Kernel]:
    """The DeepEP or HybridEP metadata kernel of one forward dispatch (FLEX_METADATA_LAUNCHES) on an expert-parallel
    rank holding `local` of the layer's experts (ep = experts / local ranks) and `t` tokens."""
    n_exp = layer["experts"]
    if dispatcher not in FLEX_METADATA_LAUNCHES:
        return []
    ep = n_exp / local
    if dispatcher == "hybridep":
        moved = ep * t * n_exp + 4 * t * ep + (1 + 4) * t * n_exp  # map in; int32 sparse map, bool + int32 maps out
    else:
        moved = INDEX_BYTES * t * layer["top_k"] + t * ep + 4 * (ep + n_exp)
    return [Kernel(f"{dispatcher}_metadata", "memory", Cost(fwd_bytes=moved, depth=clog2(t)),
                   launches=FLEX_METADATA_LAUNCHES[dispatcher], bwd_launches=0, split=False)]


# weighted_bias_quick_geglu_impl (megatron/core/fusions/fused_bias_geglu.py line 434, the same at every Megatron-LM
# commit the Megatron-Bridge rows pin: @92c8482e, @3758b54b, @00225507, @2d1fa8d3, and at @d98e8a64) builds its
# offset as `torch.tensor(linear_offset, dtype=input.dtype, device=input.device)`: a Python float copied from
# pageable host memory, which PyTorch does with non_blocking=False (torch/csrc/utils/tensor_new.cpp
# internal_new_from_data: `tensor.to(device, ..., /*non_blocking=*/false, ...)`), and copy_kernel_cuda then calls
# at::cuda::memcpy_and_sync = cudaMemcpyAsync + cudaStreamSynchronize (pytorch/pytorch @007aa8ae
# aten/src/ATen/native/cuda/Copy.cu). The host waits for the fc1 grouped GEMM and everything queued before it,
# once per MoE layer forward (dlperf.engine.device.sync_gap).
QUICK_GEGLU_SYNCS = 1


def _expert_extras(layer: Layer, routed: Any, d: Any, f: Any, e: int, local: Any) -> list[Kernel]:
    """Eager PyTorch operators Megatron-Core runs around the experts' fused kernels when the experts have biases
    or a clamped GLU (gpt-oss), read at the Megatron-LM commit Megatron-Bridge's GPT-OSS recipes pin
    (NVIDIA-NeMo/Megatron-Bridge @0a25f911 3rdparty/Megatron-LM = NVIDIA/Megatron-LM @3758b54b):

    - `act_clamp` (fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl): the gate half clamped from above and
      the linear half to [-c, c] by two torch.clamp calls and glued back by torch.cat *before* the compiled
      quick-GEGLU, so not fused into it: forward, the clamps read and write the [rows, 2f] fc1 output once and the
      cat once more (4 passes, 3 launches); backward, the two clamps' gradients read the gradient and the input
      and write (3 passes over each half; the masks' own bool tensors left out, a lower bound) and the chunk's
      gradient is a cat (2 passes), 3 launches. Inside the moe_act recomputation (bias_act_func is checkpointed
      whole). The same function copies its GLU offset to the device on every call, which waits for the device
      (QUICK_GEGLU_SYNCS): one more host operator among the clamp's, and a `glu_offset_copy` of no work that
      holds the wait, once per forward (and per recomputed forward); not an expert kernel, so routing imbalance
      does not stretch it.
    - `expert_bias` (transformer/moe/experts.py TEGroupedMLP: linear_fc1 adds its bias inside Transformer Engine's
      grouped GEMM, skip_bias_add=False; linear_fc2 has skip_bias_add=True and `_apply_bias` adds it afterwards):
      per resident expert `t + b * p` over its rows (p the fp32 routing probability, ROUTER_BYTES, so the
      product and sum promote to fp32), then torch.cat and .to(bf16). Forward bytes per element of the [rows, d]
      output: b*p writes 4, the add reads 2 + 4 and writes 4, the cat reads and writes 4, the cast reads 4 and
      writes 2 (28 = 7 fp32-sized passes); backward: the cast's gradient up to fp32 (2 + 4), the add's to t back
      to bf16 (4 + 2), and the product's two gradients g*p and g*b, each written in fp32 and summed over a
      dimension (4 + 4 + 4 each): 36 = 9 passes. Launches 2 per expert + 2 forward, 5 per expert + 1 backward."""
    out: list[Kernel] = []
    groups = local if isinstance(local, int) else 1
    if layer["act_clamp"] and layer["gated"]:
        n = routed * 2 * f
        out.append(Kernel("expert_act_clamp", "memory", Cost(fwd_flops=2 * n, fwd_bytes=4 * e * n,
                                                             bwd_bytes=5 * e * n, depth=1, bwd_depth=1),
                          launches=3, bwd_launches=3, expert=True, framework_ops=3 + QUICK_GEGLU_SYNCS,
                          bwd_framework_ops=3))
        out.append(Kernel("glu_offset_copy", "memory", Cost(), launches=0, bwd_launches=0, split=False,
                          syncs=QUICK_GEGLU_SYNCS))
    if layer["expert_bias"]:
        n = routed * d
        out.append(Kernel("expert_down_bias", "memory", Cost(
            fwd_flops=2 * n, bwd_data_flops=4 * n, fwd_bytes=7 * ROUTER_BYTES * n, bwd_bytes=9 * ROUTER_BYTES * n,
            depth=1, bwd_depth=clog2(routed)), launches=2 * groups + 2, bwd_launches=5 * groups + 1, expert=True))
    return out


def moe_kernels(layer: Layer, batch: Any, e: int, resident: Any = None,
                dispatcher: str = "alltoall", fold: int = 1) -> tuple[Kernel, ...]:
    """The layer's kernels on a device that holds `resident` of its experts (None: all of them; expert
    parallelism over ep ranks leaves experts / ep), with Megatron-Core's bookkeeping around them
    (`_bookkeeping`; the all-to-all dispatcher's own with `dispatcher` "alltoall"). `fold` is tp / expert tp when
    the experts run on a grid of their own (dlperf.plan.folded): an expert-tensor-parallel group then runs the
    routed copies of 1/fold of the tokens the tensor-parallel group holds (the dispatcher gathers over the expert
    tensor-parallel group only, token_dispatcher.py @92c8482e:692-701), so the routed experts' kernels
    (routed_expert_kernel) are built on those rows, for the engine to split expert-tp ways."""
    t, d, w = _tokens(layer, batch), layer.in_shape[-1], routed_width(layer)
    n_exp, k, f = layer["experts"], layer["top_k"], layer["ffn"]
    routed = t * k  # token-expert pairs: the activated work
    rows = routed if fold == 1 else routed / fold  # ... of which the experts' grid runs these
    router = replace(gemm("router", t, d, n_exp, ROUTER_BYTES), dtype=ROUTER_DTYPE, split=False)
    scores = t * n_exp
    # softmax (~5 FLOPs/element, as the loss's) and k passes of max for the top-k; writes weights and indices
    gating = Kernel("topk_gating", "transcendental", Cost(
        fwd_flops=(5 + k) * scores, bwd_data_flops=4 * scores,
        fwd_bytes=2 * ROUTER_BYTES * scores + (ROUTER_BYTES + INDEX_BYTES) * routed,
        bwd_bytes=3 * ROUTER_BYTES * scores, depth=2 * clog2(n_exp) + k, bwd_depth=clog2(n_exp)),
        launches=gating_launches(layer), bwd_launches=gating_launches(layer), split=False)
    # permute: gather each token's k copies into expert order (read + write k*d per token); its backward is the
    # matching scatter. combine: the k weighted outputs summed per token (2 FLOPs per element of each copy).
    permute = Kernel("permute", "memory", Cost(fwd_bytes=2 * e * routed * w + INDEX_BYTES * routed,
                                               bwd_bytes=2 * e * routed * w, depth=1, bwd_depth=1), bwd_launches=1,
                     split=False)
    combine = Kernel("combine", "memory", Cost(
        fwd_flops=2 * routed * w, bwd_data_flops=2 * routed * w, fwd_bytes=e * (routed * w + t * w),
        bwd_bytes=e * (2 * routed * w + t * w), depth=clog2(k), bwd_depth=1), bwd_launches=1, split=False)
    local = n_exp if resident is None else resident
    latent = list(_latent_kernels(layer, t, e)) if layer["latent"] else []  # [fc1_latent_proj, fc2_latent_proj]
    kernels = [router, gating, *latent[:1], permute,
               *_ffn_kernels(EXPERT_PREFIX, rows, w, f, layer["gated"], e, True, local),
               *_expert_extras(layer, rows, w, f, e, local),
               combine, *latent[1:], *_bookkeeping(layer, t, e, local, resident is not None, dispatcher)]
    width = _shared_width(layer)
    if width:
        kernels += _ffn_kernels("shared", t, d, width, layer["gated"], e, False)
        if layer["shared_gate"]:  # Qwen2-MoE: sigmoid(x w) scales the shared experts' output
            kernels.append(gemm("shared_gate", t, d, 1, e))
        kernels.append(elementwise_kernel("shared_add", t * d, e, 1, 0, reads=2, bwd_reads=1))
    return tuple(kernels)


# The name prefix of the routed experts' kernels (_ffn_kernels, _expert_extras), which the FP8 casts, transposes and
# swizzles dlperf.ops.fp8 derives from a GEMM keep (f"{kernel.name}_fp8_cast", ...).
EXPERT_PREFIX = "expert"


def routed_expert_kernel(kernel: Kernel) -> bool:
    """Whether `kernel` runs on the routed experts' grid: their GEMMs, activation and extras (`expert`) and what an
    FP8 recipe derives from those GEMMs (named after them). The router, gating, permutation, combine, bookkeeping
    and shared experts run on the dense layers' tensor-parallel ranks."""
    return kernel.expert or kernel.name.startswith(EXPERT_PREFIX + "_")


def moe_expert_params(layer: Layer) -> Any:
    """Parameters of the routed experts (what expert parallelism shards): E experts x 2 or 3 [d, f] matrices
    (d the latent with `latent`), and their biases with `expert_bias`."""
    return layer["experts"] * _expert_size(routed_width(layer), layer)


def _expert_size(d: Any, a: Any) -> Any:
    """One routed expert's parameters: 2 or 3 [d, f] matrices, and with `expert_bias` the biases of its up (and
    gate) projection, f each, and of its down projection, d (gpt-oss: gate_up_proj_bias 2f, down_proj_bias d)."""
    matrices, f = (3 if a["gated"] else 2), a["ffn"]
    return matrices * d * f + ((matrices - 1) * f + d if a["expert_bias"] else 0)


def _moe_params(shape: tuple, a: dict) -> Any:
    """Router d x E (and its E biases), the routed experts on the latent or d, the shared experts and their gate
    on d, and with `latent` fc1_latent_proj and fc2_latent_proj, d x latent each (moe_layer.py @d98e8a64
    :279-303, no bias)."""
    d = shape[-1]
    matrices = 3 if a["gated"] else 2
    router = d * a["experts"] + (a["experts"] if a["router_bias"] else 0)
    shared = matrices * d * a["shared_experts"] * (a["shared_ffn"] or a["ffn"])
    total = router + a["experts"] * _expert_size(a["latent"] or d, a) + shared + (d if a["shared_gate"] else 0)
    return total + 2 * d * a["latent"] if a["latent"] else total


def moe_activated_params(layer: Layer) -> Any:
    """Parameters one token uses: the router, its top_k experts and the shared experts."""
    per_expert = moe_expert_params(layer) // layer["experts"] if isinstance(layer["experts"], int) else (
        moe_expert_params(layer) / layer["experts"])
    return layer.params - per_expert * (layer["experts"] - layer["top_k"])


def dispatch_elements(layer: Layer, capacity: float = 1.0) -> Any:
    """Elements one sample sends to the experts in one dispatch (and gets back in one combine): every token's
    top_k copies of its d-vector (its latent with `latent`), times the capacity factor when experts are padded to
    capacity."""
    return numel(layer.in_shape[:-1]) * layer["top_k"] * routed_width(layer) * capacity


def _moe_saved(layer: Layer, e: int) -> Any:
    """Kept for backward: the input (router and permutation), fp32 router probabilities, the permuted tokens,
    the experts' gate/up outputs and activation, their outputs before the combine (which weighs them by the
    routing probabilities); shared experts likewise. With `probs_in_expert` the experts' activation applies the
    probabilities instead and keeps each copy's fp32 weight, and the combine keeps nothing: Megatron-Core's
    TEGroupedMLP calls weighted_bias_swiglu_impl(intermediate, bias, permuted_probs) (megatron/core/transformer/
    moe/experts.py @d98e8a64, lines 943-970; WeightedSwiGLUFunction saves its input and the weights,
    fusions/fused_bias_swiglu.py lines 266-270), and its alltoall and flex dispatchers unpermute without probs
    (moe/token_dispatcher.py lines 891-899 and 1460-1466). With `latent` the routed copies are latent-wide and
    fc2_latent_proj keeps its input, the combined latent (TE Linear saves its input); fc1_latent_proj's input is
    the layer's, kept already, and the permutation keeps no copy of fc1's output (TE's fused permute saves its
    row-id map only)."""
    s, d, w, k, f = numel(layer.in_shape[:-1]), layer.in_shape[-1], routed_width(layer), layer["top_k"], layer["ffn"]
    inner = 3 * f if layer["gated"] else 2 * f
    combine = ROUTER_BYTES / e if layer["probs_in_expert"] else w  # per copy: its weight, or its output
    routed = e * s * k * (w + inner + combine)
    shared = e * s * (3 if layer["gated"] else 2) * _shared_width(layer)
    saved = e * s * d + ROUTER_BYTES * s * layer["experts"] + routed + shared
    return saved + e * s * w if layer["latent"] else saved


def _moe_check(shape: tuple, a: dict) -> None:
    need_rank(shape, (1, 2), "moe")
    experts, k = a["experts"], a["top_k"]
    if isinstance(experts, int) and isinstance(k, int) and k > experts:
        raise ShapeError("moe routes each token to top_k of its experts", expected=f"top_k <= experts ({experts})",
                         found=k)
    groups, top = a["groups"], a["top_groups"]
    if (groups is None) != (top is None) or (groups and (experts % groups or top > groups)):
        raise ShapeError("group-limited routing needs both groups (dividing the experts) and top_groups <= groups",
                         expected="groups and top_groups together", found=f"groups {groups}, top_groups {top}")


MOE = OpRule(
    attrs={"experts": REQUIRED, "top_k": REQUIRED, "ffn": REQUIRED, "shared_experts": 0, "shared_ffn": None,
           "gated": True, "capacity_factor": None, "router_bias": False, "shared_gate": False, "groups": None,
           "top_groups": None, "probs_in_expert": False, "expert_bias": False, "act_clamp": False,
           "aux_loss": True, "latent": None},
    shape=lambda s, a: s,
    params=_moe_params,
    kernels=moe_kernels,
    saved=_moe_saved,
    tp="attention",  # experts split Megatron-style inside the layer: allreduce (or reduce-scatter) of its output
    check=_moe_check,
    expert_params=moe_expert_params,
)

# ---- mla ------------------------------------------------------------------------------------------------


def _mla_dims(layer: Layer) -> tuple[Any, Any, Any, Any, Any]:
    """(seq, width, heads, query/key head dim = nope + rope, value head dim)."""
    qd = layer["qk_nope_head_dim"] + layer["qk_rope_head_dim"]
    return layer.in_shape[-2], layer.in_shape[-1], layer["heads"], qd, layer["v_head_dim"]


def _latent_norm(name: str, n: Any, e: int) -> Kernel:
    return Kernel(name, "memory", Cost(fwd_flops=5 * n, bwd_data_flops=7 * n, bwd_weight_flops=2 * n,
                                       fwd_bytes=2 * e * n, bwd_bytes=4 * e * n, depth=2, bwd_depth=2), split=False)


def _mla_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    s, d, h, qd, vd = _mla_dims(layer)
    t, ql, kvl, rope = batch * s, layer["q_lora_rank"], layer["kv_lora_rank"], layer["qk_rope_head_dim"]
    if ql:
        queries = [replace(gemm("q_down", t, d, ql, e), split=False), _latent_norm("q_norm", t * ql, e),
                   gemm("q_up", t, ql, h * qd, e, tp_dim="n")]
    else:
        queries = [gemm("q_proj", t, d, h * qd, e, tp_dim="n")]
    keys = [replace(gemm("kv_down", t, d, kvl + rope, e), split=False), _latent_norm("kv_norm", t * kvl, e),
            gemm("kv_up", t, kvl, h * (layer["qk_nope_head_dim"] + vd), e, tp_dim="n")]
    rope_kernel = (_mla_rope_kernel(layer, batch, e),) if layer["rope"] else ()
    core = _mla_core(batch, s, h, qd, vd, e, causal=layer["causal"])
    return (*queries, *keys, *rope_kernel, core, gemm("out_proj", t, h * vd, layer["out"], e, tp_dim="k"))


# `rope: fused` on mla: Megatron-Core's fused MLA YaRN RoPE, two Triton kernels each way
# (megatron/core/fusions/fused_mla_yarn_rope_apply.py @3758b54b, called from multi_latent_attention.py
# qkv_up_proj_and_rope_apply :765-789 when apply_rope_fusion is set, with the cos/sin tables from
# YarnRotaryEmbedding.get_cached_cos_sin :594-598; the same calls at @92c8482e, @23265d2d, @00225507, @24bad8e6).
# Megatron-Bridge's DeepSeek-V3 bridge sets apply_rope_fusion=False (deepseek_v3_bridge.py @0a25f911 line 71), but
# every performance run overrides it to True (dlperf.ops.dense, `fused`) and turns on the Megatron-Core experimental
# flag the fused MLA path is marked with (scripts/performance/configs/deepseek/deepseek_llm_pretrain.py @0a25f911
# line 40, @97ad8cc6f line 49, @74695a06d line 40, @63b08b397 line 41; deepseek_v3_llm_pretrain.yaml @fa0315ae2
# line 33; src/megatron/bridge/perf_recipes/deepseek/common.py @4ab94dfad line 36). Per layer, with T tokens, h
# heads, nope/rope/v the head dims:
#   forward: rotary_fwd_q_kernel rotates the rope part of the up-projected query in place (reads and writes
#   T h rope elements; the nope part is untouched), and rotary_fwd_kv_kernel reads kv [T, h, nope + v] and the
#   shared k_pos_emb [T, rope], and writes the key [T, h, nope + rope] (the rotated k_pos_emb broadcast to every
#   head) and the value [T, h, v] as new tensors;
#   backward: rotary_bwd_q_kernel rotates the query gradient's rope part in place (T h rope read and written),
#   and rotary_bwd_kv_kernel reads dK [T, h, nope + rope] and dV [T, h, v], writes dKV [T, h, nope + v] and sums
#   the heads' rope gradients into d_emb [T, rope].
# Each program also reads the position's cos and sin (cached once in the activation dtype, _set_cos_sin_cache in
# yarn_rotary_pos_embedding.py :189-201; from L2 after the first head block): 2e bytes per position and rope
# dimension per kernel, counted once. Only cos and sin are saved; the kernels run
# again in backward under recompute_modules mla_up_proj (the whole qkv_up_proj_and_rope_apply is checkpointed,
# :856-861).
def _mla_rope_kernel(layer: Layer, batch: Any, e: int) -> Kernel:
    s, _, h, _, vd = _mla_dims(layer)
    t, nope, rope = batch * s, layer["qk_nope_head_dim"], layer["qk_rope_head_dim"]
    table = 2 * e * s * rope  # cos and sin, per kernel
    fwd = e * t * (2 * h * rope + h * (nope + vd) + rope + h * (nope + rope) + h * vd) + 2 * table
    bwd = e * t * (2 * h * rope + h * (nope + rope) + h * vd + h * (nope + vd) + rope) + 2 * table
    return Kernel("mla_rope", "memory", Cost(fwd_bytes=fwd, bwd_bytes=bwd, depth=1, bwd_depth=1),
                  launches=2, bwd_launches=2)


def _mla_core(batch: Any, s: Any, h: Any, qd: int, vd: int, e: int, causal: bool = True) -> Kernel:
    """The fused core, as DeepSeek and Megatron-Core train MLA (Transformer Engine's cuDNN fused attention takes
    d_qk 192 with d_vo 128, cuDNN's support matrix): QK^T over qd, softmax, AV over vd; backward twice each GEMM
    plus the QK^T it recomputes, as FlashAttention's (ops/dense.py _flash_kernel). Traffic: Q, K, V, O forward;
    Q, K, V read and their gradients written. The causal mask skips the blocks above the diagonal (dense.py
    causal_speedup of the key length, as for every causal fused kernel) while the model FLOPs stay the whole
    matrix's, and the kernel runs on the device's fused-attention curve, not the GEMM's: NVIDIA's cudnn-frontend
    SDPA benchmark on GB200 (results/gb200_919_only_cudnn/dsv3_20260226_174854.csv @afa9f7c0, cuDNN 9.19.1)
    times DeepSeek-V3's causal shape (128 heads, d_qk 192, d_vo 128) within 1-5% of Llama 3.1's causal rows over
    a training pass at 4k-16k. `seq` carries the key length to the curve's sequence term, as for the dense flash
    kernel."""
    skip = causal_speedup(s) if causal else 1
    scores = batch * h * s * s
    q_bytes, v_bytes = e * batch * s * h * qd, e * batch * s * h * vd
    core = Cost(fwd_flops=(2 * scores * qd + 2 * scores * vd + 5 * scores) / skip,
                bwd_data_flops=(4 * scores * qd + 4 * scores * vd + 4 * scores) / skip,
                fwd_bytes=2 * q_bytes + 2 * v_bytes, bwd_bytes=3 * (2 * q_bytes + v_bytes),
                depth=clog2(qd) + 2 * clog2(s) + clog2(s), bwd_depth=clog2(s) + clog2(qd))
    return Kernel("flash_attention", "attention_fa3", core, bwd_recompute_flops=2 * scores * qd / skip,
                  model_work_scale=skip, seq=s)


def _mla_params(shape: tuple, a: dict) -> Any:
    d, h = shape[-1], a["heads"]
    qd = a["qk_nope_head_dim"] + a["qk_rope_head_dim"]
    ql, kvl = a["q_lora_rank"], a["kv_lora_rank"]
    queries = d * ql + ql + ql * h * qd if ql else d * h * qd
    keys = d * (kvl + a["qk_rope_head_dim"]) + kvl + kvl * h * (a["qk_nope_head_dim"] + a["v_head_dim"])
    return queries + keys + h * a["v_head_dim"] * a["out"]


def _mla_saved(layer: Layer, e: int) -> Any:
    """Input, latents, per-head Q, K, V, the output-projection input, and the fused kernel's log-sum-exp."""
    s, d, h, qd, vd = _mla_dims(layer)
    latents = (layer["q_lora_rank"] or 0) + layer["kv_lora_rank"] + layer["qk_rope_head_dim"]
    return e * s * (d + latents + 2 * h * qd + h * vd + h * vd) + 4 * h * s


def _mla_fill(shape: tuple, a: dict) -> None:
    """Checks, and fills the output width (default: the input's) before the layer is built."""
    need_rank(shape, 2, "mla")
    a["out"] = a["out"] or shape[-1]
    if not a["flash"]:
        raise ShapeError("mla is priced as a fused (FlashAttention-style) kernel only", expected="flash: true",
                         found=a["flash"])
    if a["rope"] not in (None, "fused"):
        raise ShapeError("mla prices only Megatron-Core's fused MLA RoPE (rope: fused) or none",
                         expected="rope: fused or null", found=a["rope"])


def kv_width(layer: Layer) -> Any:
    """Elements of keys plus values per token that context parallelism passes around (per sample position)."""
    if layer.op == "mla":
        _, _, h, qd, vd = _mla_dims(layer)
        return h * (qd + vd)
    return 2 * layer["kv_heads"] * layer["head_dim"]


def qkv_widths(layer: Layer) -> tuple[Any, Any]:
    """(query + key + value elements, output elements) per token: what Ulysses all-to-alls move."""
    if layer.op == "mla":
        _, _, h, qd, vd = _mla_dims(layer)
        return h * qd + kv_width(layer), h * vd
    return layer["heads"] * layer["head_dim"] + kv_width(layer), layer["heads"] * layer["head_dim"]


MLA = OpRule(
    attrs={"heads": REQUIRED, "q_lora_rank": None, "kv_lora_rank": REQUIRED, "qk_nope_head_dim": REQUIRED,
           "qk_rope_head_dim": REQUIRED, "v_head_dim": REQUIRED, "causal": True, "flash": True, "out": None,
           "rope": None},
    shape=lambda s, a: (*s[:-1], a["out"]),
    params=_mla_params,
    kernels=_mla_kernels,
    saved=_mla_saved,
    tp="attention",
    check=_mla_fill,
)

# ---- qk_norm --------------------------------------------------------------------------------------------


def _qk_norm_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    n = batch * numel(layer.in_shape[:-1]) * (layer["heads"] + layer["kv_heads"]) * layer["head_dim"]
    return (Kernel("qk_norm", "memory", Cost(fwd_flops=5 * n, bwd_data_flops=7 * n, bwd_weight_flops=2 * n,
                                             fwd_bytes=2 * e * n, bwd_bytes=4 * e * n, depth=clog2(layer["head_dim"]),
                                             bwd_depth=clog2(layer["head_dim"]))),)


def _qk_norm_fill(shape: tuple, a: dict) -> None:
    a["kv_heads"] = a["kv_heads"] or a["heads"]


# RMSNorm of every query and key head over head_dim (Qwen3, OLMo 2): its own layer placed before the attention
# it belongs to, since attention's projections are inside the attention op; 2 x head_dim weights.
QK_NORM = OpRule(
    attrs={"heads": REQUIRED, "kv_heads": None, "head_dim": REQUIRED},
    shape=lambda s, a: s,
    params=lambda s, a: 2 * a["head_dim"],
    kernels=_qk_norm_kernels,
    saved=lambda layer, e: e * numel(layer.in_shape[:-1]) * (layer["heads"] + layer["kv_heads"]) * layer["head_dim"],
    check=_qk_norm_fill,
)


def activated_params(model: Any) -> Any:
    """Parameters a token uses: all but the routed experts it is not sent to (DeepSeek-V3's '37B activated')."""
    return sum(count * (moe_activated_params(layer) if layer.op == "moe" else layer.params)
               for layer, count in model.counted())


def has_experts(model: Any) -> bool:
    return any(layer.op == "moe" for layer, _ in model.counted())
