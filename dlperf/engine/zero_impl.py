"""ZeRO stage 3 as DeepSpeed v0.3.12-v0.4.0 ran it (plan key `zero_impl: deepspeed-0.3`).

Every rule below is read from DeepSpeed's source at v0.3.13 (microsoft/DeepSpeed@12a53b43, 2021-03-16; the same
lines are unchanged through v0.4.0@2d302d6a, 2021-06-08), and from PyTorch's NCCL process group of that time
(pytorch/pytorch torch/lib/c10d/ProcessGroupNCCL.cpp@00f5dfd5). Abbreviations: PP = deepspeed/runtime/zero/
partition_parameters.py, S3 = deepspeed/runtime/zero/stage3.py, C = deepspeed/runtime/zero/constants.py.

- Granularity: one all_gather per parameter tensor (PP `_allgather_param`, L596-636; `_all_gather` L473-493 loops
  over the tensors with async_op=True). Tensors under `param_persistence_threshold` (1e5 elements, C L100) stay
  gathered (S3 `persistent_parameters`, L1048-1060): biases and norms of a transformer layer are never gathered.
- Per-rank slices: the gather output is a Python list of world_size views (`flat_tensor.narrow` in a Python loop,
  PP L622-625), and PyTorch's list all_gather flattens the outputs into a new buffer and copies it back with one
  `copy_` per rank (ProcessGroupNCCL::allgather, "Copy the flattened output tensors to the outputs"). Each gather
  therefore costs world_size Python-level operators and world_size copy kernels: a host cost that grows with the
  group, whatever the bytes (`SLICE_PYTHON_OP_S` + the device's launch latency per rank).
- Synchronisation: `_allgather_param` calls torch.cuda.synchronize() before every gather (PP L611) and every fetch
  ends with comm_stream.synchronize() and torch.cuda.synchronize() (S3 `_synchronize_communication`, L483-491): the
  host issues the slices while the device is idle, and nothing from an earlier module is still running.
- Prefetch: after a module is fetched, the next not-yet-gathered tensors (at least one, up to
  `stage3_prefetch_bucket_size` 5e7 elements, C L94) are gathered asynchronously while that module computes, but
  only when no gather is in flight and fewer than `stage3_max_live_parameters` (1e9 elements, C L87) are gathered
  (S3 `prefetch_next_sub_modules`, L312-334, tests `total_available_parameter_numel` at L319). That total is the
  live sum of every gathered tensor: a fetch adds the module's tensors (L391) before the prefetch test (the
  pre-forward hook fetches, then prefetches, L1135-1152), a release subtracts them (L439), and a tensor kept for
  later (below) stays in it. So a gather hides behind the compute of the module before it only when that
  module's tensors plus those still kept hold fewer than 1e9 elements (`_held`). The persistent tensors, which
  enter that total as later micro-batches fetch them, are left out: 13 x hidden per layer, 2.8e7 elements for
  530B (105 layers at hidden 20480), under 3% of the cap.
- Recomputation: a checkpointed block's forward rerun in the backward pass fires the same pre-forward hooks (S3
  `pre_sub_module_forward_function`, L1135-1152), so it gathers again; after the rerun a tensor is kept for its
  backward only if fewer than `stage3_max_reuse_distance` (1e9 elements, C L91) are used in between (S3
  `_keep_for_later`, L464-470), else released (`release_sub_module`, L413-453) and gathered a third time. "In
  between" is read off the recorded module trace (`get_reuse_distance_in_numel`, L222-261: from the step after
  the release to the module's next entry; `_distance_in_numel`, L263-271, adds every module's parameters once per
  trace entry). Both the rerun and the backward hooks record into that trace (`record_trace` at L1139 and L1164),
  so between a module's rerun and its backward lie the rerun of every later module of the block and then the
  backward of each of them: each later tensor counts twice (`_kept_after_rerun`).
- Persistent tensors: every backward pass ends by partitioning all parameters, persistent ones included (S3
  `backward` L2549-2553 calls `_partition_all_parameters`; `release_and_reset_parameter`, L455-462, ignores
  ds_persist). The optimizer step gathers them back (S3 `_post_step` L2339-2344) through the synchronous path
  (PP `_allgather_params` L638-700): one list all_gather of them all, then a Python loop over every tensor and
  every rank that copies each rank's piece into place: tensors x ranks host operations per step. A second
  micro-batch of the same step gathers them one by one again in its forward pass.
- Device memory traffic: each gather first zero-fills its full-size output (PP `_allgather_param` L607-609,
  `torch.zeros`), and PyTorch's list all_gather copies the flattened result back into the per-rank views (see "Per-rank
  slices"): the full tensor written once, then read and written once more. The zero-fill is followed by
  torch.cuda.synchronize() (PP L611) before the module's own kernels are launched, so it never overlaps compute;
  the copy-back runs on the gather's stream and hides with it. Each gradient bucket is flattened into a new
  buffer, scaled in place by 1/world_size and copied back after the allreduce (S3 `allreduce_bucket` L1794-1809
  `flatten` and `div_`, `allreduce_and_copy` L1822-1827 `buf.copy_`): read and written three times. All are
  memory-bound kernels, priced at the device's achieved memory bandwidth.
- Working set (memory): the gathered weights are those the prefetch rule above allows at once: the module being
  computed, the tensors kept for later, and one prefetched tensor while the first two hold fewer than
  `stage3_max_live_parameters` (a module's weights are released in its post-forward and post-backward hooks, S3
  L1154-1180, before the next module's fetch). Full-size gradients: a bucket's gradients stay full size until the
  next reduction partitions them (S3 `reduce_ipg_grads` L1689-1693 calls `partition_previous_reduced_grads`, whose
  `partition_gradients` swaps `param.grad` for its shard, PP L846), so the previous bucket's and the arriving
  tensor's gradients are live together, and the reduction itself flattens its bucket into a copy (S3
  `allreduce_bucket` L1796): two of the largest tensor's gradients at the peak. Weights and gradients are summed,
  an upper bound (their peaks may not coincide).
- Gradients: stage 3's `contiguous_gradients` defaults to False (C L59, `ZERO3_OPTIMIZATION_CONTIGUOUS_GRADIENTS_
  DEFAULT`), so `reduce_ipg_grads` (S3 L1689-1720) takes `buffered_reduce_fallback`, whose `allreduce_bucket`
  (S3 L1794-1820) forces rank=None: every bucket of up to `reduce_bucket_size` (5e8 elements, C L62) gradients is
  flattened and all-reduced in the gradients' dtype, every micro-batch. The next fetch's device-wide
  synchronisation waits for it, so it is priced exposed.
"""

from __future__ import annotations

import math
from typing import Any

from dlperf import mathx
from dlperf.engine.stage import FULL
from dlperf.plan import Plan
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

PERSISTENCE_THRESHOLD = 100_000      # C L100 @12a53b43: tensors smaller than this are never partitioned
MAX_LIVE_PARAMETERS = 1_000_000_000  # C L87: no prefetch while this many elements are gathered
MAX_REUSE_DISTANCE = 1_000_000_000   # C L91: a tensor reused within this many elements stays gathered
REDUCE_BUCKET_SIZE = 500_000_000     # C L62: elements per gradient allreduce bucket
# Host seconds of one Python-level ATen operator (the `narrow` of each rank's slice, PP L622-625): 5.7 us per
# forward operator measured by benchmarks/host_ops.py on a Megatron-DeepSpeed layer (the figure behind
# DEFAULT_DISPATCH in dlperf/spec/hardware.py); eager PyTorch's published 6.8 us per Python-level op
# (pytorch/pytorch#41383) agrees. The copy kernel issued per rank is priced at the device's launch latency.
SLICE_PYTHON_OP_S = 5.7e-6
# Megatron-LM's attention holds the fused query_key_value projection and the output projection `dense` (h -> h),
# each with a bias (megatron/model/transformer.py ParallelSelfAttention); dlperf's attention layer carries all
# four, so it is split into them: dense h^2, query_key_value the rest of the weights, biases beyond the weights.
# A linear layer is its weight (in x out) and bias; a norm is one tensor per `hidden` of parameters (weight, bias).
# Python-level operators per rank and persistent tensor when the optimizer step re-gathers the persistent tensors
# (PP `_allgather_params` L674-696, synchronous path): `partitions[i].narrow`, `replicated_tensor.view(-1)`,
# `.narrow`, `.copy_` (the copy also launches a kernel).
POST_STEP_OPS = 4
# Device memory traffic per element, in element sizes (module doc, "Device memory traffic"): a gather writes its
# zero-filled output (ZERO_FILL), then copies the flattened result back (COPY_BACK: read + write); a gradient bucket
# is flattened (read + write), divided in place (read + write) and copied back (read + write).
ZERO_FILL = 1
COPY_BACK = 2
REDUCE_TRAFFIC = 6

Tensors = tuple[list[tuple[float, int]], list[tuple[float, int]], float]


def layer_tensors(layer: Any) -> list[float]:
    """One layer's parameter tensors, in elements, as Megatron-LM holds them (see ATTENTION above); a batch norm's
    affine weight and bias, a convolution's weight and its bias if it has one (channels first: C, H, W)."""
    params = float(layer.params)
    if layer.op == "batchnorm":
        return [params / 2, params / 2]
    if layer.op == "conv2d":
        bias = float(layer.out_shape[-3]) if layer.get("bias", False) else 0.0
        return [params - bias] + ([bias] if bias else [])
    width_in, width_out = float(layer.in_shape[-1]), float(layer.out_shape[-1])
    if layer.op == "attention":
        weights = min(4 * width_in**2, params)
        dense = min(width_in**2, weights)
        bias = params - weights
        return [weights - dense, dense] + ([bias * 0.75, bias * 0.25] if bias > 0 else [])
    if layer.op == "linear":
        weight = min(width_in * width_out, params)
        return [weight] + ([params - weight] if params > weight else [])
    if "norm" in layer.op:
        return [width_out] * max(round(params / width_out), 1)
    return [params]


def tensors(model: Model, plan: Plan) -> Tensors:
    """([(elements, occurrences)] of the partitioned tensors in module order, the same for the persistent ones,
    all parameter elements) of one device's model: a repeated block's tensors appear once with its repeat."""
    parted: list[tuple[float, int]] = []
    persistent: list[tuple[float, int]] = []
    total = 0.0
    for layer, count in model.layers():
        if not layer.params:
            continue
        total += float(layer.params) * count / plan.tp
        for n in layer_tensors(layer):
            (parted if n / plan.tp >= PERSISTENCE_THRESHOLD else persistent).append((n / plan.tp, count))
    return parted, persistent, total


def _kept_after_rerun(block: list[float]) -> list[bool]:
    """Whether each tensor of a checkpointed block stays gathered from its forward rerun to its backward (S3
    `_keep_for_later`, L464-470). The trace between the two uses holds the rerun of every later tensor, then the
    backward of each in reverse: each later tensor counts twice (S3 `_distance_in_numel`, L263-271, sums a module's
    parameters at every trace entry). The block's persistent biases and norms (about 13 x hidden elements, 0.03% of
    the distance at hidden 20480) are left out of the distance."""
    after = [sum(block[i + 1:]) for i in range(len(block))]
    return [2 * a < MAX_REUSE_DISTANCE for a in after]


def _held(block: list[float], kept: list[bool], backward: bool) -> list[float]:
    """Elements still gathered, besides the module that issues the prefetch, when each tensor of a pass over a
    checkpointed block is prefetched: the tensors kept from the rerun for their backward (`_kept_after_rerun`)
    that have been rerun and not yet used by their backward. In the rerun pass (block order) that is the kept
    tensors before the issuer; in the backward pass (reverse order, the issuer is the tensor after it in the
    block) the kept tensors before the issuer in the block. The forward pass keeps none."""
    def kept_before(j: int) -> float:
        j = max(j, 0)
        return sum(n for n, k in zip(block[:j], kept[:j], strict=True) if k)
    if backward:
        return [kept_before(j + 1) for j in reversed(range(len(block)))]  # issuer j + 1: kept ones before it
    return [kept_before(i - 1) for i in range(len(block))]             # issuer i - 1: kept ones before it


def per_micro(comm: Any, hw: Hardware, plan: Plan, group: Any, weight_element: float, grad_element: float,
              model_tensors: Tensors, forward: Any, recompute: Any,
              backward: Any, stolen: float = 0.0) -> tuple[Any, Any]:
    """(total, exposed) seconds of one micro-batch's stage-3 communication under DeepSpeed v0.3 (module doc).

    `forward`, `recompute` and `backward` are the micro-batch's compute windows; each block's share of a window
    is spread over its tensors by size (its GEMMs' work), and a prefetched gather hides behind the share of the
    tensor before it in that pass's order (reversed in the backward pass)."""
    listed, _, params = model_tensors
    slices = _slices(hw, group)
    repeat, block, rerun, kept = _block_layout(listed, plan)
    block_numel = sum(block) or 1.0

    def gather(n: float) -> Any:
        return comm.collective_time("allgather", n * weight_element, group, hw) + _traffic(hw, n * weight_element,
                                                                                             COPY_BACK)

    def fixed(n: float) -> Any:
        """What the device waits for before the gather starts: the per-rank slices and the zero-fill."""
        return slices + _traffic(hw, n * weight_element, ZERO_FILL)

    def pass_cost(order: list[float], window: Any, skip: list[bool], held: list[float]) -> tuple[Any, Any]:
        """(total, exposed) of gathering a block's tensors in `order` once, hiding each behind its
        predecessor's compute share when the prefetch may run: fewer than MAX_LIVE_PARAMETERS elements are
        gathered, the predecessor's and the `held` ones (module doc, "Prefetch")."""
        total = exposed = 0.0
        for i, n in enumerate(order):
            if skip[i]:
                continue
            g = gather(n)
            before = order[i - 1] if i else order[-1]  # the previous block's last module issued the first one
            hide = window * before / block_numel if before + held[i] < MAX_LIVE_PARAMETERS else 0.0
            shown = mathx.maximum(g - hide, 0.0)
            total += g + fixed(n)
            exposed += shown + stolen * (g - shown) + fixed(n)
        return total, exposed

    total = exposed = 0.0
    if block:
        none, empty = [False] * len(block), [0.0] * len(block)
        parts = [pass_cost(block, forward / repeat, none, empty),
                 pass_cost(block[::-1], backward / repeat, kept[::-1], _held(block, kept, backward=True))]
        if rerun:
            parts.append(pass_cost(block, recompute / repeat, none, _held(block, kept, backward=False)))
        total = repeat * sum(t for t, _ in parts)
        exposed = repeat * sum(x for _, x in parts)
    for n, count in listed:
        if count == repeat and repeat > 1:
            continue
        one = count * 2 * (gather(n) + fixed(n))  # a tensor outside the block: gathered forward and backward, exposed
        total, exposed = total + one, exposed + one
    buckets = max(math.ceil(params / REDUCE_BUCKET_SIZE), 1)
    reduce = buckets * comm.collective_time("allreduce", params / buckets * grad_element, group, hw)
    reduce += _traffic(hw, params * grad_element, REDUCE_TRAFFIC)
    return total + reduce, exposed + reduce


def _block_layout(listed: list[tuple[float, int]], plan: Plan) -> tuple[int, list[float], bool, list[bool]]:
    """(the repeat count of the model's block, the block's tensor sizes in order, whether full recomputation
    reruns the block, which of its tensors stay gathered after the rerun: `_kept_after_rerun`)."""
    repeat = max((c for _, c in listed), default=1)
    block = [n for n, c in listed if c == repeat and repeat > 1]
    rerun = plan.recompute in FULL and bool(block)
    return repeat, block, rerun, _kept_after_rerun(block) if rerun else [False] * len(block)


def _traffic(hw: Hardware, nbytes: float, passes: int) -> float:
    """Seconds of `passes` reads or writes of `nbytes` in device memory at the achieved memory bandwidth (the
    hardware file's `memory` efficiency: BabelStream-class copy kernels)."""
    return passes * nbytes / hw.device.achieved_memory_bandwidth()


def working_set(model_tensors: Tensors, plan: Plan, weight_element: float, grad_element: float) -> float:
    """Bytes of gathered weights and full-size gradients at stage 3's peak (module doc, "Working set")."""
    listed, _, _ = model_tensors
    if not listed:
        return 0.0
    repeat, block, rerun, kept = _block_layout(listed, plan)
    rest = [n for n, c in listed if not (c == repeat and repeat > 1)]
    none = [False] * len(block)
    live = []
    if block:  # the forward's first prefetch is issued by the previous block's last tensor
        live += [_live(block, [0.0] * len(block), none, block[-1])]
    if block and rerun:  # the rerun follows the next block's backward, which ends with its first tensor; the
        # backward follows the rerun, whose last tensor is already in `held` when it is kept
        live += [_live(block, _held(block, kept, backward=False), none, block[0]),
                 _live(block[::-1], _held(block, kept, backward=True), kept[::-1], 0.0 if kept[-1] else block[-1])]
    elif block:
        live += [_live(block[::-1], [0.0] * len(block), none, block[0])]
    live += [n + (block[0] if block and n < MAX_LIVE_PARAMETERS else 0.0) for n in rest]
    return max(live) * weight_element + 2 * max(n for n, _ in listed) * grad_element


def _live(order: list[float], held: list[float], skip: list[bool], first: float) -> float:
    """The most elements gathered at once in one pass over `order`: while tensor i-1 computes (`first`, what is
    gathered for the computation before the pass, for i = 0), it, the `held` ones and tensor i when the prefetch
    may fetch it (fewer than MAX_LIVE_PARAMETERS gathered before it). A `skip`ped tensor is still gathered from its
    rerun and counted in `held` (as in `per_micro`)."""
    peak = 0.0
    for i, n in enumerate(order):
        n = 0.0 if skip[i] else n
        before = (order[i - 1] if i else first) + held[i]
        peak = max(peak, before + (n if before < MAX_LIVE_PARAMETERS else 0.0), n + held[i])
    return peak


def _ranks(group: Any) -> int:
    """Ranks of a data-parallel group: a communicator's Group, or a bare count."""
    return group.size if hasattr(group, "size") else int(group)


def _slices(hw: Hardware, group: Any) -> Any:
    """Host seconds of one list all_gather's per-rank views and copies (module doc, "Per-rank slices")."""
    return _ranks(group) * (SLICE_PYTHON_OP_S + hw.device.launch_latency)


def persistent_gathers(comm: Any, hw: Hardware, group: Any, weight_element: float, model_tensors: Tensors) -> Any:
    """Seconds to gather the persistent tensors one by one in a micro-batch's forward pass: every backward pass
    ends by partitioning all parameters, persistent ones included (S3 `backward` L2549-2553 calls
    `_partition_all_parameters`, whose `release_and_reset_parameter` ignores ds_persist, L455-462), so the next
    micro-batch's fetches gather them again through the per-tensor path, exposed (nothing computes before them
    in their module)."""
    _, persistent, _ = model_tensors
    return sum(count * (comm.collective_time("allgather", n * weight_element, group, hw) + _slices(hw, group))
               for n, count in persistent)


def post_step(comm: Any, hw: Hardware, group: Any, weight_element: float, model_tensors: Tensors) -> Any:
    """Seconds of the optimizer step's re-gather of the persistent tensors (S3 `_post_step` L2339-2344): one
    coalesced list all_gather of them all (PP `_allgather_params` L638-670), then a Python loop over every tensor
    and every rank that copies each rank's piece into place (PP L674-696, POST_STEP_OPS operators and a copy
    kernel each): a host cost of tensors x ranks, on an idle device."""
    _, persistent, _ = model_tensors
    if not persistent:
        return 0.0
    pieces = sum(c * _pieces(n, _ranks(group)) for n, c in persistent)
    elements = sum(n * c for n, c in persistent)
    unpack = pieces * (POST_STEP_OPS * SLICE_PYTHON_OP_S + hw.device.launch_latency)
    return comm.collective_time("allgather", elements * weight_element, group, hw) + _slices(hw, group) + unpack


def _pieces(elements: float, ranks: int) -> int:
    """Ranks whose shard of a tensor holds any of it: shards are ceil(n / ranks) elements (PP `_padding_size`
    L469-471 pads n to a multiple of the ranks), and the loop skips a shard that starts past the end (PP L686)."""
    n = max(int(round(elements)), 1)
    return min(ranks, math.ceil(n / math.ceil(n / ranks)))
