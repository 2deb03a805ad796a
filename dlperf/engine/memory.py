"""Memory per device: model states (after ZeRO sharding), activations of in-flight micro-batches, buffers.

What the runtime reserves (CUDA context, communication buffers, allocator fragmentation) is part of the total,
so that a plan that "fits" leaves room for it (the device's memory_reserved and memory_fragmentation).

Model states per parameter (Rajbhandari et al. 2020, ZeRO, section 3.1): mixed-precision Adam keeps 2 B weights,
2 B gradients and 12 B optimizer state (fp32 master weights, momentum, variance) = 16 B; fp32 Adam 4 + 4 + 8.
ZeRO-1 shards the optimizer state over dp, ZeRO-2 also the gradients, ZeRO-3 also the weights. The plan's
grad_dtype sets the gradients' bytes and its moment_dtype the moments' (DeepSeek-V3, arXiv:2412.19437 Sec. 3.3.3:
fp32 master weights and gradients, bf16 Adam moments: 2 + 4 + (4 + 2 + 2) bytes under an FP8 recipe, plus its FP8
weight copies).
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx
from dlperf.engine.layers import element_bytes
from dlperf.engine.stage import StageCost
from dlperf.ops.fp8 import OPERAND_BYTES, RECIPES, is_recipe, weight_copy_bytes
from dlperf.plan import Plan
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP default bucket_cap_mb=25 (Li et al., VLDB 2020)
DDP_BUFFER_BYTES = 2 * DDP_BUCKET_BYTES  # two gradient buckets in flight
MIXED = ("fp16", "bf16", *RECIPES)


MOMENTS = {"sgd": 0, "momentum": 1, "adam": 2}  # tensors the optimizer keeps per parameter beside the weights


def optimizer_bytes(optimizer: str, dtype: str, moment_dtype: str = "fp32") -> int:
    """Optimizer state per parameter: its moments (momentum SGD's buffer; Adam's first and second moments) in
    `moment_dtype` (fp32, or bf16 as DeepSeek-V3 keeps Adam's, arXiv:2412.19437 Sec. 3.3.3); mixed precision adds
    a 4-byte fp32 master copy of the weights."""
    return MOMENTS[optimizer] * element_bytes(moment_dtype) + (4 if dtype in MIXED else 0)


def model_state_bytes(params: Any, plan: Plan, dtype: str, fp8_params: Any = None) -> dict[str, Any]:
    """Weights, gradients and optimizer state per device. An FP8 recipe (Micikevicius et al. 2022, section 3:
    master weights and optimizer in higher precision) keeps bf16 weights and gradients, fp32 master weights and
    moments as mixed precision does, plus the cached FP8 copy of each weight and its transpose (dlperf.ops.fp8):
    2 + 2 + 12 + 2 = 18 bytes per parameter with Adam, against 16 for bf16. With `fp8_param_gather` the FP8
    copies are the model's weights, and no 16-bit weight is kept: Megatron-Core's "keep the compute param in fp8
    (do not use any other intermediate dtype)" (DistributedDataParallelConfig.fp8_param_gather,
    megatron/core/distributed/distributed_data_parallel_config.py @d98e8a64, lines 78-80: the layers are built
    under Transformer Engine's fp8_model_init when config.fp8_param, megatron/core/fp8_utils.py lines 848 and
    881, which Megatron-Bridge keeps equal to fp8_param_gather, training/mixed_precision.py @0a25f911 lines
    79-85), the fp32 master weights living in the optimizer: 2 + 12 + 2 = 16 bytes.

    Only `fp8_params` of the `params` (default: all) have FP8 copies: the weights of the layers the recipe runs in
    FP8 (dlperf.ops.fp8.fp8_layers; Transformer Engine quantizes its own modules' weights, and the embedding and
    output layer are not TE modules in Megatron-Core). The others keep their 16-bit weight under fp8_param_gather
    too. ZeRO-3 storage by implementation: _sharded_weight_bytes."""
    weight, grad = _weight_and_grad_bytes(plan, dtype)
    fp8 = params if fp8_params is None else fp8_params
    dp = plan.data_parallel
    shard = {k: (dp if plan.zero >= level else 1) for k, level in (("opt", 1), ("grad", 2), ("weight", 3))}
    fp8_params_kept = is_recipe(dtype) and plan.fp8_param_gather
    sixteen_bit = params - fp8 if fp8_params_kept else params
    if _torch_fsdp_shards(plan, dtype):
        # the fp32 shard is the optimizer's master copy; its gradient is fp32 too
        weight, grad = 0, element_bytes("fp32")
    states = {
        "weights": sixteen_bit * weight / shard["weight"],
        "gradients": params * grad / shard["grad"],
        "optimizer": params * optimizer_bytes(plan.optimizer, dtype, plan.moment_dtype) / shard["opt"],
    }
    if is_recipe(dtype):
        states["fp8_weights"] = fp8 * _fp8_copy_bytes(plan, dtype) / shard["weight"]
    return states


def _torch_fsdp_shards(plan: Plan, dtype: str) -> bool:
    """Whether PyTorch FSDP's ZeRO-3 holds the model states: the module stays fp32 and its sharded parameter is the
    only copy of the weights between gathers, the optimizer's master copy, so no 16-bit shard is kept. FSDP1's
    low-precision shard `_mp_shard` lives only around each all-gather (torch/distributed/fsdp/_flat_param.py
    @fe03cf69, FlatParamHandle.post_unshard frees it, _free_low_precision_sharded_param); FSDP2: "FSDP ... keeps the
    high-precision sharded parameters in memory anyway ... does not require any extra memory to keep a
    high-precision copy of the parameters for the optimizer step" (MixedPrecisionPolicy,
    torch/distributed/_composable/fsdp/_fsdp_api.py). FSDP1 casts the sharded gradient back to the parameter's
    fp32 whatever dtype it was reduced in (_runtime_utils.py @3ade90a6, _cast_grad_to_param_dtype): 0 + 4 + 12 =
    16 bytes per parameter over dp with Adam. Megatron-Core's FSDP ("megatron-fsdp") and DeepSpeed's ZeRO-3 keep a
    16-bit (or FP8) model-weight shard beside the fp32 main weights instead (megatron_fsdp/param_and_grad_buffer.py
    @3758b54b, model_weight_buffer and main_weight_buffer, lines 2089-2147)."""
    return plan.zero >= 3 and plan.zero_impl == "fsdp" and dtype in MIXED


def _fp8_copy_bytes(plan: Plan, dtype: str) -> float:
    """Per parameter, the resident FP8 copy of a weight: TE's cached copies (dlperf.ops.fp8.weight_copy_bytes; one
    under the plan's fp8_weight_transpose per_use, DeepSeek-V3's), or under Megatron-Core's FSDP with
    fp8_param_gather its sharded FP8 weight buffer, which holds a transpose buffer only for MXFP8
    (fp8_need_transpose_data, megatron_fsdp/mixed_precision.py @3758b54b lines 183-185, read at
    param_and_grad_buffer.py lines 2074-2126): per-tensor FP8 keeps 1 byte per parameter."""
    if plan.zero >= 3 and plan.zero_impl == "megatron-fsdp" and plan.fp8_param_gather and dtype == "fp8":
        return OPERAND_BYTES["fp8"]
    return weight_copy_bytes(dtype, plan.fp8_weight_transpose)


def per_device(model: Model, hw: Hardware, plan: Plan, stages: list[StageCost], dtype: str,
               micro_batches_in_flight: float, held: dict[tuple, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Memory of the fullest device: the most model-state bytes of any stage, and the most activations any stage
    holds. Under 1F1B stage s keeps min(m, pp - s) micro-batches (the first the most), under GPipe all m; a
    stage with one huge layer can hold more than the first even so, so every stage is counted (issue #15:
    a 698 TiB attention layer on the last of 4 stages was reported as 260 KiB that fits). When the two maxima
    fall on different stages their sum is an upper bound. The stage with the most parameters need not hold the
    most state bytes: an FP8 layer's parameter carries its FP8 copies and the embedding's not, and the routed
    experts shard over fewer ranks than the dense weights. `held` keeps each distinct stage's model states for
    more calls on the same plan and dtype (StepModel.may_fit weighs many pipeline splits of one plan)."""
    # stages alike in what they hold (a pipeline's middle stages) are priced once
    held = {} if held is None else held
    for s in stages:
        if (s.params, s.expert_params, s.fp8_params) not in held:
            held[(s.params, s.expert_params, s.fp8_params)] = _states(s, plan, dtype)
    distinct = dict.fromkeys((s.params, s.expert_params, s.fp8_params) for s in stages)  # in the stages' order
    states = dict(max((held[key] for key in distinct), key=lambda states: sum(states.values())))
    if plan.recompute in ("full", "except_last"):
        # keep each block's input; during backward one block's full activations are rebuilt at a time
        # Korthikanti et al. 2022, Table 2: the stored layer inputs are 2sbh, divided by t only with sequence
        # parallelism (tensor parallelism alone replicates them)
        shard = (plan.tp if plan.sequence_parallel else 1) * plan.cp
        acts = _block_inputs(model, plan, dtype) * plan.micro / shard * micro_batches_in_flight
        acts += max(s.saved_bytes - s.saved_outside for s in stages) / max(blocks_in_stage(model, plan), 1)
        # the layers around the blocks (embeddings, output layer, loss) are not rerun: they keep their
        # activations for every micro-batch their stage holds
        acts += mathx.maximum(*(s.saved_outside * _stage_in_flight(plan, i, micro_batches_in_flight)
                                for i, s in enumerate(stages)))
    else:
        acts = mathx.maximum(*(_resident(model, plan, s) * _stage_in_flight(plan, i, micro_batches_in_flight)
                               for i, s in enumerate(stages)))
    if plan.zero >= 3 and plan.data_parallel > 1:
        states["gathered"] = _zero3_working_set(model, plan, max(s.params for s in stages), dtype)
    return _with_totals(hw, plan, states, acts)


def _resident(model: Model, plan: Plan, stage: StageCost) -> Any:
    """A stage's saved activations per micro-batch that stay on the device: all of them, less the offloaded
    layers' share of the blocks' when activations are offloaded (dlperf.engine.offload: (L-N)/L of them stay)."""
    if not plan.offload_layers:
        return stage.saved_bytes
    from dlperf.engine.offload import resident_blocks

    kept = resident_blocks(plan, blocks_in_stage(model, plan))
    return stage.saved_bytes - stage.saved_blocks * (1 - kept)


def dualpipe_per_device(model: Model, hw: Hardware, plan: Plan, stages: list[StageCost],
                        dtype: str) -> dict[str, Any]:
    """Memory of the fullest DualPipe rank (DeepSeek-V3, arXiv:2412.19437, Table 2: 2x parameters, PP+1
    micro-batches of activations), each rank counted with the two stages it really holds: rank r keeps stages r
    and pp-1-r whole (`stages` are the pipeline's stages in order), so both stages' weights, gradients and
    optimizer states; `plan` has the doubled data-parallel group over which the two copies of a stage reduce and
    shard them. Activations: rank r's in-flight chunks peak at pp-r micro-batches through stage r and r+1 through
    stage pp-1-r, PP+1 in all, and both counts reach their maxima at that same moment (counted from
    deepseek-ai/DualPipe dualpipe/dualpipe.py @3da1bbe, DualPipe.step: the warm-up's forward chunks of each
    direction less the backward chunks before them), the counts 1F1B gives those two stages."""
    pp = plan.pp
    ranks = [_dualpipe_rank(model, hw, plan, (stages[r], stages[pp - 1 - r]), (pp - r, r + 1), dtype)
             for r in range(pp // 2)]
    return max(ranks, key=lambda memory: float(memory["total"]))


def _dualpipe_rank(model: Model, hw: Hardware, plan: Plan, held: tuple[StageCost, StageCost],
                   in_flight: tuple[int, int], dtype: str) -> dict[str, Any]:
    """One DualPipe rank's memory: the model states of its two stages, each stage's activations times the
    micro-batches in flight through it; under ZeRO-3 a unit of each stage gathered, since a forward chunk of one
    runs beside a backward chunk of the other."""
    first, second = held
    both = first + second
    states = _states(both, plan, dtype)
    acts = in_flight[0] * first.saved_bytes + in_flight[1] * second.saved_bytes
    if plan.zero >= 3:
        states["gathered"] = _zero3_working_set(model, plan, both.params, dtype)
    return _with_totals(hw, plan, states, acts)


def _with_totals(hw: Hardware, plan: Plan, states: dict[str, Any], acts: Any) -> dict[str, Any]:
    """The memory breakdown: the states, the activations, DDP's buckets, what the runtime reserves, the total."""
    buffers = DDP_BUFFER_BYTES if plan.data_parallel > 1 else 0
    allocated = sum(states.values()) + acts + buffers
    reserved = runtime_reserve(hw, allocated)
    return {**states, "activations": acts, "buffers": buffers, "reserved": reserved, "total": allocated + reserved}


def _zero3_working_set(model: Model, plan: Plan, params: Any, dtype: str) -> Any:
    """ZeRO-3 materialises a unit's full parameters to compute it: the unit being computed and the one being
    prefetched (PyTorch FSDP's rate limiter allows two all-gathers in flight; Zhao et al. 2023, VLDB, section
    3.3.2), and in backward that unit's full gradient before its reduce-scatter. Units are the stage's repeated
    blocks (gather_units). DeepSpeed v0.3's stage 3 gathers tensor by tensor instead (zero_impl.working_set)."""
    weight, grad = _weight_and_grad_bytes(plan, dtype)
    if plan.zero_impl == "deepspeed-0.3":  # per-tensor gathers, capped by its live-parameter limit
        from dlperf.engine import zero_impl

        return zero_impl.working_set(zero_impl.tensors(model, plan), plan, weight, grad)
    return params / gather_units(model, plan) * (2 * weight + grad)


def _weight_and_grad_bytes(plan: Plan, dtype: str) -> tuple[int, int]:
    """Bytes per parameter of a weight and of its gradient (the plan's grad_dtype, else the weight's)."""
    weight = element_bytes(dtype)
    return weight, element_bytes(plan.grad_dtype) if plan.grad_dtype else weight


def runtime_reserve(hw: Hardware, allocated: Any) -> Any:
    """What the runtime holds beside the model's tensors: a fixed part (CUDA context, communication buffers) and
    the allocator's fragmentation as a fraction of what is allocated (dlperf.spec.hardware.DEFAULT_MEMORY_*)."""
    return hw.device.memory_reserved + hw.device.memory_fragmentation * allocated


def _states(stage: StageCost, plan: Plan, dtype: str) -> dict[str, Any]:
    """Model states of the heaviest stage. With context parallelism the dense states shard over dp*cp (cp ranks
    hold the same weights; Megatron-Core's distributed optimizer spans both), with expert parallelism the
    experts' states over the expert-data-parallel group (dp*cp/ep; tp*dp*cp/(ep*expert tp) with the experts
    folded onto their own grid, Plan.expert_data_parallel), each by the plan's ZeRO stage. The routed
    experts sit inside the blocks, so an FP8 recipe runs them in FP8 (their share of `fp8_params`)."""
    if plan.cp == 1 and mathx.is_zero(stage.expert_params):
        return model_state_bytes(stage.params, plan, dtype, stage.fp8_params)
    experts_fp8 = mathx.minimum(stage.expert_params, stage.fp8_params)
    dense = model_state_bytes(stage.params - stage.expert_params,
                              plan.with_(dp=plan.data_parallel * plan.cp, cp=1, ep=1, etp=None), dtype,
                              stage.fp8_params - experts_fp8)
    experts = model_state_bytes(stage.expert_params, plan.with_(dp=plan.expert_data_parallel, cp=1, ep=1, etp=None),
                                dtype, experts_fp8)
    return {k: dense[k] + experts[k] for k in dense}


def _stage_in_flight(plan: Plan, stage: int, first: Any) -> Any:
    """Micro-batches stage `stage` holds at once, given the first stage's count (Narayanan et al. 2021, 2.2.1:
    1F1B's stage s warms up with pp - s forward passes)."""
    if stage == 0 or plan.schedule == "gpipe":
        return first
    return mathx.minimum(first, plan.pp - stage)


def paired_layer(model: Model, plan: Plan) -> float:
    """Micro-batches' worth of a stage's activations that Megatron-Core's combined 1F1B (`ep_overlap`) holds beyond
    the schedule's own count: one layer. It runs micro-batch i+1's forward through layer j beside micro-batch i's
    backward through layer L-1-j ("Phase 1: forward_layer[0] + backward_layer[3]", TransformerModelChunkSchedulePlan
    .run, megatron/core/models/common/model_chunk_schedule_plan.py @d98e8a64, lines 509-575; the first forward and
    the last backward alone, combined_1f1b.py lines 51-65), so as one micro-batch's layers fill the other's empty:
    j+1 + L-j layers at once, one micro-batch and one layer. A layer is taken as the stage's activations over
    its blocks."""
    return 1 / max(blocks_in_stage(model, plan), 1)


def _blocks(model: Model) -> list[Any]:
    from dlperf.spec.model import Seq

    return [item for item in model.root.items if isinstance(item, Seq) and item.repeat > 1]


def gather_units(model: Model, plan: Plan) -> int:
    """How many units ZeRO-3 gathers parameters in on one stage: the repeated blocks it holds (FSDP wraps each
    transformer block), or 1 for a model without a repeated block."""
    return max(blocks_in_stage(model, plan), 1) if _blocks(model) else 1


def root_unit_params(model: Model, plan: Plan) -> Any:
    """Parameters per device of PyTorch FSDP's root unit: those outside the repeated blocks when the auto-wrap
    policy wraps each block and the root wraps the rest (llm-foundry's MPT: `fsdp_wrap_fn` is isinstance(module,
    MPTBlock), llmfoundry/models/mpt/modeling_mpt.py @v0.3.0:477-478 and @5e85bd62:675-676, and composer wraps the
    whole model with that policy, composer/trainer/dist_strategy.py @v0.16.4:441-500), so the root holds the
    embeddings, the final norm and the tied head. 0 with pipeline parallelism (a stage's own root is not modelled)
    or without repeated blocks. Tensor parallelism is taken to shard them as it shards the blocks."""
    blocks = _blocks(model)
    if plan.pp > 1 or not blocks:
        return 0.0
    from dlperf.spec.model import walk

    inside = sum(layer.params * count for block in blocks for layer, count in walk(block, 1))
    return mathx.maximum(model.total_params - inside, 0.0) / plan.tp


def blocks_in_stage(model: Model, plan: Plan) -> int:
    return sum(b.layer_count for b in _blocks(model)) // plan.pp or 1


def _block_inputs(model: Model, plan: Plan, dtype: str) -> float:
    """Per sample, the inputs of the repeated blocks held by one stage (Korthikanti 2022: 2sbh per layer)."""
    from dlperf.ops.base import numel
    from dlperf.spec.model import out_shape

    e = element_bytes(dtype)
    total = 0.0
    shape = model.input_shape
    blocks = _blocks(model)
    for item in model.root.items:
        if item in blocks:
            total += e * numel(shape) * item.layer_count / plan.pp
        shape = out_shape(item, shape)
    return total
