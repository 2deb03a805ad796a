"""The closed form: step time, work W, depth D and average parallelism W/D as sympy expressions.

Symbols: B (samples per device per step), F (peak FLOP/s of the compute dtype), F32 (peak of element-wise
kernels), M (memory bandwidth), lam (launch latency). Efficiencies stay numbers from the hardware file.
Identical layers are costed once and multiplied, so a 96-layer model is one term per distinct layer.
"""

from __future__ import annotations

from typing import Any

import sympy

from dlperf.engine.device import (
    MATRIX_CLASSES,
    compute_efficiency,
    compute_stretch,
    memory_efficiency,
    startup_time,
    sync_gap,
)
from dlperf.engine.input import input_time
from dlperf.engine.layers import Use, element_bytes
from dlperf.engine.stage import conv_choice, use_kernels
from dlperf.engine.work import model_cost
from dlperf.ops.conv import algorithm_kernel
from dlperf.ops.fp8 import fp8_layers, is_recipe, kernel_dtype, storage_dtype
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

B, F, F32, M, LAM = sympy.symbols("B F F32 M lam", positive=True)


def step_time_expr(model: Model, hw: Hardware, dtype: str, choose_at: int = 1, nchw: bool = False,
                   scaling: str = "delayed", swizzle: str = "quantize", transpose: str = "cached") -> Any:
    """Single-device step time in B, F, F32, M, lam (forward + backward; Hockney efficiency per kernel).
    Convolution algorithms left on `auto` are those cuDNN-style choice picks at B = choose_at, and GEMM tile
    and wave quantization (a step function of B) is the constant factor it has at B = choose_at; `nchw`: the
    plan's memory_format is nchw (layout transposes around tensor-core convolutions, stage.use_kernels);
    `scaling`, `swizzle` and `transpose`: the plan's fp8_scaling, mx_swizzle and fp8_weight_transpose
    (stage.use_kernels)."""
    e = element_bytes(dtype)
    fp8 = fp8_layers(model.root) if is_recipe(dtype) else frozenset()
    total = sympy.Integer(0)
    for layer, count in model.counted():
        use = Use(layer, count, False)
        kernels = use_kernels(use, B, e, hw, dtype, 1, layer in fp8, nchw=nchw, scaling=scaling, swizzle=swizzle,
                              transpose=transpose)
        # the fused softmax at B = choose_at too: which softmax Megatron runs depends on B, which is a symbol here
        at_choice = use_kernels(use, choose_at, e, hw, dtype, 1, layer in fp8, nchw=nchw, fallback=False,
                                scaling=scaling, swizzle=swizzle, transpose=transpose)
        if layer.op == "conv2d":
            kernels[0] = algorithm_kernel(layer, conv_choice(use, choose_at, e, hw, storage_dtype(dtype), 1)[1],
                                          B, e)
        for kernel, numeric in zip(kernels, at_choice, strict=True):
            quantization = compute_stretch(numeric, hw.device, kernel_dtype(numeric, dtype), 1, None)
            total += count * _kernel_expr(kernel, hw, dtype, quantization)
    return total


def _matrix_peak(kernel: Any, hw: Hardware, dtype: str) -> Any:
    """F for kernels at the compute dtype's peak; under an FP8 recipe the kernels that stay bf16 run at
    F * peak(bf16) / peak(fp8) (dlperf.ops.fp8)."""
    own = kernel_dtype(kernel, dtype)
    return F if own == dtype else F * sympy.Float(hw.device.peak(own) / hw.device.peak(dtype), 6)


def _kernel_expr(kernel: Any, hw: Hardware, dtype: str, quantization: tuple[Any, Any] = (1.0, 1.0)) -> Any:
    matrix = kernel.cls in MATRIX_CLASSES
    peak = _matrix_peak(kernel, hw, dtype) if matrix else F32
    eff_c = compute_efficiency(hw.device, kernel.cls, kernel_dtype(kernel, dtype))
    eff_m = memory_efficiency(hw.device, kernel.cls)
    out = sympy.Integer(0)
    for (flops, nbytes, launches), q in zip(_phases(kernel), _phase_factors(kernel, quantization), strict=True):
        flops = flops * sympy.Float(float(q), 6) if q != 1 else flops
        t0_c = sympy.Float(startup_time(eff_c, max(hw.device.peak_flops.values())), 4)
        t0_m = sympy.Float(startup_time(eff_m, hw.device.memory_bandwidth), 4)
        compute = launches * t0_c + flops / (peak * sympy.Float(eff_c.peak, 4)) if flops != 0 else 0
        memory = launches * t0_m + nbytes / (M * sympy.Float(eff_m.peak, 4)) if nbytes != 0 else 0
        out += sympy.Max(compute, memory) + launches * LAM
    if kernel.syncs:  # each host synchronisation idles the device one dispatch and two launches (device.sync_gap)
        out += kernel.syncs * (sympy.Float(hw.device.dispatch_forward, 4) + 2 * LAM)
    return out


def closed_form(model: Model, hw: Hardware, dtype: str, choose_at: int = 1, nchw: bool = False,
                scaling: str = "delayed", swizzle: str = "quantize", transpose: str = "cached") -> dict[str, Any]:
    cost = model_cost(model, B, dtype)
    work, depth = sympy.expand(cost.work), sympy.expand(cost.total_depth)
    return {"T_step": step_time_expr(model, hw, dtype, choose_at, nchw, scaling, swizzle, transpose), "W": work,
            "D": depth, "W/D": sympy.simplify(work / depth)}


def resolve_bounds(expr: Any, values: dict[Any, float]) -> Any:
    """Each Max(compute, memory) replaced by the branch that is larger at `values` (B and the hardware
    constants), then like terms collected: the short form of a long closed form, exact near those values."""
    def pick(*args: Any) -> Any:
        return max(args, key=lambda a: float(a.subs(values)))

    return sympy.expand(expr.replace(sympy.Max, pick))


def symbolic_view(model: Model, hw: Hardware, plan: Any, full: bool = False) -> dict[str, Any]:
    """What `dlperf predict --symbolic` shows for a plan without tensor or pipeline parallelism: the closed form
    of one device's forward and backward pass over a micro-batch of B samples, T(B); the step as m micro-batches
    of it plus the plan's numeric remainder (every breakdown part besides the passes: recomputation, gradient
    accumulation, exposed communication, offload waits, optimizer), each named; W, D and W/D.
    Unless `full`, every kernel's roofline bound is fixed as it is at B = the plan's micro-batch."""
    from dlperf.engine import predict
    from dlperf.errors import PlanError
    from dlperf.units import format_quantity

    if plan.tp > 1 or plan.pp > 1:
        raise PlanError(f"--symbolic gives the closed form of plans without tensor or pipeline parallelism "
                        f"(tp=1 pp=1); this plan has tp={plan.tp} pp={plan.pp}: `dlperf predict` without --symbolic "
                        f"prices it and `dlperf explain` gives its sensitivities")
    dtype = plan.dtype or model.dtype
    result = predict(model, hw, plan)
    hw = hw.for_cudnn(plan.cudnn)  # the closed form prices fused attention as predict does (StepModel._hw_for)
    values = {F: hw.device.peak(dtype), F32: hw.device.peak("fp32"), M: hw.device.memory_bandwidth,
              LAM: hw.device.launch_latency, B: plan.micro}
    forms = closed_form(model, hw, dtype, plan.micro, plan.memory_format == "nchw", plan.fp8_scaling,
                        plan.mx_swizzle, plan.fp8_weight_transpose)
    t_micro = forms["T_step"] if full else resolve_bounds(forms["T_step"], values)
    m = plan.micro_batches
    passes = result.breakdown_s.get("compute/forward", 0.0) + result.breakdown_s.get("compute/backward", 0.0)
    wait = result.breakdown_s.get("input/cpu", 0.0)
    rest = result.step_time_s - passes - wait  # what T(B) does not cover, named in the note
    parts = ", ".join(k for k, v in result.breakdown_s.items()
                      if v and k not in ("compute/forward", "compute/backward", "input/cpu"))
    what = (f"one {hw.device.name}'s forward and backward pass over a micro-batch of B samples ({model.name}, "
            f"{dtype})" + ("" if full else f"; each kernel's compute-or-memory bound as at B = {plan.micro}"))
    return {
        "what": what,
        "plan": f"{plan.devices} device(s), dp={plan.data_parallel}, micro-batch {plan.micro} x {m} per step",
        "symbols": {"B": plan.micro, "F": values[F], "F32": values[F32], "M": values[M], "lam": values[LAM]},
        "T(B)": t_micro,
        "T_step": _with_loader(sympy.Float(m, 4) * t_micro.subs(B, plan.micro) + sympy.Float(rest, 4)
                               if m != 1 or rest else t_micro.subs(B, plan.micro), plan, hw),
        "T_step_value_s": result.step_time_s,
        "W": forms["W"],
        "D": forms["D"] if full else _at(resolve_bounds(forms["D"], values), plan.micro),
        "W/D": forms["W/D"] if full else _at(resolve_bounds(forms["W/D"], values), plan.micro),
        "notes": [f"T_step = {m} x T({plan.micro}) + {format_quantity(rest, 'time')} of what the passes' closed "
                  f"form leaves out ({parts or 'nothing'}; numbers from `dlperf predict`); F, F32, M, lam stay "
                  f"symbols"]
                 + ([] if plan.data_backend != "cpu" else [
                     f"Max(..., {format_quantity(input_time(plan, hw, m * plan.micro), 'time')}): the CPU loader's "
                     f"time for the step's samples, which the step waits for when it is longer (dlperf.engine.input)"])
                 + ([] if full else [f"D and W/D at B = {plan.micro} (--full: as expressions in B)"]),
    }


def _with_loader(step: Any, plan: Any, hw: Hardware) -> Any:
    """The step as Max(GPU step, the CPU loader's time for its samples) under data_backend cpu: the loader runs
    ahead, so the step lasts the longer of the two (dlperf.engine.input.input_wait)."""
    if plan.data_backend != "cpu":
        return step
    return sympy.Max(step, sympy.Float(input_time(plan, hw, plan.micro_batches * plan.micro), 4))


def _at(expr: Any, batch: int) -> Any:
    """An expression's value at B = batch, rounded to 4 significant digits (exact integers stay exact)."""
    value = sympy.nsimplify(expr.subs(B, batch))
    return value if value.is_Integer else sympy.Float(value, 4)


def symbolic_text(view: dict[str, Any], latex: bool = False) -> str:
    """The view as lines of text (LaTeX formulas with `latex`)."""
    sym = view["symbols"]
    lines = [f"# {view['what']}", f"# plan: {view['plan']}",
             f"# F = {sym['F']:.4g} FLOP/s (matrix), F32 = {sym['F32']:.4g} FLOP/s (element-wise), "
             f"M = {sym['M']:.4g} B/s, lam = {sym['lam']:.3g} s (launch)"]
    lines += [f"# {n}" for n in view["notes"]]
    for name in ("T(B)", "T_step", "W", "D", "W/D"):
        lines.append(f"{name} = {sympy.latex(view[name]) if latex else sympy.sstr(view[name])}")
    return "\n".join(lines)


def elasticities(model: Model, hw: Hardware, dtype: str, batch: int, nchw: bool = False,
                 scaling: str = "delayed", swizzle: str = "quantize", transpose: str = "cached") -> dict[str, float]:
    """d ln T / d ln X of the one-device closed form T(B) at B = batch, for X in F, F32, M, lam.

    The derivative is taken term by term, as sympy would: each kernel phase is Max(compute, memory) + n*lam, so
    X dT/dX is -(the active branch's size / rate) when X is that branch's rate, and n*lam for the latency. Done
    in floats because differentiating the whole expression in sympy takes seconds for a ResNet.
    """
    e = element_bytes(dtype)
    fp8 = fp8_layers(model.root) if is_recipe(dtype) else frozenset()
    top = max(hw.device.peak_flops.values())
    shares = {"peak FLOP/s (F)": 0.0, "element-wise FLOP/s (F32)": 0.0, "memory bandwidth (M)": 0.0,
              "launch latency (lam)": 0.0}
    total = 0.0
    for layer, count in model.counted():
        for kernel in use_kernels(Use(layer, count, False), batch, e, hw, dtype, 1, layer in fp8, nchw=nchw,
                                  scaling=scaling, swizzle=swizzle, transpose=transpose):
            own = kernel_dtype(kernel, dtype)
            factors = _phase_factors(kernel, compute_stretch(kernel, hw.device, own, 1, None))
            for (flops, nbytes, launches), q in zip(_phases(kernel), factors, strict=True):
                flops = flops * q
                compute, memory, rate_name = _branches(kernel, flops, nbytes, launches, hw, dtype, top)
                latency = launches * hw.device.launch_latency
                total += count * (max(compute, memory) + latency)
                shares["launch latency (lam)"] += count * latency
                if compute >= memory and flops:
                    shares[rate_name] -= count * _rate_part(flops, kernel, hw, dtype)
                elif nbytes:
                    shares["memory bandwidth (M)"] -= count * nbytes / (
                        hw.device.memory_bandwidth * memory_efficiency(hw.device, kernel.cls).peak)
            if kernel.syncs:  # device.sync_gap: a dispatch and two launch latencies per host synchronisation
                total += count * kernel.syncs * sync_gap(hw.device)
                shares["launch latency (lam)"] += count * kernel.syncs * 2 * hw.device.launch_latency
    return {"T_value": total, **{k: v / total for k, v in shares.items()}}


def _phase_factors(kernel: Any, quantization: tuple[Any, Any]) -> list[Any]:
    """The quantization factors of the phases `_phases` keeps (forward, backward), in its order."""
    c = kernel.cost
    kept = [(c.fwd_flops or c.fwd_bytes), (c.bwd_data_flops + c.bwd_weight_flops or c.bwd_bytes)]
    return [q for q, keep in zip(quantization, kept, strict=True) if keep]


def _phases(kernel: Any) -> list[tuple[Any, Any, Any]]:
    """(FLOPs, bytes, launches) of the forward and backward phases that do any work."""
    c = kernel.cost
    phases = [(c.fwd_flops, c.fwd_bytes, kernel.launches), (kernel.bwd_flops, c.bwd_bytes, kernel.backward_launches)]
    return [(f, b, n) for f, b, n in phases if f or b]


def _branches(kernel: Any, flops: Any, nbytes: Any, launches: Any, hw: Hardware, dtype: str,
              top: float) -> tuple[float, float, str]:
    from dlperf.engine.device import hockney_time

    matrix = kernel.cls in MATRIX_CLASSES
    peak = hw.device.peak(kernel_dtype(kernel, dtype)) if matrix else hw.device.peak("fp32")
    eff = compute_efficiency(hw.device, kernel.cls, kernel_dtype(kernel, dtype))
    memory_eff = memory_efficiency(hw.device, kernel.cls)
    compute = float(hockney_time(flops, launches, peak, eff, top)) if flops else 0.0
    memory = float(hockney_time(nbytes, launches, hw.device.memory_bandwidth, memory_eff)) if nbytes else 0.0
    return compute, memory, "peak FLOP/s (F)" if matrix else "element-wise FLOP/s (F32)"


def _rate_part(flops: Any, kernel: Any, hw: Hardware, dtype: str) -> float:
    matrix = kernel.cls in MATRIX_CLASSES
    peak = hw.device.peak(kernel_dtype(kernel, dtype)) if matrix else hw.device.peak("fp32")
    return float(flops) / (peak * compute_efficiency(hw.device, kernel.cls, kernel_dtype(kernel, dtype)).peak)
