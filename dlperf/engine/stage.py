"""Compute and tensor-parallel communication time of a group of layers (a pipeline stage, or the whole model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlperf import mathx
from dlperf.engine.device import dispatch_times, kernel_times
from dlperf.engine.layers import Use
from dlperf.engine.overlap import exposed
from dlperf.ops import OPS
from dlperf.ops.base import Kernel
from dlperf.ops.conv import algorithm_kernel, applicable
from dlperf.ops.dense import quadratic_attention_bytes
from dlperf.ops.fp8 import fp8_kernels, kernel_dtype, storage_dtype
from dlperf.ops.fp8 import saved_bytes as fp8_saved_bytes
from dlperf.spec.hardware import Device, Hardware

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


def use_kernels(use: Use, batch: Any, e: int, hw: Hardware, dtype: str, divisor: Any,
                fp8: bool = False) -> list[Kernel]:
    """The layer's kernels; with `fp8` (an FP8 recipe's layer) its weight GEMMs in FP8 with their casts."""
    kernels = list(OPS[use.layer.op].kernels(use.layer, batch, e))
    if use.layer.op == "conv2d":
        kernels[0] = conv_choice(use, batch, e, hw, storage_dtype(dtype), divisor)[0]
    return fp8_kernels(kernels, e) if fp8 else kernels


def stage_cost(uses: list[Use], batch: Any, e: int, hw: Hardware, dtype: str, tp: int, sp: bool,
               recompute: str, comm_time: Any, fp8: frozenset = frozenset(), tp_overlap: bool = False) -> StageCost:
    """Sum the layers' kernels at micro-batch `batch`; `comm_time(op, nbytes)` prices tp collectives. Under
    dtype fp8, the layers in `fp8` run their weight GEMMs in FP8 (dlperf.ops.fp8); with `tp_overlap` each
    layer's tp collectives hide behind its GEMMs (dlperf.engine.overlap)."""
    out = StageCost()
    for use in uses:
        divisor = tp if (use.sharded or sp) else 1
        in_fp8 = dtype == "fp8" and use.layer in fp8
        gemm = {"fwd": 0.0, "bwd": 0.0}  # this layer's weight-GEMM seconds per pass: what overlap hides behind
        for kernel in use_kernels(use, batch, e, hw, dtype, tp if use.sharded else (tp if sp else 1), in_fp8):
            split = divisor if (kernel.split or sp) else 1
            fwd, bwd = kernel_times(kernel, hw.device, kernel_dtype(kernel, dtype), split, use.tp_dim)
            host_fwd, host_bwd = dispatch_times(kernel, hw.device)
            out.forward = out.forward + use.count * fwd
            out.backward = out.backward + use.count * bwd
            out.host_fwd = out.host_fwd + use.count * host_fwd
            out.host_bwd = out.host_bwd + use.count * host_bwd
            if _recomputed(recompute, use, kernel):
                out.recompute = out.recompute + use.count * fwd
                out.host_recompute = out.host_recompute + use.count * host_fwd
            if kernel.weight_gemm is not None:
                gemm["fwd"], gemm["bwd"] = gemm["fwd"] + fwd, gemm["bwd"] + bwd
            key = f"{use.layer.op}"
            out.per_type[key] = out.per_type.get(key, 0.0) + use.count * (fwd + bwd)
        if tp > 1:
            _add_tp_comm(out, use, batch, e, tp, recompute, comm_time, gemm if tp_overlap else None, hw.device)
        out.params = out.params + use.count * use.layer.params / (tp if use.sharded else 1)
        saved = OPS[use.layer.op].saved(use.layer, e)
        saved = fp8_saved_bytes(use.layer, saved, e) if in_fp8 else saved
        saved = saved * batch / (tp if (use.sharded or sp) else 1)
        if recompute == "selective":
            saved = saved - quadratic_attention_bytes(use.layer, e) * batch / tp
        out.saved_bytes = out.saved_bytes + use.count * saved
    return out


def _add_tp_comm(out: StageCost, use: Use, batch: Any, e: int, tp: int, recompute: str, comm_time: Any,
                 gemm: dict[str, Any] | None, device: Device) -> None:
    """A layer's tensor-parallel collectives per pass: on the critical path, or with `gemm` (its GEMM seconds
    per pass) overlapped with them, leaving the exposed part and the GEMMs' slowdown (dlperf.engine.overlap).
    Issuing each collective is one more op for the host (c10d call, stream sync, launch)."""
    for phase in ("fwd", "bwd"):
        parts = [(op, comm_time(op, e * batch * n)) for p, op, n in use.comm if p == phase and not mathx.is_zero(n)]
        if not parts:
            continue
        comm, slowdown = (sum(t for _, t in parts), 0.0) if gemm is None else exposed(parts, gemm[phase], phase, tp,
                                                                                     device.sms)
        comm, slowdown = use.count * comm, use.count * slowdown
        host = use.count * len(parts) * (device.dispatch_forward if phase == "fwd" else device.dispatch_backward)
        if phase == "fwd":
            out.tp_comm_fwd, out.forward, out.host_fwd = out.tp_comm_fwd + comm, out.forward + slowdown, \
                out.host_fwd + host
            if recompute in FULL:
                out.recompute = out.recompute + comm + slowdown
                out.host_recompute = out.host_recompute + host
        else:
            out.tp_comm_bwd, out.backward, out.host_bwd = out.tp_comm_bwd + comm, out.backward + slowdown, \
                out.host_bwd + host


def _recomputed(recompute: str, use: Use, kernel: Kernel) -> bool:
    """Full recomputation reruns every forward kernel; selective (Korthikanti et al. 2022) only the attention
    core (QK^T, softmax, AV) whose s^2 activations it does not keep."""
    if recompute in FULL:
        return True
    return recompute == "selective" and kernel.name in ATTENTION_CORE and not use.layer.get("flash", False)


