"""Kernels in torch on the CPU or a CUDA GPU: GEMM (fp32, tf32, bf16, fp16), convolution forward and backward
(cuDNN / oneDNN), STREAM-like memory kernels and the launch overhead of a one-element op.

On CUDA every sample is timed with CUDA events around the inner loop (the host clock only sees launches);
tf32 is switched on or off per point through torch.backends flags, which are restored afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dlperf.calibrate import probes as P
from dlperf.calibrate.probes import Kernel, Point, Series
from dlperf.calibrate.timing import Sampler, host_sampler
from dlperf.errors import CalibrationError

CPU_DTYPES = ("fp32", "bf16", "fp16")
CUDA_DTYPES = ("fp32", "tf32", "bf16", "fp16")


def load_torch(device: str) -> Any:
    """Import torch and check the device, or raise a CalibrationError that says what is missing."""
    try:
        import torch
    except ImportError:
        raise CalibrationError("the torch backend needs PyTorch, which is not installed "
                               "(pip install torch, or use --backend numpy)") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError(f"--device cuda: torch {torch.__version__} sees no CUDA device "
                               f"(torch.cuda.is_available() is False); use --device cpu")
    return torch


def device_name(torch: Any, device: str) -> str:
    if device == "cuda":
        return str(torch.cuda.get_device_name(0))
    from dlperf.calibrate.environment import cpu_model

    return cpu_model()


def device_memory(torch: Any, device: str) -> float:
    if device == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory)
    from dlperf.calibrate.environment import physical_memory

    return physical_memory()


def device_sms(torch: Any, device: str) -> int | None:
    """Streaming multiprocessors of the CUDA device (None on a CPU)."""
    return int(torch.cuda.get_device_properties(0).multi_processor_count) if device == "cuda" else None


def dispatch_times(torch: Any, device: str, layers: int = 16, rounds: int = 7) -> tuple[float, float]:
    """Host seconds per engine-counted kernel launch that an eager step spends issuing the forward pass (Python,
    modules, dispatcher, autograd recording, launch calls) and the backward pass (the autograd engine).

    Times the check transformer's layer (dlperf.calibrate.check_nets.Layer: pre-LN attention and MLP) at a width
    of 8, where the kernels do next to nothing, `layers` deep, on the host clock without waiting for the device;
    divides by the launches dlperf counts for one such layer (its spec, check_models/transformer.yaml), so views,
    reshapes and module calls that launch no kernel are included in what each launch costs (median of `rounds`).
    The engine's host-bound passes use these (spec/hardware.py DEFAULT_DISPATCH)."""
    import statistics

    from dlperf.calibrate import check_nets

    model = torch.nn.Sequential(*(check_nets.Layer(8, 2, 32) for _ in range(layers))).to(device)
    x = torch.randn(1, 8, 8, device=device, requires_grad=True)
    fwd_launches, bwd_launches = _layer_launches()
    forward, backward = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread issues the kernels; intra-op threads only add wake-ups to tiny ops
    try:
        _time_passes(torch, device, model, x, rounds, forward, backward)
    finally:
        torch.set_num_threads(threads)
    return (statistics.median(forward) / (layers * fwd_launches),
            statistics.median(backward) / (layers * bwd_launches))


def _time_passes(torch: Any, device: str, model: Any, x: Any, rounds: int, forward: list[float],
                 backward: list[float]) -> None:
    """Host seconds of `rounds` forward and backward passes, after two warm-up rounds."""
    import time

    for round_ in range(rounds + 2):
        start = time.perf_counter()
        y = model(x).sum()
        middle = time.perf_counter()
        y.backward()
        end = time.perf_counter()
        if device == "cuda":
            torch.cuda.synchronize()
        if round_ >= 2:  # the first rounds warm the allocator and autograd's caches
            forward.append(middle - start)
            backward.append(end - middle)
        model.zero_grad(set_to_none=True)
        x.grad = None


def _layer_launches() -> tuple[int, int]:
    """(forward, backward) kernel launches dlperf counts for one check-transformer layer."""
    from dlperf.calibrate import check_nets

    sizes = {"hidden": 8, "heads": 2, "ffn": 32, "seq": 8, "vocab": 8}
    return layer_launches(check_nets.spec_path("transformer"), sizes)


def layer_launches(model: str, sizes: dict[str, int], batch: int = 1, e: int = 4) -> tuple[int, int]:
    """(forward, backward) kernel launches dlperf counts for one layer of `model` (a name or spec path whose
    `layers` parameter repeats a block): the model with two layers minus the model with one."""
    from dlperf.ops import OPS
    from dlperf.spec.model import load_model

    def launches(layers: int) -> tuple[int, int]:
        forward = backward = 0
        for layer, count in load_model(model, sizes | {"layers": layers}).counted():
            for kernel in OPS[layer.op].kernels(layer, batch, e):
                fwd, bwd = kernel.phase_launches
                forward, backward = forward + count * fwd, backward + count * bwd
        return forward, backward

    one, two = launches(1), launches(2)
    return two[0] - one[0], two[1] - one[1]


def cuda_sampler(torch: Any) -> Sampler:
    """Seconds per call from CUDA events recorded around `inner` launches."""

    def sample(fn: Kernel, inner: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / inner

    return sample


def sampler(torch: Any, device: str) -> Sampler:
    return cuda_sampler(torch) if device == "cuda" else host_sampler()


@contextlib.contextmanager
def saved_flags(torch: Any) -> Iterator[None]:
    """Restore the tf32 switches that the tf32/fp32 points flip."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


class TorchKernels:
    """Builds the timed kernels for one torch device."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch = torch
        self.device = device
        self.dtypes = CUDA_DTYPES if device == "cuda" else CPU_DTYPES

    def _dtype(self, name: str) -> Any:
        t = self.torch
        if self.device == "cuda":  # tf32 is fp32 storage with tensor-core math; fp32 means exact fp32 math
            t.backends.cuda.matmul.allow_tf32 = name == "tf32"
            t.backends.cudnn.allow_tf32 = name == "tf32"
        return {"fp32": t.float32, "tf32": t.float32, "bf16": t.bfloat16, "fp16": t.float16}[name]

    def _rand(self, shape: tuple[int, ...], dtype: Any) -> Any:
        gen = self.torch.Generator(device="cpu").manual_seed(0)
        return self.torch.randn(shape, generator=gen).to(device=self.device, dtype=dtype)

    def gemm(self, m: int, k: int, n: int, name: str, batch: int = 0) -> Kernel:
        dtype = self._dtype(name)
        lead = (batch,) if batch else ()
        a, b = self._rand((*lead, m, k), dtype), self._rand((*lead, k, n), dtype)
        out = self.torch.empty((*lead, m, n), dtype=dtype, device=self.device)
        return lambda: self.torch.matmul(a, b, out=out)

    def linear(self, m: int, k: int, n: int, name: str) -> Kernel:
        """The three GEMMs of a linear layer's training step, as autograd calls them (probes.LINEAR_ROWS_*)."""
        t, dtype = self.torch, self._dtype(name)
        x, w, b, dy = (self._rand(shape, dtype) for shape in ((m, k), (n, k), (n,), (m, n)))
        y, dx, dw = (t.empty(shape, dtype=dtype, device=self.device) for shape in ((m, n), (m, k), (n, k)))

        def step() -> None:
            t.addmm(b, x, w.t(), out=y)
            t.mm(dy, w, out=dx)
            t.mm(dy.t(), x, out=dw)

        return step

    def conv(self, shape: P.ConvShape, batch: int, backward: bool) -> Kernel:
        t = self.torch
        dtype = self._dtype("fp32")
        x = self._rand((batch, shape.c_in, shape.size, shape.size), dtype)
        w = self._rand((shape.c_out, shape.c_in, shape.kernel, shape.kernel), dtype)
        stride, pad = [shape.stride] * 2, [shape.pad] * 2
        if not backward:
            return lambda: t.nn.functional.conv2d(x, w, stride=shape.stride, padding=shape.pad)
        grad = self._rand((batch, shape.c_out, shape.out_size, shape.out_size), dtype)
        # both gradients (input and weight) in one call, as autograd does it; each costs a forward's FLOPs
        return lambda: t.ops.aten.convolution_backward(grad, x, w, None, stride, pad, [1, 1], False, [0, 0], 1,
                                                       [True, True, False])

    def memory(self, kind: str, nbytes: int) -> Kernel:
        t = self.torch
        n = nbytes // 4
        a, b, c = (t.ones(n, dtype=t.float32, device=self.device) for _ in range(3))
        row = min(P.SOFTMAX_ROW, n)
        rows = n // row
        a2, b2 = a[: rows * row].view(rows, row), b[: rows * row].view(rows, row)
        kernels = {
            "copy": lambda: b.copy_(a),
            "scale": lambda: t.mul(a, 3.0, out=b),
            "add": lambda: t.add(a, b, out=c),
            "triad": lambda: t.add(b, c, alpha=3.0, out=a),
            "sum": lambda: a.sum(),
            "relu": lambda: t.clamp_min(a, 0.0, out=b),
            "gelu": lambda: t.ops.aten.gelu.out(a, out=b),
            "tanh": lambda: t.tanh(a, out=b),
            "softmax": lambda: t.ops.aten._softmax.out(a2, -1, False, out=b2),
        }
        return kernels[kind]

    def memory_kinds(self) -> tuple[str, ...]:
        return tuple(P.MEMORY_KERNELS)

    def launch(self) -> Kernel:
        x = self.torch.zeros(1, device=self.device)
        return lambda: x.add_(1.0)


def gemm_series(k: TorchKernels, quick: bool) -> list[Series]:
    return P.gemm_series(k.dtypes, quick, k.gemm, k.linear, k.device)


def conv_series(k: TorchKernels, quick: bool) -> list[Series]:
    batches = P.CONV_BATCH_QUICK if quick else P.CONV_BATCH_FULL
    out = []
    for shape in P.conv_shapes(quick):
        for backward in (False, True):  # backward: data and weight gradients, one forward's FLOPs each
            out.append(Series("conv", shape.name + (" bwd" if backward else ""), "fp32", tuple(
                Point(shape.flops(n), shape.label(n), lambda s=shape, n=n, bw=backward: k.conv(s, n, bw),
                      kernels=2 if backward else 1)
                for n in batches)))
    return out


def memory_series(k: TorchKernels, quick: bool) -> list[Series]:
    sizes = P.MEMORY_QUICK if quick else P.MEMORY_FULL
    return [Series("memory", kind, "fp32", tuple(
        Point(float(P.MEMORY_KERNELS[kind] * s), f"{s // 4} x fp32", lambda kd=kind, s=s: k.memory(kd, s))
        for s in sizes)) for kind in P.MEMORY_KERNELS]


def all_series(torch: Any, device: str, quick: bool) -> list[Series]:
    k = TorchKernels(torch, device)
    launch = [Series("launch", "one-element add_", "fp32", (Point(1.0, "1 element", k.launch),))]
    return launch + gemm_series(k, quick) + conv_series(k, quick) + memory_series(k, quick)
