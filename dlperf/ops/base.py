"""What every operator rule provides, and the Layer record the spec loader produces."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlperf import mathx
from dlperf.cost import Cost
from dlperf.errors import ShapeError

Shape = tuple[Any, ...]
REQUIRED = object()  # marks an attribute without default

BYTES_PER_ELEMENT = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "mxfp8": 1, "nvfp4": 0.5}
MASK_BYTES = 1  # dropout masks are stored as one byte per element (PyTorch bool tensors)
INDEX_BYTES = 8  # int64 indices (torch.topk, torch.nonzero)


@dataclass(frozen=True)
class Layer:
    """One operator instance with its resolved attributes and shapes (per sample; batch is symbolic). `precision`:
    "bf16" for a layer built inside a `{block: ..., precision: bf16}` call, which an FP8 recipe leaves in 16 bits
    (dlperf.ops.fp8.fp8_layers); it makes the layer differ from equal layers elsewhere. "" otherwise."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    in_shape: Shape
    out_shape: Shape
    name: str = ""
    params: Any = 0
    precision: str = ""

    def __getitem__(self, key: str) -> Any:
        return dict(self.attrs)[key]

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)


@dataclass(frozen=True)
class Kernel:
    """One kernel (or fused group) of an operator: its cost and how it behaves on the device.

    `cls` picks the efficiency curve (matmul, conv, attention, memory); `launches` counts forward kernel launches
    and `bwd_launches` backward ones (None: twice as many, data and weight gradient); `split` says whether tensor
    parallelism divides it. A GEMM carries its forward shape `gemm` (batch, m, n, k) for tile and wave
    quantization, and `tp_dim` names the dimension tensor parallelism divides: n (column-parallel), k
    (row-parallel), batch (attention heads), or None when the op's place in the network decides (a linear layer).
    `bwd_recompute_flops` are forward FLOPs the backward kernel executes again (a fused attention kernel
    recomputes the scores instead of storing them): executed and timed, but not model FLOPs. `weight_gemm` is
    (m, k, n) for a GEMM against a weight matrix (a linear layer or projection), the GEMMs an FP8 recipe runs in
    FP8 (dlperf.ops.fp8) and overlapped tensor-parallel communication hides behind; `weight_groups` is how many
    [k, n] weight matrices it reads (a grouped expert GEMM: one per resident expert). `model_work_scale` turns the
    executed work into the model FLOPs MFU counts (a causal FlashAttention kernel skips masked blocks that the
    MFU convention still counts).
    `dtype` pins the kernel's compute precision whatever the plan's (a MoE router runs in
    fp32); `expert` marks the routed experts' work, which lands on the busiest expert-parallel rank (the engine
    scales its time by the load-imbalance or capacity factor). `framework_ops` is how many operators the
    framework issues for the kernel's forward launches, which is what the host pays for (None: one per launch;
    cuDNN launches a Winograd or FFT convolution's transform kernels from C++ inside one conv2d call), and
    `bwd_framework_ops` how many for the backward's (None: twice `framework_ops`, data and weight gradient).
    `slowdown` is (forward, backward) time of this implementation over what its class's curve gives, for a kernel
    measured only relative to the one the curve describes (FlashAttention in Triton against FlashAttention-2).
    `syncs` counts the forward's host synchronisations (a `.item()` or `torch.nonzero` waits for the device):
    after each the device runs dry until the host issues the next kernel (dlperf.engine.device.sync_gap).
    `library_host` is (forward, backward) host seconds, at the reference host's speed, that a library spends
    inside its framework operators issuing per-expert work the operators' dispatch does not cover (Transformer
    Engine's grouped GEMM and grouped quantize: dlperf.ops.moe.per_expert_gemm_host, dlperf.ops.fp8).
    """

    name: str
    cls: str
    cost: Cost
    launches: Any = 1
    split: bool = True
    bwd_launches: Any = None
    gemm: tuple[Any, Any, Any, Any] | None = None
    tp_dim: str | None = None
    bwd_recompute_flops: Any = 0
    weight_gemm: tuple[Any, Any, Any] | None = None
    weight_groups: Any = 1
    model_work_scale: Any = 1
    dtype: str | None = None
    expert: bool = False
    framework_ops: Any = None
    bwd_framework_ops: Any = None
    slowdown: tuple[float, float] = (1.0, 1.0)
    seq: Any = None  # a fused attention kernel: the key length its query blocks loop over (curve's seq_half)
    head_dim: Any = None  # a fused attention kernel: its head dim, for its curve's rate there (dlperf.ops.headdim)
    syncs: Any = 0
    library_host: tuple[Any, Any] = (0.0, 0.0)

    @property
    def backward_launches(self) -> Any:
        return 2 * self.launches if self.bwd_launches is None else self.bwd_launches

    @property
    def bwd_flops(self) -> Any:
        """FLOPs the backward kernels execute: both gradients and any forward work they redo."""
        c = self.cost
        return c.bwd_data_flops + c.bwd_weight_flops + self.bwd_recompute_flops

    @property
    def phase_launches(self) -> tuple[Any, Any]:
        """(forward, backward) launches, counting only a phase that does any work."""
        c = self.cost
        fwd = 0 if mathx.is_zero(c.fwd_flops) and mathx.is_zero(c.fwd_bytes) else self.launches
        bwd = 0 if mathx.is_zero(self.bwd_flops) and mathx.is_zero(c.bwd_bytes) else self.backward_launches
        return fwd, bwd

    @property
    def host_ops(self) -> tuple[Any, Any]:
        """(forward, backward) operators the host issues: `phase_launches`, or `framework_ops` per forward and
        `bwd_framework_ops` (default twice that: data and weight gradient) backward when the kernels launch more
        than the framework calls."""
        fwd, bwd = self.phase_launches
        if self.framework_ops is None:
            return fwd, bwd
        backward = 2 * self.framework_ops if self.bwd_framework_ops is None else self.bwd_framework_ops
        return (self.framework_ops if fwd else 0), (backward if bwd else 0)


@dataclass(frozen=True)
class OpRule:
    """A table entry: ~10-line functions for shape, parameters, kernels and saved activations.

    tp describes the op under Megatron-style tensor parallelism: 'linear' (column/row pairing), 'attention'
    (heads split; allreduce of the output forward and of the input gradient backward), 'conv' (filters split;
    allgather of outputs forward, allreduce of input gradients backward, survey section 6), 'vocab'
    (vocabulary-parallel embedding or loss), 'elementwise' (follows its input's sharding), 'full' (needs the
    whole activation), 'none' (no data). `expert_params` (MoE layers) gives the part of the parameters that
    expert parallelism shards.
    """

    attrs: dict[str, Any]
    shape: Callable[[Shape, dict], Shape]
    kernels: Callable[[Layer, Any, int], tuple[Kernel, ...]]
    params: Callable[[Shape, dict], Any] = lambda shape, a: 0
    saved: Callable[[Layer, int], Any] = lambda layer, e: e * numel(layer.in_shape)
    asymptotic: Callable[[Layer, Any], tuple[Any, Any]] | None = None
    tp: str = "elementwise"
    check: Callable[[Shape, dict], None] = field(default=lambda shape, a: None)
    expert_params: Callable[[Layer], Any] | None = None  # the routed experts' share of `params` (MoE layers)


def numel(shape: Shape) -> Any:
    out: Any = 1
    for dim in shape:
        out = out * dim
    return out


def clog2(x: Any) -> Any:
    """ceil(log2 x), the depth of a binary reduction tree over x values (survey Table 6)."""
    if isinstance(x, int):
        return 0 if x <= 1 else math.ceil(math.log2(x))
    return mathx.ceil(mathx.log2(x))


def need_rank(shape: Shape, rank: int | tuple[int, ...], op: str) -> None:
    ranks = (rank,) if isinstance(rank, int) else rank
    if len(shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ShapeError(f"{op} needs a rank-{want} input per sample", expected=f"rank {want}", found=list(shape))


def elementwise_kernel(name: str, n: Any, e: int, flops_per: float, bwd_flops_per: float,
                       reads: float = 1, bwd_reads: float = 2, cls: str = "memory") -> Kernel:
    """A memory-bound kernel over n elements: reads `reads` tensors and writes one (backward: reads, writes dx).
    `cls` is 'transcendental' for kernels built on exp/tanh, which calibration may time apart."""
    return Kernel(name, cls, Cost(
        fwd_flops=flops_per * n, bwd_data_flops=bwd_flops_per * n,
        fwd_bytes=e * n * (reads + 1), bwd_bytes=e * n * (bwd_reads + 1),
        depth=1, bwd_depth=1,
    ))
