"""The closed form: step time, work W, depth D and average parallelism W/D as sympy expressions.

Symbols: B (samples per device per step), F (peak FLOP/s of the compute dtype), F32 (peak of element-wise
kernels), M (memory bandwidth), lam (launch latency). Efficiencies stay numbers from the hardware file.
Identical layers are costed once and multiplied, so a 96-layer model is one term per distinct layer.
"""

from __future__ import annotations

from typing import Any

import sympy

from dlperf.engine.device import startup_time
from dlperf.engine.layers import Use, element_bytes
from dlperf.engine.stage import use_kernels
from dlperf.engine.work import model_cost
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

B, F, F32, M, LAM = sympy.symbols("B F F32 M lam", positive=True)


def step_time_expr(model: Model, hw: Hardware, dtype: str) -> Any:
    """Single-device step time in B, F, F32, M, lam (forward + backward; Hockney efficiency per kernel)."""
    e = element_bytes(dtype)
    total = sympy.Integer(0)
    for layer, count in model.counted():
        for kernel in use_kernels(Use(layer, count, False), B, e, hw, dtype, 1):
            total += count * _kernel_expr(kernel, hw)
    return total


def _kernel_expr(kernel: Any, hw: Hardware) -> Any:
    c = kernel.cost
    matrix = kernel.cls in ("matmul", "conv")
    peak = F if matrix else F32
    eff_c = hw.device.eff(kernel.cls if matrix else "memory")
    eff_m = hw.device.eff("memory")
    out = sympy.Integer(0)
    for flops, nbytes, launches in ((c.fwd_flops, c.fwd_bytes, kernel.launches),
                                    (c.bwd_data_flops + c.bwd_weight_flops, c.bwd_bytes, 2 * kernel.launches)):
        if flops == 0 and nbytes == 0:
            continue
        t0_c = sympy.Float(startup_time(eff_c, max(hw.device.peak_flops.values())), 4)
        t0_m = sympy.Float(startup_time(eff_m, hw.device.memory_bandwidth), 4)
        compute = launches * t0_c + flops / (peak * sympy.Float(eff_c.peak, 4)) if flops != 0 else 0
        memory = launches * t0_m + nbytes / (M * sympy.Float(eff_m.peak, 4)) if nbytes != 0 else 0
        out += sympy.Max(compute, memory) + launches * LAM
    return out


def closed_form(model: Model, hw: Hardware, dtype: str) -> dict[str, Any]:
    cost = model_cost(model, B, dtype)
    work, depth = sympy.expand(cost.work), sympy.expand(cost.total_depth)
    return {"T_step": step_time_expr(model, hw, dtype), "W": work, "D": depth,
            "W/D": sympy.simplify(work / depth)}


def closed_form_text(model: Model, hw: Hardware, plan: Any, latex: bool = False) -> str:
    dtype = plan.dtype or model.dtype
    forms = closed_form(model, hw, dtype)
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
