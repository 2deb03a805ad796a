"""Context and expert parallelism inside one layer: which share of the attention core a context-parallel rank
computes, what ring attention and Ulysses exchange, and what expert dispatch all-to-alls cost.

Context parallelism (cp ranks split every sequence): all token-wise work divides by cp. The attention core needs
every key for every query:
- ring (Liu et al. 2023, Ring Attention; Megatron-Core's context parallelism): each rank keeps its queries and
  passes its key/value block around the ring, cp - 1 sends forward (keys and values) and cp - 1 backward (keys,
  values and their gradients), each overlapped with the attention on the block it holds. With a causal mask the
  sequence is cut into 2*cp chunks and rank r holds chunks r and 2*cp-1-r, so that every rank gets the same share
  of the unmasked blocks (Megatron-Core's load balancing);
- ulysses (Jacobs et al. 2023, DeepSpeed-Ulysses): an all-to-all turns sequence shards into head shards before
  the core (queries, keys, values) and back after it (the output), and the same in backward.

Expert parallelism (ep ranks carved out of the data- and context-parallel ranks, Megatron-Core): each rank keeps
E/ep experts; its tokens' top_k copies are dispatched to the experts' ranks by an all-to-all and combined back by
another, forward and backward (Lepikhin et al. 2020, GShard, section 3.2). With MoE parallel folding (Liu et al.
2025, arXiv:2504.14960; plan etp < tp) the experts run on a grid of their own, etp x ep x edp over the stage's
tp x cp x dp ranks, so the ep group also spans tensor-parallel ranks (`Parallel.etp`, dlperf.engine.stage).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from math import comb
from typing import Any

from dlperf import mathx
from dlperf.engine.layers import Use
from dlperf.ops.base import INDEX_BYTES, Layer, numel
from dlperf.ops.moe import ROUTER_BYTES, dispatch_elements, kv_width, qkv_widths, routed_width
from dlperf.ops.recompute import FP8_TILED

ATTENTION_OPS = ("attention", "mla")
# DeepEP (ep_dispatcher "deepep"), as DeepSeek-V3 (arXiv:2412.19437) describes its all-to-all kernels:
# Sec. 3.2.2, "only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink", the IB leg to the GPU
# with the same in-node index on each target node and the NVLink forward "fully overlapped"; Sec. 3.3.3, the
# activation "before MoE up-projections" quantized to FP8 before the dispatch (and the activation gradient before
# the MoE down-projections, the backward's dispatch-direction leg), "both the forward and backward combine
# components" kept in BF16.
DEEPEP_SMS = 20
# HybridEP (ep_dispatcher "hybridep"), NVIDIA's kernels in DeepEP's hybrid-ep branch (deepseek-ai/DeepEP @94a9f8f,
# docs/README_Hybrid-EP.md) as Megatron-Core's flex dispatcher runs them. Priced as DeepEP where it behaves alike:
# a hierarchical design (RDMA across nodes, NVLink inside through TMA, warp-level pipelined) whose legs overlap as
# DeepEP's; routing probabilities carried inside the dispatch (HybridEPBuffer.dispatch_with_permute `probs`); the
# host waits for the received-token count unless the run fixes a static budget (hybrid_ep_buffer.py: "Synchronize
# the stream ... num_dispatched_tokens_tensor"; Megatron-Core token_dispatcher.py _HybridEPManager, NVIDIA/
# Megatron-LM @d98e8a64: "HybridEP sizes buffers dynamically (CPU sync in dispatch)" when
# moe_expert_rank_capacity_factor is unset). Both are priced at the bandwidth their own benchmarks publish where
# a table covers the device and link (dlperf.comm.ep_kernels; on GB200, 8 ranks, 32 SMs, 4096 tokens x 7168
# hidden, top-8, the README measures HybridEP's BF16 dispatch at 545.71 GB/s and combine at 568.94 GB/s through
# the Torch API, DeepEP's at 615.78 and 519.57), elsewhere by the NCCL all-to-all model. HybridEP differs in:
# - precision: BF16 both ways, FP8 recipe or not (Megatron-Core fused_a2a.py init_hybrid_ep_buffer @d98e8a64:
#   "HybridEP dispatcher does not support fp8 dispatch now");
# - SMs held: 32 (NVIDIA-NeMo/Megatron-Bridge scripts/performance/utils/overrides.py sets moe_hybridep_num_sms = 32
#   whenever moe_flex_dispatcher_backend is hybridep, @0a25f911 and the later performance recipes).
HYBRIDEP_SMS = 32
DISPATCHER_SMS = {"deepep": DEEPEP_SMS, "hybridep": HYBRIDEP_SMS}


@dataclass(frozen=True)
class Parallel:
    """Expert and context parallelism of one plan, with the collectives priced on its groups."""

    ep: int = 1
    cp: int = 1
    cp_algorithm: str = "ring"
    imbalance: float = 1.0
    ep_alltoall: Callable[[Any], Any] | None = None   # bytes per rank -> seconds, over the ep group
    ep_nodes: int = 1                                 # nodes the ep group spans
    ep_alltoall_nodes: Callable[[Any], Any] | None = None  # over one rank per node (same in-node index)
    ep_alltoall_node: Callable[[Any], Any] | None = None   # over the ep ranks inside one node
    ep_dispatcher: str = "alltoall"                   # dlperf.plan.EP_DISPATCHERS
    etp: int | None = None                            # expert tensor parallelism when below tp (folded experts;
                                                      # dlperf.plan.folded); None: the experts split as tp splits
    ep_allgather: Callable[[Any], Any] | None = None  # bytes per rank -> seconds, over the ep group
    sync_gap: Any = 0.0                               # device idle seconds after a host sync (ep_dispatch_extra)
    fp8_dispatch: bool = False                        # deepep under an FP8 recipe: dispatch-direction legs in FP8
                                                      # (hybridep dispatches BF16: HYBRIDEP_SMS)
    ep_kernel: Callable[[str], Any] | None = None     # comm.ep_kernels column -> published bytes/s for this plan's
                                                      # dispatcher, device, link, EP size and SMs; None: NCCL model
    cp_alltoall: Callable[[Any], Any] | None = None   # over the cp group (Ulysses)
    cp_send: Callable[[Any], Any] | None = None       # one ring hop

    @property
    def active(self) -> bool:
        return self.ep > 1 or self.cp > 1


def chunk_owner(cp: int, balanced: bool) -> list[int]:
    """Owner rank of each of the 2*cp sequence chunks: rank r holds chunks r and 2cp-1-r when balanced, chunks
    2r and 2r+1 (a contiguous split) otherwise."""
    chunks = 2 * cp
    if balanced:
        return [c if c < cp else chunks - 1 - c for c in range(chunks)]
    return [c // 2 for c in range(chunks)]


def core_shares(cp: int, causal: bool, balanced: bool = True) -> list[Fraction]:
    """Each rank's share of the attention core's work, by counting (query chunk, key chunk) blocks: all 4cp^2
    blocks without a mask; with a causal mask the blocks below the diagonal, and half of each diagonal block."""
    owner = chunk_owner(cp, balanced)
    work = [Fraction(0)] * cp
    for q in range(2 * cp):
        for k in range(2 * cp):
            if not causal or k < q:
                work[owner[q]] += 1
            elif k == q:
                work[owner[q]] += Fraction(1, 2)
    total = sum(work)
    return [w / total for w in work]


def _tile_work(queries: tuple[int, ...], keys: tuple[int, ...], causal: bool) -> Fraction:
    """Blocks of work in one (query chunks x key chunks) tile, counted as core_shares counts them."""
    return sum((Fraction(1) if not causal or k < q else Fraction(1, 2) if k == q else Fraction(0)
                for q in queries for k in keys), Fraction(0))


def ring_steps(cp: int, causal: bool, rank: int | None = None) -> list[tuple[Fraction, Fraction]]:
    """(share of the rank's attention work, key length over the whole sequence's) of each of the cp fused-attention
    kernels a load-balanced ring rank launches per pass, as Transformer Engine's AttnFuncWithCPAndKVP2P runs them
    (NVIDIA/TransformerEngine @d0067d0d, transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py). Rank r holds chunks r and 2cp-1-r (chunk_owner); at step i it holds the keys and values of
    rank (r - i) mod cp. Causal (forward, lines 1796-1895): step 0 is the "diagonal" tile, its own 2 chunks against
    themselves under the causal mask; steps i <= r the "lower-triangle" tile, both query chunks against the first
    key chunk only (max_seqlen_kv // 2, lines 871-885: the second is wholly masked); steps i > r the
    "upper-triangle" tile, the second query chunk only (max_seqlen_q // 2, lines 886-912: the first sees no key)
    against both key chunks, unmasked. The backward runs the same tiles in reverse (lines 2577-2618; max_seqlen
    halved alike in cp_p2p_bwd_fused_attn, lines 1171-1183). Without the mask every step is the whole 2 x 2 chunk
    tile ("all"). The work is counted from the tile shapes; every tile holds 2 chunk-blocks of work (4 unmasked),
    so every step is 1/cp of the rank's work (the shares, over the rank's unmasked blocks, sum to 1: the halved
    tiles drop only masked blocks) and every rank does the same work. The ranks differ in key lengths:
    rank r runs r half-key tiles, so rank cp-1 (the default), whose every off-diagonal tile has half the keys,
    is the slowest on a curve that penalizes short keys, and the ring, whose step i waits for every rank's tile i,
    runs at its pace."""
    rank = cp - 1 if rank is None else rank
    mine = (rank, 2 * cp - 1 - rank)
    tiles = []
    for i in range(cp):
        j = (rank - i) % cp
        theirs = (j, 2 * cp - 1 - j)
        if not causal:
            queries, keys = mine, theirs
        elif i == 0:
            queries, keys = mine, mine
        elif i <= rank:
            queries, keys = mine, theirs[:1]
        else:
            queries, keys = mine[1:], theirs
        tiles.append((_tile_work(queries, keys, causal), Fraction(len(keys), 2 * cp)))
    whole = _tile_work(tuple(range(2 * cp)), tuple(range(2 * cp)), causal)
    work = core_shares(cp, causal)[rank] * whole  # the rank's unmasked blocks: the tiles skip only masked ones
    return [(tile / work, keys) for tile, keys in tiles]


def core_divisor(cp: int, layer: Layer, algorithm: str) -> Any:
    """What the slowest rank's attention-core time is divided by: 1 / its share. Ulysses gives every rank
    heads/cp whole heads (an exact 1/cp); ring attention gives the busiest rank's block share."""
    if cp == 1:
        return 1
    if algorithm == "ulysses":
        return cp
    share = max(core_shares(cp, bool(layer.get("causal", False))))
    inverse = 1 / share
    return int(inverse) if inverse.denominator == 1 else float(inverse)


def _heads_split(use: Use, tp: int) -> int:
    return tp if use.sharded else 1


def cp_exchange(use: Use, batch: Any, e: int, tp: int, par: Parallel, core_fwd: Any,
                core_bwd: Any) -> tuple[Any, Any]:
    """(forward, backward) exposed seconds of one attention layer's context-parallel exchange per micro-batch.

    ring: every step sends one key/value block of s/cp tokens (keys, values and their gradients backward) while
    the core computes on the block it has, so a step costs max(send, compute) and cp - 1 steps expose
    (cp - 1) * max(0, send - core/cp). ulysses: two all-to-alls each way, not overlapped.
    """
    layer, cp = use.layer, par.cp
    tokens = batch * layer.in_shape[-2] / cp
    heads = _heads_split(use, tp)
    if par.cp_algorithm == "ulysses":
        qkv, out = qkv_widths(layer)
        t = par.cp_alltoall(e * tokens * qkv / heads) + par.cp_alltoall(e * tokens * out / heads)
        return t, t
    block = e * tokens * kv_width(layer) / heads
    steps = cp - 1
    fwd = steps * mathx.maximum(par.cp_send(block) - core_fwd / cp, 0.0)
    bwd = steps * mathx.maximum(par.cp_send(2 * block) - core_bwd / cp, 0.0)
    return fwd, bwd


def expert_load(layer: Layer, par: Parallel) -> float:
    """Tokens the busiest rank's experts run, over the mean: the capacity factor when experts are padded to
    capacity (tokens over it are dropped), else the routing imbalance once experts are spread over ranks (on one
    rank every expert's tokens run there anyway, so the sum is the mean)."""
    capacity = layer.get("capacity_factor")
    if capacity:
        return capacity
    return par.imbalance if par.ep > 1 else 1


def dispatch_bytes(layer: Layer, batch: Any, e: int, tp: int, cp: int) -> Any:
    """Bytes one rank puts into one dispatch all-to-all (and gets back from one combine), at mean load: its
    tokens' top_k copies of the hidden vector (of its latent with `latent`). A tensor-parallel group splits its
    tokens among its ranks before dispatching (Megatron-Core's all-to-all dispatcher), a context-parallel rank
    holds s/cp of them."""
    return e * batch * dispatch_elements(layer, layer.get("capacity_factor") or 1) / (tp * cp)


def nodes_reached(layer: Layer, nodes: int) -> int:
    """Most nodes one token's top_k experts lie on under group-limited routing (DeepSeek-V3 Sec. 2.1.2: experts
    in `groups` groups, a token choosing among the best `top_groups`): experts spread evenly over the nodes, a
    group covers ceil(nodes / groups) of them."""
    return min(layer["top_k"], nodes, layer["top_groups"] * -(-nodes // layer["groups"]))


def ep_exchange(use: Use, batch: Any, e: int, tp: int, par: Parallel) -> Any:
    """Seconds of one MoE layer's dispatch + combine all-to-alls per micro-batch, one direction (forward; the
    backward sends the gradients the same way). Dropless routing sends the busiest rank's load.

    Plain routing sends each of a token's top_k copies to its expert's rank (Megatron-Core's all-to-all
    dispatcher). Group-limited routing across nodes is dispatched hierarchically (DeepSeek-V3 Sec. 3.2.2,
    DeepEP): a token crosses InfiniBand once per node it reaches, to the GPU with the same in-node index, and is
    forwarded over NVLink to its experts there; the combine retraces the path.

    With DeepEP (`par.ep_dispatcher` "deepep", DEEPEP_SMS) the two legs of a hierarchical all-to-all overlap (the
    longer one sets its time), and under an FP8 recipe the dispatch direction carries FP8 values with one FP32
    scale per 128 (dlperf.ops.recompute.FP8_TILED) while the combine direction stays BF16: one leg of each kind
    per pass, forward and backward alike. HybridEP (`par.ep_dispatcher` "hybridep", HYBRIDEP_SMS) overlaps its legs
    the same way and sends BF16 both ways. Where their published benchmarks cover the case (`par.ep_kernel`), each
    transfer is priced as those kernels measure it instead (`_kernel_transfer`)."""
    layer = use.layer
    load = 1 if layer.get("capacity_factor") else expert_load(layer, par)
    nbytes = dispatch_bytes(layer, batch, e, tp, par.cp) * load
    dispatch = nbytes * FP8_TILED / e if par.fp8_dispatch else nbytes
    column = "dispatch_fp8" if par.fp8_dispatch else "dispatch_bf16"
    return _transfer(layer, par, dispatch, column) + _transfer(layer, par, nbytes, "combine")


def _transfer(layer: Layer, par: Parallel, nbytes: Any, column: str) -> Any:
    """One dispatch or combine of `nbytes` per rank (top_k copies per token): at the dispatcher's published
    bandwidth where a table covers it, else as an all-to-all."""
    bandwidth = par.ep_kernel(column) if par.ep_kernel else None
    if bandwidth is None:
        return _alltoall(layer, par, nbytes)
    return _kernel_transfer(layer, par, nbytes, bandwidth)


def _kernel_transfer(layer: Layer, par: Parallel, nbytes: Any, bandwidth: float) -> Any:
    """Seconds of one DeepEP or HybridEP transfer: the bytes its benchmark counts over the bandwidth it measured
    (dlperf/data/ep_kernels/deepep.yaml). Those count one copy per token and rank reached inside an NVLink domain,
    one per token and node reached across nodes (the RDMA leg, the bottleneck whose bandwidth the tables give for
    the whole transfer, NVLink forwarding overlapped inside it), not one per expert."""
    parts = par.ep_nodes if par.ep_nodes > 1 else par.ep
    return nbytes / layer["top_k"] * parts_reached(layer, parts) / bandwidth


def parts_reached(layer: Layer, parts: int) -> float:
    """Expected number of distinct parts (ranks or nodes, the experts spread evenly over them) one token's top_k
    experts lie on, routed uniformly as the published benchmarks route (random scores). Group-limited routing
    (DeepSeek-V3 Sec. 2.1.2) draws them from the `top_groups` best of `groups` groups: when each part holds whole
    groups, every chosen group is reached (groups are ranked by their best experts' scores, as DeepSeek-V3's
    router and DeepEP's tests/legacy/test_internode.py choose them) and the parts reached are those the chosen
    groups lie on; when a group spans several parts, the experts are drawn uniformly from the chosen groups'."""
    experts, k = int(layer["experts"]), int(layer["top_k"])
    groups, chosen = (int(layer["groups"]), int(layer["top_groups"])) if layer.get("top_groups") else (1, 1)
    if groups >= parts and groups % parts == 0 and chosen < groups:
        per_part = groups // parts
        return parts * (1 - comb(groups - per_part, chosen) / comb(groups, chosen))
    candidates = min(parts, -(-parts * chosen // groups))
    pool = experts * candidates // parts
    return candidates * (1 - comb(pool - experts // parts, k) / comb(pool, k))


def ep_dispatch_extra(use: Use, batch: Any, tp: int, par: Parallel) -> tuple[Any, Any]:
    """(forward, backward) seconds a dropless MoE layer's dispatcher adds per micro-batch beyond the token
    all-to-alls (ep_exchange), as Megatron-Core's all-to-all dispatcher runs (MoEAlltoAllTokenDispatcher in
    megatron/core/transformer/moe/token_dispatcher.py, NVIDIA/Megatron-LM @d98e8a64):
    - `preprocess` all-gathers each rank's tokens per expert (E int64 counts) over the expert-parallel group to
      size the all-to-alls, forward;
    - `token_dispatch` sends the routing probabilities (fp32, one per routed token copy) in an all-to-all of their
      own after the tokens', and the backward returns their gradients the same way;
    - the split sizes reach the host by a device-to-host copy that the host waits on ("A synchronization is
      needed before expert parallel AlltoAll communication to get the `input_splits` and `output_splits` CPU
      values", `_maybe_dtoh_and_synchronize` at "before_ep_alltoall"): the device runs dry, and the next kernel
      starts only when the host has issued it (`par.sync_gap`). DeepEP's dispatch waits the same way ("the CPU
      will wait for GPU's signal to arrive", deepseek-ai/DeepEP README, normal kernels) but carries the
      probabilities inside its dispatch and counts in its own notify step, so only the gap applies there; so does
      HybridEP's (HYBRIDEP_SMS: its host waits for the received-token count);
    - HybridEP's forward dispatch also all-gathers every rank's routing map (`routing_map_gather`), which the
      bandwidth its benchmark publishes leaves out.
    Experts padded to capacity have static sizes: no count gather and no sync (`drop_and_pad`), the
    probabilities still travel (capacity x E of them) and HybridEP still gathers its routing maps."""
    layer = use.layer
    if par.ep_dispatcher != "alltoall":
        gather = routing_map_gather(layer, batch, tp, par)
        return (gather, 0.0) if layer.get("capacity_factor") else (gather + par.sync_gap, 0.0)
    capacity = layer.get("capacity_factor") or 1
    load = 1 if layer.get("capacity_factor") else expert_load(layer, par)
    probs = ROUTER_BYTES * batch * dispatch_elements(layer, capacity) / routed_width(layer) / (tp * par.cp)
    probs_alltoall = _alltoall(layer, par, probs * load)
    if layer.get("capacity_factor"):
        return probs_alltoall, probs_alltoall
    # the gathered [ep, E] int64 counts: an all-gather is priced on its whole (concatenated) buffer
    counts = par.ep_allgather(par.ep * INDEX_BYTES * layer["experts"]) if par.ep_allgather else 0.0
    return counts + probs_alltoall + par.sync_gap, probs_alltoall


def routing_map_gather(layer: Layer, batch: Any, tp: int, par: Parallel) -> Any:
    """Seconds of HybridEP's routing-map all-gather, forward only: with no cached handle (Megatron-Core's
    HybridEPDispatch.forward calls dispatch_with_permute without one, fused_a2a.py @92c8482e) the buffer
    gathers each rank's [tokens, experts] bool routing map over the expert-parallel group before its metadata
    preprocessing (deepseek-ai/DeepEP hybrid-ep @94a9f8f, deep_ep/hybrid_ep_buffer.py dispatch_with_permute and
    csrc/hybrid_ep/executor/executor.cu allgather_routing_map: NCCL all_gather_into_tensor across nodes, a
    custom NVLink all-gather inside one domain when enabled). The published HybridEP bandwidths leave it out:
    tests/test_hybrid_ep.py times dispatch with the cached `handle` of an earlier call. The backward's dispatch
    and combine reuse the handle. DeepEP gathers no routing map (its counts travel in the timed notify step)."""
    if par.ep_dispatcher != "hybridep" or not par.ep_allgather:
        return 0.0
    tokens = batch * numel(layer.in_shape[:-1]) / (tp * par.cp)
    return par.ep_allgather(par.ep * tokens * layer["experts"])


def ep_collectives(layer: Layer, par: Parallel) -> tuple[int, int]:
    """(forward, backward) collectives the all-to-all dispatcher issues per MoE layer (token_dispatcher.py
    MoEAlltoAllTokenDispatcher, NVIDIA/Megatron-LM @92c8482e): forward the tokens-per-expert all-gather
    (`preprocess`; none when experts are padded to capacity), the token and probability all-to-alls
    (`token_dispatch`) and the combine's (`token_combine`); backward the three all-to-alls' gradients. HybridEP
    issues its forward routing-map all-gather through torch.distributed (`routing_map_gather`); its and DeepEP's
    own kernels are no NCCL collectives (the gather is one host operator either way)."""
    if par.ep_dispatcher == "hybridep":
        return 1, 0
    if par.ep_dispatcher != "alltoall":
        return 0, 0
    return (3 if layer.get("capacity_factor") else 4), 3


def _alltoall(layer: Layer, par: Parallel, nbytes: Any) -> Any:
    """One all-to-all of `nbytes` per rank over the ep group: flat, or in two legs across nodes under group-limited
    routing or a hierarchical dispatcher (summed; overlapped under DeepEP and HybridEP). DeepEP's and HybridEP's
    kernels send a token over RDMA once per node it reaches and forward it over NVLink there ("normal kernels with
    NVLink and RDMA forwarding", deepseek-ai/DeepEP docs/legacy.md @dd758caf; the hybrid-ep branch's
    docs/README_Hybrid-EP.md @94a9f8f), whatever the routing: where no published table prices them across nodes
    (`_transfer`), the RDMA leg carries the expected nodes reached (parts_reached), not top_k copies."""
    grouped = bool(layer.get("top_groups"))
    if par.ep_nodes == 1 or not (grouped or par.ep_dispatcher in DISPATCHER_SMS):
        return par.ep_alltoall(nbytes)
    reached = nodes_reached(layer, par.ep_nodes) if grouped else parts_reached(layer, par.ep_nodes)
    across = par.ep_alltoall_nodes(nbytes / layer["top_k"] * reached)
    inside = par.ep_alltoall_node(nbytes)
    return mathx.maximum(across, inside) if par.ep_dispatcher in DISPATCHER_SMS else across + inside
