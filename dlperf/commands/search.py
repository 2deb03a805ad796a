"""`dlperf search`, `dlperf sweep` and `dlperf explain`: rank plans, scaling curves, sensitivities."""

from __future__ import annotations

from typing import Any

import click

from dlperf.commands.common import (
    EXIT_NO,
    Count,
    Finite,
    PlotPath,
    exit_unless_fits,
    folded_note,
    format_option,
    name_list,
    set_option,
    warn,
    wrote,
)
from dlperf.commands.predict import BATCH, DTYPE_CHOICES, _load, build_plan, config_notes, plan_options
from dlperf.plan import FP8_WEIGHT_TRANSPOSES, MOMENT_DTYPES
from dlperf.report import render, to_json

BREAKDOWN_COLUMNS = ["compute/forward", "compute/backward", "compute/recompute", "compute/grad_accumulation",
                     "compute/straggler", "comm/tp", "comm/ep", "comm/cp", "overhead/host", "comm/host_offload",
                     "comm/pp_p2p", "pipeline/bubble", "comm/dp_allreduce", "optimizer", "overhead/metric_sync",
                     "input/cpu"]


def _degrees(option: str, text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): positive integers."""
    from dlperf.errors import PlanError

    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise PlanError(option, expected="a list of positive integers like 1,2,4", found=text) from None
    if not values or min(values) < 1:
        raise PlanError(option, expected="a list of positive integers like 1,2,4", found=text)
    return values


def _memory_option(text: str | None) -> float | None:
    """--max-memory with its unit: a bare '40' would be read as 40 bytes, which nobody means."""
    if text is None:
        return None
    from dlperf.errors import DlperfError, SpecError
    from dlperf.units import parse_quantity

    if not any(c.isalpha() for c in text):
        raise SpecError(field="--max-memory", expected="a size with its unit such as '40 GiB'", found=text)
    try:
        return parse_quantity(text, "bytes")
    except DlperfError as err:
        raise err.located(field="--max-memory") from None


@click.command("search")
@click.argument("model")
@click.argument("hardware")
@set_option
@click.option("--gpus", "devices", required=True,
              help="Number of devices to plan for, or a range/list (512..4096 = powers of two; 64,128,256) to "
                   "find the best device count.")
@click.option("--global-batch", type=BATCH, required=True, help="Samples per step over all replicas.")
@click.option("--top", type=Count(1, 10_000), default=5, show_default=True,
              help="How many of the best plans to show.")
@click.option("--max-step-time", type=Finite(0, low_open=True), default=None,
              help="Time budget: drop plans slower than this many seconds per step (with --objective cost, the "
                   "cheapest plan that meets it).")
@click.option("--max-memory", default=None, help="Per-device memory cap, e.g. '40 GiB' (default: the device's).")
@click.option("--objective", type=click.Choice(["time", "cost"]), default="time", show_default=True,
              help="Rank by step time, or by cost per step (device-hours x price; also tries fewer devices).")
@click.option("--max-micro-batch", type=BATCH, default=8, show_default=True,
              help="Largest power-of-two micro-batch tried (the whole per-replica batch is always tried).")
@click.option("--uneven-stages", is_flag=True,
              help="Also try pipeline depths that do not divide the layer count (slower: balanced partition).")
@click.option("--ep", "ep_degrees", default=None,
              help="Expert-parallel degrees to try, e.g. 1,8,64 (default: every power of two that divides dp*cp and "
                   "the expert count, or tp*dp*cp with the experts unsplit at expert tp 1, which is tried beside "
                   "the dense layers' split at tp > 1; MoE models only).")
@click.option("--cp", "cp_degrees", default="1", show_default=True,
              help="Context-parallel degrees to try, e.g. 1,2,4,8 (long sequences).")
@click.option("--cp-algorithm", type=click.Choice(["ring", "ulysses"]), default="ring", show_default=True,
              help="Context parallelism by ring attention or Ulysses all-to-alls.")
@click.option("--dtype", type=DTYPE_CHOICES, default=None, help="Compute dtype (default: the model's).")
@click.option("--cudnn", default=None, metavar="VERSION",
              help="cuDNN version fused attention runs, e.g. 9.13.1 (as `dlperf predict --cudnn`).")
@click.option("--moment-dtype", type=click.Choice(list(MOMENT_DTYPES)), default="fp32", show_default=True,
              help="Dtype of the optimizer's moments (as `dlperf predict --moment-dtype`).")
@click.option("--fp8-weight-transpose", type=click.Choice(list(FP8_WEIGHT_TRANSPOSES)), default="cached",
              show_default=True, help="With --dtype fp8: FP8 weight copies kept (as `dlperf predict "
                                      "--fp8-weight-transpose`).")
@click.option("--cuda-graphs", default="", metavar="SCOPE[,SCOPE]",
              help="Modules every plan runs under CUDA graphs, e.g. attn,moe_router (as `dlperf predict "
                   "--cuda-graphs`). Default: eager.")
@format_option
def search(model: str, hardware: str, sets: tuple[str, ...], devices: str, global_batch: int, top: int,
           max_step_time: float | None, max_memory: str | None, objective: str, max_micro_batch: int,
           uneven_stages: bool, ep_degrees: str | None, cp_degrees: str, cp_algorithm: str, dtype: str | None,
           cudnn: str | None, moment_dtype: str, fp8_weight_transpose: str, cuda_graphs: str, fmt: str) -> None:
    """Enumerate parallel plans for MODEL on HARDWARE, keep those that fit, print the best."""
    from dlperf.ops.moe import has_experts
    from dlperf.plan import Plan, check_cuda_graphs, check_fp8_weight_transpose, cudnn_version
    from dlperf.search import SearchSpace, parse_gpu_list, terminal_progress
    from dlperf.search import search as run

    if cudnn is not None:  # refused here: search skips a plan its rules refuse, which would hide the typo
        cudnn_version(cudnn, "--cudnn")
    graphs = name_list(cuda_graphs)
    check_cuda_graphs(graphs)  # refused here too, for the same reason
    check_fp8_weight_transpose(fp8_weight_transpose, dtype)
    spec, hw = _load(model, hardware, sets)
    space = SearchSpace(max_micro_batch=max_micro_batch, uneven_stages=uneven_stages,
                        ep=_degrees("--ep", ep_degrees) if ep_degrees else None, cp=_degrees("--cp", cp_degrees))
    counts = parse_gpu_list(devices)
    result = run(spec, hw, counts if len(counts) > 1 else counts[0], global_batch, objective=objective,
                 max_memory=_memory_option(max_memory),
                 base=Plan(dtype=dtype, cp_algorithm=cp_algorithm, cudnn=cudnn, cuda_graphs=graphs,
                           moment_dtype=moment_dtype, fp8_weight_transpose=fp8_weight_transpose),
                 space=space,
                 progress=terminal_progress("searching plans"), max_step_time=max_step_time)
    rows = result.rows(top)
    if not rows:
        _no_plan(result, fmt)
        raise SystemExit(EXIT_NO)
    # JSON and CSV hold plain numbers: the device count (or the list of counts searched), not the option's text
    summary = {"model": spec.name, "hardware": hw.name, "devices": counts[0] if len(counts) == 1 else counts,
               "global_batch": global_batch,
               "objective": objective, "cost_unit": "USD" if hw.price_per_device_hour else "device-hours",
               "considered": result.considered, "folded": result.folded, "feasible": result.feasible,
               "search_seconds": result.elapsed_s}
    if fmt in ("json", "csv"):
        click.echo(to_json({**summary, "plans": rows}) if fmt == "json" else render(rows, "csv"))
        return
    title = (f"{spec.name} on {devices} x {hw.device.name} ({hw.name}), global batch {global_batch}: "
             f"{_considered(result)}, {result.feasible:,} fit; best {len(rows)} by {objective}")
    plan_cols = ["rank", "dp", "tp", "pp", "micro_batch", "schedule", "virtual_stages", "zero", "recompute",
                 "sequence_parallel", "step_time_s", "samples_per_s", "memory_gib"]
    # context and expert parallelism's columns where they vary; the expert ones only for a model with experts,
    # where ep 1 is a choice (a dense model's ep is 1, its dispatcher unused, whatever the plan)
    extra = ["cp"] if any(r["cp"] > 1 for r in rows) else []
    if has_experts(spec) and any(r["ep"] > 1 or r["cp"] > 1 for r in rows):
        folds = any(r["etp"] != r["tp"] for r in rows)  # an etp column only where some plan folds its experts
        extra += ["ep", *(["etp"] if folds else []), "ep_overlap", "ep_dispatcher"]
    plan_cols = plan_cols[:4] + extra + plan_cols[4:]
    if any(r["recompute_modules"] for r in rows):
        plan_cols.insert(plan_cols.index("recompute") + 1, "recompute_modules")
        rows = [{**r, "recompute_modules": r["recompute_modules"] or "-"} for r in rows]  # none, for people
    if any(r["fp8_activations"] for r in rows):
        plan_cols.insert(plan_cols.index("recompute") + 1, "fp8_activations")
    if objective == "cost" or len(counts) > 1:
        plan_cols = ["rank", "devices"] + plan_cols[1:] + (["cost_per_step"] if objective == "cost" else [])
    if objective == "cost":
        unit = "USD" if hw.price_per_device_hour else "device-hours"
        plan_cols[plan_cols.index("cost_per_step")] = f"cost_per_step ({unit})"
        rows = [{**r, f"cost_per_step ({unit})": r["cost_per_step"]} for r in rows]
    click.echo(render(rows, "table", columns=plan_cols, title=title))
    if rows:
        shown = [k for k in BREAKDOWN_COLUMNS if any(r.get(k) for r in rows)]  # a part no plan has is noise here
        short = [{"rank": r["rank"], **{k: r.get(k, 0.0) for k in shown}} for r in rows]
        click.echo("\nstep-time breakdown")
        click.echo(render(short, "table", kinds=dict.fromkeys(shown, "time")))


def _considered(result: Any) -> str:
    """'N plans considered', with the plans left out as another's twin under a new name (search._no_ops)."""
    folded = f" ({result.folded:,} equivalent ones folded)" if result.folded else ""
    return f"{result.considered:,} plans considered{folded}"


def _no_plan(result: Any, fmt: str) -> None:
    """Nothing fits (or meets the time budget): say why, with the smallest memory any plan needed."""
    from dlperf.units import format_quantity as q

    if result.too_slow:
        why = f"{result.too_slow:,} fit in memory but none meets --max-step-time"
    elif result.smallest is None:
        why = "no plan is valid for this device count and batch"
    else:
        p = result.smallest.plan
        why = (f"the smallest needs {q(result.smallest.memory_bytes_per_device, 'bytes')} per device "
               f"(dp={p.data_parallel} tp={p.tp} pp={p.pp} micro-batch {p.micro} zero {p.zero} recompute "
               f"{p.recompute}), the limit is {q(result.memory_limit, 'bytes')}")
    message = f"no plan fits: {_considered(result)}; {why}"
    if fmt == "json":
        click.echo(to_json({"plans": [], "considered": result.considered, "feasible": 0, "message": message}))
    warn(message)


@click.command("sweep")
@click.argument("model")
@click.argument("hardware")
@set_option
@click.option("--gpus", "gpus", required=True,
              help="Device counts: a list '1,2,4,8' or a range '1..256' (powers of two).")
@click.option("--strategy", type=click.Choice(["data", "model", "pipeline", "hybrid", "best"]), default="data",
              show_default=True, help="How each point parallelizes (best = full plan search per point).")
@click.option("--weak/--strong", default=False, show_default=True,
              help="Weak: fixed per-device batch. Strong: fixed global batch.")
@click.option("--global-batch", type=BATCH, default=None,
              help="Strong: the global batch (default 32 x largest count). Weak: the batch at the first count "
                   "(default 32 per device).")
@click.option("--micro-batch", type=BATCH, default=None,
              help="Largest micro-batch per replica for data/model/pipeline; bigger per-replica batches use "
                   "gradient accumulation (default 32; pipeline: global batch / (4 x GPUs)).")
@click.option("--dtype", type=DTYPE_CHOICES, default=None, help="Compute dtype (default: the model's).")
@click.option("--plot", type=PlotPath(), default=None,
              help="Write the scaling figure (.png, .svg or .pdf).")
@format_option
def sweep(model: str, hardware: str, sets: tuple[str, ...], gpus: str, strategy: str, weak: bool,
          global_batch: int | None, micro_batch: int | None, dtype: str | None, plot: str | None, fmt: str) -> None:
    """Strong or weak scaling of MODEL on HARDWARE: step time, throughput, speedup, parallel efficiency."""
    from dlperf.search import parse_gpu_list, terminal_progress
    from dlperf.search import sweep as run

    spec, hw = _load(model, hardware, sets)
    result = run(spec, hw, parse_gpu_list(gpus), strategy=strategy, weak=weak, global_batch=global_batch,
                 micro_batch=micro_batch, dtype=dtype, progress=terminal_progress("sweeping"))
    if plot:
        from dlperf.plot import scaling_chart

        scaling_chart([result], plot)
        wrote(plot)
    title = f"{spec.name} on {hw.name}, {strategy} parallelism, {result.mode} scaling"
    click.echo(render(result.rows(), fmt, title=title))
    _warn_sweep(result)


def _warn_sweep(result: Any) -> None:
    """Points without a prediction or whose plan does not fit are rows like the others: say so on stderr."""
    rows = result.rows()
    missing = [str(r["gpus"]) for r in rows if r["samples_per_s"] is None]
    too_big = [str(r["gpus"]) for r in rows if r["samples_per_s"] is not None and not r["fits"]]
    if too_big:
        warn(f"the plan does not fit in device memory at {', '.join(too_big)} GPUs (fits = no)")
    if missing:
        warn(f"no prediction at {', '.join(missing)} GPUs (see the note column)")


@click.command("explain")
@click.argument("model")
@click.argument("hardware")
@set_option
@plan_options
@click.option("--step", type=Finite(0, 1, low_open=True), default=0.10, show_default=True,
              help="Relative change applied to each hardware constant (0.10 = +10%).")
@format_option
def explain(model: str, hardware: str, sets: tuple[str, ...], step: float, fmt: str, **opts: Any) -> None:
    """Sensitivity of step time to each hardware constant and plan knob, and the bottleneck."""
    from dlperf.search import explain as run
    from dlperf.search import format_change
    from dlperf.units import format_quantity

    spec, hw = _load(model, hardware, sets)
    plan, notes = build_plan(spec, hw, opts)
    notes = config_notes(model, sets, spec) + notes
    out = run(spec, hw, plan, step)
    rows = out["sensitivities"]
    if fmt == "json":
        click.echo(to_json({"step_time_s": out["prediction"].step_time_s, "bottleneck": out["bottleneck"],
                            "bottleneck_share": out["bottleneck_share"], "plan": out["prediction"].plan,
                            "sensitivities": rows, "refused": out["refused"],
                            "notes": notes + out["prediction"].notes}))
        exit_unless_fits(out["prediction"])
        return
    if fmt == "csv":
        click.echo(render(rows, "csv"))
        exit_unless_fits(out["prediction"])
        return
    r = out["prediction"]
    notes = notes + r.notes
    p = r.plan
    extra = "".join(f" {k}={p[k]}" for k in ("cp", "ep") if p.get(k, 1) > 1) + folded_note(p)
    lines = [f"{spec.name} on {p['devices']} x {hw.device.name}: dp={p['dp']} tp={p['tp']} pp={p['pp']}{extra}, "
             f"step time {format_quantity(r.step_time_s, 'time')}"]
    lines += [f"note: {n}" for n in notes]
    lines.append(f"bottleneck: {out['bottleneck']} ({100 * out['bottleneck_share']:.1f}% of the step)")
    lines.append("sensitivities (each computed by re-predicting with that one constant or knob changed):")
    width = max(len(row["change"]) for row in rows)
    lines += [f"  {row['change']:<{width}} -> {format_change(row['step_time_change'])} step time" for row in rows]
    if out["refused"]:
        lines.append("knob changes this plan cannot take:")
        lines += [f"  {row['change']}: {row['reason']}" for row in out["refused"]]
    lines += _closed_form_lines(spec, hw, plan, p["dtype"])
    click.echo("\n".join(lines))
    exit_unless_fits(r)


def _closed_form_lines(spec: Any, hw: Any, plan: Any, dtype: str) -> list[str]:
    """The one-device closed form of a micro-batch's compute and its symbolic elasticities d ln T / d ln X."""
    from dlperf.engine.symbolic import elasticities
    from dlperf.units import format_quantity

    forms = elasticities(spec, hw.for_cudnn(plan.cudnn), dtype, plan.micro, plan.memory_format == "nchw",
                         plan.fp8_scaling, plan.mx_swizzle, plan.fp8_weight_transpose)
    lines = [f"closed form T(B) (one device, forward+backward of a micro-batch, B = {plan.micro}: "
             f"{format_quantity(forms['T_value'], 'time')}; `dlperf predict --symbolic` prints it), its derivatives:"]
    lines += [f"  d ln T / d ln {label:<26} = {value:+.3f}" for label, value in forms.items() if label != "T_value"]
    return lines
