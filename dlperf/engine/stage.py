"""Compute and tensor-parallel communication time of a group of layers (a pipeline stage, or the whole model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlperf import mathx
from dlperf.engine.device import dispatch_times, kernel_times
from dlperf.engine.layers import Use
from dlperf.ops import OPS
from dlperf.ops.base import Kernel
from dlperf.ops.conv import algorithm_kernel, applicable
from dlperf.ops.dense import quadratic_attention_bytes
from dlperf.spec.hardware import Hardware

FULL = ("full", "except_last")  # rerun every forward kernel (except_last: not for the last micro-batch)
ATTENTION_CORE = ("scores", "softmax", "attn_dropout", "attend", "flash_attention")


@dataclass
class StageCost:
    """Seconds per micro-batch (forward, backward, recompute, tp comm) and per-device parameters."""

    forward: Any = 0.0
    backward: Any = 0.0
    recompute: Any = 0.0
    tp_comm_fwd: Any = 0.0
    tp_comm_bwd: Any = 0.0
    params: Any = 0
    saved_bytes: Any = 0.0          # activations kept for backward, per micro-batch
    per_type: dict[str, Any] = field(default_factory=dict)
    synced_params: Any = None       # parameters data parallelism allreduces (None: all of `params`)
    host_fwd: Any = 0.0             # host seconds to issue the forward kernels of one micro-batch
    host_bwd: Any = 0.0             # ... the backward kernels
    host_recompute: Any = 0.0       # ... the recomputed forward kernels

    @property
    def dp_params(self) -> Any:
        return self.params if self.synced_params is None else self.synced_params

    def __add__(self, other: StageCost) -> StageCost:
        """Two parts of one device's work run one after the other (e.g. the convolutional body and the head)."""
        names = ("forward", "backward", "recompute", "tp_comm_fwd", "tp_comm_bwd", "params",
                 "saved_bytes", "host_fwd", "host_bwd", "host_recompute")
        out = StageCost(**{n: getattr(self, n) + getattr(other, n) for n in names})
        for part in (self, other):
            for key, value in part.per_type.items():
                out.per_type[key] = out.per_type.get(key, 0.0) + value
        return out

    @property
    def total(self) -> Any:
        return self.forward + self.backward + self.recompute + self.tp_comm_fwd + self.tp_comm_bwd


def conv_choice(use: Use, batch: Any, e: int, hw: Hardware, dtype: str, divisor: Any) -> tuple[Kernel, str]:
    """cuDNN-style `auto`: the applicable algorithm with the least forward+backward time on this device."""
    layer = use.layer
    if layer["algorithm"] != "auto":
        return algorithm_kernel(layer, layer["algorithm"], batch, e), layer["algorithm"]
    best, best_time, name = None, None, "direct"
    for algorithm in applicable(layer, dtype):
        kernel = algorithm_kernel(layer, algorithm, batch, e)
        total = sum(kernel_times(kernel, hw.device, dtype, divisor, use.tp_dim))
        if best is None or isinstance(total, float) and total < best_time:
            best, best_time, name = kernel, total, algorithm
    return best, name


def use_kernels(use: Use, batch: Any, e: int, hw: Hardware, dtype: str, divisor: Any) -> list[Kernel]:
    kernels = list(OPS[use.layer.op].kernels(use.layer, batch, e))
    if use.layer.op == "conv2d":
        kernels[0] = conv_choice(use, batch, e, hw, dtype, divisor)[0]
    return kernels


def stage_cost(uses: list[Use], batch: Any, e: int, hw: Hardware, dtype: str, tp: int, sp: bool,
               recompute: str, comm_time: Any) -> StageCost:
    """Sum the layers' kernels at micro-batch `batch`; `comm_time(op, nbytes)` prices tp collectives."""
    out = StageCost()
    for use in uses:
        divisor = tp if (use.sharded or sp) else 1
        for kernel in use_kernels(use, batch, e, hw, dtype, tp if use.sharded else (tp if sp else 1)):
            split = divisor if (kernel.split or sp) else 1
            fwd, bwd = kernel_times(kernel, hw.device, dtype, split, use.tp_dim)
            host_fwd, host_bwd = dispatch_times(kernel, hw.device)
            out.forward = out.forward + use.count * fwd
            out.backward = out.backward + use.count * bwd
            out.host_fwd = out.host_fwd + use.count * host_fwd
            out.host_bwd = out.host_bwd + use.count * host_bwd
            if _recomputed(recompute, use, kernel):
                out.recompute = out.recompute + use.count * fwd
                out.host_recompute = out.host_recompute + use.count * host_fwd
            key = f"{use.layer.op}"
            out.per_type[key] = out.per_type.get(key, 0.0) + use.count * (fwd + bwd)
        for phase, op, elements in use.comm:
            if tp > 1 and not mathx.is_zero(elements):
                t = use.count * comm_time(op, e * batch * elements)
                # issuing the collective is one more op for the host (c10d call, stream sync, launch)
                host = use.count * (hw.device.dispatch_forward if phase == "fwd" else hw.device.dispatch_backward)
                if phase == "fwd":
                    out.tp_comm_fwd, out.host_fwd = out.tp_comm_fwd + t, out.host_fwd + host
                else:
                    out.tp_comm_bwd, out.host_bwd = out.tp_comm_bwd + t, out.host_bwd + host
                if recompute in FULL and phase == "fwd":
                    out.recompute = out.recompute + t
                    out.host_recompute = out.host_recompute + host
        out.params = out.params + use.count * use.layer.params / (tp if use.sharded else 1)
        saved = OPS[use.layer.op].saved(use.layer, e) * batch / (tp if (use.sharded or sp) else 1)
        if recompute == "selective":
            saved = saved - quadratic_attention_bytes(use.layer, e) * batch / tp
        out.saved_bytes = out.saved_bytes + use.count * saved
    return out


def _recomputed(recompute: str, use: Use, kernel: Kernel) -> bool:
    """Full recomputation reruns every forward kernel; selective (Korthikanti et al. 2022) only the attention
    core (QK^T, softmax, AV) whose s^2 activations it does not keep."""
    if recompute in FULL:
        return True
    return recompute == "selective" and kernel.name in ATTENTION_CORE and not use.layer.get("flash", False)


