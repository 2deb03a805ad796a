"""What gets timed: series of kernels of one class, family and dtype at increasing sizes.

Shapes are data here and kernels are built by the backends (numpy, torch), so that both time the same
GEMM and convolution shapes. A point allocates its operands only when it runs (`make`) and drops them
afterwards, so a full sweep never holds more than one size in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Kernel = Callable[[], object]


@dataclass(frozen=True)
class Point:
    size: float                      # FLOPs for matmul/conv, bytes moved for memory, 1 for launch: per kernel
    label: str                       # the shape, for tables and the calibration stamp
    make: Callable[[], Kernel]       # allocate operands, return the kernel to time
    kernels: int = 1                 # kernels one call runs (the time is divided by it: seconds per kernel)


@dataclass(frozen=True)
class Series:
    cls: str                         # matmul | conv | memory | launch
    family: str                      # square, linear, batched, copy, triad, resnet-3x3-64, ...
    dtype: str
    points: tuple[Point, ...]        # in increasing size


# GEMM shapes (M, K, N): one multiply-add = 2 FLOPs (survey section 2c).
SQUARE_FULL = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
SQUARE_QUICK = (16, 32, 64, 128, 256, 512, 1024)
SQUARE_GPU_EXTRA = (4096, 8192)  # a GPU's GEMM plateau lies beyond 2048^3 (17 GFLOP: ~30 us on an A100)
# Linear: a batch of M rows through a W -> W linear layer, timed as the three GEMMs autograd runs for it in
# one training step (forward X W^T + b, data gradient dY W, weight gradient dY^T X: 2MKN FLOPs each, the time
# per kernel is a third of a call's), since these, not one plain A B, are what a network's linear layers
# cost; on this project's CPU the transposed and bias-fused variants ran ~8% below plain A B of the same size
# (225 vs 245 GFLOP/s at 4096x256x256). The written matmul curve is fitted to this family alone
# (calibration.MATMUL_FAMILIES), from its smallest point of at least MIN_FIT_FLOPS (8 rows full, 16 quick, at
# W = 256; 4 rows is reported) to the plateau. W = 256 on a CPU (MLP/transformer projections at small width);
# a GPU needs a wider layer to leave the launch-bound regime (4096: GPT-2-XL/LLaMA-7B width).
LINEAR_ROWS_FULL = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
LINEAR_ROWS_QUICK = (4, 16, 64, 256, 1024, 2048, 4096, 8192)  # several plateau points: r_inf averages over them
LINEAR_WIDTH = {"cpu": 256, "cuda": 4096}
# Batched: attention scores, (b, n, 64) @ (b, 64, n) with b = 16 heads x batch.
BATCHED_FULL = (32, 64, 128, 256, 512)
BATCHED_QUICK = (32, 128, 512)
BATCH_HEADS, HEAD_DIM = 16, 64


def gemm_flops(m: int, k: int, n: int, batch: int = 1) -> float:
    return 2.0 * batch * m * k * n


@dataclass(frozen=True)
class ConvShape:
    """A convolution layer as it appears in common networks; the batch is swept."""

    name: str
    c_in: int
    size: int                        # input height = width
    c_out: int
    kernel: int
    stride: int = 1
    padding: int | None = None       # None = kernel // 2 ('same' for odd kernels at stride 1)

    @property
    def pad(self) -> int:
        return self.kernel // 2 if self.padding is None else self.padding

    @property
    def out_size(self) -> int:
        """H' = floor((H + 2p - K) / s) + 1 (survey section 2c)."""
        return (self.size + 2 * self.pad - self.kernel) // self.stride + 1

    def flops(self, batch: int) -> float:
        """Forward FLOPs 2 * N * C_out * H' * W' * C_in * K^2 (survey section 2c, direct / im2col)."""
        return 2.0 * batch * self.c_out * self.out_size**2 * self.c_in * self.kernel**2

    def label(self, batch: int) -> str:
        return f"N{batch} {self.c_in}x{self.size}x{self.size} k{self.kernel}s{self.stride} -> {self.c_out}"


# ResNet-50 (He et al. 2016, Table 1) and VGG-16 (Simonyan & Zisserman 2015) layer shapes, plus CIFAR-size
# and LeNet-5 layers so the curve also covers the small end.
CONV_SHAPES = (
    ConvShape("resnet-stem-7x7", 3, 224, 64, 7, 2, 3),
    ConvShape("resnet-3x3-64", 64, 56, 64, 3),
    ConvShape("resnet-3x3-128", 128, 28, 128, 3),
    ConvShape("resnet-3x3-256", 256, 14, 256, 3),
    ConvShape("resnet-1x1-256-64", 256, 56, 64, 1),
    ConvShape("vgg-3x3-128", 128, 112, 128, 3),
    ConvShape("cifar-3x3-32", 32, 32, 32, 3),
    ConvShape("cifar-3x3-64", 64, 16, 64, 3),
    ConvShape("lenet-5x5-6-16", 6, 14, 16, 5, 1, 0),
)
CONV_QUICK = ("resnet-3x3-64", "resnet-3x3-256", "resnet-1x1-256-64", "cifar-3x3-32", "cifar-3x3-64")
CONV_BATCH_FULL = (1, 2, 4, 8, 16, 32)
CONV_BATCH_QUICK = (1, 4, 16)


# Memory kernels: STREAM's copy, scale, add, triad (McCalpin 1995), a reduction, and the element-wise layers
# of networks (ReLU, GELU, tanh, softmax over rows of 1024). Bytes moved = read + written, the engine's
# convention; GELU/tanh/softmax spend time on exp/erf as well, which is why they are timed here.
MEMORY_FULL = tuple(2**k for k in range(12, 31))      # 4 KiB .. 1 GiB per array
# 4 KiB .. 256 MiB: every other power of two up to 16 MiB, then every one (the DRAM points that are fitted)
MEMORY_QUICK = tuple(2**k for k in range(12, 24, 2)) + tuple(2**k for k in range(24, 29))
# arrays read + written per element for each STREAM-like kernel
MEMORY_KERNELS = {"copy": 2, "scale": 2, "add": 3, "triad": 3, "sum": 1, "relu": 2, "gelu": 2, "tanh": 2,
                  "softmax": 2}
SOFTMAX_ROW = 1024


GemmMaker = Callable[[int, int, int, str, int], Kernel]  # (m, k, n, dtype, batch; 0 = unbatched) -> kernel
LinearMaker = Callable[[int, int, int, str], Kernel]     # (rows m, in k, out n, dtype) -> the 3 GEMMs


def gemm_series(dtypes: tuple[str, ...], quick: bool, make: GemmMaker, linear: LinearMaker,
                device: str = "cpu") -> list[Series]:
    """Square, linear-layer and batched GEMM series for each dtype, built by a backend's `make`/`linear`."""

    def point(m: int, k: int, n: int, dtype: str, batch: int = 0) -> Point:
        label = f"{batch}x({m}x{k}x{n})" if batch else f"{m}x{k}x{n}"
        return Point(gemm_flops(m, k, n, max(batch, 1)), label, lambda: make(m, k, n, dtype, batch))

    def layer(m: int, dtype: str) -> Point:
        return Point(gemm_flops(m, w, w), f"{m}x{w}x{w} (fwd, dX, dW)", lambda: linear(m, w, w, dtype), kernels=3)

    w, b, d = LINEAR_WIDTH[device], BATCH_HEADS, HEAD_DIM
    big = SQUARE_GPU_EXTRA if device == "cuda" else ()
    out = []
    for dtype in dtypes:
        out += [
            Series("matmul", "square", dtype,
                   tuple(point(s, s, s, dtype) for s in (SQUARE_QUICK if quick else SQUARE_FULL) + big)),
            Series("matmul", "linear", dtype,
                   tuple(layer(m, dtype) for m in (LINEAR_ROWS_QUICK if quick else LINEAR_ROWS_FULL))),
            Series("matmul", "batched", dtype,
                   tuple(point(s, d, s, dtype, b) for s in (BATCHED_QUICK if quick else BATCHED_FULL))),
        ]
    return out


def conv_shapes(quick: bool) -> tuple[ConvShape, ...]:
    return tuple(s for s in CONV_SHAPES if not quick or s.name in CONV_QUICK)
