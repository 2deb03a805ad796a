"""`dlperf predict` and `dlperf compare`: one plan's step time and memory, or strategies side by side."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from dlperf.commands.common import (
    Count,
    Finite,
    PlotPath,
    exit_unless_fits,
    folded_note,
    format_option,
    name_list,
    parse_sets,
    set_option,
    wrote,
)
from dlperf.plan import (
    DP_IMPLS,
    DTYPES,
    EP_DISPATCHERS,
    FP8_SCALINGS,
    FP8_WEIGHT_TRANSPOSES,
    GRAD_DTYPES,
    MOMENT_DTYPES,
    MX_SWIZZLES,
    OPTIMIZER_IMPLS,
    ZERO_IMPLS,
)
from dlperf.report import render, to_json

DTYPE_CHOICES = click.Choice(DTYPES)
GRAD_DTYPE_CHOICES = click.Choice(GRAD_DTYPES)
POSITIVE = Count(1, 2**20)     # degrees and device counts: at most dlperf.plan.MAX_DEVICES
BATCH = Count(1, 2**40)        # samples: at most dlperf.plan.MAX_BATCH


def plan_options(fn: Callable) -> Callable:
    """Every plan knob as an option (shared by predict, explain and search-like commands)."""
    options = [
        click.option("--gpus", "devices", type=POSITIVE, default=None,
                     help="Number of devices (default: dp*tp*pp*cp, 1 when no degree is given)."),
        click.option("--dp", type=POSITIVE, default=None,
                     help="Data-parallel degree (default: devices/(tp*pp*cp)). With none of --dp, --tp, --pp, --ep, "
                          "--etp and --cp given, the degrees are filled in: pure data parallelism when the model fits, "
                          "else the fastest plan that fits; a note says which."),
        click.option("--tp", type=POSITIVE, default=None, help="Tensor (model) parallel degree (default: 1)."),
        click.option("--pp", type=POSITIVE, default=None, help="Pipeline-parallel degree (stages; default: 1)."),
        click.option("--cp", type=POSITIVE, default=1, show_default=True,
                     help="Context-parallel degree: each sequence split over this many ranks."),
        click.option("--cp-algorithm", type=click.Choice(["ring", "ulysses"]), default="ring", show_default=True,
                     help="Context parallelism by ring attention (KV blocks passed around, overlapped) or by "
                          "Ulysses all-to-alls over heads."),
        click.option("--zero-impl", type=click.Choice(list(ZERO_IMPLS)), default=None,
                     help="How ZeRO runs (default: fsdp; a ZeRO-1 plan filled in without --zero: megatron): at "
                          "ZeRO-3, PyTorch FSDP's per-block gathers with prefetch (fp32 shards), "
                          "Megatron-Core's FSDP (the same gathers; a 16-bit or FP8 weight shard beside fp32 main "
                          "weights), or DeepSpeed v0.3's stage 3 (per-tensor list gathers, device-wide syncs, "
                          "bucketed allreduce). At ZeRO-2 with overlap, fsdp is FSDP's SHARD_GRAD_OP; at ZeRO-1, "
                          "megatron is Megatron-Core's distributed optimizer (its parameter gather hidden behind "
                          "the next forward when the gradient reduction overlaps: by default only at pp 1)."),
        click.option("--dp-impl", type=click.Choice(list(DP_IMPLS)), default="nccl", show_default=True,
                     help="Who runs the data-parallel gradient allreduce: the framework calling NCCL in buckets (DDP, "
                          "Megatron-Core), Horovod v0.18-v0.20's background thread (5 ms negotiation cycle, 64 MiB "
                          "fusion buffers, TensorFlow-side casts and averaging; dlperf.engine.horovod) or "
                          "post-backward (the gradients flattened, all-reduced and copied back after the backward "
                          "pass, never overlapped: DeepSpeed's engine without ZeRO, Megatron-LM's local DDP of "
                          "2019-2021; dlperf.engine.post_backward)."),
        click.option("--ep", type=POSITIVE, default=1, show_default=True,
                     help="Expert-parallel degree: MoE experts sharded over this many ranks of the data-parallel "
                          "group (of all tp*dp*cp ranks with --etp 1)."),
        click.option("--etp", type=POSITIVE, default=None,
                     help="Expert tensor-parallel degree (Megatron-Core's --expert-tensor-parallel-size; default: "
                          "tp). 1 runs the experts unsplit on a grid of their own (MoE parallel folding): ep*etp "
                          "must divide tp*dp*cp, so ep may span the tensor-parallel ranks; needs "
                          "--sequence-parallel."),
        click.option("--ep-overlap", is_flag=True,
                     help="Hide expert all-to-alls behind an adjacent micro-batch's compute (Megatron-Core's "
                          "combined 1F1B, --overlap-moe-expert-parallel-comm; DeepSeek-V3's DualPipe pairing)."),
        click.option("--p2p-overlap", is_flag=True,
                     help="With --schedule interleaved: post the steady state's pipeline sends/recvs asynchronously "
                          "beside the next chunk's compute (Megatron-Core overlap_p2p_comm, which Megatron-Bridge "
                          "turns on whenever vp > 1); warm-up and cool-down sends stay blocking."),
        click.option("--moe-imbalance", type=Finite(1, 1000), default=None,
                     help="Tokens of the busiest expert-parallel rank over the mean (default 1.25, Switch "
                          "Transformer's capacity factor)."),
        click.option("--global-batch", type=BATCH, default=None,
                     help="Samples per step over all replicas (default: one per device)."),
        click.option("--micro-batch", type=BATCH, default=None,
                     help="Samples per micro-batch per replica (default: 1 with pipelining, else the whole "
                          "per-replica batch in one pass)."),
        click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "dualpipe"]), default="1f1b",
                     show_default=True, help="Pipeline schedule (dualpipe: DeepSeek-V3's bidirectional pipeline, "
                                             "expert all-to-alls hidden behind paired chunks; needs an even pp)."),
        click.option("--virtual-stages", type=POSITIVE, default=1, show_default=True,
                     help="Model chunks per device for the interleaved schedule."),
        click.option("--zero", type=Count(0, 3), default=None,
                     help="ZeRO stage (sharded data parallelism; 3 = FSDP). Default: 0; where the degrees are filled "
                          "in, 0 or 1 (the optimizer states sharded over dp, Megatron-Core's distributed optimizer "
                          "unless --zero-impl says otherwise), whichever gives the faster plan that fits."),
        click.option("--recompute", type=click.Choice(["none", "selective", "full", "except_last"]),
                     default="none",
                     show_default=True,
                     help="Activation recomputation (except_last: full for every micro-batch but the last, "
                          "torchgpipe's default)."),
        click.option("--recompute-modules", default="", show_default=False,
                     help="Comma-separated layer parts recomputed in backward instead of kept: layernorm (every "
                          "norm), mla_up_proj, moe_act (Megatron-Core's --recompute-modules; DeepSeek-V3 Sec. "
                          "3.2.3, 3.3.3)."),
        click.option("--fp8-activations", is_flag=True,
                     help="With --dtype fp8: cache the Linear inputs inside MLA and MoE layers in FP8 (the "
                          "attention output projection's in E5M6), as DeepSeek-V3 does (Sec. 3.3.3)."),
        click.option("--ep-dispatcher", type=click.Choice(list(EP_DISPATCHERS)), default="alltoall",
                     show_default=True,
                     help="Expert token transport: NCCL all-to-alls (BF16, hierarchical legs in sequence), "
                          "DeepEP (FP8 dispatch under --dtype fp8, BF16 combine, IB and NVLink legs overlapped, "
                          "20 SMs; DeepSeek-V3 Sec. 3.2.2, 3.3.3) or HybridEP (DeepEP's hybrid-ep kernels as "
                          "Megatron-Core runs them: BF16 both ways, legs overlapped, 32 SMs)."),
        click.option("--memory-format", type=click.Choice(["nhwc", "nchw"]), default="nhwc", show_default=True,
                     help="Activation layout of convolutions: nhwc (PyTorch channels_last) or nchw (PyTorch's "
                          "default), where each tensor-core convolution pays cuDNN's NCHW <-> NHWC transposes."),
        click.option("--cuda-graphs", default="", metavar="SCOPE[,SCOPE]",
                     help="Comma-separated modules captured as CUDA graphs, Megatron-Core's cuda_graph_scope names: "
                          "attn, mlp, moe, moe_router, moe_preprocess, mamba, full_iteration. Their kernels cost the "
                          "host nothing; each replay one dispatch (dlperf.engine.cuda_graphs). Default: eager."),
        click.option("--optimizer-impl", type=click.Choice(list(OPTIMIZER_IMPLS)), default="fused",
                     show_default=True,
                     help="How the optimizer step runs: fused (one pass over all parameters), per-tensor "
                          "(PyTorch < 2.0's torch.optim loop: a few kernels per parameter tensor, each paying the "
                          "host; after AMP's GradScaler sync the step waits for the host, dlperf.engine."
                          "optimizer_loop), tf1-graph (a TensorFlow 1 graph-mode update branch per variable; "
                          "after Horovod's allreduce the step waits for the host, dlperf.engine.tf1_update) or "
                          "deepspeed-fp16 / megatron-fp16-2020 (DeepSpeed's and Megatron-LM 2019-2020's "
                          "FP16_Optimizer: a host-synced overflow check per gradient tensor, gradient copies, fp16 "
                          "weight refresh; "
                          "dlperf.engine.fp16_wrappers)."),
        click.option("--data-backend", type=click.Choice(["synthetic", "cpu"]), default="synthetic", show_default=True,
                     help="Where samples come from: synthetic (on the device, no cap) or cpu (a DataLoader of "
                          "--loader-workers processes per training process running --input-ops; caps the step "
                          "when slower than the GPU, dlperf.engine.input)."),
        click.option("--loader-workers", type=int, default=0, show_default=True,
                     help="CPU loader worker processes per training process (--data-backend cpu); where the "
                          "hardware file gives device.host.cores, at most the node's spare cores per process count."),
        click.option("--offload-layers", type=int, default=0, show_default=True,
                     help="Transformer layers whose saved activations go to host memory during forward and come "
                          "back for backward (Megatron-Core --cpu-offloading-num-layers through Transformer "
                          "Engine; pp 1; needs device.host_link in the hardware file). Counted in copies of the "
                          "model's repeated block: one per layer, except where a block holds two (gpt-oss's pair)."),
        click.option("--input-ops", default="", show_default=False,
                     help="Comma-separated per-sample CPU work of the loader, e.g. "
                          "jpeg-decode-pillow,rrc224-flip-pillow,fast-collate (fast-collate-nhwc: into a "
                          "channels_last batch; dlperf.engine.input.INPUT_COSTS)."),
        click.option("--grad-passes", default="", show_default=False,
                     help="Comma-separated passes the training script makes over every micro-batch's gradient "
                          "besides accumulating it, e.g. amp-casts,unscale,finite-check,global-norm,clip "
                          "(dlperf.engine.grad_passes.GRAD_PASSES: DeepLearningExamples' TensorFlow 1 BERT)."),
        click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism (needs tp > 1)."),
        click.option("--no-overlap", is_flag=True, help="Do not overlap the gradient allreduce with backward."),
        click.option("--tp-overlap", is_flag=True,
                     help="Overlap tensor-parallel all-gathers/reduce-scatters with the GEMMs (Megatron-Core "
                          "--tp-comm-overlap; needs --sequence-parallel)."),
        click.option("--fp8-param-gather", is_flag=True,
                     help="With an FP8 recipe (--dtype fp8, mxfp8, nvfp4) and ZeRO: the FP8 layers keep no 16-bit "
                          "weight and the distributed optimizer all-gathers parameters as their FP8 casts (MXFP8: "
                          "in bf16, quantized on copy) (Megatron --fp8-param-gather)."),
        click.option("--fp8-scaling", type=click.Choice(list(FP8_SCALINGS)), default="delayed", show_default=True,
                     help="With --dtype fp8: scales from an amax history (Transformer Engine's DelayedScaling) or "
                          "from each tensor as it is cast (Float8CurrentScaling, Megatron-Bridge's FP8-CS: an amax "
                          "pass and a scale kernel before every cast, per expert in a grouped GEMM)."),
        click.option("--fp8-weight-transpose", type=click.Choice(list(FP8_WEIGHT_TRANSPOSES)), default="cached",
                     show_default=True,
                     help="With --dtype fp8: keep each weight's FP8 copy and its FP8 transpose (Transformer "
                          "Engine), or one FP8 copy transposed by a kernel before each GEMM that reads the other "
                          "layout, every micro-batch (per_use: DeepSeek-V3's framework, deepseek-ai/profile-data)."),
        click.option("--mx-swizzle", type=click.Choice(list(MX_SWIZZLES)), default="quantize", show_default=True,
                     help="With --dtype mxfp8: which GEMM operands have their block scales swizzled for cuBLASLt by "
                          "kernels of their own: the weights and sequence-parallel gathers (Transformer Engine >= "
                          "2.12) or both operands of every GEMM (gemm: Transformer Engine < 2.12)."),
        click.option("--cudnn", default=None, metavar="VERSION",
                     help="cuDNN version Transformer Engine's fused attention runs, e.g. 9.13.1: priced at the "
                          "hardware file's curve measured at the newest version at or below it (its oldest when "
                          "none is; efficiency.attention_fa3.by_cudnn). Default: the file's own curve."),
        click.option("--compression", default="none", show_default=True,
                     help="Gradient compression: none, fp16, int8, 1bit, terngrad, qsgd:S, topk:FRACTION."),
        click.option("--consistency", type=click.Choice(["sync", "ssp", "async"]), default="sync",
                     show_default=True, help="Synchronous, stale-synchronous or asynchronous SGD."),
        click.option("--staleness", type=Count(0, 2**20), default=0, show_default=True,
                     help="SSP staleness bound."),
        click.option("--hybrid-fc", is_flag=True,
                     help="Krizhevsky's 'one weird trick': data-parallel convolutions, model-parallel FC layers."),
        click.option("--parameter-server", type=Count(0, 2**20), default=0, show_default=True,
                     help="Use N sharded parameter servers instead of allreduce (0 = allreduce)."),
        click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]), default="adam",
                     show_default=True, help="Optimizer update rule."),
        click.option("--moment-dtype", type=click.Choice(list(MOMENT_DTYPES)), default="fp32", show_default=True,
                     help="Dtype of the optimizer's moments (Adam's two, momentum's buffer); bf16 as DeepSeek-V3 "
                          "keeps AdamW's (Sec. 3.3.3; master weights stay fp32)."),
        click.option("--dtype", type=DTYPE_CHOICES, default=None, help="Compute dtype (default: the model's)."),
        click.option("--grad-dtype", type=GRAD_DTYPE_CHOICES, default=None,
                     help="Dtype gradients are reduced and kept in (default: the compute dtype's storage type; fp32 "
                          "= FSDP MixedPrecision reduce_dtype fp32, composer's 'DEFAULT'); parameters are still "
                          "gathered in the compute dtype."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_plan(model: Any, hw: Any, opts: dict[str, Any]) -> tuple[Any, list[str]]:
    """A Plan from CLI options; degrees left out are filled in (pure data parallelism when it fits)."""
    from dlperf.plan import Plan

    tp, pp, dp = opts.get("tp"), opts.get("pp"), opts.get("dp")
    devices = opts.get("devices")
    cp = opts.get("cp") or 1
    devices = (dp or 1) * (tp or 1) * (pp or 1) * cp if devices is None else devices
    notes = []
    batch = opts.get("global_batch")
    if batch is None:
        batch = devices
        notes.append(f"global batch not given: using {batch} (one sample per device)")
    base = Plan(
        devices=devices, dp=dp, tp=tp or 1, pp=pp or 1, global_batch=batch, micro_batch=opts.get("micro_batch"),
        schedule=opts.get("schedule", "1f1b"), virtual_stages=opts.get("virtual_stages", 1), zero=opts.get("zero") or 0,
        recompute=opts.get("recompute", "none"), sequence_parallel=opts.get("sequence_parallel", False),
        overlap=False if opts.get("no_overlap") else None, compression=opts.get("compression", "none"),
        consistency=opts.get("consistency", "sync"), staleness=opts.get("staleness", 0),
        parameter_server=opts.get("parameter_server", 0), optimizer=opts.get("optimizer", "adam"),
        hybrid_fc=opts.get("hybrid_fc", False), tp_overlap=opts.get("tp_overlap", False),
        fp8_param_gather=opts.get("fp8_param_gather", False), fp8_scaling=opts.get("fp8_scaling") or "delayed",
        fp8_weight_transpose=opts.get("fp8_weight_transpose") or "cached",
        moment_dtype=opts.get("moment_dtype") or "fp32",
        mx_swizzle=opts.get("mx_swizzle") or "quantize", cudnn=opts.get("cudnn"),
        dtype=opts.get("dtype"), grad_dtype=opts.get("grad_dtype"),
        ep=opts.get("ep") or 1, etp=opts.get("etp"), cp=cp, cp_algorithm=opts.get("cp_algorithm") or "ring",
        moe_imbalance=opts.get("moe_imbalance"), ep_overlap=opts.get("ep_overlap", False),
        p2p_overlap=opts.get("p2p_overlap", False),
        zero_impl=opts.get("zero_impl") or "fsdp", dp_impl=opts.get("dp_impl") or "nccl",
        recompute_modules=name_list(opts.get("recompute_modules")),
        fp8_activations=opts.get("fp8_activations", False), ep_dispatcher=opts.get("ep_dispatcher") or "alltoall",
        memory_format=opts.get("memory_format") or "nhwc",
        data_backend=opts.get("data_backend") or "synthetic", loader_workers=opts.get("loader_workers") or 0,
        input_ops=name_list(opts.get("input_ops")), grad_passes=name_list(opts.get("grad_passes")),
        offload_layers=opts.get("offload_layers") or 0, optimizer_impl=opts.get("optimizer_impl") or "fused",
        cuda_graphs=name_list(opts.get("cuda_graphs")),
    )
    if tp is None and pp is None and dp is None and cp == 1 and base.ep == 1 and base.etp is None and devices > 1:
        from dlperf.engine.defaults import ZERO1_IMPL, default_plan

        # --zero not given: ZeRO-1 is tried too, run as --zero-impl names or as Megatron-Core's distributed optimizer
        zero1 = None if opts.get("zero") is not None else opts.get("zero_impl") or ZERO1_IMPL
        return default_plan(model, hw, base, notes, zero1)
    if base.pp > 1 and base.micro_batch is None:
        from dlperf.plan import check_degrees

        check_degrees(base)  # the note below counts micro-batches over dp, which must exist (pp > devices: none)
        # Megatron-LM's default and its published runs: micro-batch 1 with pipelining, so that the m = B/(dp*b)
        # micro-batches fill the pipeline (bubble (pp-1)/(m+pp-1); Narayanan et al. 2021, section 2.2 and Table 1)
        base = base.with_(micro_batch=1)
        notes.append(f"micro-batch not given: 1 with pipelining (Megatron-LM's default), {base.micro_batches} "
                     f"micro-batches per step")
        _check_interleaving(base)
    return base, notes


def _check_interleaving(plan: Any) -> None:
    """The interleaved schedule's rule, said about the value the user gave (the global batch), not the filled-in
    micro-batch."""
    from dlperf.errors import PlanError

    if plan.schedule == "interleaved" and plan.micro_batches % plan.pp:
        raise PlanError(f"the interleaved schedule needs the micro-batches per step (global batch "
                        f"{plan.global_batch} / dp={plan.data_parallel} at micro-batch 1 = {plan.micro_batches}) "
                        f"divisible by pp={plan.pp}",
                        expected=f"a global batch that is a multiple of {plan.data_parallel * plan.pp}",
                        found=plan.global_batch)


def config_notes(model_name: str, sets: tuple[str, ...], spec: Any) -> list[str]:
    """A Hugging Face config.json names no training sequence length; dlperf reads its max_position_embeddings
    (dlperf/spec/hf.py), often 32k-164k tokens where pre-training ran at 4k-8k: say so, as for every value filled
    in, unless `--set seq=N` gave it."""
    from dlperf.spec import hf

    if not hf.is_config(model_name) or "seq" in parse_sets(sets) or "seq" not in spec.params:
        return []
    return [f"sequence length not given: {spec.params['seq']:,} tokens per sample, the config's "
            f"max_position_embeddings (--set seq=N for the length you train at)"]


def _load(model_name: str, hardware: str, sets: tuple[str, ...], numbers: bool = True) -> tuple[Any, Any]:
    """The model and hardware; with `numbers`, a model with symbolic (null) params is refused up front."""
    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model, require_numbers

    model = load_model(model_name, parse_sets(sets))
    return (require_numbers(model) if numbers else model), load_hardware(hardware)


@click.command("predict")
@click.argument("model")
@click.argument("hardware")
@set_option
@plan_options
@click.option("--symbolic", is_flag=True, help="Print the closed form of step time, work W, depth D and W/D.")
@click.option("--latex", is_flag=True, help="With --symbolic: print the formulas as LaTeX.")
@click.option("--full", is_flag=True,
              help="With --symbolic: keep every kernel's max(compute, memory) instead of the bound that holds at the "
                   "plan's micro-batch.")
@click.option("--plot", type=PlotPath(), default=None, help="Write a breakdown bar chart.")
@format_option
def predict(model: str, hardware: str, sets: tuple[str, ...], symbolic: bool, latex: bool, full: bool,
            plot: str | None, fmt: str, **opts: Any) -> None:
    """Predict step time, throughput, MFU and memory of training MODEL on HARDWARE."""
    from dlperf.engine import predict as run
    from dlperf.plan import validate

    if (latex or full) and not symbolic:
        raise click.UsageError(f"--{'latex' if latex else 'full'} only changes the --symbolic view; add --symbolic")
    spec, hw = _load(model, hardware, sets)  # the --symbolic view substitutes a numeric prediction too
    plan, notes = build_plan(spec, hw, opts)
    notes = config_notes(model, sets, spec) + notes
    if symbolic:
        from dlperf.engine.step import StepModel

        validate(plan, heads=StepModel(spec, hw).heads)
        click.echo(_render_symbolic(spec, hw, plan, full, latex, fmt, notes))
        return
    result = run(spec, hw, plan)
    result.notes = notes + result.notes
    if plot:
        from dlperf.plot import breakdown_chart

        breakdown_chart([result], [spec.name], plot)
        wrote(plot)
    click.echo(_render_prediction(result, spec, hw, fmt))
    exit_unless_fits(result)


def _render_symbolic(spec: Any, hw: Any, plan: Any, full: bool, latex: bool, fmt: str, notes: list[str]) -> str:
    import sympy

    from dlperf.engine.symbolic import symbolic_text, symbolic_view

    view = symbolic_view(spec, hw, plan, full)
    view["notes"] = notes + view["notes"]
    show = sympy.latex if latex else sympy.sstr
    formulas = {k: show(view[k]) for k in ("T(B)", "T_step", "W", "D", "W/D")}
    if fmt == "json":
        return to_json({**{k: v for k, v in view.items() if k not in formulas}, **formulas})
    if fmt == "csv":
        return render([{"name": k, "expression": v} for k, v in formulas.items()], "csv").rstrip("\n")
    return symbolic_text(view, latex)


def _render_prediction(result: Any, spec: Any, hw: Any, fmt: str) -> str:
    data = result.to_dict()
    if fmt == "json":
        return to_json(data)
    flat = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
    flat.update({f"breakdown_s.{k}": v for k, v in data["breakdown_s"].items()})
    flat.update({f"memory.{k}": v for k, v in data["memory"].items()})
    # a list-valued plan field (recompute_modules, input_ops, grad_passes, cuda_graphs) as its comma list, as
    # search's CSV writes it, not Python's tuple repr "('layernorm', 'moe_act')" / "()"
    flat.update({f"plan.{k}": ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v
                 for k, v in data["plan"].items()})
    if fmt == "csv":
        return render([flat], "csv")
    return _table(result, spec, hw)


def _percent(fraction: float) -> str:
    """A fraction as the tables show it (40.5%), with two significant digits where one decimal would read 0.0%."""
    pct = 100 * fraction
    return f"{pct:.1f}%" if pct == 0 or abs(pct) >= 0.05 else f"{pct:.2g}%"


def _table(r: Any, spec: Any, hw: Any) -> str:
    from dlperf.report import _cell
    from dlperf.units import format_quantity as q

    p = r.plan
    extra = "".join(f" {k}={p[k]}" for k in ("cp", "ep") if p.get(k, 1) > 1) + folded_note(p)
    lines = [f"{spec.name} on {hw.name}: {p['devices']} x {hw.device.name}, "
             f"dp={p['dp']} tp={p['tp']} pp={p['pp']}{extra}, "
             f"global batch {p['global_batch']} (micro-batch {p['micro_batch']} x {p['micro_batches']}), "
             f"{p['dtype']}, {p['optimizer']}, recompute {p['recompute']}, zero {p['zero']}"]
    lines += [f"note: {n}" for n in r.notes]
    rows = [{"part": k, "time_s": v, "share": v / r.step_time_s} for k, v in r.breakdown_s.items() if v]
    lines.append(render(rows, "table"))
    by_type = sorted(r.per_type_s.items(), key=lambda kv: -kv[1])
    rest = f", {len(by_type) - 6} more in --format json (per_type_s)" if len(by_type) > 6 else ""
    lines.append("by layer type   " + ", ".join(f"{k} {q(v, 'time')}" for k, v in by_type[:6]) + rest)
    lines.append(f"step time       {q(r.step_time_s, 'time')}")
    # rates by the tables' number rule (report._cell: 4 significant digits, thousands separated), so that a B200's
    # 1,700 TFLOP/s is not "1700.3" beside "4,485.1 samples/s", and LeNet's rate is not "0.0 model TFLOP/s"
    lines.append(f"throughput      {_cell(float(r.throughput_samples_per_s))} samples/s")
    lines.append(f"per device      {_cell(float(r.model_tflops_per_device))} model TFLOP/s "
                 f"({_cell(float(r.hardware_tflops_per_device))} as executed: recomputation in, causal attention's "
                 f"skipped blocks out), MFU {_percent(r.mfu)}")
    mem = r.memory
    parts = ", ".join(f"{k} {q(v, 'bytes')}" for k, v in mem.items() if k != "total" and v)
    fits = "fits" if r.fits else f"DOES NOT FIT in {q(hw.device.memory, 'bytes')}"
    lines.append(f"memory/device   {q(mem['total'], 'bytes')} ({parts}) -> {fits}")
    if r.staleness:
        lines.append(f"staleness       {r.staleness} steps")
    return "\n".join(lines)


@click.command("compare")
@click.argument("model")
@click.argument("hardware")
@set_option
@click.option("--gpus", "devices", type=POSITIVE, required=True, help="Number of devices.")
@click.option("--global-batch", type=BATCH, required=True, help="Samples per step.")
@click.option("--dtype", type=DTYPE_CHOICES, default=None, help="Compute dtype (default: the model's).")
@format_option
def compare(model: str, hardware: str, sets: tuple[str, ...], devices: int, global_batch: int, dtype: str | None,
            fmt: str) -> None:
    """Put data, model (tensor), pipeline and the best hybrid plan side by side (time, throughput, MFU, memory).

    The best hybrid is the fastest tp x pp x dp (x ep) plan that fits, recomputation, gradient accumulation and
    ZeRO 0 or 1 (Megatron-Core's distributed optimizer) tried, as for a predict whose degrees are left out."""
    from dlperf.engine.defaults import strategy_plans

    spec, hw = _load(model, hardware, sets)
    rows = []
    for name, plan, result, why in strategy_plans(spec, hw, devices, global_batch, dtype):
        row = {"strategy": name, "dp": plan.data_parallel if plan else None, "tp": plan.tp if plan else None,
               "pp": plan.pp if plan else None, "ep": plan.ep if plan else None,
               "micro_batch": plan.micro if plan else None, "zero": plan.zero if plan else None}
        if result is None:
            row.update(step_time_s=None, samples_per_s=None, mfu=None, memory_gib=None, fits=False, note=why)
        else:
            row.update(step_time_s=result.step_time_s, samples_per_s=result.throughput_samples_per_s,
                       mfu=result.mfu, memory_gib=result.memory_bytes_per_device / 2**30, fits=result.fits,
                       note=why)
        rows.append(row)
    if not any(row["ep"] and row["ep"] > 1 for row in rows):  # the column says something only for a MoE plan
        rows = [{k: v for k, v in row.items() if k != "ep"} for row in rows]
    click.echo(render(rows, fmt, title=f"{spec.name} on {devices} x {hw.device.name}, global batch {global_batch}"))
