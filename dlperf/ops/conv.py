"""2-D convolution and its four algorithms (survey Table 6 for work/depth, SURVEY_MODELS.md 2c for exact counts).

direct and im2col do the same work, 2*N*C_out*H'*W'*C_in*Ky*Kx/g; im2col writes and reads a
(C_in*Ky*Kx)x(N*H'*W') buffer and runs as a GEMM. Winograd F(m x m, r x r) cuts multiplies by m^2 r^2/alpha^2
(alpha = m + r - 1); FFT convolves in the frequency domain.
"""

from __future__ import annotations

from typing import Any

from dlperf.cost import Cost
from dlperf.errors import ShapeError
from dlperf.ops.base import REQUIRED, Kernel, Layer, OpRule, clog2, need_rank, numel
from dlperf.ops.elementwise import _pair, pool_out

ALGORITHMS = ("direct", "im2col", "winograd", "fft", "auto")
WINOGRAD_M = 4  # cuDNN's non-fused Winograd uses F(4x4, 3x3) tiles; F(2x2, 3x3) is also supported via winograd_m
TENSOR_CORE_DTYPES = ("fp16", "bf16", "tf32", "fp8", "mxfp8", "nvfp4")


def _geometry(layer: Layer) -> dict[str, Any]:
    (kh, kw), (sh, sw) = _pair(layer["kernel"]), _pair(layer["stride"])
    c_in, h, w = layer.in_shape
    c_out, ho, wo = layer.out_shape
    return {"ci": c_in, "h": h, "w": w, "co": c_out, "ho": ho, "wo": wo, "kh": kh, "kw": kw, "sh": sh, "sw": sw,
            "g": layer["groups"], "dil": _pair(layer["dilation"])}


def _padding(s: tuple, a: dict) -> tuple[Any, Any]:
    if a["padding"] == "same":
        (kh, kw), (dh, dw) = _pair(a["kernel"]), _pair(a["dilation"])
        return dh * (kh - 1) // 2, dw * (kw - 1) // 2
    return _pair(a["padding"])


def _conv_shape(s: tuple, a: dict) -> tuple:
    need_rank(s, 3, "conv2d")
    (kh, kw), (sh, sw), (dh, dw) = _pair(a["kernel"]), _pair(a["stride"]), _pair(a["dilation"])
    ph, pw = _padding(s, a)
    for value, what in ((a["groups"], "groups"), (kh, "kernel"), (kw, "kernel"), (sh, "stride"), (sw, "stride")):
        if isinstance(value, int) and value < 1:
            raise ShapeError(f"conv2d {what} must be positive", expected="a positive integer", found=value)
    if isinstance(s[0], int) and isinstance(a["groups"], int) and (s[0] % a["groups"] or a["out"] % a["groups"]):
        raise ShapeError(expected=f"channels in ({s[0]}) and out ({a['out']}) divisible by groups",
                         found=a["groups"])
    return (a["out"], pool_out(s[1], kh, sh, ph, dh), pool_out(s[2], kw, sw, pw, dw))


def _conv_params(s: tuple, a: dict) -> Any:
    kh, kw = _pair(a["kernel"])
    return a["out"] * (s[0] // a["groups"]) * kh * kw + (a["out"] if a["bias"] else 0)


def direct_flops(g: dict, batch: Any) -> Any:
    """2 * N * C_out * H' * W' * C_in * Ky * Kx / groups (Table 6, direct and im2col rows, times 2 FLOPs/MAC)."""
    return 2 * batch * g["co"] * g["ho"] * g["wo"] * g["ci"] * g["kh"] * g["kw"] / g["g"]


def _io_bytes(g: dict, batch: Any, e: int) -> tuple[Any, Any, Any]:
    inputs = batch * g["ci"] * g["h"] * g["w"]
    outputs = batch * g["co"] * g["ho"] * g["wo"]
    weights = g["co"] * g["ci"] // g["g"] * g["kh"] * g["kw"]
    return e * inputs, e * weights, e * outputs


def _direct_depth(g: dict) -> Any:
    return clog2(g["ci"] // g["g"]) + clog2(g["kh"]) + clog2(g["kw"])  # Table 6


def _gemm_like(name: str, cls: str, g: dict, batch: Any, e: int, buffer: Any = 0) -> Kernel:
    x, w, y = _io_bytes(g, batch, e)
    flops = direct_flops(g, batch)
    return Kernel(name, cls, Cost(
        fwd_flops=flops, bwd_data_flops=flops, bwd_weight_flops=flops,
        fwd_bytes=x + w + y + 2 * buffer, bwd_bytes=2 * (x + w + y) + 4 * buffer,
        depth=_direct_depth(g), bwd_depth=clog2(g["co"]) + clog2(g["kh"]) + clog2(g["kw"]),
    ))


def im2col_buffer(g: dict, batch: Any, e: int) -> Any:
    """(C_in*Ky*Kx) x (N*H'*W') elements (SURVEY_MODELS.md 2c)."""
    return e * g["ci"] * g["kh"] * g["kw"] * batch * g["ho"] * g["wo"]


def winograd_kernel(g: dict, batch: Any, e: int, m: int = WINOGRAD_M) -> Kernel:
    """F(m x m, r x r): alpha^2 batched GEMMs over P_t = N*ceil(H'/m)*ceil(W'/m) tiles plus the transforms."""
    r, alpha = g["kh"], m + g["kh"] - 1
    tiles = batch * (-(-g["ho"] // m)) * (-(-g["wo"] // m))
    ci, co = g["ci"], g["co"]
    multiply = 2 * co * ci * tiles * alpha**2
    transforms = ci * tiles * 2 * alpha**3 + co * ci * (alpha * r**2 + alpha**2 * r) + co * tiles * (
        alpha**2 * m + alpha * m**2)
    x, w, y = _io_bytes(g, batch, e)
    workspace = e * alpha**2 * (ci * tiles + co * tiles + co * ci)
    flops = multiply + transforms
    return Kernel("winograd", "matmul", Cost(
        fwd_flops=flops, bwd_data_flops=flops, bwd_weight_flops=flops,
        fwd_bytes=x + w + y + 2 * workspace, bwd_bytes=2 * (x + w + y) + 4 * workspace,
        depth=2 * clog2(r) + 4 * clog2(alpha) + clog2(ci),  # Table 6
        bwd_depth=2 * clog2(r) + 4 * clog2(alpha) + clog2(co),
    ), launches=3, framework_ops=1)


def _next_pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def fft_kernel(g: dict, batch: Any, e: int) -> Kernel:
    """Real 2-D FFTs (2.5 n log2 n FLOPs) of N*C_in inputs, C_out*C_in kernels and N*C_out outputs, plus the
    complex pointwise multiply-accumulate 8*N*C_in*C_out*Hf*(Wf/2+1) (SURVEY_MODELS.md 2c)."""
    hf, wf = _next_pow2(g["h"] + g["kh"] - 1), _next_pow2(g["w"] + g["kw"] - 1)
    n = hf * wf
    fft = 2.5 * n * clog2(n)
    ci, co = g["ci"], g["co"]
    transforms = fft * (batch * ci + co * ci + batch * co)
    pointwise = 8 * batch * ci * co * hf * (wf // 2 + 1)
    x, w, y = _io_bytes(g, batch, e)
    spectra = 2 * e * hf * (wf // 2 + 1) * (batch * ci + co * ci + batch * co)
    flops = transforms + pointwise
    return Kernel("fft", "matmul", Cost(
        fwd_flops=flops, bwd_data_flops=flops, bwd_weight_flops=flops,
        fwd_bytes=x + w + y + 2 * spectra, bwd_bytes=2 * (x + w + y) + 4 * spectra,
        depth=2 * clog2(n) + clog2(ci), bwd_depth=2 * clog2(n) + clog2(co),  # Table 6
    ), launches=4, framework_ops=1)


def applicable(layer: Layer, dtype: str) -> tuple[str, ...]:
    """Algorithms cuDNN would consider: Winograd only for 3x3, stride 1, undilated, ungrouped; FFT only for
    stride 1 and kernels >= 3. Both run on CUDA cores, so with tensor-core dtypes only GEMM forms are used."""
    g = _geometry(layer)
    plain = g["sh"] == g["sw"] == 1 and g["dil"] == (1, 1) and g["g"] == 1
    out = ["direct", "im2col"]
    if dtype in TENSOR_CORE_DTYPES:
        return tuple(out)
    if plain and g["kh"] == g["kw"] == 3:
        out.append("winograd")
    if plain and min(g["kh"], g["kw"]) >= 3:
        out.append("fft")
    return tuple(out)


def algorithm_kernel(layer: Layer, algorithm: str, batch: Any, e: int) -> Kernel:
    g = _geometry(layer)
    if algorithm == "winograd":
        return winograd_kernel(g, batch, e)
    if algorithm == "fft":
        return fft_kernel(g, batch, e)
    if algorithm == "im2col":
        return _gemm_like("im2col", "matmul", g, batch, e, buffer=im2col_buffer(g, batch, e))
    return _gemm_like("direct", "conv", g, batch, e)


def layout_transpose_kernel(layer: Layer, batch: Any, e: int) -> Kernel:
    """The NCHW <-> NHWC transposes cuDNN wraps around a tensor-core convolution whose tensors are NCHW.

    Tensor-core convolution kernels read and write NHWC; given NCHW tensors, cuDNN transposes each operand a call
    reads into NHWC and the result back (NVIDIA Deep Learning Performance docs, "Convolutional Layers User's
    Guide", section "Tensor Layouts In Memory: NCHW vs NHWC"; ptrblck's nsys profile of an A100 TF32 NCHW forward
    in pytorch/pytorch#81940, cuDNN 8.3.2: cudnn::ops::nchwToNhwcKernel, the NHWC implicit GEMM
    sm80_xmma_fprop_implicit_gemm_tf32f32_..._nhwckrsc_nhwc, then nhwcToNchwKernel, one of each per call). Each
    transpose reads and writes its tensor once (2 * e bytes per element) in its own launch. Forward: x and w in,
    y out; backward-data: dy and w in, dx out; backward-filter: x and dy in, dw out, so backward moves each tensor
    twice."""
    x, w, y = _io_bytes(_geometry(layer), batch, e)
    moved = x + w + y
    return Kernel("layout_transpose", "memory", Cost(fwd_bytes=2 * moved, bwd_bytes=4 * moved, depth=1, bwd_depth=1),
                  launches=3, bwd_launches=6, framework_ops=0)


def _conv_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    algorithm = layer["algorithm"]
    kernels = [algorithm_kernel(layer, "direct" if algorithm == "auto" else algorithm, batch, e)]
    if layer["bias"]:
        n = batch * numel(layer.out_shape)
        kernels.append(Kernel("bias", "memory", Cost(fwd_flops=n, bwd_weight_flops=n, fwd_bytes=2 * e * n,
                                                     bwd_bytes=e * n, depth=1, bwd_depth=1)))
    return tuple(kernels)


def _conv_asymptotic(layer: Layer, batch: Any) -> tuple[Any, Any]:
    g = _geometry(layer)
    return direct_flops(g, batch) / 2, _direct_depth(g)


CONV2D = OpRule(
    attrs={"out": REQUIRED, "kernel": REQUIRED, "stride": 1, "padding": 0, "dilation": 1, "groups": 1,
           "bias": True, "algorithm": "auto"},
    shape=_conv_shape,
    params=_conv_params,
    kernels=_conv_kernels,
    asymptotic=_conv_asymptotic,
    tp="conv",
)
