"""Compute and tensor-parallel communication time of a group of layers (a pipeline stage, or the whole model)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from dlperf import mathx
from dlperf.cost import Cost
from dlperf.engine.context import (
    ATTENTION_OPS,
    Parallel,
    core_divisor,
    cp_exchange,
    ep_collectives,
    ep_dispatch_extra,
    ep_exchange,
    expert_load,
    ring_steps,
)
from dlperf.engine.cuda_graphs import Graphs, eager_share, eager_use_share, replays, sublayer_share
from dlperf.engine.device import dispatch_times, kernel_times
from dlperf.engine.layers import Use
from dlperf.engine.overlap import exposed
from dlperf.ops import OPS
from dlperf.ops.base import Kernel, Layer, numel
from dlperf.ops.conv import TENSOR_CORE_DTYPES, algorithm_kernel, applicable, layout_transpose_kernel
from dlperf.ops.dense import qkv_split_for_rank, quadratic_attention_bytes, softmax_for_rank
from dlperf.ops.elementwise import XLA_SOFTMAX_KERNELS
from dlperf.ops.fp8 import OPERAND_BYTES, fp8_kernels, is_recipe, kernel_dtype, storage_dtype
from dlperf.ops.fp8 import saved_bytes as fp8_saved_bytes
from dlperf.ops.moe import moe_kernels, routed_expert_kernel
from dlperf.ops.recompute import ActivationPolicy, freed_bytes, rerun_kernels, reruns
from dlperf.plan import fast_replace
from dlperf.spec.hardware import Device, Hardware

FULL = ("full", "except_last")  # rerun every forward kernel (except_last: not for the last micro-batch)
ATTENTION_CORE = ("scores", "softmax", "attn_random_uniform", "attn_dropout", "attend", "flash_attention",
                  *XLA_SOFTMAX_KERNELS)
# Ops that full recomputation never reruns: the loss runs after the checkpointed blocks (Megatron-LM checkpoints
# the transformer layers, ParallelTransformer._checkpointed_forward in megatron/model/transformer.py @5281919, and
# GPT2Model computes the loss on their output; FSDP-style activation checkpointing wraps the blocks too).
NOT_CHECKPOINTED = ("cross_entropy",)


@dataclass
class StageCost:
    """Seconds per micro-batch (forward, backward, recompute, tp comm) and per-device parameters."""

    forward: Any = 0.0
    backward: Any = 0.0
    recompute: Any = 0.0
    tp_comm_fwd: Any = 0.0
    tp_comm_bwd: Any = 0.0
    params: Any = 0
    saved_bytes: Any = 0.0          # activations kept for backward, per micro-batch
    saved_outside: Any = 0.0        # ... of those, the layers full recomputation does not rerun (_full_rerun)
    saved_blocks: Any = 0.0         # ... of those, the repeated blocks' (what activation offloading moves to host)
    per_type: dict[str, Any] = field(default_factory=dict)
    synced_params: Any = None       # parameters data parallelism allreduces (None: all of `params`)
    host_fwd: Any = 0.0             # host seconds to issue the forward kernels of one micro-batch
    host_bwd: Any = 0.0             # ... the backward kernels
    host_recompute: Any = 0.0       # ... the recomputed forward kernels
    ep_comm_fwd: Any = 0.0          # expert dispatch + combine all-to-alls
    ep_comm_bwd: Any = 0.0
    cp_comm_fwd: Any = 0.0          # context-parallel exchange left exposed (ring sends, Ulysses all-to-alls)
    cp_comm_bwd: Any = 0.0
    expert_params: Any = 0          # the routed experts' share of `params` when ep > 1 (reduced over edp)
    fp8_params: Any = 0             # the share of `params` in layers an FP8 recipe runs in FP8 (cached FP8 copies)
    bf16_params: Any = 0            # ... in layers a `precision: bf16` block call keeps out of an FP8 recipe
    backward_weight: Any = 0.0      # the weight-gradient share of `backward` (DualPipe's W; see _weight_share)
    tp_comm_rerun: Any = 0.0        # the tp collectives full recomputation reruns (a part of `recompute`)
    ep_comm_rerun: Any = 0.0        # ... the expert all-to-alls it reruns
    cp_comm_rerun: Any = 0.0        # ... the context-parallel exchange it reruns
    flow_fwd: Any = None            # the forward kernels as a flow shop split at host syncs (None: no sync; flow_shop)

    def with_(self, **changes: Any) -> StageCost:
        """dataclasses.replace(self, **changes), as `plan.fast_replace` does it (the copy shares `per_type`): the
        step makes one per plan."""
        return fast_replace(self, _STAGE_FIELDS, changes)

    @property
    def dp_params(self) -> Any:
        return self.params if self.synced_params is None else self.synced_params

    def __add__(self, other: StageCost) -> StageCost:
        """Two parts of one device's work run one after the other (e.g. the convolutional body and the head)."""
        names = ("forward", "backward", "recompute", "tp_comm_fwd", "tp_comm_bwd", "params", "saved_bytes",
                 "saved_outside", "saved_blocks", "host_fwd", "host_bwd", "host_recompute", "ep_comm_fwd",
                 "ep_comm_bwd", "cp_comm_fwd", "cp_comm_bwd", "expert_params", "backward_weight", "tp_comm_rerun",
                 "ep_comm_rerun", "cp_comm_rerun", "fp8_params", "bf16_params")
        out = StageCost(**{n: getattr(self, n) + getattr(other, n) for n in names})
        if self.flow_fwd is not None or other.flow_fwd is not None:  # a part without syncs: its max(H, D)
            out.flow_fwd = sum(mathx.maximum(p.forward, p.host_fwd) if p.flow_fwd is None else p.flow_fwd
                               for p in (self, other))
        for part in (self, other):
            for key, value in part.per_type.items():
                out.per_type[key] = out.per_type.get(key, 0.0) + value
        return out

    @property
    def recompute_kernels(self) -> Any:
        """The device seconds of `recompute` that are kernels: less the collectives the rerun repeats, which a
        breakdown files under comm/tp, comm/ep and comm/cp beside the forward pass's own."""
        return self.recompute - self.tp_comm_rerun - self.ep_comm_rerun - self.cp_comm_rerun

    @property
    def forward_window(self) -> Any:
        """Wall seconds of the forward computation, which a collective on its own stream can hide behind: the
        device's work, or the host's issuing of it when that takes longer."""
        return mathx.maximum(self.forward, self.host_fwd)

    @property
    def backward_window(self) -> Any:
        """As `forward_window`, for the backward computation."""
        return mathx.maximum(self.backward, self.host_bwd)

    def passes(self, extra_backward: Any = 0.0, ep: tuple[Any, Any] | None = None,
               recompute_share: Any = 1.0) -> tuple[Any, Any, Any, Any]:
        """(forward, backward, device forward, device backward) seconds of a micro-batch's passes, each pass the
        longer of the device's work and the host's issuing of it (a pass is host-bound when issuing its kernels
        takes longer than running them; DEFAULT_DISPATCH in spec/hardware.py). `extra_backward` is more device
        work in the backward pass, `ep` the expert all-to-all left exposed (default: all of it), and
        `recompute_share` the fraction of micro-batches whose forward is rerun. A forward with host syncs
        (`flow_fwd`) lasts at least its kernels' flow shop plus the exposed collectives (each collective placed
        where it adds to every term of flow_shop's maximum: right after a sync, as the expert dispatch is)."""
        ep_fwd, ep_bwd = (self.ep_comm_fwd, self.ep_comm_bwd) if ep is None else ep
        device_fwd = self.forward + self.tp_comm_fwd + ep_fwd + self.cp_comm_fwd
        device_bwd = (self.backward + self.tp_comm_bwd + ep_bwd + self.cp_comm_bwd + self.recompute * recompute_share
                      + extra_backward)
        forward = mathx.maximum(device_fwd, self.host_fwd)
        if self.flow_fwd is not None:
            forward = mathx.maximum(forward, self.flow_fwd + (device_fwd - self.forward))
        return (forward,
                mathx.maximum(device_bwd, self.host_bwd + self.host_recompute * recompute_share),
                device_fwd, device_bwd)

    def pass_time(self, extra_backward: Any = 0.0) -> Any:
        """Seconds of a micro-batch's two passes (`passes`): the slowest stage is the one whose passes last
        longest, and ranking stages by device time alone let faster memory move the bottleneck to a host-bound
        stage."""
        fwd, bwd, _, _ = self.passes(extra_backward)
        return fwd + bwd


_STAGE_FIELDS = frozenset(f.name for f in fields(StageCost))


def conv_choice(use: Use, batch: Any, e: int, hw: Hardware, dtype: str, divisor: Any) -> tuple[Kernel, str]:
    """cuDNN-style `auto`: the applicable algorithm with the least forward+backward time on this device. A conv
    curve measured per direct FLOP of whatever cuDNN ran (`algorithm_choice`) prices every convolution, an
    explicit algorithm too: the measurement holds no figure for one algorithm apart, and pricing an explicit
    Winograd on the plain matmul curve made it faster than cuDNN's own choice (reviewer)."""
    layer = use.layer
    if hw.device.eff("conv", dtype).algorithm_choice:  # the measured curve already holds cuDNN's choice
        return algorithm_kernel(layer, "direct", batch, e), "direct"
    if layer["algorithm"] != "auto":
        return algorithm_kernel(layer, layer["algorithm"], batch, e), layer["algorithm"]
    best, best_time, name = None, None, "direct"
    for algorithm in applicable(layer, dtype):
        kernel = algorithm_kernel(layer, algorithm, batch, e)
        total = sum(kernel_times(kernel, hw.device, dtype, divisor, use.tp_dim))
        if best is None or isinstance(total, float) and total < best_time:
            best, best_time, name = kernel, total, algorithm
    return best, name


def use_kernels(use: Use, batch: Any, e: int, hw: Hardware, dtype: str, divisor: Any,
                fp8: bool = False, ep: int = 1, dispatcher: str = "alltoall", nchw: bool = False,
                fallback: bool = True, scaling: str = "delayed", swizzle: str = "quantize",
                sp_dim: str | None = None, transpose: str = "cached", fold: int = 1) -> list[Kernel]:
    """The layer's kernels; with `fp8` (an FP8 recipe's layer) its weight GEMMs in FP8 with their casts; a MoE
    layer under expert parallelism keeps experts / ep on a device (its grouped GEMMs read fewer weights) and
    does the bookkeeping of its token `dispatcher`, its routed experts on 1/`fold` of the tokens when they run on
    a grid of their own (`_fold`); with `nchw` (activations in PyTorch's default NCHW layout) a
    tensor-core convolution also pays cuDNN's layout transposes (dlperf.ops.conv.layout_transpose_kernel). An
    attention layer with `softmax: megatron` runs Megatron's PyTorch softmax where its fused kernel refuses the
    micro-batch and heads per rank (dlperf.ops.dense.softmax_for_rank; `fallback` False keeps the fused one).
    `scaling` is the fp8 recipe's (dlperf.ops.fp8.FP8_SCALINGS), `swizzle` the mxfp8 recipe's (MX_SWIZZLES),
    `sp_dim` the use's tensor-parallel dimension when sequence parallelism gathers its operands (None: it does not),
    and `transpose` which FP8 weight copies the recipe keeps (dlperf.plan.FP8_WEIGHT_TRANSPOSES)."""
    if use.layer.op == "moe" and (ep > 1 or fold > 1):
        resident = use.layer["experts"] // ep if ep > 1 else None
        kernels = list(moe_kernels(use.layer, batch, e, resident, dispatcher, fold))
        return fp8_kernels(kernels, e, dtype, scaling, swizzle, sp_dim, transpose) if fp8 else kernels
    kernels = list(OPS[use.layer.op].kernels(use.layer, batch, e))
    if fallback:
        kernels = softmax_for_rank(use.layer, kernels, batch, e, divisor)
    kernels = qkv_split_for_rank(use.layer, kernels, batch, e, divisor)
    if use.layer.op == "conv2d":
        kernels[0] = conv_choice(use, batch, e, hw, storage_dtype(dtype), divisor)[0]
        if nchw and dtype in TENSOR_CORE_DTYPES:  # NCHW tensors on tensor cores: cuDNN's layout transposes
            kernels.append(layout_transpose_kernel(use.layer, batch, e))
    return fp8_kernels(kernels, e, dtype, scaling, swizzle, sp_dim, transpose) if fp8 else kernels


def stage_cost(uses: list[Use], batch: Any, e: int, hw: Hardware, dtype: str, tp: int, sp: bool,
               recompute: str, comm_time: Any, fp8: frozenset = frozenset(), tp_overlap: bool = False,
               par: Parallel | None = None, memo: dict | None = None,
               acts: ActivationPolicy | None = None, nchw: bool = False, scaling: str = "delayed",
               swizzle: str = "quantize", graphs: Graphs | None = None, transpose: str = "cached") -> StageCost:
    """Sum the layers' kernels at micro-batch `batch`; `comm_time(op, nbytes)` prices tp collectives. Under
    dtype fp8, the layers in `fp8` run their weight GEMMs in FP8 (dlperf.ops.fp8); with `tp_overlap` each
    layer's tp collectives hide behind its GEMMs (dlperf.engine.overlap); `par` adds expert and context
    parallelism (None: neither); `memo` keeps kernel times across calls on the same hardware (search prices the
    same kernels for thousands of plans); `acts` recomputes parts of layers and caches activations in FP8
    (dlperf.ops.recompute; None: neither); `nchw` keeps activations NCHW; `scaling`, `swizzle` and `transpose` are
    the fp8 and mxfp8 recipes' (use_kernels); `graphs` the modules captured as CUDA graphs, whose kernels and
    collectives cost the host nothing and whose replays one dispatch each (dlperf.engine.cuda_graphs; None:
    eager)."""
    out = StageCost()
    par = par or Parallel()
    acts = acts or ActivationPolicy()
    graphs = graphs or Graphs()
    sublayers = sublayer_share(graphs, uses) if graphs.scopes else 0.0
    sequence: list[tuple[Use, Kernel, Any, Any, bool]] = []  # the forward's (use, kernel, host, device, syncs)
    for use in uses:
        divisor = tp if (use.sharded or sp) else 1
        in_fp8 = is_recipe(dtype) and use.layer in fp8
        rerun = rerun_kernels(use.layer, acts.modules) if acts.modules else frozenset()
        gemm = {"fwd": 0.0, "bwd": 0.0}  # this layer's weight-GEMM seconds per pass: what overlap hides behind
        core = [0.0, 0.0]  # this layer's attention-core seconds, which a ring exchange overlaps
        sp_dim = use.tp_dim if sp and tp > 1 else None
        fold = _fold(use, tp, par)
        kernels = _use_kernels(use, batch, e, hw, dtype, tp if use.sharded else (tp if sp else 1), in_fp8,
                               par.ep, par.ep_dispatcher, memo, nchw, (scaling, swizzle, sp_dim), transpose, fold)
        for kernel in [rank for k in kernels for rank in _cp_kernels(use, k, par)]:
            folded = fold > 1 and routed_expert_kernel(kernel)
            split = kernel_split(kernel, divisor, sp, fold, par)
            fwd, bwd, host_fwd, host_bwd = _kernel_times(kernel, hw.device, kernel_dtype(kernel, dtype), split,
                                                         use.tp_dim, memo)
            if graphs.scopes:
                eager = eager_share(graphs, use, kernel, par.ep_dispatcher, sublayers)
                host_fwd, host_bwd = host_fwd * eager, host_bwd * eager
            load = expert_load(use.layer, par) if kernel.expert else 1
            if load != 1:
                fwd, bwd = fwd * load, bwd * load
            if kernel.name in ATTENTION_CORE:
                core = [core[0] + fwd, core[1] + bwd]
            sequence.append((use, kernel, host_fwd, fwd, _host_sync(use, kernel, par)))
            out.forward = out.forward + use.count * fwd
            out.backward = out.backward + use.count * bwd
            out.backward_weight = out.backward_weight + use.count * bwd * _weight_share(kernel)
            out.host_fwd = out.host_fwd + use.count * host_fwd
            out.host_bwd = out.host_bwd + use.count * host_bwd
            if _recomputed(recompute, use, kernel) or reruns(rerun, kernel.name):
                out.recompute = out.recompute + use.count * fwd
                out.host_recompute = out.host_recompute + use.count * host_fwd
            if kernel.weight_gemm is not None and not folded:  # folded experts: no tp collective to hide
                gemm["fwd"], gemm["bwd"] = gemm["fwd"] + fwd, gemm["bwd"] + bwd
            key = f"{use.layer.op}"
            out.per_type[key] = out.per_type.get(key, 0.0) + use.count * (fwd + bwd)
        collectives = eager_use_share(graphs, use, sublayers)
        if par.active:
            _add_ep_cp(out, use, batch, e, tp, recompute, par, core, hw.device, 0.0 if graphs.full else 1.0)
        if tp > 1:
            _add_tp_comm(out, _tp_collectives(use, fold, par.ep_dispatcher), batch / par.cp, e, tp, recompute,
                         comm_time, gemm if tp_overlap else None, hw.device, collectives)
        _add_held(out, use, batch, e, dtype, tp, sp, recompute, in_fp8, par, acts)
    if graphs.scopes:
        fwd_replays, bwd_replays = replays(graphs, uses)
        out.host_fwd = out.host_fwd + fwd_replays * hw.device.dispatch_forward
        out.host_bwd = out.host_bwd + bwd_replays * hw.device.dispatch_backward
    out.flow_fwd = _flow_forward(sequence)
    return out


def stage_memory(uses: list[Use], batch: Any, e: int, dtype: str, tp: int, sp: bool, recompute: str,
                 fp8: frozenset = frozenset(), par: Parallel | None = None,
                 acts: ActivationPolicy | None = None) -> StageCost:
    """What a stage holds, without pricing its kernels: the StageCost whose parameter and saved-activation fields
    (params, expert_params, fp8_params, saved_bytes, saved_blocks, saved_outside) are stage_cost's for the same
    arguments, bit for bit (both add them with `_add_held`), and whose times are 0. Memory per device reads only
    these, so a search screens a plan by memory without timing the kernels of a stage no fitting plan uses."""
    out = StageCost()
    par = par or Parallel()
    acts = acts or ActivationPolicy()
    for use in uses:
        _add_held(out, use, batch, e, dtype, tp, sp, recompute, is_recipe(dtype) and use.layer in fp8, par, acts)
    return out


def _add_held(out: StageCost, use: Use, batch: Any, e: int, dtype: str, tp: int, sp: bool, recompute: str,
              in_fp8: bool, par: Parallel, acts: ActivationPolicy) -> None:
    """What one layer adds to the device's memory: its parameters (sharded by tp, the routed experts also by ep;
    `in_fp8`: the layer runs in FP8 and keeps FP8 copies of them) and the activations it saves for backward per
    micro-batch, less what selective or partial recomputation and FP8 caching free, split by context parallelism."""
    held = out.params
    if _fold(use, tp, par) > 1:  # the routed experts on their own grid: sharded ep x expert-tp ways, not tp
        experts = OPS[use.layer.op].expert_params(use.layer)
        out.params = out.params - use.count * experts / tp + use.count * experts / (par.ep * par.etp)
        out.expert_params = out.expert_params + use.count * experts / (par.ep * par.etp)
    elif par.ep > 1 and use.layer.op == "moe":  # the routed experts' parameters are sharded ep ways on top of tp
        experts = OPS[use.layer.op].expert_params(use.layer) / (tp if use.sharded else 1)
        out.params = out.params - use.count * experts * (1 - 1 / par.ep)
        out.expert_params = out.expert_params + use.count * experts / par.ep
    out.params = out.params + use.count * use.layer.params / (tp if use.sharded else 1)
    if in_fp8:
        out.fp8_params = out.fp8_params + (out.params - held)
    if use.layer.precision:
        out.bf16_params = out.bf16_params + (out.params - held)
    divisor = tp if (use.sharded or sp) else 1
    saved = OPS[use.layer.op].saved(use.layer, e)
    saved = fp8_saved_bytes(use.layer, saved, e, dtype) if in_fp8 else saved
    saved = saved * batch / divisor
    if recompute == "selective":
        saved = saved - quadratic_attention_bytes(use.layer, e) * batch / tp
    if acts.active:
        cache = in_fp8 if use.layer.op == "linear" else in_fp8 and acts.fp8_cache
        freed = freed_bytes(use.layer, e, acts.modules, cache, use.layer in acts.after_norm,
                            OPERAND_BYTES[dtype] if in_fp8 else None)
        saved = saved - freed * batch / divisor
    saved = use.count * (saved / par.cp if par.cp > 1 else saved)
    out.saved_bytes = out.saved_bytes + saved
    if use.in_block:
        out.saved_blocks = out.saved_blocks + saved
    if recompute in FULL and not _full_rerun(recompute, use):
        out.saved_outside = out.saved_outside + saved


# Megatron-Core's MoE layer forward runs (NVIDIA/Megatron-LM @3758b54b): moe_layer.py custom_forward lines 556-583,
# shared_experts_compute, route (router GEMM, fused top-k and aux-loss scores, router.py _apply_aux_loss), preprocess
# (token_dispatcher.py dispatch_preprocess lines 594-649: `preprocess`'s counts, then TE's fused permute: row-id map,
# permute), dispatch (token_dispatch lines 651-678: the wait at "before_ep_alltoall", then the all-to-all),
# routed_experts_compute (dispatch_postprocess's chunk sort lines 680-749, the experts: fc1, the activation with
# gpt-oss's clamp and offset copy, fc2; combine_preprocess's chunk sort), combine, postprocess (unpermute = dlperf's
# `combine`, the shared experts' output added). moe_kernels lists its kernels in another order; this is the rank of
# each (an fp8 cast or swizzle takes its GEMM's), `chunk_sort` standing for both sorts before the experts.
# A LatentMoE layer's fc1_latent_proj opens preprocess, before the counts, and fc2_latent_proj follows the
# unpermute in postprocess (moe_layer.py @d98e8a64 :488-490, :591-592); moe_kernels lists each before its peer.
MOE_ORDER = {"shared": 0, "router": 1, "topk_gating": 2, "aux_loss": 3, "fc1_latent_proj": 4, "dispatch_counts": 4,
             "deepep_metadata": 4, "hybridep_metadata": 4, "row_id_map": 5, "permute": 6, "chunk_sort": 7,
             "expert_gate_up": 8, "expert_up": 8, "expert_act_clamp": 9, "glu_offset_copy": 10, "expert": 11,
             "combine": 12, "fc2_latent_proj": 12, "shared_add": 13, "grad_accumulate": 13}


def _moe_rank(kernel: Kernel) -> int:
    """`kernel`'s place in Megatron-Core's MoE forward (MOE_ORDER)."""
    name = kernel.name.removesuffix("_fp8_cast").removesuffix("_mx_swizzle")
    return MOE_ORDER.get(name, MOE_ORDER.get(name.split("_")[0], 11))


def _host_sync(use: Use, kernel: Kernel, par: Parallel) -> bool:
    """Whether the host waits for the device right after issuing `kernel`: a synchronising kernel (Kernel.syncs),
    or, in a dropless MoE layer under expert parallelism, the permute before the all-to-all dispatcher's wait for
    its split sizes (token_dispatcher.py lines 566 and 668: the sync point "before_ep_alltoall", issued after
    dispatch_preprocess's permute; context.ep_dispatch_extra charges its gap) or DeepEP's / HybridEP's metadata
    before their dispatch, which waits the same way."""
    if kernel.syncs:
        return True
    if use.layer.op != "moe" or par.ep <= 1 or use.layer.get("capacity_factor"):
        return False
    return kernel.name == ("permute" if par.ep_dispatcher == "alltoall" else f"{par.ep_dispatcher}_metadata")


def flow_shop(jobs: list[tuple[Any, Any]]) -> Any:
    """Seconds for the host to issue and the device to run `jobs` (host, device) in order, the device starting a
    job once it is issued and the previous one done (a two-stage permutation flow shop, Johnson 1954):
    max over i of h_1 + ... + h_i + d_i + ... + d_n; at least max(sum h, sum d), at most their sum, and never less
    when any h or d grows."""
    best, issued, left = 0.0, 0.0, sum(d for _, d in jobs)
    for h, d in jobs:
        issued = issued + h
        best = mathx.maximum(best, issued + left)
        left = left - d
    return best


def _flow_forward(sequence: list[tuple[Use, Kernel, Any, Any, bool]]) -> Any:
    """Seconds of a forward pass whose host syncs drain the device (None: no sync, the pass stays max(H, D)).
    Each sync loses the host's lead: between two syncs the kernels run as a flow shop. The uses are distinct
    layers with counts, in model order; the synchronising ones run `n` times per micro-batch (one per block), so
    one cycle is every kernel once per block (count / n: layers outside the blocks spread over them, a layer used
    twice per block counted twice at its place), MoE kernels in Megatron-Core's order (MOE_ORDER), cut after each
    sync and rotated to start after the last one; the pass is n cycles. Syncs in layers of different counts fall
    back to max(H, D) (not priced by this prototype)."""
    counts = {use.count for use, _, _, _, syncs in sequence if syncs}
    if len(counts) != 1:
        return None
    n = counts.pop()
    first: dict[int, int] = {}  # each use's first place in `sequence` (its kernels are contiguous there)
    for i, (use, *_) in enumerate(sequence):
        first.setdefault(id(use), i)

    def place(i: int) -> tuple[int, int]:
        use, kernel = sequence[i][:2]
        return (first[id(use)], _moe_rank(kernel)) if use.layer.op == "moe" else (i, 0)
    segments: list[list[tuple[Any, Any]]] = [[]]
    for use, _, host, device, syncs in (sequence[i] for i in sorted(range(len(sequence)), key=place)):
        segments[-1].append((host * use.count / n, device * use.count / n))
        if syncs:
            segments.append([])
    segments[0] = segments.pop() + segments[0]  # the cycle repeats: what follows the last sync precedes the first
    return n * sum(flow_shop(jobs) for jobs in segments)


def _weight_share(kernel: Kernel) -> Any:
    """The share of a kernel's backward time spent on weight gradients, taken as its share of the backward FLOPs
    (dgrad and wgrad GEMMs of one layer have the same shape class and run at about the same rate): what a
    zero-bubble schedule (Qi et al. 2024, ZB1P; DeepSeek-V3's DualPipe) defers as the "W" chunk."""
    weight = kernel.cost.bwd_weight_flops
    if mathx.is_zero(weight):
        return 0.0
    return weight / kernel.bwd_flops


def _use_kernels(use: Use, batch: Any, e: int, hw: Hardware, dtype: str, divisor: Any, fp8: bool, ep: int,
                 dispatcher: str, memo: dict | None, nchw: bool, quant: tuple[str, str, str | None],
                 transpose: str = "cached", fold: int = 1) -> list[Kernel]:
    """use_kernels, looked up in `memo` (one dict per hardware) when given, keyed on what it reads of the use:
    its layer and, for a convolution's algorithm choice, its tp dimension; `quant` is (scaling, swizzle, sp_dim),
    `transpose` the FP8 weight copies kept, `fold` the folded experts' share (use_kernels)."""
    scaling, swizzle, sp_dim = quant
    key = ("use_kernels", use.layer, use.row, batch, e, dtype, divisor, fp8, ep, dispatcher, nchw, quant, transpose,
           fold)
    kernels = None if memo is None else memo.get(key)
    if kernels is None:
        kernels = use_kernels(use, batch, e, hw, dtype, divisor, fp8, ep, dispatcher, nchw, scaling=scaling,
                              swizzle=swizzle, sp_dim=sp_dim, transpose=transpose, fold=fold)
        if memo is not None:
            memo[key] = kernels
    return kernels


def _kernel_times(kernel: Kernel, device: Device, dtype: str, split: Any, tp_dim: str | None,
                  memo: dict | None) -> tuple[Any, Any, Any, Any]:
    """(kernel_times, dispatch_times) as one tuple, looked up in `memo` (one dict per hardware) when given; the key
    carries the cuDNN version whose fused-attention curve the device holds (Device.for_cudnn), the one part of the
    hardware a plan changes."""
    if memo is None:
        return *kernel_times(kernel, device, dtype, split, tp_dim), *dispatch_times(kernel, device)
    key = (kernel, dtype, split, tp_dim, device.cudnn)
    times = memo.get(key)
    if times is None:
        times = memo[key] = (*kernel_times(kernel, device, dtype, split, tp_dim), *dispatch_times(kernel, device))
    return times


def kernel_split(kernel: Kernel, divisor: Any, sp: bool, fold: int, par: Parallel) -> Any:
    """What one rank's share of a kernel's work is divided by: the tensor-parallel `divisor` for a split kernel,
    and for every kernel under sequence parallelism (each rank holds 1/tp of the tokens); with the experts folded
    (`fold` > 1) the expert tp for the routed experts' kernels, which use_kernels built on the rank's own rows."""
    if fold > 1 and routed_expert_kernel(kernel):
        return par.etp
    return divisor if (kernel.split or sp) else 1


def _fold(use: Use, tp: int, par: Parallel) -> int:
    """tp / expert tp for a MoE layer whose experts run on a grid of their own (MoE parallel folding, Liu et al.
    2025, arXiv:2504.14960; dlperf.plan.folded), else 1. Megatron-Core builds the experts' GEMMs on the expert
    tensor-parallel group (TEGroupedMLP linear_fc1/linear_fc2 `tp_group=pg_collection.expt_tp`, moe/experts.py
    @92c8482e:749-790) and its all-to-all dispatcher gathers and reduce-scatters over that group alone
    (token_dispatcher.py @92c8482e:72-76, 692-701, 775-782): at expert tp 1 each rank's experts run the routed
    copies of its own sequence-parallel shard, unsplit, and no tensor-parallel collective joins them."""
    if par.etp is None or par.etp == tp or use.layer.op != "moe":
        return 1
    return tp // par.etp


def _tp_collectives(use: Use, fold: int, dispatcher: str) -> Use:
    """The use with the tensor-parallel collectives it runs. A dense layer's are its own (layers._tp_layer). A MoE
    layer's, under sequence parallelism with the experts split tp ways (Megatron-Core's default expert tp = tp),
    are the all-to-all dispatcher's: after the expert-parallel all-to-all it all-gathers the *routed* copies and
    their probabilities over the tensor-parallel group, and the combine reduce-scatters the experts' routed outputs
    (MoEAlltoAllTokenDispatcher.dispatch_postprocess and combine_preprocess, gather_from_sequence_parallel_region /
    reduce_scatter_to_sequence_parallel_region, moe/token_dispatcher.py @92c8482e:676-701), top_k times the bytes of
    a dense layer's hidden-state all-gather (of the latent with `latent`: the dispatcher runs after fc1_latent_proj,
    moe_layer.py @d98e8a64 :488-490), plus the shared experts' own all-gather and reduce-scatter (a dense MLP,
    SharedExpertMLP on the tensor-parallel group, moe/shared_experts.py @92c8482e:52). The flex dispatchers (DeepEP,
    HybridEP) send over the tp x ep ranks themselves and keep the dense pair as before. With the experts folded
    (`_fold`) the shared experts alone keep the dense pair, so a layer without shared experts runs none."""
    layer = use.layer
    if layer.op != "moe":
        return use
    if fold > 1:
        return use if layer["shared_experts"] else replace(use, comm=())
    pairs = tuple(c for c in use.comm if c[1] in ("allgather", "reduce_scatter"))
    if dispatcher != "alltoall" or not pairs:
        return use
    k = layer["top_k"]
    probs = 2 * k * numel(layer.in_shape[:-1])  # one fp32 probability per routed copy, in 16-bit elements
    routed = tuple((phase, op, k * _routed_share(layer, n)) for phase, op, n in pairs)
    routed += (("fwd", "allgather", probs), ("bwd", "reduce_scatter", probs))
    return replace(use, comm=routed + (pairs if layer["shared_experts"] else ()))


def _routed_share(layer: Layer, n: Any) -> Any:
    """Of a hidden-state collective of `n` elements, what the dispatcher moves per routed copy: `n`, or with
    `latent` its latent-wide part (fc1_latent_proj and fc2_latent_proj run duplicated, with no collective)."""
    return n * layer["latent"] / layer.in_shape[-1] if layer["latent"] else n


def _add_tp_comm(out: StageCost, use: Use, batch: Any, e: int, tp: int, recompute: str, comm_time: Any,
                 gemm: dict[str, Any] | None, device: Device, eager: Any = 1.0) -> None:
    """A layer's tensor-parallel collectives per pass: on the critical path, or with `gemm` (its GEMM seconds
    per pass) overlapped with them, leaving the exposed part and the GEMMs' slowdown (dlperf.engine.overlap).
    Issuing each collective is one more op for the host (c10d call, stream sync, launch), for the `eager` share of
    the layer's occurrences not captured in a CUDA graph."""
    for phase in ("fwd", "bwd"):
        parts = [(op, comm_time(op, e * batch * n)) for p, op, n in use.comm if p == phase and not mathx.is_zero(n)]
        if not parts:
            continue
        comm, slowdown = (sum(t for _, t in parts), 0.0) if gemm is None else exposed(parts, gemm[phase], phase, tp,
                                                                                     device.sms)
        comm, slowdown = use.count * comm, use.count * slowdown
        dispatch = device.dispatch_forward if phase == "fwd" else device.dispatch_backward
        host = eager * use.count * len(parts) * dispatch
        if phase == "fwd":
            out.tp_comm_fwd, out.forward, out.host_fwd = out.tp_comm_fwd + comm, out.forward + slowdown, \
                out.host_fwd + host
            if _full_rerun(recompute, use):
                out.recompute = out.recompute + comm + slowdown
                out.tp_comm_rerun = out.tp_comm_rerun + comm
                out.host_recompute = out.host_recompute + host
        else:
            out.tp_comm_bwd, out.backward, out.host_bwd = out.tp_comm_bwd + comm, out.backward + slowdown, \
                out.host_bwd + host


def _cp_kernel(kernel: Kernel, divisor: Any) -> Kernel:
    """The kernel on one context-parallel rank: its FLOPs and bytes divided, and a GEMM's token rows m (for tile
    and wave quantization) with them; the launches stay.

    A fused attention kernel's backward also recomputes QK^T (`bwd_recompute_flops`), over the blocks the rank
    holds, so that divides too. Transformer Engine's ring attention runs the backward on the same cp tiles as the
    forward, in reverse (NVIDIA/TransformerEngine @d0067d0d, transformer_engine/pytorch/attention/
    dot_product_attention/context_parallel.py: AttnFuncWithCPAndKVP2P.backward, "Reverse the steps in forward",
    lines 2577-2618; cp_p2p_bwd_fused_attn, lines 1171-1183, halves max_seqlen_kv / max_seqlen_q for the lower /
    upper-triangle tiles as cp_p2p_fwd_fused_attn does, lines 871-912), and each tile's backward kernel
    recomputes the scores of that tile only. Left undivided it kept the whole sequence's recomputed QK^T on
    every rank: Llama 3 8B at tp 8, seq 131072, cp 8 priced the attention backward at 3.3x its cp 1 share."""
    if divisor == 1:
        return kernel
    c = kernel.cost
    cost = Cost(c.fwd_flops / divisor, c.bwd_data_flops / divisor, c.bwd_weight_flops / divisor,
                c.fwd_bytes / divisor, c.bwd_bytes / divisor, c.depth, c.bwd_depth)
    shape = kernel.gemm and (kernel.gemm[0], kernel.gemm[1] / divisor, *kernel.gemm[2:])
    return replace(kernel, cost=cost, gemm=shape, bwd_recompute_flops=kernel.bwd_recompute_flops / divisor)


def _cp_kernels(use: Use, kernel: Kernel, par: Parallel) -> list[Kernel]:
    """The kernel as one context-parallel rank runs it: divided by its share (_cp_kernel), and a fused attention
    kernel under ring attention cut into the cp step kernels Transformer Engine launches (ring_steps): each its own
    launch (and host call) with its share of the rank's FLOPs and bytes, and the key length of its tile for the
    curve's sequence term, capped at the kernel's own (a sliding window). Steps with the same key length are one
    Kernel of as many launches, which the device prices as the sum of the identical kernels. Ulysses keeps whole
    sequences on every rank, one kernel."""
    divisor = _cp_split(use, kernel, par)
    rank = _cp_kernel(kernel, divisor)
    if divisor == 1 or par.cp_algorithm != "ring" or kernel.seq is None or kernel.name not in ATTENTION_CORE \
            or use.layer.op not in ATTENTION_OPS:
        return [rank]
    whole = use.layer.get("kv_seq") or use.layer.in_shape[-2]
    groups: dict[Any, list[Any]] = {}  # key fraction -> [share, steps], the diagonal's first
    for share, keys in ring_steps(par.cp, bool(use.layer.get("causal", False))):
        group = groups.setdefault(keys, [0, 0])
        group[0] += share
        group[1] += 1
    out = []
    for index, (keys, (share, steps)) in enumerate(groups.items()):
        c, f = rank.cost, float(share)
        out.append(replace(
            rank, cost=Cost(c.fwd_flops * f, c.bwd_data_flops * f, c.bwd_weight_flops * f, c.fwd_bytes * f,
                            c.bwd_bytes * f, c.depth, c.bwd_depth),
            bwd_recompute_flops=rank.bwd_recompute_flops * f, launches=rank.launches * steps,
            bwd_launches=_times(rank.bwd_launches, steps), framework_ops=_times(rank.framework_ops, steps),
            bwd_framework_ops=_times(rank.bwd_framework_ops, steps),
            seq=mathx.minimum(kernel.seq, whole * keys.numerator / keys.denominator),
            syncs=rank.syncs if index == 0 else 0, library_host=rank.library_host if index == 0 else (0.0, 0.0)))
    return out


def _times(count: Any, steps: int) -> Any:
    """A kernel's per-pass count (launches, framework operators) over `steps` launches; None stays None (the
    Kernel's "as in the forward")."""
    return None if count is None else count * steps


def _cp_split(use: Use, kernel: Kernel, par: Parallel) -> Any:
    """Context parallelism divides token-wise work by cp, and the attention core by its busiest rank's share."""
    if par.cp == 1:
        return 1
    if kernel.name in ATTENTION_CORE and use.layer.op in ATTENTION_OPS:
        return core_divisor(par.cp, use.layer, par.cp_algorithm)
    return par.cp


def _add_ep_cp(out: StageCost, use: Use, batch: Any, e: int, tp: int, recompute: str, par: Parallel,
               core: list[Any], device: Device, eager: Any = 1.0) -> None:
    """Expert all-to-alls of a MoE layer and the context-parallel exchange of an attention layer (the experts'
    parameters, sharded ep ways, are `_add_held`'s). Issuing each collective of the all-to-all dispatcher is one
    more op for the host, as a tensor-parallel one (context.ep_collectives), for the `eager` share not captured in
    a CUDA graph (all of them but under full_iteration)."""
    layer, count = use.layer, use.count
    ep = cp = 0.0  # the forward exchanges, which full recomputation reruns
    host = 0.0
    if par.ep > 1 and layer.op == "moe":
        exchange = ep_exchange(use, batch, e, tp, par)
        extra_fwd, extra_bwd = ep_dispatch_extra(use, batch, tp, par)
        ep = exchange + extra_fwd
        out.ep_comm_fwd = out.ep_comm_fwd + count * ep
        out.ep_comm_bwd = out.ep_comm_bwd + count * (exchange + extra_bwd)
        fwd_ops, bwd_ops = ep_collectives(layer, par)
        host = eager * count * fwd_ops * device.dispatch_forward
        out.host_fwd = out.host_fwd + host
        out.host_bwd = out.host_bwd + eager * count * bwd_ops * device.dispatch_backward
    if par.cp > 1 and layer.op in ATTENTION_OPS:
        cp, bwd = cp_exchange(use, batch, e, tp, par, core[0], core[1])
        out.cp_comm_fwd = out.cp_comm_fwd + count * cp
        out.cp_comm_bwd = out.cp_comm_bwd + count * bwd
    if _full_rerun(recompute, use):
        out.host_recompute = out.host_recompute + host
        out.recompute = out.recompute + count * (ep + cp)
        out.ep_comm_rerun = out.ep_comm_rerun + count * ep
        out.cp_comm_rerun = out.cp_comm_rerun + count * cp


def _full_rerun(recompute: str, use: Use) -> bool:
    """Full recomputation reruns the layer's forward (kernels and collectives) unless it is not checkpointed.
    `full` checkpoints each block, as Megatron-LM (`--checkpoint-activations` wraps the transformer layers only;
    Megatron-DeepSpeed's GPTModelPipe._is_checkpointable accepts only ParallelTransformerLayerPipe), FSDP stacks
    (composer and torchtitan wrap each transformer block) do: the layers around the blocks run once.
    `except_last` is torchgpipe's, which checkpoints a whole partition (Kim et al. 2020, arXiv:2004.09910)."""
    if recompute not in FULL or use.layer.op in NOT_CHECKPOINTED:
        return False
    return use.in_block or recompute == "except_last"


def _recomputed(recompute: str, use: Use, kernel: Kernel) -> bool:
    """Full recomputation reruns every forward kernel but the loss's (NOT_CHECKPOINTED); selective (Korthikanti
    et al. 2022) only the attention core (QK^T, softmax, AV) whose s^2 activations it does not keep."""
    if recompute in FULL:
        return _full_rerun(recompute, use)
    return recompute == "selective" and kernel.name in ATTENTION_CORE and not use.layer.get("flash", False)


def selective_changes(layer: Any) -> bool:
    """Whether recompute `selective` prices `layer` differently from `none`. The engine reads selective in two
    places only: `_recomputed` reruns the ATTENTION_CORE kernels of a layer without `flash`, and `_add_held` frees
    quadratic_attention_bytes, which is nonzero only on an attention layer without `flash`. A fused (flash)
    attention or MLA core keeps no s^2 scores (only a per-row log-sum-exp), so selective recomputation, which
    recomputes exactly those (Korthikanti et al. 2022, section 5), is recompute none for it; so for any layer that
    is neither an unfused attention nor one whose kernels carry an attention-core name (a standalone softmax
    layer). Every other knob (tp, sp, cp, ep, fp8) reaches neither branch, so the answer holds for every plan."""
    if layer.get("flash", False):
        return False
    if layer.op == "attention":
        return True
    return any(kernel.name in ATTENTION_CORE for kernel in OPS[layer.op].kernels(layer, 1, 2))


