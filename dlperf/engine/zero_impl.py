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
  (S3 `prefetch_next_sub_modules`, L312-334): a gather hides behind the compute of the module before it only when
  that module holds fewer than 1e9 gathered elements.
- Recomputation: a checkpointed block's forward rerun in the backward pass fires the same pre-forward hooks (S3
  `pre_sub_module_forward_function`, L1135-1152), so it gathers again; after the rerun a tensor is kept for its
  backward only if fewer than `stage3_max_reuse_distance` (1e9 elements, C L91) are used in between (S3
  `_keep_for_later`, L464-470), else released (`release_sub_module`, L413-453) and gathered a third time.
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
# Megatron-LM's attention holds two weight matrices: the fused query_key_value projection (h -> 3h) and the output
# projection `dense` (h -> h) (megatron/model/transformer.py ParallelSelfAttention); dlperf's attention layer
# carries both, so it is split into those two tensors.
ATTENTION_SPLIT = (0.75, 0.25)


def tensors(model: Model, plan: Plan) -> tuple[list[tuple[float, int]], float]:
    """([(elements, occurrences)] of the partitioned tensors in module order, all parameter elements) of one
    device's model: a repeated block's tensors appear once with the block's repeat count."""
    out: list[tuple[float, int]] = []
    total = 0.0
    for layer, count in model.layers():
        if not layer.params:
            continue
        total += float(layer.params) * count / plan.tp
        shares = ATTENTION_SPLIT if layer.op == "attention" else (1.0,)
        for share in shares:
            n = float(layer.params) * share / plan.tp
            if n >= PERSISTENCE_THRESHOLD:
                out.append((n, count))
    return out, total


def _kept_after_rerun(block: list[float]) -> list[bool]:
    """Whether each tensor of a checkpointed block stays gathered from its forward rerun to its backward: the
    backward walks the block in reverse, so what is used in between is every tensor after it (S3 L464-470)."""
    after = [sum(block[i + 1:]) for i in range(len(block))]
    return [a < MAX_REUSE_DISTANCE for a in after]


def per_micro(comm: Any, hw: Hardware, plan: Plan, group: Any, weight_element: float, grad_element: float,
              model_tensors: tuple[list[tuple[float, int]], float], forward: Any, recompute: Any,
              backward: Any, stolen: float = 0.0) -> tuple[Any, Any]:
    """(total, exposed) seconds of one micro-batch's stage-3 communication under DeepSpeed v0.3 (module doc).

    `forward`, `recompute` and `backward` are the micro-batch's compute windows; each block's share of a window
    is spread over its tensors by size (its GEMMs' work), and a prefetched gather hides behind the share of the
    tensor before it in that pass's order (reversed in the backward pass)."""
    listed, params = model_tensors
    ranks = group.size if hasattr(group, "size") else int(group)
    slices = ranks * (SLICE_PYTHON_OP_S + hw.device.launch_latency)
    repeat = max((c for _, c in listed), default=1)
    block = [n for n, c in listed if c == repeat and repeat > 1]
    block_numel = sum(block) or 1.0
    rerun = plan.recompute in FULL and bool(block)
    kept = _kept_after_rerun(block) if rerun else [False] * len(block)

    def gather(n: float) -> Any:
        return comm.collective_time("allgather", n * weight_element, group, hw)

    def pass_cost(order: list[float], window: Any, skip: list[bool]) -> tuple[Any, Any]:
        """(total, exposed) of gathering a block's tensors in `order` once, hiding each behind its
        predecessor's compute share when the prefetch may run."""
        total = exposed = 0.0
        for i, n in enumerate(order):
            if skip[i]:
                continue
            g = gather(n)
            before = order[i - 1] if i else order[-1]  # the previous block's last module issued the first one
            hide = window * before / block_numel if before < MAX_LIVE_PARAMETERS else 0.0
            shown = mathx.maximum(g - hide, 0.0)
            total += g + slices
            exposed += shown + stolen * (g - shown) + slices
        return total, exposed

    total = exposed = 0.0
    if block:
        none = [False] * len(block)
        parts = [pass_cost(block, forward / repeat, none),
                 pass_cost(block[::-1], backward / repeat, kept[::-1])]
        if rerun:
            parts.append(pass_cost(block, recompute / repeat, none))
        total = repeat * sum(t for t, _ in parts)
        exposed = repeat * sum(x for _, x in parts)
    for n, count in listed:
        if count == repeat and repeat > 1:
            continue
        one = count * 2 * (gather(n) + slices)  # a tensor outside the block: gathered forward and backward, exposed
        total, exposed = total + one, exposed + one
    buckets = max(math.ceil(params / REDUCE_BUCKET_SIZE), 1)
    reduce = buckets * comm.collective_time("allreduce", params / buckets * grad_element, group, hw)
    return total + reduce, exposed + reduce
