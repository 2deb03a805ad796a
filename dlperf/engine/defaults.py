"""Filling in degrees a user left out, and the four strategies `dlperf compare` puts side by side."""

from __future__ import annotations

from typing import Any

from dlperf.errors import DlperfError, PlanError
from dlperf.mathx import divisors as _divisors
from dlperf.plan import Plan


def _try(model: Any, hw: Any, plan: Plan) -> Any:
    from dlperf.engine import predict

    try:
        return predict(model, hw, plan)
    except DlperfError:
        return None


def hybrid_candidates(model: Any, hw: Any, base: Plan) -> list[Plan]:
    """tp inside a node (powers of two), pp over what is left; the micro-batch and recomputation the user gave
    are kept, and only what was left out is searched (micro-batch 1 with pipelining, as Megatron-LM defaults;
    recomputation none, selective or full)."""
    node = hw.network[0].size or 1
    n = base.devices
    recomputes = (base.recompute,) if base.recompute != "none" else ("none", "selective", "full")
    plans = []
    for tp in (d for d in _divisors(n) if d <= node and d & (d - 1) == 0):
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            if base.global_batch % dp:
                continue
            micro = base.micro_batch if base.micro_batch is not None else (1 if pp > 1 else None)
            for recompute in recomputes:
                plans.append(base.with_(tp=tp, pp=pp, dp=dp, micro_batch=micro, recompute=recompute))
    return plans


def best_plan(model: Any, hw: Any, base: Plan) -> tuple[Plan | None, Any]:
    best, best_result = None, None
    for plan in hybrid_candidates(model, hw, base):
        result = _try(model, hw, plan)
        if result is not None and result.fits and (best_result is None or
                                                   result.step_time_s < best_result.step_time_s):
            best, best_result = plan, result
    return best, best_result


def default_plan(model: Any, hw: Any, base: Plan, notes: list[str]) -> tuple[Plan, list[str]]:
    """Pure data parallelism when it fits; otherwise the fastest fitting tp x pp (x dp) plan. The note says
    why data parallelism was not chosen. A batch that pure data parallelism cannot split, for a model that
    would fit under it, is an error naming the batch: running it tensor-parallel instead would be a surprise."""
    from dlperf.engine import predict
    from dlperf.units import format_quantity as q

    n, batch = base.devices, base.global_batch
    data = base.with_(dp=n, tp=1, pp=1)
    # judged at the next batch that splits evenly when this one does not: would the model fit at all?
    probe = data if batch % n == 0 else data.with_(global_batch=n * -(-batch // n))
    try:
        result, why = predict(model, hw, probe), ""
    except DlperfError as err:
        result, why = None, f"pure data parallelism dp={n} is not possible ({err})"
    if result is not None and result.fits:
        if batch % n:
            raise PlanError(f"global batch {batch} does not split over {n} devices under pure data parallelism "
                            f"(the default when no degree is given)",
                            expected=f"a multiple of {n} (e.g. {max(n, n * (batch // n))} or {n * -(-batch // n)}), "
                                     f"or degrees given with --dp/--tp/--pp", found=batch)
        notes.append(f"degrees not given: pure data parallelism dp={n} (the model fits)")
        return data, notes
    if result is not None:
        why = (f"pure data parallelism dp={n} does not fit ({q(result.memory_bytes_per_device, 'bytes')} per "
               f"device of {q(hw.device.memory, 'bytes')})")
    plan, _ = best_plan(model, hw, base)
    if plan is None:
        notes.append(f"no plan fits in device memory: {why}; showing pure data parallelism")
        return data, notes
    micro = f" micro-batch {plan.micro}" if plan.pp > 1 else ""
    notes.append(f"degrees not given: {why}; chose dp={plan.data_parallel} tp={plan.tp} pp={plan.pp}{micro} "
                 f"recompute={plan.recompute} (fastest that fits)")
    return plan, notes


def pipeline_micro_batch(global_batch: int, pp: int) -> int:
    """The largest micro-batch that gives at least 4*pp micro-batches and divides the batch (GPipe keeps the
    bubble (pp-1)/(m+pp-1) under ~20% with m >= 4pp; Huang et al. 2019, section 3)."""
    return max(d for d in _divisors(global_batch) if d == 1 or global_batch // d >= 4 * pp)


def strategy_plans(model: Any, hw: Any, devices: int, global_batch: int, dtype: str | None) -> list[tuple]:
    """(name, plan, prediction or None, note) for data, model (tensor), pipeline and best hybrid."""
    base = Plan(devices=devices, global_batch=global_batch, dtype=dtype)
    candidates = [
        ("data", base.with_(dp=devices)),
        ("model (tensor)", base.with_(dp=1, tp=devices)),
        ("pipeline", base.with_(dp=1, pp=devices, micro_batch=pipeline_micro_batch(global_batch, devices))),
    ]
    rows = []
    for name, plan in candidates:
        try:
            from dlperf.engine import predict

            rows.append((name, plan, predict(model, hw, plan), ""))
        except DlperfError as err:
            rows.append((name, plan, None, str(err)))
    plan, result = best_plan(model, hw, base)
    rows.append(("best hybrid", plan, result, "" if plan else "no hybrid plan fits"))
    return rows
