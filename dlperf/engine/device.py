"""From work to time on one device: a roofline per kernel with size-dependent (Hockney) efficiency.

t = max(FLOPs / (peak * eff(FLOPs)), bytes / (bandwidth * eff(bytes))) + launches * launch_latency, where
eff(n) = eff_max * n / (n + n_half), i.e. time = (n + n_half) / r_inf with r_inf = peak * eff_max (Hockney).
A GEMM whose shape is known also pays tile and wave quantization: the GPU computes the output in tiles, one
tile per SM at a time, so a GEMM with fewer tiles than SMs, or a last partial wave, leaves SMs idle (NVIDIA,
"Matrix Multiplication Background User's Guide", DU-09799-001, sections "Tile quantization" and "Wave
quantization"). Everything here works on floats and numpy arrays alike (mathx), so a grid of plans is one call.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any

from dlperf import mathx
from dlperf.ops.base import Kernel
from dlperf.ops.headdim import head_dim_rate
from dlperf.spec.hardware import DEFAULT_DISPATCH, Device, Efficiency

# tensor-core kernels, timed at the dtype's peak
MATRIX_CLASSES = ("matmul", "conv", "attention", "attention_fa3", "matmul_fp8")


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


def compute_efficiency(device: Device, cls: str, dtype: str | None = None) -> Efficiency:
    return device.eff(cls, dtype) if cls in MATRIX_CLASSES else memory_efficiency(device, cls)


def phase_time(flops: Any, nbytes: Any, launches: Any, cls: str, device: Device, dtype: str,
               quantization: Any = 1.0) -> Any:
    """Roofline time of one phase of one kernel (max of compute and memory time) plus launch overhead;
    `quantization` (>= 1) stretches the compute time of a GEMM whose tiles do not fill whole waves."""
    if mathx.is_zero(flops) and mathx.is_zero(nbytes):
        return 0.0
    peak = device.peak(dtype) if cls in MATRIX_CLASSES else device.peak("fp32")
    top = max(device.peak_flops.values())
    compute = hockney_time(flops * quantization, launches, peak, compute_efficiency(device, cls, dtype), top)
    memory = hockney_time(nbytes, launches, device.memory_bandwidth, memory_efficiency(device, cls))
    return mathx.maximum(compute, memory) + launches * device.launch_latency


def wave_quantization(batch: Any, m: Any, n: Any, k: Any, sms: int, tile: tuple[int, int],
                      overhead_k: int = 128) -> Any:
    """Time of a tiled GEMM over the time of the same FLOPs spread evenly on every SM (>= 1).

    The output has T = batch * ceil(m/Tm) * ceil(n/Tn) tiles (tile quantization); they run ceil(T/SMs) waves (wave
    quantization). Split-K cuts K into s slices to make s*T shorter tiles when there are too few, as cuBLAS's
    heuristics do; every tile also pays a fixed prologue/epilogue worth `overhead_k` K-elements of its main loop,
    which is what keeps split-K from shrinking tiles forever. The best s in 1, 2, 4, 8, 16 is taken: each choice's
    time grows with m, n and k, so their minimum does too (a larger GEMM is never faster). Shapes that are not
    numbers (the symbolic B) are left unquantized (1.0).
    """
    if all(type(x) in (int, float) for x in (batch, m, n, k)):
        return _scalar_quantization(float(batch), float(m), float(n), float(k), sms, tile, overhead_k)
    if not all(_is_number(x) for x in (batch, m, n, k)):
        return 1.0
    return _quantization(batch, m, n, k, sms, tile, overhead_k)


SPLITS = (1, 2, 4, 8, 16)  # split-K factors considered (powers of two, as cuBLAS's split-K kernels use)


def _quantization(batch: Any, m: Any, n: Any, k: Any, sms: int, tile: tuple[int, int], overhead_k: int) -> Any:
    tm, tn = tile
    tiles = batch * mathx.ceil(m / tm) * mathx.ceil(n / tn)
    best = mathx.minimum(*(mathx.ceil(tiles * s / sms) * (k / s + overhead_k) for s in SPLITS))
    return best * (tm * tn * sms) / (batch * m * n * k)


# memoised for plain numbers: search prices the same GEMMs for thousands of plans
_scalar_quantization = functools.lru_cache(maxsize=65536)(_quantization)


def _is_number(x: Any) -> bool:
    return type(x) in (int, float) or isinstance(x, numbers.Real) or type(x).__module__ == "numpy"


def gemm_quantization(kernel: Kernel, device: Device, dtype: str, divisor: Any, tp_dim: str | None) -> tuple[Any,
                                                                                                             Any]:
    """(forward, backward) quantization factors of a GEMM kernel on this device (1.0 when unknown).

    Forward computes C[m,n]; backward computes dA[m,k] (reducing over n) and dB[k,n] (reducing over m). The
    tensor-parallel `divisor` shrinks the dimension `tp_dim` on every rank (m: the token rows, for a GEMM every
    rank runs whole on its sequence-parallel tokens, a LatentMoE projection)."""
    eff = compute_efficiency(device, kernel.cls, dtype)
    if kernel.gemm is None or device.sms is None or eff.tile is None:
        return 1.0, 1.0
    b, m, n, k = kernel.gemm
    if divisor != 1 and tp_dim is not None:
        b, n, k = (b / divisor if tp_dim == "batch" else b, n / divisor if tp_dim == "n" else n,
                   k / divisor if tp_dim == "k" else k)
        m = m / divisor if tp_dim == "m" else m  # a duplicated GEMM on the rank's sequence-parallel rows
    def q(rows: Any, cols: Any, inner: Any, m_at: int = 0) -> Any:
        return _grouped_quantization(kernel.weight_groups, b, (rows, cols, inner), m_at, lambda batch, shape: (
            wave_quantization(batch, *shape, device.sms, eff.tile, eff.tile_overhead_k)))

    c = kernel.cost
    data, weight = c.bwd_data_flops, c.bwd_weight_flops
    if mathx.is_zero(weight):  # batched attention GEMMs: both backward GEMMs are 'data' gradients
        return q(m, n, k), (q(m, k, n) + q(k, n, m)) / 2
    return q(m, n, k), (data * q(m, k, n) + weight * q(k, n, m, m_at=2)) / (data + weight)


def _grouped_quantization(groups: Any, batch: Any, shape: tuple[Any, Any, Any], m_at: int, q: Any) -> Any:
    """Quantization of `groups` GEMMs of `shape` (rows, cols, inner; the rows each group owns at index `m_at`)
    run `batch` at a time, as a grouped expert GEMM runs on Transformer Engine's streams
    (dlperf.ops.moe.grouped_gemm); `q(b, shape)` is the factor of b concurrent GEMMs. Full rounds of `batch`,
    then one round of the rest, which fills fewer SMs: the FLOP-weighted mean over the rounds, so five GEMMs on
    four streams cost a round of four and a round of one, not one and a quarter rounds of four. Never below the
    factor of the one GEMM that does all groups' rows (the same FLOPs): forward and data gradient, cutting its rows
    into per-expert pieces only adds partial tiles and waves; weight gradient, the pieces are that GEMM split along
    its reduction by expert, one split among those its best split-K stands for. Where the engine's one tile shape
    and power-of-two splits (SPLITS) make a piece-wise schedule look better, that is the menu's limit, not the
    library's (cuBLAS chooses among many tiles and splits). Anything else (one GEMM, a batched GEMM, a symbolic
    count) is one round of `batch`."""
    if not (isinstance(groups, int) and isinstance(batch, int) and groups > 1):
        return q(batch, shape)
    full, rest = divmod(groups, batch)
    rounds = q(batch, shape) if rest == 0 else (full * batch * q(batch, shape) + rest * q(rest, shape)) / groups
    merged = tuple(x * groups if i == m_at else x for i, x in enumerate(shape))
    return mathx.maximum(rounds, q(1, merged))


def compute_stretch(kernel: Kernel, device: Device, dtype: str, divisor: Any, tp_dim: str | None) -> tuple[Any, Any]:
    """(forward, backward) factors (>= 1) on a kernel's compute time: its GEMM tile and wave quantization times
    the implementation's own `slowdown` against its class's curve, times a fused attention kernel's sequence
    term (s + seq_half) / s (Efficiency.seq_half: a short key loop amortizes each query block's fixed cost less)
    and its head-dim term (head_dim_stretch)."""
    q_fwd, q_bwd = gemm_quantization(kernel, device, dtype, divisor, tp_dim)
    seq = sequence_stretch(kernel, device, dtype)
    hd_fwd, hd_bwd = head_dim_stretch(kernel, device, dtype)
    return q_fwd * kernel.slowdown[0] * seq * hd_fwd, q_bwd * kernel.slowdown[1] * seq * hd_bwd


def sequence_stretch(kernel: Kernel, device: Device, dtype: str) -> Any:
    """(s + seq_half) / s for a fused attention kernel over s keys on a curve with a sequence term, else 1."""
    half = compute_efficiency(device, kernel.cls, dtype).seq_half if kernel.seq is not None else 0.0
    return (kernel.seq + half) / kernel.seq if half else 1.0


def head_dim_stretch(kernel: Kernel, device: Device, dtype: str) -> tuple[Any, Any]:
    """(forward, backward) time of a fused attention kernel at its head dim over the time its curve, measured at
    head dim 128, gives: 1 / dlperf.ops.headdim.head_dim_rate with the head-dim-64 rates of the curve the device
    prices the kernel at (Efficiency.head_dim_64); 1 for every other kernel, on a curve without them, and at head
    dim 128 and above."""
    if kernel.head_dim is None:
        return 1.0, 1.0
    fwd, bwd = head_dim_rate(compute_efficiency(device, kernel.cls, dtype).head_dim_64, kernel.head_dim)
    return 1 / fwd, 1 / bwd


def kernel_times(kernel: Kernel, device: Device, dtype: str, divisor: Any = 1,
                 tp_dim: str | None = None) -> tuple[Any, Any]:
    """(forward, backward) seconds of a kernel whose work is split `divisor` ways (tensor/sequence parallel);
    `tp_dim` says which GEMM dimension the split divides when the kernel does not say itself."""
    c = kernel.cost
    q_fwd, q_bwd = compute_stretch(kernel, device, dtype, divisor, kernel.tp_dim or tp_dim)
    fwd_launches, bwd_launches = kernel.phase_launches
    fwd = phase_time(c.fwd_flops / divisor, c.fwd_bytes / divisor, fwd_launches, kernel.cls, device, dtype, q_fwd)
    if kernel.syncs:
        fwd = fwd + kernel.syncs * sync_gap(device)
    bwd = phase_time(kernel.bwd_flops / divisor, c.bwd_bytes / divisor, bwd_launches, kernel.cls, device, dtype,
                     q_bwd)
    return fwd, bwd


def sync_gap(device: Device) -> float:
    """Device seconds idle at a host synchronization inside a pass (a MoE dispatcher's wait for its split sizes,
    flash-attn's unpad_input): the device-to-host copy the host waits on is one more launch, and once it returns
    the host issues the next operator (one forward dispatch, DEFAULT_DISPATCH) before the device has work again,
    which reaches it a launch latency later."""
    return device.dispatch_forward + 2 * device.launch_latency


def dispatch_times(kernel: Kernel, device: Device) -> tuple[Any, Any]:
    """(forward, backward) host seconds to issue the kernel's operators (DEFAULT_DISPATCH in spec/hardware.py),
    plus the library's own per-expert host work (`library_host`, reference-host seconds) scaled as the forward
    dispatch is scaled from DEFAULT_DISPATCH (the host's speed, or a measured dispatch)."""
    fwd, bwd = kernel.host_ops
    lib_fwd, lib_bwd = kernel.library_host
    scale = host_scale(device)
    return fwd * device.dispatch_forward + scale * lib_fwd, bwd * device.dispatch_backward + scale * lib_bwd


def host_scale(device: Device) -> float:
    """How much longer this device's host takes than the reference host for the same host work: its forward
    dispatch over the reference's (the host's speed, or a measured dispatch; DEFAULT_DISPATCH)."""
    return device.dispatch_forward / DEFAULT_DISPATCH[0]
