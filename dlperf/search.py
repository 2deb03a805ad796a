"""Plan search and scaling sweeps on top of `dlperf.engine.predict`.

Search enumerates (dp, tp, pp, micro-batch, schedule, virtual stages, ZeRO stage, recomputation, sequence
parallelism), screens every valid plan by memory, prices those that fit and ranks them. The expensive part of a
prediction -- the stage costs, which walk every layer's kernels -- depends only on (tp, pp, sequence parallelism,
recomputation, micro-batch, dtype); the cheap knobs (micro-batch count, schedule bubble, virtual stages, ZeRO memory, dp
communication) are combined per plan. The engine's `StepModel` memoises the expensive part; `predict` is the
same object with a fresh cache, so search's numbers are predict's (tests/test_search.py checks 1e-9 relative
agreement on a random sample).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from dlperf.comm import ep_kernels
from dlperf.errors import DlperfError, PlanError
from dlperf.mathx import divisors as _divisors
from dlperf.ops.moe import has_experts
from dlperf.plan import RECOMPUTE_MODULES, Plan, dualpipe_micro_batches_ok, folded

OBJECTIVES = ("time", "cost")
STRATEGIES = ("data", "model", "pipeline", "hybrid", "best")
# Dispatchers a search tries on group-limited MoE models. HybridEP is added only on devices where its published
# bandwidths price it (dlperf.comm.ep_kernels: GB200, B200, H100), for any MoE model: elsewhere it is DeepEP with
# BF16 dispatch and more SMs held on the NCCL model (dlperf.engine.context.HYBRIDEP_SMS), never faster, and
# searching it would only cost the search's time.
SEARCHED_DISPATCHERS = ("alltoall", "deepep")
DEFAULT_MICRO_CAP = 32  # samples per micro-batch in sweeps: ResNet-50's per-GPU batch in Goyal et al. 2017




def powers_of_two_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to n (the degrees and micro-batches a search tries)."""
    out, p = [], 1
    while p <= n:
        out.append(p)
        p *= 2
    return out


# --------------------------------------------------------------------------------------------------- evaluation
def _step_model(model: Any, hw: Any) -> Any:
    """The engine's memoising evaluator: search and predict share one code path (dlperf.engine.step.StepModel)."""
    from dlperf.engine.step import StepModel

    return StepModel(model, hw)


# -------------------------------------------------------------------------------------------------- enumeration
@dataclass(frozen=True)
class SearchSpace:
    """Which knob values search tries. tp stays inside a node (powers of two), as Megatron-LM recommends
    (Narayanan et al. 2021, takeaway #1); micro-batches are powers of two up to max_micro_batch, plus the whole
    per-replica batch."""

    schedules: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "dualpipe")  # dualpipe: only with ep > 1
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    sequence_parallel: tuple[bool, ...] = (False, True)
    max_micro_batch: int = 8
    max_virtual_stages: int = 4
    # Megatron-LM requires the layer count to divide evenly among stages; pricing uneven splits needs the
    # balanced-partition DP per structure, which dominates search time (profiled: ~0.2 s per call for GPT-3).
    uneven_stages: bool = False
    # Expert parallelism (models with moe layers only): None tries every power of two that divides both dp and
    # the experts; context parallelism is off unless asked for (long sequences: e.g. (1, 2, 4, 8)).
    ep: tuple[int, ...] | None = None
    # Expert tensor parallelism on MoE models at tp > 1: the experts split as the dense layers (None, etp = tp) or
    # unsplit on a grid of their own, ep then carved out of all tp*dp*cp ranks (1: MoE parallel folding, Liu et al.
    # 2025, arXiv:2504.14960; with sequence parallelism, dlperf.plan._check_expert_grid).
    etp: tuple[int | None, ...] = (None, 1)
    cp: tuple[int, ...] = (1,)
    ep_overlap: tuple[bool, ...] = (False, True)  # combined 1F1B, where its rules allow it (ep > 1)
    # Partial recomputation (dlperf.plan.RECOMPUTE_MODULES) and FP8 activation caching, tried beside `recompute`
    # none; the expert dispatcher where ep > 1. None: where they apply (search(): every module at once on models
    # with MLA or MoE layers, FP8 caching there under dtype fp8, DeepEP with group-limited routing); enumerate_plans
    # reads None as off.
    recompute_modules: tuple[tuple[str, ...], ...] | None = None
    fp8_activations: tuple[bool, ...] | None = None
    ep_dispatcher: tuple[str, ...] | None = None


def enumerate_plans(base: Plan, node_size: int, heads: int | None, layers: int,
                    space: SearchSpace = SearchSpace(), pp_ok: Callable[[int], bool] = lambda pp: True,
                    experts: int = 0) -> Iterator[Plan]:
    """Every valid plan for base.devices and base.global_batch (other fields of base are kept). `experts` is the
    expert count every MoE layer shares (their gcd; 0: no MoE layer, so no expert parallelism)."""
    n, batch = base.devices, base.global_batch
    for tp in (d for d in _divisors(n) if d <= node_size and d & (d - 1) == 0):
        if heads and tp > 1 and heads % tp:
            continue
        for pp in (d for d in _divisors(n // tp) if d <= layers and pp_ok(d)):
            for cp in (c for c in space.cp if (n // (tp * pp)) % c == 0):
                dp = n // (tp * pp * cp)
                if batch % dp:
                    continue
                for etp in expert_tps(tp, experts, space):
                    for ep in ep_degrees(dp * cp * (tp // (etp or tp)), experts, space):
                        yield from _cheap_knobs(base.with_(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp), batch // dp,
                                                space, layers)


def expert_tps(tp: int, experts: int, space: SearchSpace) -> list[int | None]:
    """Expert tensor-parallel degrees to try (SearchSpace.etp): on a MoE model at tp > 1 the dense layers' split
    (None) and 1; otherwise the dense layers' split alone (at tp 1 both are one plan)."""
    if not experts or tp == 1:
        return [None]
    return [etp for etp in space.etp if etp is None or etp == 1]


def ep_degrees(ranks: int, experts: int, space: SearchSpace) -> list[int]:
    """Expert-parallel degrees to try: powers of two dividing the ranks ep is carved out of (dp*cp, or
    tp*dp*cp/etp with the experts folded) and the expert count."""
    if not experts:
        return [1]
    options = space.ep if space.ep is not None else powers_of_two_upto(ranks)
    return [ep for ep in options if ranks % ep == 0 and experts % ep == 0]


def _cheap_knobs(plan: Plan, per_replica: int, space: SearchSpace, layers: int) -> Iterator[Plan]:
    """The cheap knobs of one (dp, tp, pp, cp, ep) layout: micro-batch, schedule, ZeRO, recomputation, SP."""
    micros = sorted({d for d in powers_of_two_upto(space.max_micro_batch) if per_replica % d == 0} | {per_replica})
    for micro in micros:
        m = per_replica // micro
        for schedule, v in _schedules(plan.pp, m, space, layers, plan.ep):
            for zero in (space.zero if plan.dp > 1 or plan.cp > 1 else (0,)):
                for recompute, modules, fp8 in _recomputes(schedule, space):
                    for sp in _sequence_parallel(plan, space):
                        for overlap in _ep_overlaps(plan, m, schedule, recompute, space):
                            for dispatcher in (space.ep_dispatcher or ("alltoall",) if plan.ep > 1 else ("alltoall",)):
                                yield plan.with_(micro_batch=micro, schedule=schedule, virtual_stages=v, zero=zero,
                                                 recompute=recompute, sequence_parallel=sp, ep_overlap=overlap,
                                                 recompute_modules=modules, ep_dispatcher=dispatcher,
                                                 fp8_activations=fp8,
                                                 # the base plan's p2p overlap where Megatron-Core has it
                                                 p2p_overlap=plan.p2p_overlap and schedule == "interleaved")


def _sequence_parallel(plan: Plan, space: SearchSpace) -> tuple[bool, ...]:
    """Sequence parallelism where it applies: at tp > 1, and always with folded experts, which need it
    (dlperf.plan._check_expert_grid)."""
    if plan.tp == 1:
        return (False,)
    return tuple(sp for sp in space.sequence_parallel if sp) if folded(plan) else space.sequence_parallel


def _recomputes(schedule: str, space: SearchSpace) -> list[tuple[str, tuple[str, ...], bool]]:
    """(recompute, recompute_modules, fp8_activations): each recompute mode alone, then with none the partial
    recomputations and FP8 activation caching. DualPipe pairs forward with backward chunks and takes no full
    recomputation (dlperf.plan._check_dualpipe)."""
    modes = space.recompute
    if schedule == "dualpipe":
        modes = tuple(r for r in modes if r not in ("full", "except_last"))
    out = [(r, (), False) for r in modes]
    if "none" in modes:
        out += [("none", m, fp8) for m in space.recompute_modules or ((),) for fp8 in space.fp8_activations or (False,)
                if m or fp8]
    return out


def _ep_overlaps(plan: Plan, m: int, schedule: str, recompute: str, space: SearchSpace) -> tuple[bool, ...]:
    """Expert all-to-all overlap where Megatron-Core allows it (dlperf.plan._check_ep_overlap); DualPipe always
    pairs its chunks, so the flag would only repeat the plan."""
    if schedule == "dualpipe":
        return (False,)
    allowed = plan.ep > 1 and m >= 2 and recompute not in ("full", "except_last") and (
        plan.pp == 1 or schedule == "interleaved")
    return space.ep_overlap if allowed else (False,)


def _schedules(pp: int, m: int, space: SearchSpace, layers: int, ep: int = 1) -> Iterator[tuple[str, int]]:
    if pp == 1:
        yield "1f1b", 1  # no pipeline: the schedule does not matter
        return
    for schedule in space.schedules:
        if schedule == "gpipe" and m == 1 and FOLD_GPIPE and "1f1b" in space.schedules:
            continue  # one micro-batch: GPipe runs 1F1B's plan (forward through every stage, then backward; _no_ops)
        if schedule == "dualpipe":
            # DeepSeek-V3's schedule exists to hide expert all-to-alls: tried with expert parallelism only, where
            # its rules hold (dlperf.plan._check_dualpipe)
            if ep > 1 and pp % 2 == 0 and dualpipe_micro_batches_ok(m, pp):
                yield schedule, 1
        elif schedule != "interleaved":
            yield schedule, 1
        elif m % pp == 0:
            for v in range(2, min(space.max_virtual_stages, layers // pp) + 1):
                yield schedule, v


# ------------------------------------------------------------------------------------------------------ search
@dataclass
class SearchResult:
    """Ranked fitting plans (best first) and how many were considered / feasible."""

    ranked: list[Any]
    considered: int
    feasible: int
    objective: str
    hw: Any = None
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    smallest: Any = None          # the priced plan that needs the least memory (fitting or not)
    memory_limit: float = 0.0     # bytes per device a plan had to fit in
    too_slow: int = 0             # plans that fit but missed max_step_time
    folded: int = 0               # plans left out as another's twin (selective as none, GPipe at m 1: _no_ops)

    def objective_value(self, ev: Any) -> float:
        return objective_value(ev, self.objective, self.hw)

    def rows(self, top: int | None = None) -> list[dict[str, Any]]:
        out = []
        for rank, ev in enumerate(self.ranked[:top], 1):
            p = ev.plan
            row = {"rank": rank, "devices": p.devices, "dp": p.data_parallel, "tp": p.tp, "pp": p.pp, "cp": p.cp,
                   "ep": p.ep, "etp": p.expert_tp, "ep_overlap": p.ep_overlap, "ep_dispatcher": p.ep_dispatcher,
                   "recompute_modules": ",".join(p.recompute_modules), "fp8_activations": p.fp8_activations,
                   "micro_batch": p.micro, "micro_batches": p.micro_batches, "schedule": p.schedule,
                   "virtual_stages": p.virtual_stages, "zero": p.zero, "recompute": p.recompute,
                   "sequence_parallel": p.sequence_parallel, "step_time_s": ev.step_time_s,
                   "samples_per_s": ev.throughput(), "memory_gib": ev.memory_bytes_per_device / 2**30}
            if self.objective == "cost":
                row["cost_per_step"] = self.objective_value(ev)
            row.update({k: v for k, v in ev.breakdown_s.items()})
            out.append(row)
        return out

    def to_frame(self, top: int | None = None) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows(top))


def objective_value(ev: Any, objective: str, hw: Any) -> float:
    """time: seconds per step. cost: device-hours per step, times the hardware's price per device-hour if known."""
    if objective == "time":
        return ev.step_time_s
    price = getattr(hw, "price_per_device_hour", None) or 1.0
    return ev.plan.devices * ev.step_time_s / 3600.0 * price


def _applicable(space: SearchSpace, model: Any, base: Plan, device: str = "") -> SearchSpace:
    """Fill the options left at None with where they apply. DeepEP is built for group-limited routing across
    nodes (DeepSeek-V3 Sec. 3.2.2); HybridEP is searched on the devices its published bandwidths cover
    (SEARCHED_DISPATCHERS; `device` is the hardware's device name). Partial recomputation is the
    MLA/MoE recipes' (DeepSeek-V3 Sec. 3.2.3; Megatron-Core's mla_up_proj and moe_act): on other models only
    `layernorm` applies, freeing one input per MLP, and it is not searched there, to keep the search's time
    (benchmarks/bench_vs_baseline.py). FP8 caching needs an FP8 recipe."""
    ops = {layer.op for layer, _ in model.counted()}
    mla_moe = bool(ops & {"mla", "moe"})
    if space.ep_dispatcher is None:
        space = replace(space, ep_dispatcher=_dispatchers(model, device))
    if space.recompute_modules is None:
        space = replace(space, recompute_modules=((), _present_modules(ops)) if mla_moe else ((),))
    if space.fp8_activations is None:
        space = replace(space, fp8_activations=(False, True) if mla_moe and base.dtype == "fp8" else (False,))
    return space


FOLD_GPIPE = True  # GPipe at one micro-batch is left out as 1F1B's twin (_no_ops); False enumerates both


def _no_ops(space: SearchSpace, model: Any) -> tuple[SearchSpace, Callable[[Plan], int]]:
    """The space without the knob values that are provably another value's plan under a new name, and how many
    left-out twins each enumerated plan stands for (their sum is what the search folded).
    - Recompute selective is recompute none when no layer prices them apart (dlperf.engine.stage.selective_changes:
      every attention is fused, as FlashAttention, cuDNN's fused attention and MLA's core are, or there is none):
      the same step time, breakdown and memory for every plan. Each enumerated plan with recompute none and neither
      partial recomputation nor FP8 caching had exactly one selective twin (_recomputes pairs them; _ep_overlaps
      reads recompute only for full; no other knob reads it).
    - GPipe at one micro-batch per step is 1F1B's run: one forward through every stage, then its backward, one
      micro-batch in flight on every stage (dlperf.engine.pipeline.in_flight, memory._stage_in_flight) and the
      same busy time, bubble and sends (pipeline.schedule_time reads no schedule but interleaving's);
      tests/test_search.py checks predict's equality. _schedules leaves GPipe out there when 1F1B is searched.
    The other no-ops are never enumerated in the first place: sequence parallelism at tp 1, ZeRO at dp * cp 1,
    the schedule at pp 1, ep overlap and dispatchers at ep 1, partial recomputation of modules the model lacks
    (_cheap_knobs, _schedules, _present_modules)."""
    from dlperf.engine.stage import selective_changes

    selective = {"none", "selective"} <= set(space.recompute) and \
        not any(selective_changes(layer) for layer, _ in model.counted())
    gpipe = FOLD_GPIPE and {"1f1b", "gpipe"} <= set(space.schedules)
    if selective:
        space = replace(space, recompute=tuple(r for r in space.recompute if r != "selective"))

    def twins(plan: Plan) -> int:
        as_none = selective and plan.recompute == "none" and not plan.recompute_modules and not plan.fp8_activations
        as_1f1b = gpipe and plan.pp > 1 and plan.schedule == "1f1b" and plan.micro_batches == 1
        return (1 + as_none) * (1 + as_1f1b) - 1

    return space, twins


def _present_modules(ops: set[str]) -> tuple[str, ...]:
    """The partial-recomputation modules the model has: mla_up_proj needs an MLA layer, moe_act a MoE one (a
    plan naming one the model lacks would recompute nothing, and printing it would mislead)."""
    needs = {"mla_up_proj": "mla", "moe_act": "moe"}
    return tuple(m for m in RECOMPUTE_MODULES if m not in needs or needs[m] in ops)


def _dispatchers(model: Any, device: str) -> tuple[str, ...]:
    """The expert dispatchers a search tries (SEARCHED_DISPATCHERS)."""
    tried = SEARCHED_DISPATCHERS if _group_limited(model) else ("alltoall",)
    if has_experts(model) and ep_kernels.covers_device("hybridep", device):
        tried = (*tried, "hybridep")
    return tried


def _group_limited(model: Any) -> bool:
    """A MoE layer routes each token to a limited number of expert groups (DeepSeek-V3 node-limited routing)."""
    return any(layer.op == "moe" and layer.get("top_groups") for layer, _ in model.counted())


def search(model: Any, hw: Any, devices: int | list[int], global_batch: int, *, objective: str = "time",
           max_memory: float | None = None, base: Plan | None = None, space: SearchSpace = SearchSpace(),
           progress: Callable[[Iterable], Any] | None = None, max_step_time: float | None = None) -> SearchResult:
    """All valid plans on `devices` (a count, or a list of counts to choose among; with objective 'cost' a
    single count also tries its halvings devices/2, /4, ... since fewer devices may cost less per step), keep
    those whose memory fits the device (and max_memory) and that meet max_step_time, rank.

    Plans are screened by memory before they are priced: a plan's memory does not depend on its step time
    (StepModel.memory reads the memoised stage costs and the schedule), so a plan that does not fit is never
    timed; only the smallest of them is, when nothing fits, for the report (`smallest`)."""
    import time

    if objective not in OBJECTIVES:
        raise PlanError("objective", expected=" or ".join(OBJECTIVES), found=objective)
    start = time.perf_counter()
    evaluator = _step_model(model, hw)
    limit = hw.device.memory if max_memory is None else min(max_memory, hw.device.memory)
    if isinstance(devices, list):
        counts = devices
    elif objective == "time":
        counts = [devices]
    else:
        counts = [d for d in _divisors(devices) if (devices // d) & (devices // d - 1) == 0]
    plans: list[Plan] = []
    node = hw.network[0].size or 1
    base = base or Plan()
    space, twins = _no_ops(_applicable(space, model, base, hw.device.name), model)
    for n in counts:
        plans += enumerate_plans(base.with_(devices=n, global_batch=global_batch), node, evaluator.heads,
                                 evaluator.layers, space, _pp_filter(model, space), expert_count(model))
    folded = sum(twins(plan) for plan in plans)
    fitting: list[Any] = []
    smallest, too_slow = None, 0  # the smallest-memory plan priced (fitting ones only, see _smallest)
    over: list[tuple[float, Plan]] = []  # (memory, plan) of the valid plans that do not fit, never priced
    fits: set[Plan] = set()  # plans without partial recomputation that fit
    iterator = progress(plans) if progress else _null(plans)
    with iterator as items:
        for plan in items:
            if (plan.recompute_modules or plan.fp8_activations) and \
                    plan.with_(recompute_modules=(), fp8_activations=False) in fits:
                # recomputing more never shortens the step, nor does FP8 caching (tests/test_recompute_modules.py):
                # where the plan fits without them, they only save memory it does not need, so are not priced
                continue
            try:
                memory, ev = evaluator.fitting_timeline(plan, limit)
            except DlperfError:
                continue
            if ev is None:
                over.append((memory["total"], plan))
                continue
            if smallest is None or ev.memory_bytes_per_device < smallest.memory_bytes_per_device:
                smallest = ev
            if not plan.recompute_modules and not plan.fp8_activations:
                fits.add(plan)
            if max_step_time is None or ev.step_time_s <= max_step_time:
                fitting.append(ev)
            else:
                too_slow += 1
    fitting.sort(key=lambda ev: (objective_value(ev, objective, hw), ev.memory_bytes_per_device))
    if smallest is None:
        smallest = _smallest(evaluator, over)
    return SearchResult(fitting, len(plans), len(fitting), objective, hw, time.perf_counter() - start,
                        smallest=smallest, memory_limit=limit, too_slow=too_slow, folded=folded)


def _smallest(evaluator: Any, over: list[tuple[float, Plan]]) -> Any:
    """The Timeline of the plan that needs the least memory when none fits (the first of them in search order),
    priced now: search prices only plans that fit. When one fits, it is the smallest, since every plan in `over`
    needs more than the limit. A plan whose pricing its rules refuse is passed over, as search passes it over."""
    for _, plan in sorted(over, key=lambda item: item[0]):  # stable: ties keep the search's order
        try:
            return evaluator.timeline(plan)
        except DlperfError:
            continue
    return None


def expert_count(model: Any) -> int:
    """The expert count all MoE layers share (gcd), 0 without MoE layers."""
    counts = [layer["experts"] for layer, _ in model.counted() if layer.op == "moe"]
    return math.gcd(*counts) if counts and all(isinstance(c, int) for c in counts) else 0


def _pp_filter(model: Any, space: SearchSpace) -> Callable[[int], bool]:
    """Without uneven stages: only pp that Megatron's uniform split accepts (when the model has a repeated
    block; a model without one always needs the balanced split)."""
    from dlperf.engine.pipeline import uniform_partition

    if space.uneven_stages or uniform_partition(model, 1) is None:
        return lambda pp: True
    return lambda pp: pp == 1 or uniform_partition(model, pp) is not None


class _null:
    def __init__(self, items: Iterable) -> None:
        self.items = items

    def __enter__(self) -> Iterable:
        return self.items

    def __exit__(self, *exc: Any) -> None:
        return None


def terminal_progress(label: str) -> Callable[[Iterable], Any] | None:
    """A click progress bar on stderr when stderr is a terminal; None (quiet) when piped."""
    if not sys.stderr.isatty():
        return None
    import click

    return lambda items: click.progressbar(items, label=label, file=sys.stderr)


# ------------------------------------------------------------------------------------------------------- sweeps
MAX_COUNTS = 64  # device counts in one --gpus list or range (1..2**20 is 21)


def parse_gpu_list(text: str) -> list[int]:
    """'1,2,4,8' or '1..256' (powers of two from 1 to 256, both ends included). Every count is at most
    dlperf.plan.MAX_DEVICES and a list has at most MAX_COUNTS of them, checked before any planning."""
    from dlperf.plan import MAX_DEVICES

    text = text.strip()
    expected = "a list like 1,2,4,8 or a range 1..256 (ASCII digits)"
    parts = text.split("..") if ".." in text else text.split(",")
    parts = [p.strip() for p in parts if p.strip() or ".." in text]
    if not parts or len(parts) > MAX_COUNTS or (".." in text and len(parts) != 2) or any(
            not (p.isascii() and p.isdigit()) or len(p) > 12 for p in parts):
        raise PlanError(field="--gpus", expected=expected + f", at most {MAX_COUNTS} counts", found=text)
    values = [int(p) for p in parts]
    if any(not 1 <= v <= MAX_DEVICES for v in values):
        raise PlanError(field="--gpus", expected=f"device counts from 1 to {MAX_DEVICES:,} (dlperf.plan.MAX_DEVICES)",
                        found=text)
    if ".." in text:
        lo, hi = values
        if hi < lo:
            raise PlanError(field="--gpus", expected="LOW..HIGH with LOW <= HIGH", found=text)
        out = [p for p in (2**k for k in range(hi.bit_length())) if lo <= p <= hi]
        return out or [lo]
    return sorted(set(values))


@dataclass
class SweepPoint:
    devices: int
    global_batch: int
    plan: Plan | None
    prediction: Any
    note: str = ""


@dataclass
class Sweep:
    """Scaling curve: per device count the chosen plan's step time and throughput; speedup and parallel
    efficiency relative to the first point that has a prediction (speedup = throughput ratio, efficiency =
    speedup / device ratio -- for strong scaling the speedup is the step-time ratio)."""

    model: str
    hardware: str
    strategy: str
    mode: str
    points: list[SweepPoint]

    def _reference(self) -> SweepPoint | None:
        return next((p for p in self.points if p.prediction is not None), None)

    def rows(self) -> list[dict[str, Any]]:
        ref = self._reference()
        out = []
        for p in self.points:
            r = p.prediction
            row: dict[str, Any] = {"gpus": p.devices, "global_batch": p.global_batch, **_knobs(p.plan)}
            if r is None or ref is None:
                row.update(step_time_s=None, samples_per_s=None, speedup=None, efficiency=None, fits=False)
            else:
                base = ref.prediction.throughput_samples_per_s
                speedup = r.throughput_samples_per_s / base
                row.update(step_time_s=r.step_time_s, samples_per_s=r.throughput_samples_per_s, speedup=speedup,
                           efficiency=speedup / (p.devices / ref.devices), fits=r.fits)
            row["note"] = p.note
            out.append(row)
        return out

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows())


def _knobs(plan: Plan | None) -> dict[str, Any]:
    """The plan's degrees and the knobs that explain a sweep row (micro-batch, ZeRO, recomputation)."""
    if plan is None:
        return dict.fromkeys(("dp", "tp", "pp", "micro_batch", "zero", "recompute"))
    return {"dp": plan.data_parallel, "tp": plan.tp, "pp": plan.pp, "micro_batch": plan.micro, "zero": plan.zero,
            "recompute": plan.recompute}


def _sweep_plan(model: Any, hw: Any, strategy: str, n: int, batch: int, micro: int | None,
                dtype: str | None) -> tuple[Plan | None, Any, str]:
    from dlperf.engine import predict
    from dlperf.engine.defaults import ZERO1_IMPL, best_plan

    base = Plan(devices=n, global_batch=batch, dtype=dtype)
    if strategy in ("data", "model", "pipeline"):
        if strategy == "data":
            plan = base.with_(dp=n)
            per = batch // n if batch % n == 0 else None
        elif strategy == "model":
            plan, per = base.with_(dp=1, tp=n), batch
        else:
            plan, per = base.with_(dp=1, pp=n), batch
        if strategy == "pipeline" and n > 1 and micro is None:
            # at least 4 micro-batches per stage keeps the 1F1B bubble (pp-1)/(m+pp-1) under 20%
            # (Narayanan et al. 2021, section 2.2), as `dlperf compare` does
            plan = plan.with_(micro_batch=max(d for d in _divisors(batch) if d <= max(1, batch // (4 * n))))
        elif per:
            # gradient accumulation: the largest divisor of the per-replica batch up to the cap
            plan = plan.with_(micro_batch=max(d for d in _divisors(per) if d <= (micro or DEFAULT_MICRO_CAP)))
        try:
            return plan, predict(model, hw, plan), ""
        except DlperfError as err:
            return plan, None, str(err)
    if strategy == "hybrid":
        plan, result = best_plan(model, hw, base, ZERO1_IMPL)  # ZeRO 0 or 1, as `dlperf compare`'s best hybrid
        return plan, result, "" if plan else "no hybrid plan fits"
    found = search(model, hw, n, batch, base=base)
    if not found.ranked:
        return None, None, "no plan fits"
    plan = found.ranked[0].plan
    return plan, predict(model, hw, plan), ""


def sweep(model: Any, hw: Any, gpus: list[int], *, strategy: str = "data", weak: bool = False,
          global_batch: int | None = None, micro_batch: int | None = None, dtype: str | None = None,
          progress: Callable[[Iterable], Any] | None = None) -> Sweep:
    """Strong scaling: the global batch stays `global_batch` (default 32 per device at the largest count).
    Weak scaling: the per-device batch stays global_batch / gpus[0] (default 32)."""
    if strategy not in STRATEGIES:
        raise PlanError("strategy", expected=", ".join(STRATEGIES), found=strategy)
    gpus = sorted(gpus)
    if weak:
        per_device = (global_batch // gpus[0]) if global_batch else 32
        if per_device < 1:
            raise PlanError(f"weak scaling: global batch {global_batch} gives no sample per device at {gpus[0]} GPUs")
        batches = [per_device * n for n in gpus]
    else:
        batches = [global_batch or 32 * gpus[-1]] * len(gpus)
    points = []
    with (progress(list(zip(gpus, batches, strict=True))) if progress
          else _null(list(zip(gpus, batches, strict=True)))) as items:
        for n, batch in items:
            plan, result, note = _sweep_plan(model, hw, strategy, n, batch, micro_batch, dtype)
            points.append(SweepPoint(n, batch, plan, result, note))
    return Sweep(model.name, hw.name, strategy, "weak" if weak else "strong", points)


# ------------------------------------------------------------------------------------------------------ explain
def _scaled_hardware(hw: Any, factor: float) -> list[tuple[str, Any]]:
    """(label, hardware with one constant scaled by `factor`) for every device and network constant."""
    from dataclasses import replace

    dev = hw.device
    out = [
        ("peak FLOP/s", replace(hw, device=replace(dev, peak_flops={k: v * factor
                                                                   for k, v in dev.peak_flops.items()}))),
        ("memory bandwidth", replace(hw, device=replace(dev, memory_bandwidth=dev.memory_bandwidth * factor))),
        ("launch latency", replace(hw, device=replace(dev, launch_latency=dev.launch_latency * factor))),
        ("host time per launch", replace(hw, device=replace(dev, dispatch_forward=dev.dispatch_forward * factor,
                                                            dispatch_backward=dev.dispatch_backward * factor))),
    ]
    for i, level in enumerate(hw.network):
        for attr, word in (("bandwidth", "bandwidth"), ("latency", "latency")):
            net = list(hw.network)
            changed = {attr: getattr(level, attr) * factor}
            if attr == "bandwidth" and level.nvls_bandwidth is not None:
                # NVLS runs over the same switch links: without this, a level whose collectives NCCL runs as NVLS
                # (H100/B200 tensor parallelism) showed "+10% nvswitch bandwidth -> +0.0%" at 30% of the step
                changed["nvls_bandwidth"] = level.nvls_bandwidth * factor
            net[i] = replace(level, **changed)
            out.append((f"{level.name} {word}", replace(hw, network=tuple(net))))
    return out


def explain(model: Any, hw: Any, plan: Plan, step: float = 0.10) -> dict[str, Any]:
    """Sensitivity of step time to each hardware constant and to doubling/halving plan knobs, by re-predicting
    with the constant scaled by (1 + step) (dataclasses.replace on the Hardware), and the bottleneck."""
    from dlperf.engine import predict

    base = predict(model, hw, plan)
    t0 = base.step_time_s
    rows = []
    for label, changed in _scaled_hardware(hw, 1.0 + step):
        t = predict(model, changed, plan).step_time_s
        rows.append({"change": f"+{step:.0%} {label}", "step_time_s": t, "step_time_change": t / t0 - 1})
    refused = []  # knob changes the plan cannot take, with the reason (a user asking "what about ZeRO 3?" sees why)
    for label, new in _knob_changes(plan):
        try:
            t = predict(model, hw, new).step_time_s
        except DlperfError as err:
            refused.append({"change": label, "reason": str(err)})
            continue
        rows.append({"change": label, "step_time_s": t, "step_time_change": t / t0 - 1})
    bottleneck = max(base.breakdown_s.items(), key=lambda kv: kv[1])
    return {"prediction": base, "sensitivities": rows, "refused": refused, "bottleneck": bottleneck[0],
            "bottleneck_share": bottleneck[1] / t0}


def _knob_changes(plan: Plan) -> list[tuple[str, Plan]]:
    out = []
    micro = plan.micro
    if micro > 1 and micro % 2 == 0:
        out.append((f"micro-batch {micro} -> {micro // 2}", plan.with_(micro_batch=micro // 2)))
    out.append((f"micro-batch {micro} -> {micro * 2}", plan.with_(micro_batch=micro * 2)))
    for value in ("none", "selective", "full"):
        if value != plan.recompute:
            out.append((f"recompute {plan.recompute} -> {value}", plan.with_(recompute=value)))
    for z in (0, 1, 2, 3):
        if z != plan.zero:
            out.append((f"zero {plan.zero} -> {z}", plan.with_(zero=z)))
    if plan.tp > 1:
        out.append((f"sequence parallel {'on -> off' if plan.sequence_parallel else 'off -> on'}",
                    plan.with_(sequence_parallel=not plan.sequence_parallel)))
    if plan.data_backend == "cpu":  # an input-bound step moves only with the loader (dlperf.engine.input)
        workers = plan.loader_workers
        out.append((f"loader workers {workers} -> {2 * workers}", plan.with_(loader_workers=2 * workers)))
    if plan.memory_format == "nchw":
        out.append(("memory format nchw -> nhwc", plan.with_(memory_format="nhwc")))
    if plan.optimizer_impl == "per-tensor":  # a fused step launches one kernel (dlperf.engine.optimizer_loop)
        out.append(("optimizer per-tensor -> fused", plan.with_(optimizer_impl="fused")))
    return out


def format_change(value: float) -> str:
    return "+0.0%" if math.isclose(value, 0.0, abs_tol=5e-5) else f"{100 * value:+.1f}%"
