"""Kernels in plain numpy on the CPU: BLAS GEMM (fp32, fp64), im2col + GEMM convolution, STREAM-like memory
kernels and the per-call overhead of a tiny ufunc."""

from __future__ import annotations

import numpy as np

from dlperf.calibrate import probes as P
from dlperf.calibrate.probes import Kernel, Point, Series

DTYPES = {"fp32": np.float32, "fp64": np.float64}
NUMPY_MEMORY = ("copy", "scale", "add", "sum", "relu", "tanh")


def _rand(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def conv2d_im2col(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0) -> np.ndarray:
    """2-D convolution (cross-correlation, as in deep learning) by im2col + one GEMM.

    x: (N, C, H, W), w: (C_out, C, K, K) -> (N, C_out, H', W'). The column buffer holds
    (C*K*K) x (N*H'*W') elements (survey Table 6, im2col row), built here from a strided window view.
    """
    n, c, _, _ = x.shape
    c_out, c_w, k, k2 = w.shape
    if c_w != c or k != k2:
        raise ValueError(f"weight {w.shape} does not match input channels {c} or is not square")
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding))) if padding else x
    windows = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    h_out, w_out = windows.shape[2], windows.shape[3]
    cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h_out * w_out, c * k * k)
    out = cols @ w.reshape(c_out, c * k * k).T
    return out.reshape(n, h_out, w_out, c_out).transpose(0, 3, 1, 2)


def _gemm(m: int, k: int, n: int, dtype: str, batch: int = 0) -> Kernel:
    lead = (batch,) if batch else ()
    a, b = _rand((*lead, m, k), DTYPES[dtype]), _rand((*lead, k, n), DTYPES[dtype])
    out = np.empty((*lead, m, n), DTYPES[dtype])
    return lambda: np.matmul(a, b, out=out)


def _linear(m: int, k: int, n: int, dtype: str) -> Kernel:
    """A linear layer's forward x W^T + b, data gradient dY W and weight gradient dY^T x (probes.LINEAR_ROWS_*)."""
    x, w, b = _rand((m, k), DTYPES[dtype]), _rand((n, k), DTYPES[dtype]), _rand((n,), DTYPES[dtype])
    dy, y, dx, dw = _rand((m, n), DTYPES[dtype]), np.empty((m, n), DTYPES[dtype]), np.empty((m, k), DTYPES[dtype]), \
        np.empty((n, k), DTYPES[dtype])

    def step() -> None:
        np.add(np.matmul(x, w.T, out=y), b, out=y)
        np.matmul(dy, w, out=dx)
        np.matmul(dy.T, x, out=dw)

    return step


def gemm_series(quick: bool) -> list[Series]:
    return P.gemm_series(tuple(DTYPES), quick, _gemm, _linear)


def _conv(shape: P.ConvShape, batch: int) -> Kernel:
    x = _rand((batch, shape.c_in, shape.size, shape.size), np.float32)
    w = _rand((shape.c_out, shape.c_in, shape.kernel, shape.kernel), np.float32)
    return lambda: conv2d_im2col(x, w, shape.stride, shape.pad)


def conv_series(quick: bool) -> list[Series]:
    batches = P.CONV_BATCH_QUICK if quick else P.CONV_BATCH_FULL
    return [Series("conv", f"{s.name} (im2col)", "fp32", tuple(
        Point(s.flops(n), s.label(n), lambda s=s, n=n: _conv(s, n)) for n in batches)) for s in P.conv_shapes(quick)]


def _memory(kind: str, nbytes: int) -> Kernel:
    n = nbytes // 8
    a, b, c = np.ones(n), np.ones(n), np.ones(n)
    kernels = {
        "copy": lambda: np.copyto(b, a),
        "scale": lambda: np.multiply(a, 3.0, out=b),
        "add": lambda: np.add(a, b, out=c),
        "sum": lambda: a.sum(),
        "relu": lambda: np.maximum(a, 0.0, out=b),
        "tanh": lambda: np.tanh(a, out=b),
    }
    return kernels[kind]


def memory_series(quick: bool) -> list[Series]:
    sizes = P.MEMORY_QUICK if quick else P.MEMORY_FULL
    # numpy has no single-pass triad (b + s*c takes two passes) and no GELU/softmax ufunc: left out rather
    # than miscounted
    return [Series("memory", kind, "fp64", tuple(
        Point(float(P.MEMORY_KERNELS[kind] * s), f"{s // 8} x fp64", lambda k=kind, s=s: _memory(k, s))
        for s in sizes)) for kind in NUMPY_MEMORY]


def launch_series() -> list[Series]:
    def make() -> Kernel:
        x = np.zeros(1)
        return lambda: np.add(x, 1.0, out=x)

    return [Series("launch", "tiny ufunc", "fp64", (Point(1.0, "1 element", make),))]


def all_series(quick: bool) -> list[Series]:
    return launch_series() + gemm_series(quick) + conv_series(quick) + memory_series(quick)
