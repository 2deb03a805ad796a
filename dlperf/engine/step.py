"""model + hardware + plan -> Prediction: step time with its breakdown, memory per device, throughput, MFU.

step = pipeline time of the slowest stage (busy + bubble + point-to-point) + exposed data-parallel
communication + optimizer update. With dp = tp = pp = 1 this is the single-device step:
forward + backward (+ recomputation) + optimizer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dlperf.engine import memory as mem
from dlperf.engine.layers import element_bytes, tp_uses
from dlperf.engine.pipeline import balanced_partition, in_flight, schedule_time, uniform_partition, units
from dlperf.engine.stage import StageCost, stage_cost
from dlperf.engine.work import model_cost
from dlperf.ops.base import numel
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP default bucket_cap_mb=25 (Li et al., VLDB 2020)
# Optimizer update per parameter, memory-bound: bytes read + written and FLOPs (fp32 states).
# Adam reads/writes weight, m, v (3 x 8 B) and reads the gradient; ~12 FLOPs (two moments, bias-corrected step).
OPTIMIZER_COST = {"sgd": (12, 2), "momentum": (20, 4), "adam": (28, 12)}


@dataclass
class Prediction:
    step_time_s: float
    throughput_samples_per_s: float
    model_tflops_per_device: float
    hardware_tflops_per_device: float
    matrix_tflops_per_device: float
    mfu: float
    breakdown_s: dict[str, float]
    memory: dict[str, float]
    memory_bytes_per_device: float
    fits: bool
    work_flops: float
    depth: float
    plan: dict[str, Any]
    staleness: int = 0
    notes: list[str] = field(default_factory=list)
    per_type_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(model: Model, hw: Hardware, plan: Plan) -> Prediction:
    """Predict one training step of `model` on `hw` under `plan` (see dlperf.plan.Plan)."""
    validate(plan, heads=_heads(model), layers=len(units(model)))
    dtype = plan.dtype or model.dtype
    e = element_bytes(dtype)
    comm = _comm(hw)
    tp_time = _tp_comm_fn(comm, hw, plan)
    stages = _stage_costs(model, hw, plan, dtype, e, tp_time)
    slow = max(stages, key=lambda s: s.total)
    m, v = plan.micro_batches, plan.virtual_stages
    t_fwd = slow.forward + slow.tp_comm_fwd
    t_bwd = slow.backward + slow.tp_comm_bwd + slow.recompute
    busy, bubble, p2p = schedule_time(t_fwd, t_bwd, _p2p_time(model, hw, plan, e, comm), m, plan.pp, v)
    dp_total, dp_exposed = _dp_comm(hw, plan, slow, m * slow.backward, dtype, comm)
    optimizer = _optimizer_time(hw, plan, max(s.params for s in stages))
    compute = busy + bubble + p2p
    step, staleness = _consistency(plan, compute, dp_total, dp_exposed)
    breakdown = {
        "compute/forward": m * slow.forward,
        "compute/backward": m * slow.backward,
        "compute/recompute": m * slow.recompute,
        "comm/tp": m * (slow.tp_comm_fwd + slow.tp_comm_bwd),
        "comm/pp_p2p": p2p,
        "pipeline/bubble": bubble,
        "comm/dp_allreduce": step - compute - optimizer if plan.consistency != "sync" else dp_exposed,
        "optimizer": optimizer,
    }
    step = step + optimizer
    memory = mem.per_device(model, hw, plan, stages, dtype, in_flight(plan.schedule, m, plan.pp, v))
    model_flops, hardware_flops, matrix_flops = step_flops(model, plan, e)
    peak = hw.device.peak(dtype) * plan.devices
    return Prediction(
        step_time_s=step,
        throughput_samples_per_s=plan.global_batch / step,
        model_tflops_per_device=model_flops / step / plan.devices / 1e12,
        hardware_tflops_per_device=hardware_flops / step / plan.devices / 1e12,
        matrix_tflops_per_device=matrix_flops / step / plan.devices / 1e12,
        mfu=model_flops / step / peak,
        breakdown_s=breakdown,
        memory=memory,
        memory_bytes_per_device=memory["total"],
        fits=memory["total"] <= hw.device.memory,
        work_flops=model_flops + _optimizer_flops(model, plan),
        depth=float(model_cost(model, plan.micro, dtype).total_depth),
        plan=plan.to_dict() | {"dtype": dtype},
        staleness=staleness,
        per_type_s={k: m * v_ for k, v_ in slow.per_type.items()},
    )


def _heads(model: Model) -> int | None:
    heads = [layer["heads"] for layer, _ in model.counted() if layer.op == "attention"]
    return min(heads) if heads else None


def _comm(hw: Hardware) -> Any:
    import dlperf.comm as comm

    return comm


def _tp_comm_fn(comm: Any, hw: Hardware, plan: Plan) -> Any:
    group = comm.Group(plan.tp, 1)
    return lambda op, nbytes: comm.collective_time(op, nbytes, group, hw)


def _stage_costs(model: Model, hw: Hardware, plan: Plan, dtype: str, e: int, tp_time: Any) -> list[StageCost]:
    def cost(nodes: list[Any]) -> StageCost:
        return stage_cost(tp_uses(nodes, plan.sequence_parallel), plan.micro, e, hw, dtype, plan.tp,
                          plan.sequence_parallel, plan.recompute, tp_time)

    if plan.pp == 1:
        return [cost(list(model.root.items))]
    stages = uniform_partition(model, plan.pp)
    if stages is None:
        pieces = units(model)
        unit_costs = [float(cost([u]).total) for u in pieces]
        stages = [pieces[i:j] for i, j in balanced_partition(unit_costs, plan.pp)]
    return [cost(nodes) for nodes in stages]


def _level_for_stride(hw: Hardware, stride: int) -> int:
    """Index of the innermost network level whose domains contain ranks `stride` apart."""
    for index, level in enumerate(hw.network):
        if level.size is None or stride < level.size:
            return index
    return len(hw.network) - 1


def _p2p_time(model: Model, hw: Hardware, plan: Plan, e: int, comm: Any) -> float:
    """One stage-boundary transfer of a micro-batch's activations. With tp > 1, Megatron's scatter/gather
    optimisation sends 1/tp of it across the boundary and allgathers it inside the node (Narayanan 2021, 4.1)."""
    if plan.pp == 1:
        return 0.0
    boundary = _boundary_elements(model)
    nbytes = e * plan.micro * boundary
    stride = plan.tp * plan.data_parallel
    t = comm.p2p_time(nbytes / plan.tp, hw, _level_for_stride(hw, stride))
    if plan.tp > 1:
        t += comm.collective_time("allgather", nbytes, comm.Group(plan.tp, 1), hw)
    return t


def _boundary_elements(model: Model) -> Any:
    blocks = [i for i in model.root.items if isinstance(i, type(model.root)) and i.repeat > 1]
    if blocks:
        from dlperf.spec.model import out_shape

        return numel(out_shape(blocks[0], model.input_shape))
    return max(numel(layer.out_shape) for layer, _ in model.layers())


def _dp_comm(hw: Hardware, plan: Plan, slow: StageCost, backward: float, dtype: str, comm: Any) -> tuple[Any, Any]:
    """Gradient synchronisation across dp replicas: (total, exposed) seconds.

    Allreduce of this device's gradients (ZeRO-2/3: reduce-scatter, plus ZeRO-3's parameter allgathers in forward
    and backward). Overlapped with the backward pass in DDP buckets when pp == 1 (Li et al. 2020): only what
    outlasts the backward pass, and at least the last bucket, is exposed. Megatron-LM issues it after the
    pipeline flush, so with pp > 1 it is exposed unless overlap is forced.
    """
    dp = plan.data_parallel
    if dp == 1:
        return 0.0, 0.0
    grad_bytes = slow.params * element_bytes(plan.grad_dtype or ("fp32" if dtype in ("fp32", "tf32") else dtype))
    group = comm.Group(dp, plan.tp)
    if plan.parameter_server:
        total = comm.parameter_server_time(grad_bytes, dp, plan.parameter_server, hw)
    elif plan.compression != "none":
        total = comm.compressed_allreduce_time(slow.params, grad_bytes / slow.params,
                                               comm.Compression.parse(plan.compression), group, hw)[0]
    elif plan.zero >= 2:
        total = comm.collective_time("reduce_scatter", grad_bytes, group, hw)
        if plan.zero == 3:
            total = total + 2 * comm.collective_time("allgather", grad_bytes, group, hw)
    else:
        total = comm.collective_time("allreduce", grad_bytes, group, hw)
    if plan.zero in (1, 2):  # updated parameter shards are allgathered after the step
        total = total + comm.collective_time("allgather", grad_bytes, group, hw)
    overlap = plan.overlap if plan.overlap is not None else plan.pp == 1
    if not overlap:
        return total, total
    last_bucket = comm.collective_time("allreduce", min(DDP_BUCKET_BYTES, grad_bytes), group, hw)
    return total, max(total - backward, last_bucket)


def _optimizer_time(hw: Hardware, plan: Plan, params: Any) -> float:
    nbytes, flops = OPTIMIZER_COST[plan.optimizer]
    shard = plan.data_parallel if plan.zero >= 1 else 1
    bw = hw.device.memory_bandwidth * hw.device.eff("memory").peak
    return params / shard * max(nbytes / bw, flops / hw.device.peak("fp32")) + hw.device.launch_latency


def _optimizer_flops(model: Model, plan: Plan) -> float:
    return float(model.total_params) * OPTIMIZER_COST[plan.optimizer][1]


def _consistency(plan: Plan, compute: Any, dp_total: Any, dp_exposed: Any) -> tuple[Any, int]:
    """Synchronous: compute + exposed allreduce. Stale-synchronous with bound s and asynchronous SGD (survey
    section 7.1): workers do not wait for the reduction, so communication hides behind compute up to the
    bandwidth bound, max(compute, comm); staleness is at most s (SSP) or about dp - 1 (async)."""
    if plan.consistency == "sync":
        return compute + dp_exposed, 0
    staleness = plan.staleness if plan.consistency == "ssp" else max(plan.data_parallel - 1, 0)
    return max(compute, dp_total), staleness


def step_flops(model: Model, plan: Plan, e: int) -> tuple[float, float, float]:
    """FLOPs of one step over the global batch: (model, executed, matrix).

    model: forward + backward, no recomputation (the MFU numerator, PaLM Appendix B convention).
    executed: model + the forward work that recomputation repeats.
    matrix: GEMM and convolution FLOPs only, recomputation included: the convention of Megatron-LM's published
    TF/s (Narayanan et al. 2021, eq. 3 counts only the matrix multiplications).
    """
    from dlperf.engine.stage import ATTENTION_CORE
    from dlperf.ops import OPS

    model_total = recompute = matrix = 0.0
    for layer, count in model.counted():
        for kernel in OPS[layer.op].kernels(layer, 1, e):
            again = plan.recompute == "full" or (
                plan.recompute == "selective" and kernel.name in ATTENTION_CORE and not layer.get("flash"))
            extra = kernel.cost.fwd_flops if again else 0.0
            model_total += count * kernel.cost.work
            recompute += count * extra
            if kernel.cls in ("matmul", "conv"):
                matrix += count * (kernel.cost.work + extra)
    batch = plan.global_batch
    return float(model_total) * batch, float(model_total + recompute) * batch, float(matrix) * batch
