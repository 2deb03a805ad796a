"""Filling in degrees a user left out, and the four strategies `dlperf compare` puts side by side."""

from __future__ import annotations

from typing import Any

from dlperf.errors import DlperfError, PlanError
from dlperf.mathx import divisors as _divisors
from dlperf.plan import Plan

# The ZeRO implementation a filled-in ZeRO-1 plan runs when the user named none: Megatron-Core's distributed optimizer
# (the optimizer states sharded over dp, its parameter gather hidden behind the next forward at pp 1), what Megatron-LM
# and Megatron-Bridge runs use; zero_impl "fsdp" at stage 1 prices DeepSpeed ZeRO-1's gather after the step instead.
ZERO1_IMPL = "megatron"
# What the filled-in plan is the fastest of (hybrid_candidates), said in its note: a newcomer read "fastest that fits"
# as the best plan there is, but search's wider space (micro-batches above 1 with pipelining, ZeRO 2/3, interleaving,
# expert tp) finds faster ones (DeepSeek-V3 on 2048 H800s: 38.6 s here, 24.9 s from `dlperf search`).
DEFAULT_SCOPE = "fastest that fits of the default layouts; dlperf search tries more"


def _evaluator(model: Any, hw: Any) -> Any:
    """One memoising StepModel for all the candidates of a filled-in plan: they share their stages' costs, which
    pricing each afresh repeated (DeepSeek-V3 on 2048 GPUs: ~1,700 candidates)."""
    from dlperf.engine.step import StepModel

    return StepModel(model, hw)


def _fitting(evaluator: Any, plan: Plan, limit: float) -> Any:
    """The plan's Timeline if it fits in `limit` bytes per device, else None (as for a plan its rules refuse): its
    memory is read first, without pricing its time (StepModel.fitting_timeline), as search screens plans, and a
    plan whose pipeline split is chosen by pricing is not priced when none of its candidate splits fits
    (StepModel.may_fit)."""
    try:
        return evaluator.fitting_timeline(plan, limit)[1] if evaluator.may_fit(plan, limit) else None
    except DlperfError:
        return None


def zero_stages(base: Plan, zero1: str | None) -> list[Plan]:
    """The base at its own ZeRO stage, and where `zero1` names a ZeRO implementation (the user gave no --zero) also
    at ZeRO-1 run so: real multi-GPU LLM runs shard the optimizer states (Megatron-Core's distributed optimizer,
    ZeRO-1, FSDP), and a default that never tried it put Llama-3-8B on 8 H100s at dp=2 tp=4 (983 ms) because 16
    bytes a parameter of model states did not fit under pure data parallelism."""
    if zero1 is None or base.zero == 1:
        return [base]
    return [base, base.with_(zero=1, zero_impl=zero1)]


def hybrid_candidates(model: Any, hw: Any, base: Plan, zero1: str | None = None) -> list[Plan]:
    """tp inside a node (powers of two), pp over what is left, and on a MoE model expert parallelism over the
    data-parallel ranks (expert_degrees); the micro-batch and recomputation the user gave are kept, and only what
    was left out is searched (micro-batches: 1 with pipelining, as Megatron-LM defaults, else micro_batches;
    recomputation none, selective or full; ZeRO: the base's stage, and 1 run as `zero1` where that is given,
    zero_stages)."""
    node = hw.network[0].size or 1
    n = base.devices
    recomputes = (base.recompute,) if base.recompute != "none" else ("none", "selective", "full")
    stages = zero_stages(base, zero1)
    plans = []
    for tp in (d for d in _divisors(n) if d <= node and d & (d - 1) == 0):
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            if base.global_batch % dp:
                continue
            for micro in micro_batches(base, pp, base.global_batch // dp):
                for ep in expert_degrees(model, base, dp):
                    for recompute in recomputes:
                        for staged in stages:
                            plans.append(staged.with_(tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=micro,
                                                      recompute=recompute))
    return plans


def micro_batches(base: Plan, pp: int, per_replica: int) -> list[int | None]:
    """The micro-batches a filled-in plan tries: the one the user gave; 1 with pipelining (Megatron-LM's default);
    else the whole per-replica batch in one pass (None) and every smaller power of two dividing it, i.e. gradient
    accumulation, which a data-parallel plan that does not fit in one pass needs before it needs recomputation
    (GPT-2 XL on 8 A100s at batch 512: micro-batch 64 fits only with full recomputation, 6.55 s; micro-batch 4 fits
    without, 5.52 s)."""
    from dlperf.search import powers_of_two_upto

    if base.micro_batch is not None:
        return [base.micro_batch]
    if pp > 1:
        return [1]
    smaller = [p for p in powers_of_two_upto(per_replica) if p < per_replica and per_replica % p == 0]
    return [None, *reversed(smaller)]


def expert_degrees(model: Any, base: Plan, dp: int) -> list[int]:
    """The expert-parallel degrees a filled-in plan tries: the one the user gave, else on a MoE model every power
    of two dividing both dp (Megatron-Core carves expert parallelism out of the data-parallel ranks) and the
    expert count, as `dlperf search` does; without MoE layers 1. A MoE model is trained expert-parallel (each rank
    holds its share of the experts), so a default that never tried it chose a tensor-parallel plan for
    Qwen3-30B-A3B on 8 GPUs at 1.7x the step of the expert-parallel one."""
    if base.ep != 1:
        return [base.ep]
    from dlperf.search import SearchSpace, ep_degrees, expert_count

    return ep_degrees(dp, expert_count(model), SearchSpace())


def best_plan(model: Any, hw: Any, base: Plan, zero1: str | None = None,
              evaluator: Any = None) -> tuple[Plan | None, Any]:
    """The fastest of hybrid_candidates that fits (ties: the first, ZeRO 0 before ZeRO-1), and its prediction.
    Candidates are compared by their Timelines; only the chosen one's Prediction (its FLOP rates) is made."""
    evaluator = evaluator or _evaluator(model, hw)
    timelines = [t for t in (_fitting(evaluator, plan, hw.device.memory)
                             for plan in hybrid_candidates(model, hw, base, zero1)) if t is not None]
    while timelines:
        best = min(timelines, key=lambda t: t.step_time_s)  # the first of the fastest
        try:
            return best.plan, evaluator.prediction(best)
        except DlperfError:  # passed over, as a plan whose prediction its rules refuse always was
            timelines = [t for t in timelines if t is not best]
    return None, None


def default_plan(model: Any, hw: Any, base: Plan, notes: list[str],
                 zero1: str | None = None) -> tuple[Plan, list[str]]:
    """Pure data parallelism when it fits at the base's ZeRO stage (on a MoE model with the fastest fitting
    expert-parallel degree); otherwise the fastest fitting tp x pp (x dp, x ep) plan, at the base's ZeRO stage or,
    where `zero1` names a ZeRO implementation (the user gave no --zero), at ZeRO-1 run so (zero_stages): pure data
    parallelism with the optimizer states sharded among them. The note says why data parallelism was not chosen
    (without ZeRO, and with ZeRO-1 where it was tried). A batch that pure data parallelism cannot split, for a model
    that would fit under it, is an error naming the batch: running it tensor-parallel instead would be a
    surprise."""
    from dlperf.units import format_quantity as q

    n, batch = base.devices, base.global_batch
    # judged at the next batch that splits evenly when this one does not: would the model fit at all?
    probe_batch = batch if batch % n == 0 else n * -(-batch // n)
    evaluator = _evaluator(model, hw)  # one for all: pure data parallelism's stage costs are the candidates' too
    ep, result, why = _data_parallel(evaluator, base.with_(dp=n, tp=1, pp=1, global_batch=probe_batch))
    data = base.with_(dp=n, tp=1, pp=1, ep=ep)
    if result is not None and result.fits:
        if batch % n:
            raise PlanError(f"global batch {batch} does not split over {n} devices under pure data parallelism "
                            f"(the default when no degree is given)",
                            expected=f"a multiple of {n} (e.g. {max(n, n * (batch // n))} or {n * -(-batch // n)}), "
                                     f"or degrees given with --dp/--tp/--pp", found=batch)
        experts = f", its experts split over ep={ep} ranks (the fastest expert-parallel degree)" if ep > 1 else ""
        notes.append(f"degrees not given: pure data parallelism dp={n} (the model fits){experts}")
        return data, notes
    if result is not None:
        # the micro-batch and recomputation it was judged at: the plan chosen instead may be data-parallel too,
        # at a smaller micro-batch or with recomputation, and the note must not read "dp=8 does not fit; chose dp=8"
        tried = result.plan
        experts = f" ep={tried['ep']}" if tried.get("ep", 1) > 1 else ""
        needs = f"{q(result.memory_bytes_per_device, 'bytes')} per device of {q(hw.device.memory, 'bytes')}"
        sharded = _zero1_memory(evaluator, data.with_(global_batch=probe_batch), zero1) if base.zero == 0 else None
        # the same plan with the optimizer states sharded: "does not fit without ZeRO; chose dp=8 ... zero=1" reads
        # as the reason, and where ZeRO-1 does not fit either, by how much
        needs = f"without ZeRO ({needs}; {q(sharded, 'bytes')} with ZeRO-1)" if sharded is not None else f"({needs})"
        why = (f"pure data parallelism dp={n}{experts} (micro-batch {tried['micro_batch']}, recompute "
               f"{tried['recompute']}) does not fit {needs}")
    plan, _ = best_plan(model, hw, base, zero1, evaluator)
    if plan is None:
        notes.append(f"no plan fits in device memory: {why}; showing pure data parallelism")
        return data, notes
    experts = f" ep={plan.ep}" if plan.ep > 1 else ""
    zero = f" zero={plan.zero}" if zero1 is not None and plan.zero != base.zero else ""
    notes.append(f"degrees not given: {why}; chose dp={plan.data_parallel} tp={plan.tp} pp={plan.pp}{experts} "
                 f"micro-batch {plan.micro} recompute={plan.recompute}{zero} ({DEFAULT_SCOPE})")
    return plan, notes


def _zero1_memory(evaluator: Any, data: Plan, zero1: str | None) -> float | None:
    """Bytes per device of pure data parallelism `data` at ZeRO-1 run as `zero1`; None where it is not tried (the
    user gave --zero) or its rules refuse it."""
    if zero1 is None:
        return None
    try:
        return evaluator.memory(data.with_(zero=1, zero_impl=zero1))["total"]
    except DlperfError:
        return None


def _data_parallel(evaluator: Any, data: Plan) -> tuple[int, Any, str]:
    """(ep, prediction or None, why it is not possible) of pure data parallelism: on a MoE model the fastest
    expert-parallel degree that fits, else the smallest one's prediction (it says how far from fitting)."""
    tried, why = [], ""
    for ep in expert_degrees(evaluator.model, data, data.dp):
        try:
            tried.append((ep, evaluator.predict(data.with_(ep=ep))))
        except DlperfError as err:
            why = why or f"pure data parallelism dp={data.dp} is not possible ({err})"
    fitting = [(ep, r) for ep, r in tried if r.fits]
    if fitting:
        return *min(fitting, key=lambda t: t[1].step_time_s), ""
    if tried:
        return *min(tried, key=lambda t: t[1].memory_bytes_per_device), ""
    return 1, None, why


def pipeline_micro_batch(global_batch: int, pp: int) -> int:
    """The largest micro-batch that gives at least 4*pp micro-batches and divides the batch (GPipe keeps the
    bubble (pp-1)/(m+pp-1) under ~20% with m >= 4pp; Huang et al. 2019, section 3)."""
    return max(d for d in _divisors(global_batch) if d == 1 or global_batch // d >= 4 * pp)


def strategy_plans(model: Any, hw: Any, devices: int, global_batch: int, dtype: str | None) -> list[tuple]:
    """(name, plan, prediction or None, note) for data, model (tensor), pipeline and best hybrid (which tries ZeRO 0
    and ZeRO-1, as a filled-in plan does)."""
    base = Plan(devices=devices, global_batch=global_batch, dtype=dtype)
    candidates = [
        ("data", base.with_(dp=devices)),
        ("model (tensor)", base.with_(dp=1, tp=devices)),
        ("pipeline", base.with_(dp=1, pp=devices, micro_batch=pipeline_micro_batch(global_batch, devices))),
    ]
    rows = []
    evaluator = _evaluator(model, hw)  # one for all four: the best hybrid's candidates include the first three's stages
    for name, plan in candidates:
        try:
            rows.append((name, plan, evaluator.predict(plan), ""))
        except DlperfError as err:
            rows.append((name, plan, None, str(err)))
    plan, result = best_plan(model, hw, base, ZERO1_IMPL, evaluator)
    rows.append(("best hybrid", plan, result, "" if plan else "no hybrid plan fits"))
    return rows
