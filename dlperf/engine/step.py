"""model + hardware + plan -> Prediction: step time with its breakdown, memory per device, throughput, MFU.

step = pipeline time of the slowest stage (busy + bubble + point-to-point) + exposed data-parallel
communication + optimizer update. With dp = tp = pp = 1 this is the single-device step:
forward + backward (+ recomputation) + optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from dlperf import mathx
from dlperf.comm import ep_kernels
from dlperf.engine import fp16_wrappers, horovod, offload, post_backward, zero_impl
from dlperf.engine import memory as mem
from dlperf.engine.context import DISPATCHER_SMS, Parallel
from dlperf.engine.cuda_graphs import Graphs
from dlperf.engine.device import sync_gap
from dlperf.engine.grad_passes import grad_pass_time
from dlperf.engine.input import input_note, input_wait
from dlperf.engine.layers import element_bytes, tp_uses
from dlperf.engine.metric_sync import metric_sync_time, synced_metrics
from dlperf.engine.optimizer_loop import loop_launches, loop_time
from dlperf.engine.overlap import hidden_transfer
from dlperf.engine.pipeline import (
    balanced_partition,
    dualpipe_bubble,
    dualpipe_pairs,
    in_flight,
    schedule_time,
    uniform_partition,
    units,
)
from dlperf.engine.stage import StageCost, stage_cost, stage_memory
from dlperf.engine.straggler import straggler_factor
from dlperf.engine.tf1_update import POST_SYNC_PASSES, accumulation_sync_host, update_step_time
from dlperf.engine.work import model_cost
from dlperf.errors import PlanError
from dlperf.ops.base import numel
from dlperf.ops.fp8 import fp8_layers, is_recipe, param_gather_bytes, weight_cast_bytes
from dlperf.ops.recompute import ActivationPolicy, norm_consumers, rerun_kernels, reruns
from dlperf.plan import (
    FP16_WRAPPERS,
    PER_BLOCK_ZERO_IMPLS,
    Plan,
    cudnn_version,
    dualpipe_micro_batches_ok,
    folded,
    validate,
)
from dlperf.spec.hardware import DEFAULT_CHANNELS, Hardware
from dlperf.spec.model import Model, out_shape

DDP_BUCKET_BYTES = mem.DDP_BUCKET_BYTES
# DualPipe's twin data-parallel group: the first devices of pipeline ranks r and pp-1-r, whose replicas reduce one
# stage's gradients together, and the devices of one pipeline rank (None: an ordinary group, dp ranks tp apart)
Twin = tuple[int, int, int] | None
# Optimizer update per parameter, memory-bound: bytes read + written and FLOPs (fp32 states).
# Adam reads/writes weight, m, v (3 x 8 B) and reads the gradient; ~12 FLOPs (two moments, bias-corrected step).
OPTIMIZER_COST = {"sgd": (12, 2), "momentum": (20, 4), "adam": (28, 12)}
Split = tuple[tuple[int, int], ...]  # a pipeline split: each stage's range of units (StepModel.units)
Loop = tuple[Any, str]  # (kernels per parameter, compute dtype) of a per-tensor optimizer step, (0, "") if fused


class Passes(NamedTuple):
    """One stage's passes per micro-batch (seconds): what _combine and the pipeline bubble use."""

    fwd: Any
    bwd: Any
    recompute: Any
    accumulate: Any
    ep_fwd: Any
    ep_bwd: Any
    host_excess: Any   # what the host adds beyond the device's work, both passes
    offload: Any = 0.0  # what waiting on activation copies to and from host memory adds, both passes


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


@dataclass
class Timeline:
    """Step time, its breakdown and memory of one plan (what search ranks by; predict adds FLOP rates)."""

    plan: Plan
    step_time_s: float
    breakdown_s: dict[str, float]
    memory: dict[str, float]
    slow: StageCost
    dtype: str
    staleness: int

    @property
    def memory_bytes_per_device(self) -> float:
        return self.memory["total"]

    def throughput(self) -> float:
        return self.plan.global_batch / self.step_time_s


class StepModel:
    """One model on one cluster, priced plan after plan.

    The expensive part of a prediction, the stage costs (every layer's kernels), depends only on pp and what
    stage_cost reads of the plan (tp, sequence parallelism, recomputation, micro-batch, dtype, ...:
    _stage_cost_key); it is memoised, so a search over many plans prices each distinct structure once and
    combines the cheap knobs (micro-batch count, schedule, virtual stages, ZeRO, dp communication) per plan.
    Memory (`memory`) needs only what each stage holds, which stage_memory adds up without pricing a kernel: a
    search screens every plan by memory and prices the stages of those that fit. `predict` is this with a fresh
    cache.
    """

    def __init__(self, model: Model, hw: Hardware) -> None:
        self.model, self.hw = model, hw
        self.heads = _heads(model)
        self.fp8 = fp8_layers(model.root)
        self._after_norm: frozenset | None = None  # layers fed by a norm (dlperf.ops.recompute), found when needed
        total = model.total_params
        self.fp8_share = sum(layer.params * n for layer, n in model.counted() if layer in self.fp8) / total \
            if isinstance(total, int) and total else 0.0
        # the pipeline units, opened once: the stage memos key on them, and units() builds new wrapper nodes on
        # every call, whose hashes and equality the memos would then recompute deep down the tree
        self.units = units(model)
        self.layers = len(self.units)
        # each unit as the index of the first unit equal to it: a range's content as a tuple of ints (`_range`),
        # which keys the stage memos as cheaply as it hashes, and equal ranges (a repeated block's) alike
        first: dict[Any, int] = {}
        self._unit_ids = tuple(first.setdefault(unit, k) for k, unit in enumerate(self.units))
        self.metrics = synced_metrics(model)  # training metrics synced every step (dlperf.engine.metric_sync)
        self.comm = _PricedComm(_comm(), hw)
        self._stages: dict[tuple, tuple[list[StageCost], StageCost, Any, Any]] = {}
        self._slowest: dict[tuple, tuple[list[StageCost], StageCost, Any, Any]] = {}  # `stages` per slowest-stage key
        self._cost: dict[tuple, StageCost] = {}
        self._holds: dict[tuple, list[StageCost] | None] = {}  # stage_memory's stages per split (_held)
        self._uniform: dict[int, list[list[Any]] | None] = {}  # _partition's split per pp
        self._uses: dict[tuple, list] = {}
        self._splits: dict[tuple[int, int, int], list[Split]] = {}  # _candidate_splits per (micro, e, pp)
        self._work: dict[tuple[int, int], list[tuple[float, float, float]]] = {}  # _unit_work per (micro, e)
        self._par: dict[tuple, Parallel | None] = {}  # _parallel per stage-cost key
        self._p2p: dict[tuple, Any] = {}
        self._dp: dict[tuple, tuple[Any, Any]] = {}
        self._pace: dict[tuple[int, int], tuple[StageCost, StageCost, StageCost]] = {}
        self._tp_fns: dict[int, Any] = {}
        self._twins: dict[tuple, tuple[list[StageCost], list[StageCost]]] = {}
        # stage_cost's memo: self.hw never changes, but for the fused-attention curve a plan's cuDNN version picks
        # (_hw_for), which the kernel-times key carries (engine/stage.py _kernel_times: Device.cudnn)
        self._kernel_times: dict[tuple, tuple[Any, Any]] = {}
        self._by_cudnn: dict[str | None, Hardware] = {None: hw}

    def _hw_for(self, plan: Plan) -> Hardware:
        """The hardware a plan's kernels are priced on: self.hw with the fused-attention curve measured at the
        plan's cuDNN version (Hardware.for_cudnn; plan.cudnn None: self.hw itself)."""
        if plan.cudnn not in self._by_cudnn:
            self._by_cudnn[plan.cudnn] = self.hw.for_cudnn(plan.cudnn)
        return self._by_cudnn[plan.cudnn]

    def stages(self, plan: Plan, dtype: str, e: int) -> tuple[list[StageCost], StageCost, Any, Any]:
        """(every stage's cost, the slowest stage, the most parameters on one device, the largest activation
        crossing a stage boundary per sample)."""
        key = (plan.pp, plan.hybrid_fc, plan.data_parallel, *_stage_cost_key(plan, dtype))
        if key not in self._stages and plan.hybrid_fc:
            part = self._hybrid_fc(plan, dtype, e)
            self._stages[key] = ([part], part, part.params, 0)
        if key not in self._stages and self._partition(plan, dtype, e) is not None:
            self._stages[key] = self._staged(self._partition(plan, dtype, e), plan, dtype, e)
        if key in self._stages:
            # the stages are the key's; the slowest of them is picked with the plan's gradient accumulation, which
            # reads more of the plan (_accumulation_key: ZeRO-2 shards what a stage accumulates, grad_dtype sizes it)
            choice = (key, *_accumulation_key(plan))
            if choice not in self._slowest:
                stages, _, params, boundary = self._stages[key]
                self._slowest[choice] = stages, self._slowest_of(stages, plan, dtype), params, boundary
            return self._slowest[choice]
        # a balanced partition is chosen for the whole plan (it weighs communication, see _balanced)
        if plan not in self._stages:
            self._stages[plan] = self._balanced(plan, dtype, e)
        return self._stages[plan]

    def _staged(self, nodes: list[list[Any]], plan: Plan, dtype: str, e: int,
                stages: list[StageCost] | None = None) -> tuple[list[StageCost], StageCost, Any, Any]:
        """(stages, slowest, most parameters, largest boundary) of the split `nodes`, each stage priced whole
        unless `stages` gives their costs."""
        stages = [self._cost_of(n, plan, dtype, e) for n in nodes] if stages is None else stages
        return stages, self._slowest_of(stages, plan, dtype), max(s.params for s in stages), self._boundary(nodes)

    def _boundary(self, nodes: list[list[Any]]) -> Any:
        """The largest activation crossing a stage boundary of the split `nodes`, per sample."""
        return max((numel(out_shape(n[-1], self.model.input_shape)) for n in nodes[:-1]), default=0)

    def _slowest_of(self, stages: list[StageCost], plan: Plan, dtype: str,
                    memo: dict[tuple, Any] | None = None) -> StageCost:
        """The stage whose passes last longest, counting its gradient accumulation, which grows with its
        parameters, not its work (the first of equals). Equal stages are one object (the stage memos), timed once:
        the first of equals is the same stage either way. `memo` is _combine's (more splits of the plan)."""
        memo = {} if memo is None else memo
        distinct = {id(s): s for s in stages}.values()  # each object at its first place
        for s in distinct:
            if ("pace", id(s)) not in memo:
                memo[("pace", id(s))] = s.pass_time(_grad_accumulation(self.hw, plan, s.params, dtype))
        return max(distinct, key=lambda s: memo[("pace", id(s))])

    def _balanced(self, plan: Plan, dtype: str, e: int) -> tuple[list[StageCost], StageCost, Any, Any]:
        """The pipeline split of a model without a uniformly divisible repeated block: of the contiguous splits
        that balance a fixed family of hardware-independent unit weights (FLOPs + lambda x bytes moved, with
        and without each unit's parameters, for lambda spanning the FLOP-per-byte ratios of real devices), the
        one with the shortest step. A split balanced by this hardware's compute time (torchgpipe's balance by
        time) moved every fully connected layer of a VGG onto one stage once compute got faster, and that
        stage's gradient traffic made the step slower on faster hardware (issue #15); a minimum over a family
        that does not depend on the hardware cannot get slower when the hardware gets faster, since no split
        in it does."""
        best, best_step = None, None
        memo: dict[tuple, Any] = {}  # what _combine prices per stage, for this plan: the candidates share stages
        for split in self._candidate_splits(plan.micro, e, plan.pp):
            stages, params, boundary = self._summed_split(split, plan, dtype, e)
            staged = stages, self._slowest_of(stages, plan, dtype, memo), params, boundary
            step = float(self._combine(plan, dtype, e, staged, plan.micro_batches, plan.virtual_stages, memo)[0])
            if best_step is None or step < best_step:
                best, best_step = split, step
        # the chosen split priced whole: a stage walked unit by unit would run the vocabulary-parallel loss unsplit
        return self._staged([self.units[i:j] for i, j in best], plan, dtype, e, self._per_range(
            best, lambda i, j: self._cost_of(self.units[i:j], plan, dtype, e, self._range(i, j))))

    def _summed_split(self, split: Split, plan: Plan, dtype: str, e: int) -> tuple[list[StageCost], Any, Any]:
        """(stages, most parameters, largest boundary) of a candidate split, each stage the sum of its units' costs
        (_range_cost), memoised per split and stage-cost key: the plans of one shape (ZeRO 0 and 1) share them. A
        range's cost is the sum of its units' (stage_cost adds use by use, and tp_uses walks each unit from an
        unsharded input: equal to pricing the range whole up to float rounding, except that a vocabulary-parallel
        loss priced as a unit of its own runs unsplit), so a candidate costs additions."""
        stage_key = _stage_cost_key(plan, dtype)
        key = ("summed", split, *stage_key)
        if key not in self._cost:
            stages = self._per_range(split, lambda i, j: self._range_cost(i, j, plan, dtype, e, stage_key))
            self._cost[key] = stages, max(s.params for s in stages), \
                self._boundary([self.units[i:j] for i, j in split])
        return self._cost[key]

    def _candidate_splits(self, micro: int, e: int, pp: int) -> list[Split]:
        """The distinct splits that balance BALANCE_WEIGHTS' unit weights over pp stages, first found first (the
        order _balanced breaks ties in). They depend on the model, micro-batch, element size and pp alone, so
        every plan of that shape tries the same ones: made once."""
        key = (micro, e, pp)
        if key not in self._splits:
            if (micro, e) not in self._work:
                self._work[(micro, e)] = [_unit_work(u, micro, e) for u in self.units]
            work = self._work[(micro, e)]
            splits: list[Split] = []
            for flops_per_byte, flops_per_param in BALANCE_WEIGHTS:
                costs = [f + flops_per_byte * b + flops_per_param * p for f, b, p in work]
                split = tuple(balanced_partition(costs, pp))
                if split not in splits:
                    splits.append(split)
            self._splits[key] = splits
        return self._splits[key]

    def _range_cost(self, i: int, j: int, plan: Plan, dtype: str, e: int, stage_key: tuple) -> StageCost:
        """The units i..j-1's stage costs added left to right, memoised per range content (equal ranges are one
        object, as stage_cost's memo keyed by the nodes makes them; _combine prices each distinct stage once).
        A range extends the longest one already summed from i: the same parts added in the same order, so the
        same floats as adding all j-i afresh, at one addition per new range. `stage_key` is
        _stage_cost_key(plan, dtype)."""
        ids = self._unit_ids
        start = j
        while start > i + 1 and ("range", ids[i:start], *stage_key) not in self._cost:
            start -= 1
        total = self._cost[("range", ids[i:start], *stage_key)] if start > i + 1 else \
            self._cost_of(self.units[i:i + 1], plan, dtype, e, self._range(i, i + 1))
        for k in range(start, j):
            total = total + self._cost_of(self.units[k:k + 1], plan, dtype, e, self._range(k, k + 1))
            self._cost[("range", ids[i:k + 1], *stage_key)] = total
        return total

    def _per_range(self, split: Split, stage: Callable[[int, int], StageCost]) -> list[StageCost]:
        """stage(i, j) for each range of `split`, called once per distinct content (a pipeline's middle stages are
        alike, and the memos behind `stage` give equal ranges one object anyway)."""
        made: dict[tuple, StageCost] = {}
        for i, j in split:
            if self._unit_ids[i:j] not in made:
                made[self._unit_ids[i:j]] = stage(i, j)
        return [made[self._unit_ids[i:j]] for i, j in split]

    def _range(self, i: int, j: int) -> tuple:
        """What identifies the units i..j-1 to the stage memos (`content`): their _unit_ids, which hash faster than
        the nodes and are equal for equal ranges."""
        return ("units", self._unit_ids[i:j])

    def _cost_of(self, nodes: list[Any], plan: Plan, dtype: str, e: int, content: tuple | None = None) -> StageCost:
        """stage_cost of `nodes`, memoised per nodes (or `content`, `_range`'s key for a range of units) and
        stage-cost key."""
        key = (tuple(nodes) if content is None else content, *_stage_cost_key(plan, dtype))
        if key not in self._cost:
            self._cost[key] = stage_cost(self._tp_uses(nodes, plan, content), plan.micro, e, self._hw_for(plan),
                                         dtype, plan.tp, plan.sequence_parallel, plan.recompute,
                                         self._tp_comm(plan.tp), self.fp8, plan.tp_overlap,
                                         self._parallel(plan, dtype), self._kernel_times, self._policy(plan),
                                         plan.memory_format == "nchw", plan.fp8_scaling, plan.mx_swizzle,
                                         _graphs(plan), plan.fp8_weight_transpose)
        return self._cost[key]

    def _parallel(self, plan: Plan, dtype: str) -> Parallel | None:
        """_parallel for the plan, made once per stage-cost key (which holds all it reads: tp, dtype, _ep_cp_key)."""
        key = _stage_cost_key(plan, dtype)
        if key not in self._par:
            self._par[key] = _parallel(self.comm, self.hw, plan, dtype)
        return self._par[key]

    def _tp_uses(self, nodes: list[Any], plan: Plan, content: tuple | None = None) -> list[Any]:
        """The nodes' layer uses as tensor parallelism shards them (tp_uses), memoised per nodes (or `content`, as
        in _cost_of) and sequence parallelism."""
        key = (tuple(nodes) if content is None else content, plan.sequence_parallel)
        if key not in self._uses:
            self._uses[key] = tp_uses(nodes, plan.sequence_parallel)
        return self._uses[key]

    def _held(self, plan: Plan, dtype: str, e: int) -> list[StageCost]:
        """Every stage's parameters and saved activations, all `_memory` reads of the stages: stage_memory's, which
        prices no kernel, on the split `stages` takes without pricing (one stage, or Megatron's uniform split), so
        a plan that does not fit costs no stage pricing. The balanced split is chosen by pricing and --hybrid-fc's
        stage is built from priced parts: those are read from `stages`."""
        key = (plan.pp, plan.hybrid_fc, *_stage_cost_key(plan, dtype))
        if key not in self._holds:
            unpriced = not plan.hybrid_fc and self._partition(plan, dtype, e) is not None
            self._holds[key] = [self._held_by(nodes, plan, dtype, e)
                                for nodes in self._partition(plan, dtype, e)] if unpriced else None
        held = self._holds[key]
        return self.stages(plan, dtype, e)[0] if held is None else held

    def _held_by(self, nodes: list[Any], plan: Plan, dtype: str, e: int, content: tuple | None = None) -> StageCost:
        """stage_memory of one stage, memoised as _cost_of memoises its stage_cost (a pipeline's middle stages
        hold the same layers)."""
        key = ("held", tuple(nodes) if content is None else content, *_stage_cost_key(plan, dtype))
        if key not in self._cost:
            self._cost[key] = stage_memory(self._tp_uses(nodes, plan, content), plan.micro, e, dtype, plan.tp,
                                           plan.sequence_parallel, plan.recompute, self.fp8,
                                           self._parallel(plan, dtype), self._policy(plan))
        return self._cost[key]

    def _held_split(self, split: Split, plan: Plan, dtype: str, e: int) -> list[StageCost]:
        """_held_by of each stage of a candidate split, memoised per split and stage-cost key (may_fit)."""
        key = ("held", split, *_stage_cost_key(plan, dtype))
        if key not in self._cost:
            self._cost[key] = self._per_range(
                split, lambda i, j: self._held_by(self.units[i:j], plan, dtype, e, self._range(i, j)))
        return self._cost[key]

    def _policy(self, plan: Plan) -> ActivationPolicy | None:
        """The plan's partial recomputation and FP8 activation caching (None when it uses neither)."""
        if not plan.recompute_modules and not plan.fp8_activations:
            return None
        if self._after_norm is None:
            self._after_norm = norm_consumers(self.model.root)
        return ActivationPolicy(frozenset(plan.recompute_modules), plan.fp8_activations, self._after_norm)

    def _hybrid_fc(self, plan: Plan, dtype: str, e: int) -> StageCost:
        """Krizhevsky's "one weird trick" (2014; survey section 6): the convolutional body is data-parallel on
        B/N samples per device, the fully connected head is model-parallel over all N devices on the whole batch
        B, and the body's outputs are allgathered in between (and their gradients reduce-scattered back). Only
        the body's parameters are allreduced."""
        items = list(self.model.root.items)
        cut = _head_start(items)
        if cut == 0 or cut == len(items):
            raise PlanError("--hybrid-fc needs a convolutional body followed by a head without convolutions")
        n = plan.data_parallel
        body = self._cost_of(items[:cut], plan, dtype, e)
        head = self._cost_of(items[cut:], plan.with_(tp=n, dp=1, micro_batch=plan.micro * n), dtype, e)
        boundary = e * plan.micro * n * numel(out_shape(items[cut - 1], self.model.input_shape)) if cut else 0
        group = self.comm.Group(n, 1)
        exchange = StageCost(tp_comm_fwd=self.comm.collective_time("allgather", boundary, group, self.hw),
                             tp_comm_bwd=self.comm.collective_time("reduce_scatter", boundary, group, self.hw))
        whole = body + head + exchange
        whole.synced_params = body.params
        return whole

    def _partition(self, plan: Plan, dtype: str, e: int) -> list[list[Any]]:
        """One stage, or Megatron's uniform split over the repeated block (see _balanced for the rest), made once
        per pp: the split depends on the model and pp alone, and the stage memos hash its nodes, whose hashes
        are kept on the node objects."""
        if plan.pp not in self._uniform:
            self._uniform[plan.pp] = [list(self.model.root.items)] if plan.pp == 1 else \
                uniform_partition(self.model, plan.pp)
        return self._uniform[plan.pp]

    def _check(self, plan: Plan) -> None:
        """The plan's rules against this model and hardware: degrees and knobs, expert/context parallelism,
        activation offloading."""
        validate(plan, heads=self.heads, layers=self.layers)
        _check_ep_cp(self.model, plan)
        if plan.offload_layers:
            offload.check(plan, self.hw, mem.blocks_in_stage(self.model, plan))

    def timeline(self, plan: Plan) -> Timeline:
        return self._timed(plan, self.memory(plan))

    def memory(self, plan: Plan) -> dict[str, Any]:
        """The plan's memory per device, as timeline(plan).memory, without pricing its step: memory depends on
        what the stages hold and the schedule's micro-batches in flight, never on the step time, so search screens
        plans with it and prices only those that fit. A plan its rules refuse (_check, _dtype) raises as in
        timeline; one whose kernels cannot be priced (a dtype the device has no peak for) raises only there."""
        self._check(plan)
        return self._memory(plan, plan.micro_batches, plan.virtual_stages)

    def may_fit(self, plan: Plan, limit: float) -> bool:
        """False where memory(plan)["total"] > limit is certain before the plan is priced. A pipeline split that
        _balanced chooses by pricing the step is one of _candidate_splits, and what its stages hold is
        stage_memory's on it, bit for bit (stage.stage_memory), so when no candidate fits, the plan does not: the
        default plan's search then skips its balancing, which prices every candidate's step (DeepSeek-V3 on 2048
        GPUs: ~430 of 1,674 candidates). True for every other plan, whose memory costs no pricing anyway. Raises
        what memory(plan) raises for a plan its rules refuse."""
        self._check(plan)
        dtype = self._dtype(plan)
        e = element_bytes(dtype)
        if plan.hybrid_fc or plan in self._stages or self._partition(plan, dtype, e) is not None:
            return True
        states: dict[tuple, dict[str, Any]] = {}  # model states per distinct stage: the splits share stages
        for split in self._candidate_splits(plan.micro, e, plan.pp):
            held = self._held_split(split, plan, dtype, e)
            if not self._memory_of(plan, held, dtype, plan.micro_batches, plan.virtual_stages, states)["total"] > limit:
                return True
        return False

    def fitting_timeline(self, plan: Plan, limit: float) -> tuple[dict[str, Any], Timeline | None]:
        """(memory(plan), timeline(plan) if its memory total is at most `limit` bytes, else None): a plan that
        does not fit is never priced."""
        memory = self.memory(plan)
        return memory, None if memory["total"] > limit else self._timed(plan, memory)

    def _timed(self, plan: Plan, memory: dict[str, Any]) -> Timeline:
        """The plan's Timeline, its memory already computed (memory(plan): the plan has passed _check)."""
        step, breakdown, slow, dtype, staleness = self._evaluate(plan, plan.micro_batches, plan.virtual_stages)
        return Timeline(plan, step, breakdown, memory, slow, dtype, staleness)

    def grid(self, plan: Plan, global_batch: Any, virtual_stages: Any = None) -> dict[str, Any]:
        """Step time and memory for whole arrays of global batches (and virtual-stage counts) that share the
        rest of `plan`: the per-structure costs are computed once and the cheap knobs combined as numpy
        arrays (the vectorised path of search and sweep). Points that break a plan rule are NaN."""
        import numpy as np

        self._check(plan)
        gb = np.asarray(global_batch, dtype=float)
        v = np.asarray(plan.virtual_stages if virtual_stages is None else virtual_stages, dtype=float)
        m = gb / (plan.data_parallel * plan.micro)
        ok = (m >= 1) & (m == np.floor(m)) & (v >= 1)
        if plan.schedule == "interleaved":
            ok &= (m % plan.pp == 0) & (v >= 2) & (plan.pp * v <= self.layers)
        elif plan.schedule == "dualpipe":
            ok &= dualpipe_micro_batches_ok(m, plan.pp) & (v == 1)
        else:
            ok &= v == 1
        nan = np.full(np.broadcast(gb, v).shape, np.nan)
        if plan.zero_impl == "megatron" and plan.schedule == "interleaved":
            # Megatron's overlapped parameter gather reads the virtual stages from the plan (_megatron_param_gather,
            # keyed so in _dp_time): one plan per virtual-stage count, as timeline() would price it
            step, total = nan.copy(), nan.copy()
            for count in np.unique(v[v >= 2]):
                at = np.broadcast_to(v == count, nan.shape)
                at_count = plan.with_(virtual_stages=int(count))
                s, total_at = self._evaluate(at_count, m, count)[0], self._memory(at_count, m, count)["total"]
                step, total = np.where(at, s, step), np.where(at, total_at, total)
        else:
            step, total = self._evaluate(plan, m, v)[0], self._memory(plan, m, v)["total"]
        return {"step_time_s": np.where(ok, step, nan), "memory_bytes_per_device": np.where(ok, total, nan),
                "global_batch": gb, "virtual_stages": v}

    def _evaluate(self, plan: Plan, m: Any, v: Any) -> tuple[Any, dict[str, Any], StageCost, str, int]:
        """The step for m micro-batches and v virtual stages (numbers or numpy arrays): (step, breakdown, slowest
        stage, dtype, staleness); its memory is `_memory`'s."""
        dtype = self._dtype(plan)
        e = element_bytes(dtype)
        step, breakdown, slow, staleness = self._combine(plan, dtype, e, self.stages(plan, dtype, e), m, v)
        if plan.data_backend == "synthetic":
            return step, breakdown, slow, dtype, staleness
        # the CPU loader runs ahead of the GPU: the step waits only for what it needs beyond its own time
        wait = input_wait(plan, self.hw, m * plan.micro, step)
        return step + wait, breakdown | {"input/cpu": wait}, slow, dtype, staleness

    def _dtype(self, plan: Plan) -> str:
        """The dtype the plan computes in (its own, else the model's), refusing FP8 parameter gathers outside an
        FP8 or FP4 recipe and an fp16 optimizer wrapper outside fp16 training."""
        dtype = plan.dtype or self.model.dtype
        if plan.fp8_param_gather and not is_recipe(dtype):
            raise PlanError("--fp8-param-gather needs FP8 or FP4 training (--dtype fp8, mxfp8 or nvfp4)", found=dtype)
        if plan.optimizer_impl in FP16_WRAPPERS and dtype != "fp16":
            raise PlanError(f"optimizer_impl {plan.optimizer_impl} is an fp16 optimizer wrapper",
                            expected="dtype fp16", found=dtype)
        return dtype

    def _memory(self, plan: Plan, m: Any, v: Any) -> dict[str, Any]:
        """Memory per device for m micro-batches and v virtual stages: the fullest device's model states and the
        activations of the micro-batches in flight (dlperf.engine.memory). It reads the stages (memoised) and the
        schedule, nothing of the step's time. DualPipe counts each rank's two stages over the doubled
        data-parallel group that shards their states (`_dualpipe`); combined 1F1B (`ep_overlap`) holds one layer
        more (memory.paired_layer)."""
        dtype = self._dtype(plan)
        return self._memory_of(plan, self._held(plan, dtype, element_bytes(dtype)), dtype, m, v)

    def _memory_of(self, plan: Plan, stages: list[StageCost], dtype: str, m: Any, v: Any,
                   held: dict[tuple, dict[str, Any]] | None = None) -> dict[str, Any]:
        """`_memory` with the stages given (what each holds: stage_memory's fields); `held` as mem.per_device's."""
        if plan.schedule == "dualpipe":
            return mem.dualpipe_per_device(self.model, self.hw, _dualpipe_group(plan), stages, dtype)
        flight = in_flight(plan.schedule, m, plan.pp, v) + (mem.paired_layer(self.model, plan) if plan.ep_overlap
                                                            else 0)
        return mem.per_device(self.model, self.hw, plan, stages, dtype, flight, held)

    def _combine(self, plan: Plan, dtype: str, e: int, staged: tuple[list[StageCost], StageCost, Any, Any], m: Any,
                 v: Any, memo: dict[tuple, Any] | None = None) -> tuple[Any, dict[str, Any], StageCost, int]:
        """(step, breakdown, slowest stage, staleness) of the staged plan: its time only (`_memory` its memory).
        `memo` keeps each stage's passes and data-parallel time for more splits of the same plan, m and v (keyed by
        the stage objects, which the stage memos keep alive)."""
        if plan.schedule == "dualpipe":
            return self._dualpipe(plan, dtype, e, staged, m)
        stages, slow, params, boundary = staged
        memo = {} if memo is None else memo
        for s in stages:
            if ("passes", id(s)) not in memo:
                memo[("passes", id(s))] = self._passes(plan, s, dtype, m)
        passes = {id(s): memo[("passes", id(s))] for s in stages}
        t, share = passes[id(slow)], recompute_share(plan, m)
        busy, _, p2p = schedule_time(t.fwd, t.bwd, self._p2p_time(plan, e, boundary), m, plan.pp, v,
                                     _p2p_contention(self.hw, plan))
        # Fill and drain: the first micro-batch's forward and the last one's backward cross every other stage once
        # (per model chunk with interleaving), at that stage's own pace; the slowest stage sets the steady state.
        bubble = (sum(passes[id(s)].fwd + passes[id(s)].bwd for s in stages) - (t.fwd + t.bwd)) / v
        dp_total, dp_exposed = self._dp_over_stages(plan, stages, slow, dtype, m, memo=memo)
        optimizer = self._update_time(plan, plan, dtype, params, max(stages, key=lambda s: s.params).expert_params)
        metric_sync = metric_sync_time(self.metrics, self.hw, plan, self.comm)
        compute = busy + bubble + p2p
        step, staleness = _consistency(plan, compute, dp_total, dp_exposed)
        breakdown = {
            "compute/forward": m * slow.forward,
            "compute/backward": m * slow.backward,
            # the rerun's collectives under comm/*, as the forward's: compute/recompute <= the blocks' forward
            "compute/recompute": m * share * slow.recompute_kernels,
            "compute/grad_accumulation": m * t.accumulate,
            "compute/straggler": m * self._straggler_time(plan, slow, share),
            "comm/tp": m * (slow.tp_comm_fwd + slow.tp_comm_bwd + share * slow.tp_comm_rerun),
            "comm/ep": m * (t.ep_fwd + t.ep_bwd + share * slow.ep_comm_rerun),
            "comm/cp": m * (slow.cp_comm_fwd + slow.cp_comm_bwd + share * slow.cp_comm_rerun),
            "overhead/host": m * t.host_excess,
            "comm/host_offload": m * t.offload,
            "comm/pp_p2p": p2p,
            "pipeline/bubble": bubble,
            "comm/dp_allreduce": step - compute if plan.consistency != "sync" else dp_exposed,
            "optimizer": optimizer,
            "overhead/metric_sync": metric_sync,
        }
        return step + optimizer + metric_sync, breakdown, slow, staleness

    def _dualpipe(self, plan: Plan, dtype: str, e: int, staged: tuple[list[StageCost], StageCost, Any, Any],
                  m: Any) -> tuple[Any, dict[str, Any], StageCost, int]:
        """DeepSeek-V3's DualPipe (arXiv:2412.19437, Sec. 3.2.1, Table 2; deepseek-ai/DualPipe @3da1bbe).

        Rank r holds stages r and pp-1-r (two copies of every stage's parameters in the pipeline) and runs
        m/2 micro-batches through each, fed from both ends. Its steady state pairs one micro-batch's forward chunk
        with another's backward chunk: each chunk's expert dispatch/combine (and its pp sends) run while the other
        chunk computes, so per pair only what outlasts the partner's compute is exposed, and the hidden part
        slows that compute by the SMs the all-to-all holds (`_overlap_contention`, as for every overlapped
        collective). Warm-up and cool-down chunks run alone and expose their all-to-alls and sends
        (`dualpipe_pairs` counts the pairs). Idle time is the report's (PP/2-1)(F&B + B - 3W). The two copies of
        a stage reduce their gradients together: gradient synchronisation, ZeRO sharding and the optimizer see a
        data-parallel group of 2*dp, priced where its members sit: the dp replicas of rank r and those of rank
        pp-1-r, (pp-1-2r) stages apart (`_twin_starts`). The busiest rank sets the step (the pass times of its two
        stages, ties to the rank with fewest pairs, at the pipeline's ends). Memory, priced apart by `_memory`, is
        the fullest rank's own: its two stages' states and the chunks in flight through each
        (`memory.dualpipe_per_device`)."""
        stages, _, _, boundary = staged
        own = self._twin_devices(stages, plan.pp)
        devices = [self._straggling(plan, d) for d in own]  # at the slowest device's pace (engine.straggler)
        twin = _dualpipe_group(plan)
        share = recompute_share(plan, m)
        stolen = _ep_contention(self.hw, plan)

        t_p2p = self._p2p_time(plan, e, boundary)
        chunks = [_dualpipe_chunks(self.hw, twin, d, dtype, share, stolen) for d in devices]
        # the busiest rank at the plan's own micro-batch count (a grid of counts keeps that rank)
        rank = max(range(len(devices)), key=lambda r: (float(sum(_dualpipe_time(
            chunks[r], devices[r], plan.micro_batches, plan.pp, r, t_p2p)[:3])), -r))
        device, c = devices[rank], chunks[rank]
        busy, bubble, p2p, pairs, alone = _dualpipe_time(c, device, m, plan.pp, rank, t_p2p)
        acc, (hide_fwd, hide_bwd) = c.accumulate, c.hidden
        (fwd_p, bwd_p, dev_fwd_p, dev_bwd_p), (fwd_a, bwd_a, dev_fwd_a, dev_bwd_a) = c.paired, c.alone
        dp_total, dp_exposed = self._dp_over_stages(twin, own, own[rank], dtype, m / 2, _twin_starts(plan))
        heaviest = max(devices, key=lambda d: d.params)
        optimizer = self._update_time(plan, twin, dtype, heaviest.params, heaviest.expert_params)
        metric_sync = metric_sync_time(self.metrics, self.hw, plan, self.comm)
        compute = busy + bubble + p2p
        step, staleness = _consistency(plan, compute, dp_total, dp_exposed)
        host = pairs * ((fwd_p - dev_fwd_p) + (bwd_p - dev_bwd_p)) + alone * ((fwd_a - dev_fwd_a) + (bwd_a - dev_bwd_a))
        half = m / 2
        device = own[rank]  # the rank's stages at the median device's pace, as the breakdown files them
        breakdown = {
            "compute/forward": half * device.forward,
            "compute/backward": half * device.backward,
            "compute/recompute": half * device.recompute_kernels * share,
            "compute/grad_accumulation": half * acc,
            "compute/straggler": half * self._straggler_time(plan, device, share),
            "comm/tp": half * (device.tp_comm_fwd + device.tp_comm_bwd + share * device.tp_comm_rerun),
            "comm/ep": (pairs * (hide_fwd + hide_bwd) + alone * (device.ep_comm_fwd + device.ep_comm_bwd)) / 2
            + half * share * device.ep_comm_rerun,
            "comm/cp": half * (device.cp_comm_fwd + device.cp_comm_bwd + share * device.cp_comm_rerun),
            "overhead/host": host / 2,
            "comm/pp_p2p": p2p,
            "pipeline/bubble": bubble,
            "comm/dp_allreduce": step - compute if plan.consistency != "sync" else dp_exposed,
            "optimizer": optimizer,
            "overhead/metric_sync": metric_sync,
        }
        return step + optimizer + metric_sync, breakdown, device, staleness

    def _twin_devices(self, stages: list[StageCost], pp: int) -> list[StageCost]:
        """What DualPipe's rank r holds: stages r and pp-1-r, priced as one StageCost per pair of chunks (memoised
        with the stages they sum, so that the id()-keyed caches of _dp_time stay unique)."""
        key = tuple(id(s) for s in stages)
        if key not in self._twins:
            self._twins[key] = ([stages[r] + stages[pp - 1 - r] for r in range(pp // 2)], stages)
        return self._twins[key][0]

    def _update_time(self, plan: Plan, group: Plan, dtype: str, params: Any, expert_params: Any) -> Any:
        """The optimizer step over the fullest device's `params` (`expert_params` of them experts'), its states
        sharded over `group`'s replicas (the plan's, or DualPipe's doubled group): the update and, under an FP8
        recipe, the weights' FP8 casts, then what the plan's stack runs around it (TF1's update branch, an fp16
        optimizer wrapper)."""
        update = _optimizer_time_split(self.hw, group, params, expert_params, self._fp8_cast_bytes(params, plan, dtype),
                                       (loop_launches(self.model, plan), dtype))
        return update_step_time(self.model, self.hw, plan, dtype, params, update) \
            + fp16_wrappers.fp16_optimizer_time(self.model, self.hw, plan, params)

    def _fp8_cast_bytes(self, params: Any, plan: Plan, dtype: str) -> Any:
        """Bytes the per-step cast of `params` weights to their FP8 copies moves (0 outside an FP8 recipe): the
        copies the plan's fp8_weight_transpose keeps."""
        if not is_recipe(dtype):
            return 0
        return params * self.fp8_share * weight_cast_bytes(dtype, plan.fp8_weight_transpose)

    def _passes(self, plan: Plan, stage: StageCost, dtype: str, m: Any) -> Passes:
        """A stage's forward and backward pass per micro-batch (StageCost.passes) with what the plan adds: the
        expert all-to-all left exposed, the share of micro-batches recomputed, the gradient accumulation."""
        ep_fwd, ep_bwd = _ep_exposed(plan, stage, m)
        share = recompute_share(plan, m)
        sync = accumulation_sync_host(self.model, self.hw, plan) * stage.params / self.model.total_params
        accumulate = _grad_accumulation(self.hw, plan, stage.params, dtype, sync)
        t_fwd, t_bwd, device_fwd, device_bwd = self._straggling(plan, stage).passes(accumulate, (ep_fwd, ep_bwd),
                                                                                     share)
        wait_fwd, wait_bwd = offload.exposed(plan, self.hw, mem.blocks_in_stage(self.model, plan), stage.saved_blocks,
                                             t_fwd, t_bwd) if plan.offload_layers else (0.0, 0.0)
        return Passes(t_fwd + wait_fwd, t_bwd + wait_bwd, stage.recompute * share, accumulate, ep_fwd, ep_bwd,
                      (t_fwd - device_fwd) + (t_bwd - device_bwd), wait_fwd + wait_bwd)

    def _straggling(self, plan: Plan, stage: StageCost) -> StageCost:
        """The stage's kernels at the pace of the slowest of the plan's devices (dlperf.engine.straggler: every
        device synchronises every step), the collectives as they are."""
        slower = self._slower(plan)
        if slower == 0:
            return stage
        return stage.with_(forward=stage.forward * (1 + slower), backward=stage.backward * (1 + slower),
                           recompute=stage.recompute + slower * stage.recompute_kernels)

    def _straggler_time(self, plan: Plan, stage: StageCost, share: Any) -> Any:
        """Seconds per micro-batch by which `_straggling` lengthens the stage's kernels: the breakdown's
        compute/straggler beside the median device's compute/forward, backward and recompute."""
        return self._slower(plan) * (stage.forward + stage.backward + share * stage.recompute_kernels)

    def _slower(self, plan: Plan) -> float:
        """How much longer the slowest of the plan's devices takes than the median one (0 without a spread)."""
        return straggler_factor(self.hw.device.speed_spread, plan.devices) - 1.0

    def _tp_comm(self, tp: int) -> Any:
        """`_tp_comm_fn` for this tp, over `self.comm`, which memoises the collectives' times (`_PricedComm`)."""
        if tp not in self._tp_fns:
            self._tp_fns[tp] = _tp_comm_fn(self.comm, self.hw, tp)
        return self._tp_fns[tp]

    def _p2p_time(self, plan: Plan, e: int, boundary: Any) -> Any:
        key = (plan.tp, plan.pp, plan.data_parallel, plan.micro, e, boundary, plan.cp, plan.sequence_parallel)
        if key not in self._p2p:
            self._p2p[key] = _p2p_time(boundary, self.hw, plan, e, self.comm)
        return self._p2p[key]

    def _dp_over_stages(self, plan: Plan, stages: list[StageCost], slow: StageCost, dtype: str,
                        m: Any, twins: list[Twin] | None = None, memo: dict[tuple, Any] | None = None
                        ) -> tuple[Any, Any]:
        """(total, exposed) data-parallel communication of the step: every stage synchronises its own
        parameters with its own replicas at the same time, so the step waits for the slowest of them, which
        need not be the stage slowest to compute (a VGG's fully connected stage holds 99% of the parameters:
        pricing only the slowest-computing stage's made faster compute pick a different stage and a 480x
        larger allreduce, issue #15). Every stage hides its traffic behind the pipeline's pace, the slowest
        stage's passes, not its own: a faster stage waits for its neighbours while its collectives run (and
        pricing its own shorter passes let faster hardware expose more traffic than it saves). `twins` places
        each DualPipe rank's group (`_twin_starts`); `memo` is _combine's."""
        placed = {id(s): (s, t) for s, t in zip(stages, twins or [None] * len(stages), strict=True)}
        memo = {} if memo is None else memo
        for s, t in placed.values():
            if ("dp", id(s), id(slow), t) not in memo:
                memo[("dp", id(s), id(slow), t)] = _dp_with_micro_batches(
                    self._dp_time(plan, self._paced(s, slow), dtype, t), m)
        parts = [memo[("dp", id(s), id(slow), t)] for s, t in placed.values()]
        return mathx.maximum(*(t for t, _ in parts)), mathx.maximum(*(x for _, x in parts))

    def _paced(self, stage: StageCost, slow: StageCost) -> StageCost:
        """`stage` with the slowest stage's pass times (kept, so that the cache keys of _dp_time stay unique)."""
        if stage is slow:
            return stage
        key = (id(stage), id(slow))
        if key not in self._pace:
            self._pace[key] = (stage.with_(forward=slow.forward, backward=slow.backward, host_fwd=slow.host_fwd,
                                           host_bwd=slow.host_bwd, flow_fwd=slow.flow_fwd), stage, slow)
        return self._pace[key][0]

    def _dp_time(self, plan: Plan, slow: StageCost, dtype: str, twin: Twin = None) -> tuple[Any, Any, Any, Any]:
        key = (id(slow), plan.data_parallel, plan.tp, plan.zero, plan.pp, plan.overlap,
               plan.parameter_server, plan.compression, plan.grad_dtype, dtype, plan.fp8_param_gather, plan.cp,
               plan.ep, plan.expert_tp, plan.zero_impl, plan.dp_impl, twin,
               # only Megatron's overlapped parameter gather reads the schedule (_megatron_param_gather); keying
               # every plan on it would reprice the same communication for each schedule a search tries
               (plan.schedule, plan.virtual_stages) if plan.zero_impl == "megatron" else None)
        if key not in self._dp:
            if plan.zero == 3 and plan.zero_impl == "deepspeed-0.3":
                self._dp[key] = _deepspeed_zero3(self.hw, plan, slow, dtype, self.comm,
                                                 zero_impl.tensors(self.model, plan), twin)
            else:
                root = mem.root_unit_params(self.model, plan) if plan.zero_impl == "fsdp" else 0.0
                self._dp[key] = _grad_sync(self.hw, plan, slow, dtype, self.comm,
                                           mem.gather_units(self.model, plan), twin, root)
        return self._dp[key]

    def predict(self, plan: Plan) -> Prediction:
        return self.prediction(self.timeline(plan))

    def prediction(self, t: Timeline) -> Prediction:
        """The Prediction of a priced Timeline (timeline, or fitting_timeline's when the plan fits)."""
        plan = t.plan
        model_flops, hardware_flops, matrix_flops = step_flops(self.model, plan, element_bytes(t.dtype))
        per_device = t.step_time_s * plan.devices * 1e12
        fits = bool(t.memory["total"] <= self.hw.device.memory)
        return Prediction(
            step_time_s=t.step_time_s,
            throughput_samples_per_s=t.throughput(),
            model_tflops_per_device=model_flops / per_device,
            hardware_tflops_per_device=hardware_flops / per_device,
            matrix_tflops_per_device=matrix_flops / per_device,
            mfu=model_flops / t.step_time_s / (self.hw.device.peak(t.dtype) * plan.devices),
            breakdown_s=t.breakdown_s,
            memory=t.memory,
            memory_bytes_per_device=t.memory["total"],
            fits=fits,
            work_flops=model_flops + _optimizer_flops(self.model, plan),
            depth=float(model_cost(self.model, plan.micro, t.dtype).total_depth),
            plan=plan.to_dict() | {"dtype": t.dtype},
            staleness=t.staleness,
            # a DualPipe rank's StageCost holds two chunks (one through each of its stages) per pair of micro-batches
            per_type_s={k: plan.micro_batches / (2 if plan.schedule == "dualpipe" else 1) * x
                        for k, x in t.slow.per_type.items()},
            notes=([] if fits else [memory_note(t.memory, self.hw)]) + host_note(t.breakdown_s, t.step_time_s, self.hw)
            + input_note(plan, self.hw, t.breakdown_s, t.step_time_s) + cudnn_note(plan, self.hw),
        )


def _dualpipe_group(plan: Plan) -> Plan:
    """The plan as DualPipe's gradient synchronisation, ZeRO sharding and optimizer see it: the two copies of a
    stage (on ranks r and pp-1-r) reduce together, a data-parallel group of 2*dp."""
    return plan.with_(dp=2 * plan.data_parallel)


class DualPipeChunks(NamedTuple):
    """A DualPipe rank's two chunks (one micro-batch through each of its stages), in seconds."""

    paired: tuple[Any, Any, Any, Any]   # StageCost.passes with each all-to-all hidden behind the partner chunk
    alone: tuple[Any, Any, Any, Any]    # ... with every all-to-all exposed (warm-up and cool-down)
    hidden: tuple[Any, Any]             # the all-to-all left of a paired forward / backward chunk
    accumulate: Any


def _dualpipe_chunks(hw: Hardware, twin: Plan, device: StageCost, dtype: str, share: Any,
                     stolen: float) -> DualPipeChunks:
    """A forward chunk's all-to-alls run beside the partner's backward compute and the other way round: what
    outlasts it is exposed, and the part it hides slows that compute by the SMs the all-to-all holds."""
    acc = _grad_accumulation(hw, twin, device.params, dtype)
    hide_fwd = mathx.maximum(device.ep_comm_fwd - device.backward, 0.0) + stolen * mathx.minimum(
        device.ep_comm_fwd, device.backward)
    hide_bwd = mathx.maximum(device.ep_comm_bwd - device.forward, 0.0) + stolen * mathx.minimum(
        device.ep_comm_bwd, device.forward)
    return DualPipeChunks(device.passes(acc, (hide_fwd, hide_bwd), share), device.passes(acc, None, share),
                          (hide_fwd, hide_bwd), acc)


def _dualpipe_time(c: DualPipeChunks, device: StageCost, m: Any, pp: int, rank: int,
                   t_p2p: Any) -> tuple[Any, Any, Any, Any, Any]:
    """(busy, bubble, exposed pp sends, paired chunks, lone chunks) of rank `rank` over m micro-batches: its
    paired chunks at the overlapped pace, the rest alone, and the report's bubble with F&B the paired pace, B a
    lone backward chunk and W its weight-gradient part (each StageCost holds two chunks, hence the halves)."""
    pairs = dualpipe_pairs(m, pp, rank)
    alone = m - pairs
    paired_pace, alone_pace = c.paired[0] + c.paired[1], c.alone[0] + c.alone[1]
    busy = (pairs * paired_pace + alone * alone_pace) / 2
    bubble = dualpipe_bubble(paired_pace / 2, c.alone[1] / 2, device.backward_weight / 2, pp)
    return busy, bubble, 2 * alone * t_p2p, pairs, alone  # a paired chunk's sends hide behind its partner


HOST_NOTE_SHARE = 0.10  # the host's share of the step from which the prediction says it is host-bound


def cudnn_note(plan: Plan, hw: Hardware) -> list[str]:
    """Which measured fused-attention curve a plan's cuDNN version was priced at (Device.for_cudnn)."""
    curves = hw.device.cudnn_curves
    if plan.cudnn is None:
        return []
    if not curves:
        return [f"cudnn {plan.cudnn}: {hw.name} measures fused attention at one cuDNN version (no "
                f"efficiency.attention_fa3.by_cudnn), so its own curve prices it"]
    measured = hw.device.for_cudnn(plan.cudnn).cudnn
    versions = ", ".join(text for _, text, _ in curves)
    if cudnn_version(plan.cudnn)[:3] < curves[0][0]:  # older than every measured one: for_cudnn took the oldest
        return [f"cudnn {plan.cudnn}: older than every cuDNN {hw.name} measures fused attention at ({versions}); "
                f"priced at the oldest, {measured}: cuDNN's attention got faster release by release, so a lower bound "
                f"on its time"]
    return [f"cudnn {plan.cudnn}: fused attention priced at the curve measured with cuDNN {measured} (measured: "
            f"{versions})"]


def host_note(breakdown: dict[str, Any], step: float, hw: Hardware) -> list[str]:
    """A host-bound step depends on the CPU as much as on the GPU: say which CPU it was priced for."""
    share = float(breakdown.get("overhead/host", 0.0)) / step if step > 0 else 0.0
    if share < HOST_NOTE_SHARE:
        return []
    cpu = hw.device.host_label
    return [f"host-bound: {share:.0%} of the step waits for the CPU to issue kernels, priced for {cpu}; "
            f"`dlperf calibrate --device cuda` measures your host"]


def memory_note(memory: dict[str, Any], hw: Hardware) -> str:
    """Why a plan does not fit: what it needs per device against what the device has."""
    from dlperf.units import format_quantity as q

    need, have, reserve = float(memory["total"]), hw.device.memory, float(memory["reserved"])
    return (f"DOES NOT FIT: needs {q(need, 'bytes')} per device (runtime reserve {q(reserve, 'bytes')} included), the "
            f"{hw.device.name} has {q(have, 'bytes')} ({q(need - have, 'bytes')} over)")


# Weights of the hardware-independent balancing family (see StepModel._balanced): a unit's FLOPs plus its bytes
# moved times a FLOP-per-byte ratio, on a geometric grid from 1 to 1024 that brackets machine balances (peak
# FLOP/s over memory bandwidth from the datasheets: P40 fp32 ~35, P100 fp16 ~29, V100 fp16 ~139, A100 fp16 ~153,
# H100 fp16 ~295 FLOP/B), and a few that add the unit's parameters times FLOPs per parameter, so that stages
# also balance the gradient traffic data parallelism sends.
BALANCE_WEIGHTS = ((0.0, 0.0), *((float(2**k), 0.0) for k in range(11)),
                   *((r, p) for r in (16.0, 128.0) for p in (1e4, 1e6)))


def _unit_work(unit: Any, micro: int, e: int) -> tuple[float, float, float]:
    """(forward+backward FLOPs, bytes moved, parameters) of one pipeline unit for a micro-batch."""
    from dlperf.ops import OPS
    from dlperf.spec.model import walk

    flops = moved = params = 0.0
    for layer, count in walk(unit, 1):
        for kernel in OPS[layer.op].kernels(layer, micro, e):
            flops += count * float(kernel.cost.work)
            moved += count * float(kernel.cost.fwd_bytes + kernel.cost.bwd_bytes)
        params += count * float(layer.params)
    return flops, moved, params


def _head_start(items: list[Any]) -> int:
    """Index of the first top-level item after the last one that contains a convolution."""
    from dlperf.spec.model import walk

    last = max((i for i, item in enumerate(items) if any(layer.op == "conv2d" for layer, _ in walk(item, 1))),
               default=-1)
    return last + 1


def recompute_share(plan: Plan, m: Any = None) -> Any:
    """Fraction of micro-batches whose forward pass is rerun: all, or all but the last for torchgpipe's
    checkpoint='except_last' (Kim et al. 2020, torchgpipe, section 3.2.2)."""
    m = plan.micro_batches if m is None else m
    return (m - 1) / m if plan.recompute == "except_last" else 1.0


def predict(model: Model, hw: Hardware, plan: Plan) -> Prediction:
    """Predict one training step of `model` on `hw` under `plan` (see dlperf.plan.Plan)."""
    return StepModel(model, hw).predict(plan)


def _heads(model: Model) -> int | None:
    """The largest tp that divides every attention layer's head count and every Mamba-2 layer's groups (their gcd)."""
    import math

    heads = [layer["heads"] for layer, _ in model.counted() if layer.op in ("attention", "mla")]
    # Megatron's MambaMixer splits heads and groups (mamba_mixer.py @d98e8a64 :262-271)
    heads += [math.gcd(layer["heads"], layer["groups"]) for layer, _ in model.counted() if layer.op == "mamba2"]
    return math.gcd(*heads) if heads and all(isinstance(h, int) for h in heads) else None


def _comm() -> Any:
    import dlperf.comm as comm

    return comm


class _PricedComm:
    """dlperf.comm for one StepModel, with `collective_time` memoised on exactly its arguments when the size is a
    plain number and the hardware is the model's own: search prices the same collectives (same op, bytes and
    group) for many plans. Anything else (sympy or numpy sizes, other hardware) is priced afresh."""

    def __init__(self, comm: Any, hw: Hardware) -> None:
        self._comm, self._hw = comm, hw
        self._times: dict[tuple, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def collective_time(self, op: str, nbytes: Any, group: Any, hw: Hardware, *args: Any) -> Any:
        if hw is not self._hw or type(nbytes) not in (int, float):
            return self._comm.collective_time(op, nbytes, group, hw, *args)
        key = (op, type(nbytes), nbytes, group, args)
        if key not in self._times:
            self._times[key] = self._comm.collective_time(op, nbytes, group, hw, *args)
        return self._times[key]


def _tp_comm_fn(comm: Any, hw: Hardware, tp: int) -> Any:
    """A tensor-parallel collective as the step runs it: NCCL's time, whose per-call overhead (fitted to
    nccl-tests tables, dlperf.comm.nccl.CALL_OVERHEAD) includes the launch of its kernel."""
    group = comm.Group(tp, 1)
    return lambda op, nbytes: comm.collective_time(op, nbytes, group, hw)


def _overlap_contention(hw: Hardware, span: int) -> float:
    """Fraction of the compute rate a collective spanning `span` consecutive devices takes while it overlaps
    compute: its NCCL channels (one SM each, NVIDIA/nccl#689) of the device's SMs, at the outermost level it
    crosses. Compute-bound kernels slow down in proportion; the hidden time is charged that fraction."""
    return _contention_at(hw, _level_for_stride(hw, max(span - 1, 1)))


def _contention_at(hw: Hardware, level: int) -> float:
    """`_overlap_contention` of a collective whose outermost level is `level`."""
    if hw.device.sms is None:
        return 0.0
    return min((hw.network[level].channels or DEFAULT_CHANNELS) / hw.device.sms, 1.0)


def _twin_starts(plan: Plan) -> list[Twin]:
    """For each DualPipe rank r < pp/2, the first devices of pipeline ranks r and pp-1-r. Ranks are laid out as
    Megatron-Core orders them (tp innermost, then cp, then dp, pp outermost: see `_parallel` and `_p2p_time`), so
    pipeline rank r's replicas start at r*tp*cp*dp and the two halves of its twin group lie (pp-1-2r) such
    blocks apart: across nodes whenever those blocks leave a node, however small 2*tp*cp*dp is."""
    block = plan.tp * plan.cp * plan.data_parallel
    return [(r * block, (plan.pp - 1 - r) * block, block) for r in range(plan.pp // 2)]


def _replicas(comm: Any, hw: Hardware, plan: Plan, twin: Twin) -> tuple[Any, float]:
    """(the group a stage's gradients are reduced over, the share of the SMs it takes while overlapped): dp
    ranks tp apart (the tp field is the stride, see `_expert_group`), or under DualPipe (`twin`) the dp/2
    replicas at each of the two pipeline ranks that hold the stage, placed where they sit. Each half spreads
    evenly over its pipeline rank's devices: the dense group's dp*cp ranks tp apart, the experts' edp ranks
    expert-tp*ep apart (Megatron-Core's expert ranks fold cp into dp, order tp-ep-dp-pp:
    megatron/core/parallel_state.py, expert_decoder_rank_generator with cp=1), as `_expert_group` places them."""
    if twin is None:
        return comm.Group(plan.data_parallel, plan.tp), _overlap_contention(hw, plan.tp * plan.data_parallel)
    first, second, block = twin
    half = plan.data_parallel // 2
    group = comm.twin_group(half, block // half, first, second)
    return group, _contention_at(hw, comm.place_group(group, hw).outer_level())


def _ep_contention(hw: Hardware, plan: Plan) -> float:
    """As `_overlap_contention` for the expert all-to-alls: NCCL's channels, or the SMs DeepEP or HybridEP holds
    (context.DISPATCHER_SMS)."""
    if plan.ep_dispatcher in DISPATCHER_SMS and hw.device.sms is not None:
        return min(DISPATCHER_SMS[plan.ep_dispatcher] / hw.device.sms, 1.0)
    return _overlap_contention(hw, plan.expert_tp * plan.ep)  # the ep group's span (`_parallel`)


def _level_for_stride(hw: Hardware, stride: int) -> int:
    """Index of the innermost network level whose domains contain ranks `stride` apart."""
    for index, level in enumerate(hw.network):
        if level.size is None or stride < level.size:
            return index
    return len(hw.network) - 1


def _p2p_route(hw: Hardware, plan: Plan) -> tuple[int, int]:
    """(network level, devices of a node sending at once) of the slowest stage boundary (`_p2p_time`)."""
    stride = plan.tp * plan.data_parallel * plan.cp
    node = hw.network[0].size or 1
    if stride < node < stride * plan.pp:
        return _level_for_stride(hw, node), stride
    level = _level_for_stride(hw, stride)
    return level, (node if level > 0 else 1)


def _p2p_contention(hw: Hardware, plan: Plan) -> float | None:
    """The share of the SMs a hidden pipeline send/recv holds (`_contention_at` of the level it crosses: NCCL's
    send/recv kernels run on its channels, one SM each), or None when the plan's sends block (no p2p_overlap)."""
    return _contention_at(hw, _p2p_route(hw, plan)[0]) if plan.p2p_overlap else None


def _p2p_time(boundary: Any, hw: Hardware, plan: Plan, e: int, comm: Any) -> float:
    """One stage-boundary transfer of a micro-batch's activations. With tp > 1, Megatron's scatter/gather
    optimisation sends 1/tp of it across the boundary and allgathers it inside the node (Narayanan 2021, 4.1).
    Under sequence parallelism each tp rank already holds its 1/tp of the sequence, sends it and nothing is
    gathered: Megatron-LM sends [s/tp, b, h] and scatter-gathers only `not args.sequence_parallel`
    (megatron/p2p_communication.py, 2022, with Korthikanti et al.'s sequence parallelism; Megatron-Core's
    p2p_communication.py sends the same slice and has no gather).
    A stage spans tp x dp x cp consecutive devices, so when its boundary leaves the node every device of the node
    sends at once (all tp ranks and dp replicas of the stage run the same schedule): they share the node's
    links of that level (`links_per_domain`), as the context-parallel sends do. Stages smaller than a node
    leave it at every node's last stage: that boundary, its stage's devices sending at once, sets the pace."""
    if plan.pp == 1:
        return 0.0
    nbytes = e * plan.micro * boundary / plan.cp if plan.cp > 1 else e * plan.micro * boundary
    level, crossing = _p2p_route(hw, plan)
    t = comm.p2p_time(nbytes / plan.tp, hw, level, crossing)
    if plan.tp > 1 and not plan.sequence_parallel:
        t += comm.collective_time("allgather", nbytes, comm.Group(plan.tp, 1), hw)
    return t


def _dp_comm(hw: Hardware, plan: Plan, slow: StageCost, dtype: str, comm: Any,
             units: int = 1, twin: Twin = None, root: Any = 0.0) -> tuple[Any, Any, Any, Any]:
    """Gradient synchronisation across dp replicas: (total, exposed) seconds per step, plus the (total,
    exposed) that recur for every micro-batch, so that `_dp_with_micro_batches` scales them by m.

    Plain data parallelism allreduces the gradients once per step, in DDP buckets overlapped with the last
    micro-batch's backward pass (Li et al. 2020): only what outlasts that backward pass, and at least the last
    bucket, is exposed. ZeRO-1 reduce-scatters the gradients the same way, then allgathers the updated parameter
    shards: after the optimizer step, where nothing hides it (DeepSpeed), or, with zero_impl megatron and overlap,
    bucket by bucket behind the next step's forward (`_megatron_param_gather`). ZeRO-2 keeps only gradient shards,
    so it reduce-scatters in every micro-batch's backward pass; overlapped with zero_impl fsdp it is FSDP's
    SHARD_GRAD_OP, which also gathers per block in every forward (`_zero3_per_micro`, backward_gathers=False).
    ZeRO-3 also allgathers each layer's parameters before
    its forward and its backward pass, for every micro-batch (Rajbhandari et al. 2020, sections 5 and 7), one
    gather unit (a repeated block) at a time: see `_zero3_per_micro`. Megatron-LM issues the reduction after the
    pipeline flush, so with pp > 1 it is exposed unless overlap is forced. The survey's sharded parameter server
    and compressed allreduce replace the allreduce when the plan asks for them; so does Horovod's background thread
    (plan.dp_impl, dlperf.engine.horovod: its negotiation cycle, fusion buffers and TensorFlow-side casts).

    Reductions move gradients in the plan's grad_dtype; gathers move weights in the compute dtype's storage type
    whatever the gradients' (FSDP's MixedPrecision: param_dtype for all-gathers, reduce_dtype for
    reduce-scatters; composer's 'DEFAULT' is bf16 / fp32, composer/trainer/mosaic_fsdp_utils.py
    get_mixed_precision @1c9d8d17 = v0.16.4).
    """
    dp = plan.data_parallel
    params = slow.dp_params
    if dp == 1 or not params:
        return 0.0, 0.0, 0.0, 0.0
    weight_bytes = params * element_bytes(_weight_dtype(dtype))
    grad_bytes = params * element_bytes(_grad_dtype(plan, dtype))
    group, stolen = _replicas(comm, hw, plan, twin)
    overlap = plan.overlap if plan.overlap is not None else plan.pp == 1
    window = slow.backward_window  # a host-bound backward pass lasts longer, and hides more

    def hidden_behind(t: Any, window: Any, floor: Any) -> Any:
        """What of t outlasts `window`, but never less than the last bucket's share (nor more than t); the part
        hidden behind compute still slows that compute by the SMs the collective holds."""
        if not overlap:
            return t
        exposed = max(t - window, min(floor, t))
        return exposed + stolen * (t - exposed)

    if plan.dp_impl == "horovod-0.19":
        # overlapped, what is exposed is at least the last fusion buffer (and the cycle it waits for)
        g = element_bytes(_grad_dtype(plan, dtype))
        total = horovod.allreduce_time(comm, hw, group, params, g, plan.compression)
        buffer = mathx.minimum(params, horovod.buffer_params(g, plan.compression))
        last = horovod.allreduce_time(comm, hw, group, buffer, g, plan.compression)
        return total, hidden_behind(total, window, last), 0.0, 0.0
    if plan.dp_impl == "post-backward":  # after the backward pass, with its copies: all exposed
        total = comm.collective_time("allreduce", grad_bytes, group, hw) + post_backward.copies_time(hw, grad_bytes)
        return total, total, 0.0, 0.0
    last_bucket = comm.collective_time("allreduce", min(DDP_BUCKET_BYTES, grad_bytes), group, hw)
    if plan.parameter_server:
        total = comm.collective_time("allreduce", grad_bytes, group, hw, f"ps:{plan.parameter_server}")
        return total, hidden_behind(total, window, last_bucket), 0.0, 0.0
    if plan.compression != "none":
        total = comm.compressed_allreduce_time(params, grad_bytes / params, plan.compression, group,
                                               hw)[0]
        return total, hidden_behind(total, window, last_bucket), 0.0, 0.0
    if plan.zero == 0:
        total = comm.collective_time("allreduce", grad_bytes, group, hw)
        return total, hidden_behind(total, window, last_bucket), 0.0, 0.0
    # FSDP's root unit (`root` parameters outside the wrapped blocks, `_zero3_per_micro`), at most all of them
    root_share = mathx.minimum(root / params, 1.0) if not mathx.is_zero(root) else 0.0
    roots = (weight_bytes * root_share, grad_bytes * root_share)
    if plan.zero == 3:
        return (0.0, 0.0) + _zero3_per_micro(comm, hw, group, weight_bytes, grad_bytes, units, slow.forward_window,
                                             window, overlap, stolen, root=roots)
    if plan.zero == 2 and overlap and plan.zero_impl == "fsdp":
        # FSDP's SHARD_GRAD_OP: per-block gathers in every micro-batch's forward, none in its backward
        return (0.0, 0.0) + _zero3_per_micro(comm, hw, group, weight_bytes, grad_bytes, units, slow.forward_window,
                                             window, overlap, stolen, backward_gathers=False, root=roots)
    reduce = comm.collective_time("reduce_scatter", grad_bytes, group, hw)
    # FP8 parameter all-gather (Megatron-LM --fp8-param-gather; torchtitan/FSDP2 enable_fsdp_float8_all_gather):
    # the sharded parameters travel as their FP8 casts, one byte each (MXFP8: in bf16, param_gather_bytes)
    gather_bytes = _fp8_gather_bytes(slow, params, dtype) if plan.fp8_param_gather else weight_bytes
    gather = comm.collective_time("allgather", gather_bytes, group, hw)
    if plan.zero == 1 and overlap and plan.zero_impl == "megatron":
        exposed = _megatron_param_gather(comm, hw, plan, group, params, gather_bytes, slow.forward_window, stolen)
        return reduce + gather, hidden_behind(reduce, window, last_bucket) + exposed, 0.0, 0.0
    if plan.zero == 1:  # DeepSpeed ZeRO-1 gathers after the step, synchronously (stage_1_and_2.py @38327e07:1930)
        return reduce + gather, hidden_behind(reduce, window, last_bucket) + gather, 0.0, 0.0
    # ZeRO-2: gradients are kept as shards, so every micro-batch's backward reduce-scatters them
    return gather, gather, reduce, hidden_behind(reduce, window, last_bucket)


# Megatron-Bridge's data-parallel bucket, in parameters: 128 Mi whenever dp > 1 (src/megatron/bridge/training/
# comm_overlap.py @0a25f911:611-612, _get_optimizer_overlap_cfgs). Megatron-LM's own default is max(40M, 1M x dp)
# (megatron/training/training.py @3758b54b:1476-1479); the rows that use zero_impl megatron are Megatron-Bridge's.
MEGATRON_BUCKET_PARAMS = 128 * 1024 * 1024


def _megatron_param_gather(comm: Any, hw: Hardware, plan: Plan, group: Any, params: Any, gather_bytes: Any,
                           forward: Any, stolen: float) -> Any:
    """Exposed seconds per step of Megatron-Core's distributed-optimizer parameter all-gather with
    overlap_param_gather (NVIDIA/Megatron-LM @3758b54b; the same at @92c8482e). The optimizer step leaves the
    gather to the next iteration (optimizer/distrib_optimizer.py:2627-2631); forward pre-hooks wait for each
    bucket as its first module runs (distributed/distributed_data_parallel.py:388-422). Buckets hold the
    parameters in reverse order, the first layers in the last bucket (param_and_grad_buffer.py:908-909).

    - Without interleaving (align_param_gather is off: training/arguments.py:845 and Megatron-Bridge's
      comm_overlap.py @0a25f911:616-618), the first forward's pre-hook dispatches the first bucket and waits
      for it, and each completed bucket dispatches the next (param_and_grad_buffer.py:449-467): one bucket
      exposed, each later one hidden behind the previous bucket's share of the first micro-batch's forward
      (`_pipelined`). With pp > 1 every stage starts that when its first micro-batch arrives, so the waits add
      up along the pipeline's fill: pp times.
    - Interleaved (align_param_gather on): every stage dispatches all of its first model chunk's buckets at the
      start of the step, and the second chunk's (pipeline_parallel/schedules.py:1085-1087); each later chunk a
      pipeline's worth of micro-batches before it runs (schedules.py:1207-1219; chunks after the first are one
      bucket each, training.py:1498). The first stage's first forward waits for its first layers' bucket,
      dispatched last: the whole first chunk is exposed; the rest hides behind compute (other stages' first
      chunks behind the fill). Hidden gathers slow the compute by the SMs they hold (`stolen`).
    """
    gather = comm.collective_time("allgather", gather_bytes, group, hw)
    if plan.schedule == "interleaved":
        first_chunk = comm.collective_time("allgather", gather_bytes / plan.virtual_stages, group, hw)
        return first_chunk + stolen * mathx.maximum(gather - first_chunk, 0.0)
    buckets = max(math.ceil(params / MEGATRON_BUCKET_PARAMS), 1)
    bucket = comm.collective_time("allgather", gather_bytes / buckets, group, hw)
    return plan.pp * _pipelined(bucket, forward / buckets, buckets, 0.0, stolen)


def _fp8_gather_bytes(slow: StageCost, params: Any, dtype: str) -> Any:
    """Bytes the FP8 parameter all-gather moves for `params` of the stage: param_gather_bytes each, but the stage's
    share of parameters a `precision: bf16` block keeps out of the recipe (its bf16_params) in bf16, as
    Megatron-Core gathers a parameter with no FP8 copy in its own dtype (that share taken alike by the dense and
    the expert group)."""
    if mathx.is_zero(slow.bf16_params):
        return params * param_gather_bytes(dtype)
    kept = params * slow.bf16_params / slow.params
    return (params - kept) * param_gather_bytes(dtype) + kept * element_bytes("bf16")


def _zero3_per_micro(comm: Any, hw: Hardware, group: Any, weight_bytes: float, grad_bytes: float, units: int,
                     forward: Any, backward: Any, overlap: bool, stolen: float = 0.0,
                     backward_gathers: bool = True, root: tuple[Any, Any] = (0.0, 0.0)) -> tuple[Any, Any]:
    """(total, exposed) ZeRO-3 communication of one micro-batch: what limits hiding the parameter gathers.
    `backward_gathers` False prices PyTorch FSDP's SHARD_GRAD_OP (ZeRO-2) instead: it gathers per block in the
    forward as FULL_SHARD does, keeps the gathered blocks through the backward (_post_forward_reshard frees only
    RESHARD_AFTER_FORWARD strategies) and frees them after it when gradients sync (_should_free_in_backward;
    torch/distributed/fsdp/_runtime_utils.py, PyTorch 2.13: lines 486-499, 811-827), which composer does every
    micro-batch (an FSDP module is no DistributedDataParallel, so no no_sync: composer/trainer/trainer.py
    @v0.16.4:2377): every micro-batch gathers again. limit_all_gathers waits only on freed blocks' events
    (_unshard, _reshard: lines 297-303, 320-327), which its forward never records.

    - Granularity: parameters are gathered one unit at a time (FSDP wraps each transformer block; Zhao et al.
      2023, "PyTorch FSDP", VLDB, section 3.2), so each of the L units gathers weight_bytes/L and reduce-scatters
      grad_bytes/L (the two differ under a reduce dtype wider than the weights'), each collective with its own
      latency term: over hundreds of ranks a ring's (p-1) steps of latency recur L times per pass
      (Rajbhandari et al. 2021, ZeRO-Infinity, section 6.2 sizes its bandwidth-centric partitioning around
      exactly this).
    - Prefetch: unit i's gather can overlap only the compute of the units before it. With a serial link and a
      serial compute stream of uniform units, the first gather is always exposed and each later one hides
      behind one unit's compute: exposed = g + (L-1) max(g - c, 0), which is also what any deeper prefetch
      reaches (the link is busy back to back once g > c), so FSDP's one-unit-ahead prefetch (Zhao et al.
      2023, section 3.3.2, backward and forward prefetching) loses nothing against it for uniform blocks.
    - Backward: unit i's gather and unit i+1's gradient reduce-scatter share the links; the last
      reduce-scatter has no compute after it.
    - Root unit (`root`: the weight and gradient bytes of the parameters outside the wrapped blocks,
      memory.root_unit_params; zero_impl fsdp only): the L units are the blocks alone, and the root is its own
      unit. Read from torch FSDP's runtime (torch/distributed/fsdp/_runtime_utils.py; torch v2.1.0 is not in the
      stored corpus, the same logic is in its 2.0 line, pytorch/pytorch@00ae0bc9, and its 2.2 line):
      `_root_pre_forward` makes the unshard stream wait for the computation stream, so the root's gather opens
      the forward with nothing to hide behind; `_post_forward_reshard` frees "not state._is_root" units only, so
      the backward never gathers the root again; its reduce-scatter is issued when its FlatParameter's gradient
      is complete, after the embedding's backward at the end of the pass, and `_post_backward_final_callback`
      makes the computation stream wait for the post-backward stream: exposed. (composer's FSDP defaults, read
      at v0.16.4 and v0.17.2, composer/trainer/dist_strategy.py:135-148: backward_prefetch BACKWARD_POST,
      forward_prefetch False; llm-foundry's benchmark yamls set limit_all_gathers. The first block's backward
      gather, issued at its pre-backward hook behind the tied head's backward, is still priced exposed.)
    - Contention: while a gather overlaps compute, its NCCL channels hold SMs (`stolen`, the fraction
      `_overlap_contention` gives), charged on the overlapped part as for every other hidden collective.

    Sanity check, never a fit: Narayanan et al. 2021 (Table 2 and section 5.4) measured ZeRO-3 at 768-2240 A100s
    3-5x slower than a bandwidth bound would suggest."""
    L = max(int(units), 1)
    root_weight, root_grad = root
    g = comm.collective_time("allgather", (weight_bytes - root_weight) / L, group, hw)
    r = comm.collective_time("reduce_scatter", (grad_bytes - root_grad) / L, group, hw)
    g_back = g if backward_gathers else 0.0
    ends = 0.0  # the root unit's gather and reduce-scatter, once per micro-batch, both exposed
    if not mathx.is_zero(root_weight):
        ends = (comm.collective_time("allgather", root_weight, group, hw)
                + comm.collective_time("reduce_scatter", root_grad, group, hw))
    total = L * (g + g_back + r) + ends
    if not overlap:
        return total, total
    return total, (ends + _pipelined(g, forward / L, L, 0.0, stolen)
                   + _pipelined(g_back + r, backward / L, L, r, stolen))


def _deepspeed_zero3(hw: Hardware, plan: Plan, slow: StageCost, dtype: str, comm: Any,
                     tensors: zero_impl.Tensors, twin: Twin = None) -> tuple[Any, Any, Any, Any]:
    """`_dp_comm` for ZeRO-3 as DeepSpeed v0.3 runs it (dlperf.engine.zero_impl): the gathers and the gradient
    allreduce recur per micro-batch, the optimizer step's re-gather of the persistent tensors once per step."""
    dp = plan.data_parallel
    if dp == 1 or not slow.dp_params:
        return 0.0, 0.0, 0.0, 0.0
    weight = element_bytes(_weight_dtype(dtype))
    grad = element_bytes(_grad_dtype(plan, dtype))
    group, stolen = _replicas(comm, hw, plan, twin)
    micro = zero_impl.per_micro(comm, hw, plan, group, weight, grad, tensors, slow.forward_window, slow.recompute,
                                slow.backward_window, stolen)
    # once per step, the optimizer step's re-gather of the persistent tensors; every later micro-batch of the
    # step gathers them again one by one: m - 1 times, i.e. once per micro-batch less once per step (so that
    # the per-step and per-micro-batch parts hold for any micro-batch count, as grid() scales them)
    again = zero_impl.persistent_gathers(comm, hw, group, weight, tensors)
    step = zero_impl.post_step(comm, hw, group, weight, tensors) - again
    total, exposed = micro
    return (step, step, total + again, exposed + again)


def _pipelined(comm_unit: Any, compute_unit: Any, units: int, tail: Any, stolen: float) -> Any:
    """Exposed time of `units` transfers each hidden behind the previous unit's compute (see _zero3_per_micro),
    plus the overlapped compute's slowdown from sharing the device, plus a `tail` that nothing follows."""
    first = comm_unit - tail if tail else comm_unit  # the backward's first unit gathers, it has not reduced yet
    later = (units - 1) * hidden_transfer(comm_unit, compute_unit, stolen)
    return first + later + tail


def _grad_sync(hw: Hardware, plan: Plan, slow: StageCost, dtype: str, comm: Any,
               units: Any, twin: Twin = None, root: Any = 0.0) -> tuple[Any, Any, Any, Any]:
    """Gradient synchronisation with context and expert parallelism (Megatron-Core's groups): context-parallel
    ranks hold the same weights, so dense gradients are reduced (and ZeRO-sharded) over dp*cp ranks, tp apart;
    the routed experts' gradients over the expert-data-parallel group, dp*cp/ep ranks tp*ep apart, in the
    backward time the dense reduction leaves. Without either it is `_dp_comm` unchanged. Under DualPipe each
    group has its replicas at two pipeline ranks (`twin`), half of them at each."""
    if plan.cp == 1 and mathx.is_zero(slow.expert_params):
        return _dp_comm(hw, plan, slow, dtype, comm, units, twin, root)
    dense = slow.with_(synced_params=slow.dp_params - slow.expert_params)
    parts = _dp_comm(hw, _dense_group(plan), dense, dtype, comm, units, twin, root)
    if mathx.is_zero(slow.expert_params):
        return parts
    window = mathx.maximum(slow.backward_window - parts[0] - parts[2], 0.0)
    experts = slow.with_(synced_params=slow.expert_params, backward=window, host_bwd=0.0)
    more = _dp_comm(hw, _expert_group(plan), experts, dtype, comm, units, twin)
    return tuple(a + b for a, b in zip(parts, more, strict=True))


def _dense_group(plan: Plan) -> Plan:
    """The plan as its dense gradients see it: dp*cp replicas, tp apart."""
    return plan.with_(dp=plan.data_parallel * plan.cp, cp=1, ep=1, etp=None)


def _expert_group(plan: Plan) -> Plan:
    """The plan as the experts' gradients see it: edp = dp*cp/ep replicas (tp*dp*cp/(ep*expert tp) with the
    experts folded: Plan.expert_data_parallel), expert-tp*ep apart (the stride is the tp field of a plan that only
    prices the reduction). Megatron-Core builds the expert groups from their own rank generator, cp folded into the
    expert data parallelism (`_parallel`), so the replicas of one expert shard lie expert-tp*ep apart and span the
    stage's tp*cp*dp devices; tp*cp*ep ran cp times past them when cp > 1. Expert gradients are reduced over that
    group (distributed_data_parallel.py @92c8482e:582-585: `expt_dp_group` for parameters without `allreduce`)."""
    return plan.with_(dp=plan.expert_data_parallel, tp=plan.expert_tp * plan.ep, cp=1, ep=1, etp=None)


def _optimizer_time_split(hw: Hardware, plan: Plan, params: Any, expert_params: Any, fp8_cast: Any = 0,
                          loop: Loop = (0.0, "")) -> Any:
    """The update of dense parameters sharded over dp*cp and of expert parameters over edp (ZeRO >= 1); the
    FP8 weight casts (`fp8_cast` bytes moved) ride with the dense update; `loop` as in _optimizer_time."""
    if plan.cp == 1 and mathx.is_zero(expert_params):
        return _optimizer_time(hw, plan, params, fp8_cast, loop)
    dense = _optimizer_time(hw, _dense_group(plan), params - expert_params, fp8_cast, loop)
    if mathx.is_zero(expert_params):
        return dense
    return dense + _optimizer_time(hw, _expert_group(plan), expert_params, loop=loop)


def _parallel(comm: Any, hw: Hardware, plan: Plan, dtype: str | None = None) -> Parallel | None:
    """Expert and context parallelism with their groups placed as Megatron-Core orders ranks: the attention's
    generator puts tp innermost, then cp, then dp (cp ranks tp apart); the experts' own generator folds cp into
    the expert data parallelism, order tp-ep-dp (expert_decoder_rank_generator: tp = expert tp, ep, dp = world /
    (etp*ep*pp), cp = 1; NVIDIA/Megatron-LM @00caa53a megatron/core/parallel_state.py, initialize_model_parallel),
    so ep ranks lie expert-tp apart whatever cp is: tp apart at its default (expert tp = tp), next to each other
    at expert tp 1, where the ep group spans tensor-parallel ranks too (MoE parallel folding, dlperf.plan.folded).
    `dtype` is the one the plan computes in (StepModel._dtype: the plan's, else the model's; None: the plan's
    own), which decides DeepEP's FP8 dispatch."""
    dtype = plan.dtype if dtype is None else dtype
    if plan.ep == 1 and plan.cp == 1 and not folded(plan):
        return None
    ep_group, cp_group = comm.Group(plan.ep, plan.expert_tp), comm.Group(plan.cp, plan.tp)
    level = _level_for_stride(hw, plan.tp * plan.cp - 1)
    crossing = (hw.network[0].size or 1) if level > 0 else 1
    local, nodes = _ep_per_node(hw, plan)
    across, inside = comm.Group(nodes, plan.expert_tp * local), comm.Group(local, plan.expert_tp)
    return Parallel(
        ep=plan.ep, etp=plan.etp if folded(plan) else None, cp=plan.cp, cp_algorithm=plan.cp_algorithm,
        imbalance=plan.imbalance,
        ep_alltoall=lambda nbytes: comm.collective_time("alltoall", nbytes, ep_group, hw),
        ep_nodes=nodes,
        ep_alltoall_nodes=lambda nbytes: comm.collective_time("alltoall", nbytes, across, hw),
        ep_alltoall_node=lambda nbytes: comm.collective_time("alltoall", nbytes, inside, hw),
        ep_allgather=lambda nbytes: comm.collective_time("allgather", nbytes, ep_group, hw),
        sync_gap=sync_gap(hw.device),
        ep_dispatcher=plan.ep_dispatcher, fp8_dispatch=plan.ep_dispatcher == "deepep" and is_recipe(dtype),
        ep_kernel=_ep_kernel(hw, plan, nodes),
        cp_alltoall=lambda nbytes: comm.collective_time("alltoall", nbytes, cp_group, hw),
        cp_send=lambda nbytes: comm.p2p_time(nbytes, hw, level, crossing),
    )


def _ep_kernel(hw: Hardware, plan: Plan, nodes: int) -> Callable[[str], float | None] | None:
    """The published bandwidth of DeepEP's or HybridEP's transfers for this plan (comm.ep_kernels): over RDMA
    when the expert group spans nodes, over NVLink inside one domain, at the SMs the dispatcher holds."""
    if plan.ep_dispatcher not in DISPATCHER_SMS:
        return None
    link, sms = ("rdma" if nodes > 1 else "nvlink"), DISPATCHER_SMS[plan.ep_dispatcher]
    return lambda column: ep_kernels.bandwidth(plan.ep_dispatcher, hw.device.name, link, plan.ep, sms, column)


def _ep_exposed(plan: Plan, slow: StageCost, m: Any) -> tuple[Any, Any]:
    """Expert all-to-all seconds per micro-batch left on the critical path, forward and backward. Without
    overlap, all of it. With combined 1F1B (Megatron-Core's EP A2A overlap, DeepSeek-V3's DualPipe pairing, arXiv
    2412.19437 Sec. 3.2.1) micro-batch i's forward runs beside micro-batch j's backward: i's dispatch/combine hide
    behind j's backward compute and j's behind i's forward compute, so per pair only what outlasts the other
    pass shows; the first forward and the last backward have no partner (m - 1 pairs in m micro-batches)."""
    fwd, bwd = slow.ep_comm_fwd, slow.ep_comm_bwd
    if not plan.ep_overlap:
        return fwd, bwd
    paired_fwd = mathx.maximum(fwd - slow.backward, 0.0)
    paired_bwd = mathx.maximum(bwd - slow.forward, 0.0)
    return (fwd + (m - 1) * paired_fwd) / m, (bwd + (m - 1) * paired_bwd) / m


def _ep_per_node(hw: Hardware, plan: Plan) -> tuple[int, int]:
    """(ep ranks inside one node, nodes the ep group spans): its ranks are expert-tp apart (`_parallel`)."""
    node, stride = hw.network[0].size or plan.ep * plan.expert_tp, plan.expert_tp
    local = max(1, min(plan.ep, node // stride))
    return (local, plan.ep // local) if plan.ep % local == 0 else (plan.ep, 1)


def _stage_cost_key(plan: Plan, dtype: str) -> tuple:
    """What stage_cost reads of a plan: every memo of stage costs (StepModel.stages, _cost_of, _held_by,
    _range_cost, _summed_split, _held_split, _parallel) keys on this one tuple, so that a field the kernels come to
    depend on is added once for all of them."""
    return (plan.tp, plan.sequence_parallel, plan.recompute, plan.micro, dtype, plan.tp_overlap, plan.memory_format,
            plan.fp8_scaling, plan.mx_swizzle, plan.fp8_weight_transpose, plan.cudnn, *_ep_cp_key(plan),
            *_acts_key(plan), *_graphs_key(plan))


def _graphs_key(plan: Plan) -> tuple:
    graphs = _graphs(plan)
    return () if graphs is None else (graphs,)


def _graphs(plan: Plan) -> Graphs | None:
    """The plan's CUDA-graphed scopes for stage_cost (None: eager); full_iteration replays once per step."""
    if not plan.cuda_graphs:
        return None
    return Graphs(plan.cuda_graphs, plan.micro_batches if "full_iteration" in plan.cuda_graphs else 1)


def _ep_cp_key(plan: Plan) -> tuple:
    key = (plan.ep, plan.cp, plan.cp_algorithm, plan.imbalance, plan.ep_dispatcher) if plan.ep > 1 or plan.cp > 1 \
        else ()
    return (*key, "etp", plan.etp) if folded(plan) else key


def _acts_key(plan: Plan) -> tuple:
    return (plan.recompute_modules, plan.fp8_activations) if plan.recompute_modules or plan.fp8_activations else ()


def _check_ep_cp(model: Model, plan: Plan) -> None:
    """Expert parallelism needs experts to shard (ep divides each MoE layer's expert count); ring context
    parallelism cuts each sequence into 2*cp equal chunks."""
    if plan.ep == 1 and plan.cp == 1 and not folded(plan):
        return
    moe = [layer for layer, _ in model.counted() if layer.op == "moe"]
    if plan.ep > 1 and not moe:
        raise PlanError(f"ep={plan.ep} needs a model with moe layers; {model.name} has none")
    if folded(plan) and not moe:
        raise PlanError(f"etp={plan.etp} < tp={plan.tp} splits experts apart from the dense layers: {model.name} has "
                        "no moe layers")
    for layer in moe:
        if isinstance(layer["experts"], int) and layer["experts"] % plan.ep:
            raise PlanError(f"ep={plan.ep} must divide the experts of {layer.name} ({layer['experts']})")
    if plan.cp > 1 and any(layer.op == "mamba2" for layer, _ in model.counted()):
        # the SSD scan passes its state along the sequence: a context-parallel Mamba layer exchanges more than
        # attention's ring does, which dlperf.ops.ssm does not price
        raise PlanError(f"cp={plan.cp}: context parallelism over Mamba-2 layers is not modelled ({model.name} has "
                        "them); use cp 1")
    if plan.cp > 1:
        seqs = {layer.in_shape[-2] for layer, _ in model.counted() if layer.op in ("attention", "mla")}
        chunks = 2 * plan.cp if plan.cp_algorithm == "ring" else plan.cp
        for seq in seqs:
            if isinstance(seq, int) and seq % chunks:
                raise PlanError(f"cp={plan.cp} ({plan.cp_algorithm}) cuts the sequence into {chunks} chunks: it must "
                                f"divide the sequence length {seq}")


def _dp_with_micro_batches(parts: tuple[Any, Any, Any, Any], m: Any) -> tuple[Any, Any]:
    total, exposed, per_micro_total, per_micro_exposed = parts
    return total + m * per_micro_total, exposed + m * per_micro_exposed


def _optimizer_time(hw: Hardware, plan: Plan, params: Any, fp8_cast: Any = 0, loop: Loop = (0.0, "")) -> float:
    """The update over this device's (shard of the) parameters; under an FP8 recipe, then the cast of the
    updated weights to their cached FP8 copies (dlperf.ops.fp8), one memory-bound pass per step. `loop` is
    (kernels per parameter, compute dtype) of a per-tensor step (dlperf.engine.optimizer_loop), which launches
    those kernels instead of one."""
    nbytes, flops = optimizer_traffic(plan), OPTIMIZER_COST[plan.optimizer][1]
    shard = plan.data_parallel if plan.zero >= 1 else 1
    bw = hw.device.achieved_memory_bandwidth()
    traffic = params / shard * max(nbytes / bw, flops / hw.device.peak("fp32"))
    per_param, dtype = loop
    update = loop_time(hw, per_param * params, traffic, dtype) if per_param else traffic + hw.device.launch_latency
    resident = plan.data_parallel if plan.zero >= 3 else 1  # ZeRO-3 keeps (and casts) a shard of the weights
    cast = fp8_cast / resident / bw + hw.device.launch_latency if fp8_cast else 0.0
    return update + cast


def optimizer_traffic(plan: Plan) -> int:
    """Bytes the update reads and writes per parameter: OPTIMIZER_COST's, with each moment read and written in the
    plan's moment_dtype instead of fp32 (bf16 Adam moments, DeepSeek-V3 Sec. 3.3.3: 28 - 2 x 2 x 2 = 20 bytes)."""
    saved = mem.MOMENTS[plan.optimizer] * 2 * (element_bytes("fp32") - element_bytes(plan.moment_dtype))
    return OPTIMIZER_COST[plan.optimizer][0] - saved


def _weight_dtype(dtype: str) -> str:
    """The dtype weights are stored and gathered in: TF32 computes on fp32 tensors."""
    return "fp32" if dtype in ("fp32", "tf32") else dtype


def _grad_dtype(plan: Plan, dtype: str) -> str:
    """The dtype gradients are reduced and accumulated in: the plan's, else the weights'."""
    return plan.grad_dtype or _weight_dtype(dtype)


def _grad_accumulation(hw: Hardware, plan: Plan, params: Any, dtype: str, sync_host: Any = 0.0) -> Any:
    """Seconds per micro-batch of adding its weight gradients to the gradient buffer: read the buffer and the new
    gradient, write the sum. Megatron-LM's --gradient-accumulation-fusion makes the weight-gradient GEMM read and
    write its fp32 main_grad (zeroed at the start of the step) instead of writing a half-precision gradient,
    4 + 4 - 2 = 6 extra bytes per parameter from the first micro-batch on; PyTorch's AccumulateGrad adds in
    place (`grad += new`, 3 x 2 bytes) from the second (the first takes the new gradient's buffer), counted here
    for every micro-batch alike. ZeRO-2/3 keep only a gradient shard, which is what gets added: 1/(dp*cp), since
    context-parallel ranks hold the same weights and shard the states with the data-parallel ones (`memory`).
    The plan's grad_passes (dlperf.engine.grad_passes: a script's unscale, finite check, norm and clip of every
    micro-batch's gradient) run over the whole local gradient as well. `sync_host` is the host's time to issue
    what follows a mid-run sync (dlperf.engine.tf1_update.accumulation_sync_host): the passes after it and the
    accumulate then last as long as that, if longer."""
    if mathx.is_zero(params):
        return 0.0
    e = element_bytes(_grad_dtype(plan, dtype))
    shard = plan.data_parallel * plan.cp if plan.zero >= 2 else 1
    bw = hw.device.achieved_memory_bandwidth()
    fsdp = _fsdp_unsharded_grad_bytes(plan, dtype) * params
    accumulate = (3 * e * params / shard + fsdp) / bw + hw.device.launch_latency

    def passes(names: tuple[str, ...]) -> Any:
        return grad_pass_time(names, params, e, element_bytes(dtype), bw, hw.device.launch_latency)

    if mathx.is_zero(sync_host):
        return accumulate + passes(plan.grad_passes)
    after = tuple(name for name in plan.grad_passes if name in POST_SYNC_PASSES)
    before = tuple(name for name in plan.grad_passes if name not in POST_SYNC_PASSES)
    return passes(before) + mathx.maximum(accumulate + passes(after), sync_host)


def _accumulation_key(plan: Plan) -> tuple:
    """What _grad_accumulation reads of a plan besides the dtype, dp and cp (which StepModel.stages' key holds):
    the slowest stage is chosen with it, so that choice's memo keys on this as well."""
    return plan.zero, plan.zero_impl, plan.grad_dtype, plan.grad_passes


def _fsdp_unsharded_grad_bytes(plan: Plan, dtype: str) -> int:
    """HBM bytes per parameter that PyTorch FSDP moves over each unit's whole (unsharded) gradient in every
    micro-batch's backward pass before reduce-scattering it (ZeRO-2/3 as FSDP's SHARD_GRAD_OP / FULL_SHARD),
    read from torch v2.1.0 (the version llm-foundry's benchmarks pin, setup.py 'torch>=2.1,<2.1.1' @5e85bd62):
    - the FlatParameter is split into per-parameter views in the forward pass (flat_param.py
      `_get_unflat_views_*`: torch.split of the flat tensor), so autograd's backward of that split concatenates
      the per-parameter gradients into one flat gradient: a copy in the parameter dtype (read and write);
    - `_post_backward_hook` (_runtime_utils.py) casts that gradient to MixedPrecision's reduce_dtype when it
      differs (composer's DEFAULT: bf16 params, fp32 reductions): read it, write it in the reduce dtype;
    - `_reduce_grad` divides it in place by the gradient pre-divide factor before the reduce-scatter
      (`_div_if_needed(padded_unsharded_grad, ...)`; the factor is > 1 on every group of 2 or more ranks,
      `_get_gradient_predivide_factor`): read and write in the reduce dtype.
    These are memory-bound passes over the full gradient of every rank, so they do not shrink as the GEMMs get
    faster. They run on FSDP's post-backward stream beside the next unit's backward kernels; they are charged as
    device time (an upper bound if a pass found idle SMs and spare HBM bandwidth beside a compute-bound GEMM).
    The sharded gradient's accumulation (3 passes over 1/dp of it) is `_grad_accumulation`'s own term.
    zero_impl 'megatron-fsdp' (Megatron-Core's FSDP, the Megatron-Bridge rows) runs passes
    of the same kind (the gradient into its main-grad bucket, then `grad_data.mul_(scaling_factor)` in place,
    megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py @d98e8a64); their byte count is
    taken as PyTorch FSDP's, not read from that code."""
    if plan.zero < 2 or plan.zero_impl not in PER_BLOCK_ZERO_IMPLS or plan.data_parallel * plan.cp == 1:
        return 0
    weight, grad = element_bytes(_weight_dtype(dtype)), element_bytes(_grad_dtype(plan, dtype))
    split = 2 * weight
    cast = weight + grad if grad != weight else 0
    predivide = 2 * grad
    return split + cast + predivide


def _optimizer_flops(model: Model, plan: Plan) -> float:
    return float(model.total_params) * OPTIMIZER_COST[plan.optimizer][1]


def _consistency(plan: Plan, compute: Any, dp_total: Any, dp_exposed: Any) -> tuple[Any, int]:
    """Synchronous: compute + exposed allreduce. Stale-synchronous with bound s and asynchronous SGD (survey
    section 7.1): workers do not wait for the reduction, so communication hides behind compute up to the
    bandwidth bound, max(compute, comm); staleness is at most s (SSP) or about dp - 1 (async)."""
    if plan.consistency == "sync":
        return compute + dp_exposed, 0
    staleness = plan.staleness if plan.consistency == "ssp" else max(plan.data_parallel - 1, 0)
    return mathx.maximum(compute, dp_total), staleness


def step_flops(model: Model, plan: Plan, e: int) -> tuple[float, float, float]:
    """FLOPs of one step over the global batch: (model, executed, matrix).

    model: forward + backward, no recomputation (the MFU numerator, PaLM Appendix B convention).
    executed: model + the forward work that recomputation repeats, and the scores a fused attention kernel
    recomputes inside its backward (FlashAttention).
    matrix: GEMM and convolution FLOPs only, recomputation included: the convention of Megatron-LM's published
    TF/s (Narayanan et al. 2021, eq. 3 counts only the matrix multiplications).
    What recomputation repeats is what the step-time engine reruns (stage_cost's rule, `_recomputed`): full
    recomputation reruns the blocks' forward, not the embeddings, output layer and loss around them, as eq. 3
    counts the output layer's logits three times (6BshV, no rerun) where a transformer layer's GEMMs are counted
    four times.
    """
    from dlperf.engine.stage import _recomputed
    from dlperf.ops import OPS

    model_total = ran = recompute = matrix = matrix_again = inside = 0.0
    modules = frozenset(plan.recompute_modules)
    for use in tp_uses(model):
        layer, count = use.layer, use.count
        rerun = rerun_kernels(layer, modules) if modules else frozenset()
        for kernel in OPS[layer.op].kernels(layer, 1, e):
            again = _recomputed(plan.recompute, use, kernel) or reruns(rerun, kernel.name)
            extra = kernel.cost.fwd_flops if again else 0.0
            model_total += count * kernel.cost.work * kernel.model_work_scale  # causal flash: the whole matrix
            ran += count * kernel.cost.work
            recompute += count * extra
            inside += count * kernel.bwd_recompute_flops  # a fused kernel's own recomputation (FlashAttention)
            if kernel.cls in ("matmul", "conv", "attention", "attention_fa3", "matmul_fp8"):
                matrix += count * kernel.cost.work * kernel.model_work_scale
                matrix_again += count * extra
    batch, share = plan.global_batch, recompute_share(plan)
    executed = ran + share * recompute + inside
    return float(model_total) * batch, float(executed) * batch, float(matrix + share * matrix_again) * batch
