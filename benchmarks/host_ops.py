"""How many host operations an eager Megatron-style GPT layer issues per kernel launch that dlperf counts.

The engine prices a host-bound pass as (launches it counts) x (host seconds per launch), and the per-op host
costs it starts from are measured per ATen operator (pytorch/pytorch#41383: 6.8 us for a Python-level op with
autograd; #82793: 4 us per backward op). An eager layer issues far more operators than kernels: views,
transposes, splits, allocations, detaches and autograd bookkeeping launch nothing but cost host time. This script
counts them, with PyTorch's dispatcher (TorchDispatchMode), for a layer laid out as Megatron-LM /
Megatron-DeepSpeed's ParallelTransformerLayer at tp = 1 (megatron/model/transformer.py: fused QKV
ColumnParallelLinear with bias, view + split into heads, baddbmm on transposed views into a preallocated buffer,
scale-mask-softmax, attention dropout, bmm, permute + contiguous, RowParallelLinear with its bias added later,
bias-dropout-add, bias-GeLU), and divides by the launches dlperf counts for one `gpt` layer. It also times the
layer's passes on this machine's CPU at a tiny width, as a cross-check of the per-op cost (no CUDA launch calls
here, so a GPU host pays more).

    .venv/bin/python benchmarks/host_ops.py

The ratios it prints are what spec/hardware.py's DEFAULT_DISPATCH multiplies the per-op costs by.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
import torch.utils.checkpoint as checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

from dlperf.ops import OPS
from dlperf.spec.model import load_model

SEQ, BATCH, HIDDEN, HEADS = 16, 2, 64, 4   # tiny: only the operator stream matters here
HEAD_DIM = HIDDEN // HEADS


class CountOps(TorchDispatchMode):
    """Counts every ATen operator call, kernel-launching or not."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class MegatronStyleLayer(torch.nn.Module):
    """Pre-LN GPT layer with Megatron's operator sequence (tp = 1, so the tp region functions are identities)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.dense = torch.nn.Parameter(torch.randn(HIDDEN, HIDDEN))
        self.dense_bias = torch.nn.Parameter(torch.zeros(HIDDEN))
        self.fc1 = torch.nn.Parameter(torch.randn(4 * HIDDEN, HIDDEN))
        self.fc1_bias = torch.nn.Parameter(torch.zeros(4 * HIDDEN))
        self.fc2 = torch.nn.Parameter(torch.randn(HIDDEN, 4 * HIDDEN))
        self.fc2_bias = torch.nn.Parameter(torch.zeros(HIDDEN))

    def attention(self, x: Any, mask: Any) -> Any:
        mixed = self.qkv(x).view(SEQ, BATCH, HEADS, 3 * HEAD_DIM)
        q, k, v = torch.split(mixed, HEAD_DIM, dim=-1)
        q, k, v = (t.reshape(SEQ, BATCH * HEADS, HEAD_DIM) for t in (q, k, v))
        buffer = torch.empty(BATCH * HEADS, SEQ, SEQ)
        scores = torch.baddbmm(buffer, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2), beta=0.0,
                               alpha=HEAD_DIM ** -0.5).view(BATCH, HEADS, SEQ, SEQ)
        probs = F.dropout(torch.softmax(scores.masked_fill(mask, -10000.0), dim=-1), 0.1, True)
        context = torch.bmm(probs.view(BATCH * HEADS, SEQ, SEQ), v.transpose(0, 1))
        context = context.view(BATCH, HEADS, SEQ, HEAD_DIM).permute(2, 0, 1, 3).contiguous().view(SEQ, BATCH, HIDDEN)
        return F.linear(context, self.dense)

    def forward(self, x: Any, mask: Any) -> Any:
        x = x + F.dropout(self.attention(self.ln1(x), mask) + self.dense_bias, 0.1, True)
        inner = F.gelu(F.linear(self.ln2(x), self.fc1) + self.fc1_bias)
        return x + F.dropout(F.linear(inner, self.fc2) + self.fc2_bias, 0.1, True)


def count_ops(layer: MegatronStyleLayer, mask: Any, recompute: bool) -> tuple[int, int]:
    """(forward, backward) ATen operators of one layer; with `recompute`, reentrant activation checkpointing
    (Megatron's CheckpointFunction), whose backward reruns the forward."""
    x = torch.randn(SEQ, BATCH, HIDDEN, requires_grad=True)
    with CountOps() as forward:
        y = checkpoint.checkpoint(layer, x, mask, use_reentrant=True) if recompute else layer(x, mask)
    with CountOps() as backward:
        y.backward(torch.ones_like(y))
    return sum(forward.ops.values()), sum(backward.ops.values())


def engine_launches() -> tuple[int, int]:
    """(forward, backward) kernel launches dlperf counts for one `gpt` layer (two layers minus one)."""
    def launches(layers: int) -> tuple[int, int]:
        sizes = {"hidden": HIDDEN, "heads": HEADS, "seq": SEQ, "vocab": 64, "layers": layers}
        fwd = bwd = 0
        for layer, count in load_model("gpt", sizes).counted():
            for kernel in OPS[layer.op].kernels(layer, BATCH, 2):
                f, b = kernel.phase_launches
                fwd, bwd = fwd + count * f, bwd + count * b
        return fwd, bwd

    (f1, b1), (f2, b2) = launches(1), launches(2)
    return f2 - f1, b2 - b1


def host_seconds(layer: MegatronStyleLayer, mask: Any, recompute: bool, repeats: int = 300) -> tuple[float, float]:
    """Median-of-5 host seconds of one layer's forward and backward on this CPU."""
    x = torch.randn(SEQ, BATCH, HIDDEN, requires_grad=True)
    forward, backward = [], []
    for _ in range(5):
        fwd = bwd = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            y = checkpoint.checkpoint(layer, x, mask, use_reentrant=True) if recompute else layer(x, mask)
            middle = time.perf_counter()
            y.backward(torch.ones_like(y))
            fwd, bwd = fwd + middle - start, bwd + time.perf_counter() - middle
        forward.append(fwd / repeats)
        backward.append(bwd / repeats)
    return sorted(forward)[2], sorted(backward)[2]


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layer, mask = MegatronStyleLayer(), torch.ones(BATCH, 1, SEQ, SEQ, dtype=torch.bool).triu(1)
    fwd_launches, bwd_launches = engine_launches()
    print(f"dlperf launches per gpt layer: forward {fwd_launches}, backward {bwd_launches}")
    for recompute in (False, True):
        fwd_ops, bwd_ops = count_ops(layer, mask, recompute)
        fwd_s, bwd_s = host_seconds(layer, mask, recompute)
        label = "reentrant recompute" if recompute else "no recompute"
        print(f"{label:20s} ATen ops forward {fwd_ops:3d} ({fwd_ops / fwd_launches:.2f} per launch), backward "
              f"{bwd_ops:3d} ({bwd_ops / bwd_launches:.2f} per launch); host here {fwd_s * 1e6:.0f} us forward "
              f"({fwd_s / fwd_ops * 1e6:.1f} us/op), {bwd_s * 1e6:.0f} us backward ({bwd_s / bwd_ops * 1e6:.1f} us/op)")


if __name__ == "__main__":
    main()
