"""From work to time on one device: a roofline per kernel with size-dependent (Hockney) efficiency.

t = max(FLOPs / (peak * eff(FLOPs)), bytes / (bandwidth * eff(bytes))) + launches * launch_latency, where
eff(n) = eff_max * n / (n + n_half), i.e. time = (n + n_half) / r_inf with r_inf = peak * eff_max (Hockney).
Everything here works on floats and numpy arrays alike (mathx), so a grid of plans is one call.
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx
from dlperf.ops.base import Kernel
from dlperf.spec.hardware import Device, Efficiency

MATRIX_CLASSES = ("matmul", "conv")


def startup_time(eff: Efficiency, top_rate: float) -> float:
    """Hockney's t0 = n_1/2 / r_inf: given directly (`startup`), or from n_1/2 at the device's top rate (its
    fastest dtype); the startup time is a property of the kernel, so a slower dtype keeps t0."""
    if eff.startup is not None:
        return eff.startup
    return eff.half / (top_rate * eff.peak)


def hockney_time(size: Any, launches: Any, rate: float, eff: Efficiency, top_rate: float | None = None) -> Any:
    """Time to process `size` units (FLOPs or bytes) in `launches` kernels: launches * t0 + size / r_inf."""
    if mathx.is_zero(size):
        return 0.0
    return launches * startup_time(eff, top_rate or rate) + size / (rate * eff.peak)


def memory_efficiency(device: Device, cls: str) -> Efficiency:
    """Element-wise kernels built on exp/tanh (softmax, GELU, the loss) have their own measured curve when
    calibration wrote one; every other kernel streams at the plain element-wise rate."""
    return device.eff("transcendental" if cls == "transcendental" else "memory")


def compute_efficiency(device: Device, cls: str) -> Efficiency:
    return device.eff(cls) if cls in MATRIX_CLASSES else memory_efficiency(device, cls)


def phase_time(flops: Any, nbytes: Any, launches: Any, cls: str, device: Device, dtype: str) -> Any:
    """Roofline time of one phase of one kernel (max of compute and memory time) plus launch overhead."""
    if mathx.is_zero(flops) and mathx.is_zero(nbytes):
        return 0.0
    peak = device.peak(dtype) if cls in MATRIX_CLASSES else device.peak("fp32")
    top = max(device.peak_flops.values())
    compute = hockney_time(flops, launches, peak, compute_efficiency(device, cls), top)
    memory = hockney_time(nbytes, launches, device.memory_bandwidth, memory_efficiency(device, cls))
    return mathx.maximum(compute, memory) + launches * device.launch_latency


def kernel_times(kernel: Kernel, device: Device, dtype: str, divisor: Any = 1) -> tuple[Any, Any]:
    """(forward, backward) seconds of a kernel whose work is split `divisor` ways (tensor/sequence parallel)."""
    c = kernel.cost
    fwd = phase_time(c.fwd_flops / divisor, c.fwd_bytes / divisor, kernel.launches, kernel.cls, device, dtype)
    bwd_flops = c.bwd_data_flops + c.bwd_weight_flops
    bwd_launches = 0 if mathx.is_zero(bwd_flops) and mathx.is_zero(c.bwd_bytes) else kernel.backward_launches
    bwd = phase_time(bwd_flops / divisor, c.bwd_bytes / divisor, bwd_launches, kernel.cls, device, dtype)
    return fwd, bwd
