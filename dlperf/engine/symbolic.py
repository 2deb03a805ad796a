"""The closed form: step time, work W, depth D and average parallelism W/D as sympy expressions.

Symbols: B (samples per device per step), F (peak FLOP/s of the compute dtype), F32 (peak of element-wise
kernels), M (memory bandwidth), lam (launch latency). Efficiencies stay numbers from the hardware file.
Identical layers are costed once and multiplied, so a 96-layer model is one term per distinct layer.
"""

from __future__ import annotations

from typing import Any

import sympy

from dlperf.engine.device import compute_efficiency, gemm_quantization, memory_efficiency, startup_time
from dlperf.engine.layers import Use, element_bytes
from dlperf.engine.stage import conv_choice, use_kernels
from dlperf.engine.work import model_cost
from dlperf.ops.conv import algorithm_kernel
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

B, F, F32, M, LAM = sympy.symbols("B F F32 M lam", positive=True)


def step_time_expr(model: Model, hw: Hardware, dtype: str, choose_at: int = 1) -> Any:
    """Single-device step time in B, F, F32, M, lam (forward + backward; Hockney efficiency per kernel).
    Convolution algorithms left on `auto` are those cuDNN-style choice picks at B = choose_at, and GEMM tile
    and wave quantization (a step function of B) is the constant factor it has at B = choose_at."""
    e = element_bytes(dtype)
    total = sympy.Integer(0)
    for layer, count in model.counted():
        use = Use(layer, count, False)
        kernels = use_kernels(use, B, e, hw, dtype, 1)
        at_choice = use_kernels(use, choose_at, e, hw, dtype, 1)
        if layer.op == "conv2d":
            kernels[0] = algorithm_kernel(layer, conv_choice(use, choose_at, e, hw, dtype, 1)[1], B, e)
        for kernel, numeric in zip(kernels, at_choice, strict=True):
            quantization = gemm_quantization(numeric, hw.device, dtype, 1, None)
            total += count * _kernel_expr(kernel, hw, dtype, quantization)
    return total


def _kernel_expr(kernel: Any, hw: Hardware, dtype: str, quantization: tuple[Any, Any] = (1.0, 1.0)) -> Any:
    matrix = kernel.cls in ("matmul", "conv")
    peak = F if matrix else F32
    eff_c = compute_efficiency(hw.device, kernel.cls, dtype)
    eff_m = memory_efficiency(hw.device, kernel.cls)
    out = sympy.Integer(0)
    for (flops, nbytes, launches), q in zip(_phases(kernel), _phase_factors(kernel, quantization), strict=True):
        flops = flops * sympy.Float(float(q), 6) if q != 1 else flops
        t0_c = sympy.Float(startup_time(eff_c, max(hw.device.peak_flops.values())), 4)
        t0_m = sympy.Float(startup_time(eff_m, hw.device.memory_bandwidth), 4)
        compute = launches * t0_c + flops / (peak * sympy.Float(eff_c.peak, 4)) if flops != 0 else 0
        memory = launches * t0_m + nbytes / (M * sympy.Float(eff_m.peak, 4)) if nbytes != 0 else 0
        out += sympy.Max(compute, memory) + launches * LAM
    return out


def closed_form(model: Model, hw: Hardware, dtype: str, choose_at: int = 1) -> dict[str, Any]:
    cost = model_cost(model, B, dtype)
    work, depth = sympy.expand(cost.work), sympy.expand(cost.total_depth)
    return {"T_step": step_time_expr(model, hw, dtype, choose_at), "W": work, "D": depth,
            "W/D": sympy.simplify(work / depth)}


def closed_form_text(model: Model, hw: Hardware, plan: Any, latex: bool = False) -> str:
    dtype = plan.dtype or model.dtype
    forms = closed_form(model, hw, dtype, plan.micro)
    values = {F: hw.device.peak(dtype), F32: hw.device.peak("fp32"), M: hw.device.memory_bandwidth,
              LAM: hw.device.launch_latency}
    lines = [f"# {model.name} on one {hw.device.name} ({dtype}); B = samples per step, F = {values[F]:.4g} FLOP/s,"
             f" F32 = {values[F32]:.4g}, M = {values[M]:.4g} B/s, lam = {values[LAM]:.3g} s"]
    if plan.devices > 1:
        lines.append("# (one device: the parallel terms are in `dlperf explain` and `dlperf predict`)")
    for name, value in forms.items():
        text = sympy.latex(value) if latex else sympy.sstr(value)
        lines.append(f"{name} = {text}")
    return "\n".join(lines)


def elasticities(model: Model, hw: Hardware, dtype: str, batch: int) -> dict[str, float]:
    """d ln T / d ln X of the one-device closed form T(B) at B = batch, for X in F, F32, M, lam.

    The derivative is taken term by term, as sympy would: each kernel phase is Max(compute, memory) + n*lam, so
    X dT/dX is -(the active branch's size / rate) when X is that branch's rate, and n*lam for the latency. Done
    in floats because differentiating the whole expression in sympy takes seconds for a ResNet.
    """
    e = element_bytes(dtype)
    top = max(hw.device.peak_flops.values())
    shares = {"peak FLOP/s (F)": 0.0, "element-wise FLOP/s (F32)": 0.0, "memory bandwidth (M)": 0.0,
              "launch latency (lam)": 0.0}
    total = 0.0
    for layer, count in model.counted():
        for kernel in use_kernels(Use(layer, count, False), batch, e, hw, dtype, 1):
            factors = _phase_factors(kernel, gemm_quantization(kernel, hw.device, dtype, 1, None))
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
    return {"T_value": total, **{k: v / total for k, v in shares.items()}}


def _phase_factors(kernel: Any, quantization: tuple[Any, Any]) -> list[Any]:
    """The quantization factors of the phases `_phases` keeps (forward, backward), in its order."""
    c = kernel.cost
    kept = [(c.fwd_flops or c.fwd_bytes), (c.bwd_data_flops + c.bwd_weight_flops or c.bwd_bytes)]
    return [q for q, keep in zip(quantization, kept, strict=True) if keep]


def _phases(kernel: Any) -> list[tuple[Any, Any, Any]]:
    """(FLOPs, bytes, launches) of the forward and backward phases that do any work."""
    c = kernel.cost
    phases = [(c.fwd_flops, c.fwd_bytes, kernel.launches),
              (c.bwd_data_flops + c.bwd_weight_flops, c.bwd_bytes, kernel.backward_launches)]
    return [(f, b, n) for f, b, n in phases if f or b]


def _branches(kernel: Any, flops: Any, nbytes: Any, launches: Any, hw: Hardware, dtype: str,
              top: float) -> tuple[float, float, str]:
    from dlperf.engine.device import hockney_time

    matrix = kernel.cls in ("matmul", "conv")
    peak = hw.device.peak(dtype) if matrix else hw.device.peak("fp32")
    eff = compute_efficiency(hw.device, kernel.cls, dtype)
    memory_eff = memory_efficiency(hw.device, kernel.cls)
    compute = float(hockney_time(flops, launches, peak, eff, top)) if flops else 0.0
    memory = float(hockney_time(nbytes, launches, hw.device.memory_bandwidth, memory_eff)) if nbytes else 0.0
    return compute, memory, "peak FLOP/s (F)" if matrix else "element-wise FLOP/s (F32)"


def _rate_part(flops: Any, kernel: Any, hw: Hardware, dtype: str) -> float:
    matrix = kernel.cls in ("matmul", "conv")
    peak = hw.device.peak(dtype) if matrix else hw.device.peak("fp32")
    return float(flops) / (peak * compute_efficiency(hw.device, kernel.cls, dtype).peak)
