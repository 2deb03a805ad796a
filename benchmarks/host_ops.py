"""Host time an eager Megatron-style GPT layer spends per kernel launch that dlperf counts.

The engine prices a host-bound pass as (launches it counts) x (host seconds per launch). An eager layer issues
far more than its kernels: views, splits, allocations and autograd bookkeeping launch nothing, and Megatron adds
Python around them (custom autograd functions for its linear layers, tensor-parallel regions, fused LayerNorm
and softmax; TorchScript bias-GeLU and bias-dropout-add; forking the CUDA RNG state around attention dropout;
CheckpointFunction saving and restoring RNG states). This script runs a layer laid out as Megatron-DeepSpeed's
ParallelTransformerLayer at tp = 1 (microsoft/Megatron-DeepSpeed @f4157bea: megatron/model/transformer.py
CoreAttention / ParallelAttention / ParallelMLP / bias_dropout_add_fused_train, megatron/model/fused_bias_gelu.py,
megatron/core/tensor_parallel/random.py CudaRNGStatesTracker.fork and CheckpointFunction) on this machine's CPU
at a tiny width, so the kernels do next to nothing, and reports, per launch dlperf counts for one `gpt` layer:
the ATen operators issued (counted with PyTorch's dispatcher) and the host seconds (median of 5 x 300 passes, one
thread). CPU RNG states stand in for CUDA ones; the CUDA launch call a GPU host also pays per kernel is not in
it, so on a GPU host the figures are a lower bound.

    .venv/bin/python benchmarks/host_ops.py

spec/hardware.py's FRAMEWORK_HOST quotes what it printed on our machine (DEFAULT_DISPATCH adds the driver's launch
call, which a CPU-device run does not make).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from op_count import CountOps  # benchmarks/op_count.py: run as a script, this folder is on sys.path

from dlperf.calibrate.backend_torch import layer_launches

SEQ, BATCH, HIDDEN, HEADS = 2, 1, 8, 2   # as small as the layer allows: only the host's work should count
HEAD_DIM = HIDDEN // HEADS


class Region(torch.autograd.Function):
    """copy_to / reduce_from_tensor_model_parallel_region at tp = 1: identities, but autograd functions."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad


class Linear(torch.autograd.Function):
    """LinearWithGradAccumulationAndAsyncCommunication: input and weight gradients by hand, bias optional."""

    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, bias: Any) -> Any:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        out = torch.matmul(x, weight.t())
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        x, weight = ctx.saved_tensors
        grad_input = grad.matmul(weight)
        grad2d, x2d = grad.view(-1, grad.shape[-1]), x.view(-1, x.shape[-1])
        return grad_input, grad2d.t().matmul(x2d), grad2d.sum(dim=0) if ctx.has_bias else None


class LayerNorm(torch.autograd.Function):
    """Apex's FusedLayerNormAffineFunction: one forward and one backward operator inside a Python function."""

    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, bias: Any) -> Any:
        x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [HIDDEN], weight, bias, 1e-5)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        x, weight, bias, mean, rstd = ctx.saved_tensors
        return torch.ops.aten.native_layer_norm_backward(grad.contiguous(), x, [HIDDEN], mean, rstd, weight, bias,
                                                         [True, True, True])


class Softmax(torch.autograd.Function):
    """ScaledUpperTriangMaskedSoftmax: one fused operator each way (a scaled softmax stands in)."""

    @staticmethod
    def forward(ctx: Any, x: Any, scale: float) -> Any:
        y = torch.softmax(x * scale, -1)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        (y,) = ctx.saved_tensors
        return torch.ops.aten._softmax_backward_data(grad, y, -1, y.dtype) * ctx.scale, None


@torch.jit.script
def bias_gelu(bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


@torch.jit.script
def bias_gelu_back(g: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = bias + y
    t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    return g * (0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t))


class BiasGeLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any, bias: Any) -> Any:
        ctx.save_for_backward(x, bias)
        return bias_gelu(bias, x)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        x, bias = ctx.saved_tensors
        out = bias_gelu_back(grad, bias, x)
        return out, out


@torch.jit.script
def bias_dropout_add(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float) -> torch.Tensor:
    return residual + torch.nn.functional.dropout(x + bias, p=prob, training=True)


class RNGTracker:
    """CudaRNGStatesTracker.fork: save the current state, switch to the tracked one, and back afterwards."""

    def __init__(self) -> None:
        self.state = torch.get_rng_state()

    def fork(self) -> Any:
        original = torch.get_rng_state()
        torch.set_rng_state(self.state)
        return original

    def join(self, original: Any) -> None:
        self.state = torch.get_rng_state()
        torch.set_rng_state(original)


TRACKER = RNGTracker()


class MegatronStyleLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def param(*shape: int) -> Any:
            return torch.nn.Parameter(torch.randn(*shape) * 0.02)

        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = param(HIDDEN), param(HIDDEN), param(HIDDEN), param(HIDDEN)
        self.qkv_w, self.qkv_b = param(3 * HIDDEN, HIDDEN), param(3 * HIDDEN)
        self.dense_w, self.dense_b = param(HIDDEN, HIDDEN), param(HIDDEN)
        self.fc1_w, self.fc1_b = param(4 * HIDDEN, HIDDEN), param(4 * HIDDEN)
        self.fc2_w, self.fc2_b = param(HIDDEN, 4 * HIDDEN), param(HIDDEN)

    def attention(self, x: Any) -> Any:
        mixed = Linear.apply(Region.apply(x), self.qkv_w, self.qkv_b).view(SEQ, BATCH, HEADS, 3 * HEAD_DIM)
        q, k, v = (t.reshape(SEQ, BATCH * HEADS, HEAD_DIM) for t in torch.split(mixed, HEAD_DIM, dim=-1))
        buffer = torch.empty(BATCH * HEADS, SEQ, SEQ)
        scores = torch.baddbmm(buffer, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2), beta=0.0, alpha=1.0)
        probs = Softmax.apply(scores.view(BATCH, HEADS, SEQ, SEQ), HEAD_DIM ** -0.5)
        original = TRACKER.fork()
        probs = F.dropout(probs, 0.1, True)
        TRACKER.join(original)
        context = torch.bmm(probs.view(BATCH * HEADS, SEQ, SEQ), v.transpose(0, 1))
        context = context.view(BATCH, HEADS, SEQ, HEAD_DIM).permute(2, 0, 1, 3).contiguous().view(SEQ, BATCH, HIDDEN)
        return Region.apply(Linear.apply(context, self.dense_w, None))

    def forward(self, x: Any) -> Any:
        x = bias_dropout_add(self.attention(LayerNorm.apply(x, self.ln1_w, self.ln1_b)), self.dense_b, x, 0.1)
        hidden = Linear.apply(Region.apply(LayerNorm.apply(x, self.ln2_w, self.ln2_b)), self.fc1_w, None)
        out = Region.apply(Linear.apply(BiasGeLU.apply(hidden, self.fc1_b), self.fc2_w, None))
        return bias_dropout_add(out, self.fc2_b, x, 0.1)


class Checkpoint(torch.autograd.Function):
    """Megatron's CheckpointFunction: RNG states saved forward, restored for the rerun in backward."""

    @staticmethod
    def forward(ctx: Any, run: Any, x: Any) -> Any:
        ctx.run, ctx.cpu_state, ctx.cuda_state = run, torch.get_rng_state(), torch.get_rng_state()
        ctx.tracker_state = TRACKER.state.clone()
        with torch.no_grad():
            out = run(x)
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        (x,) = ctx.saved_tensors
        cpu_state, cuda_state, tracker_state = torch.get_rng_state(), torch.get_rng_state(), TRACKER.state.clone()
        torch.set_rng_state(ctx.cpu_state)
        torch.set_rng_state(ctx.cuda_state)
        TRACKER.state = ctx.tracker_state
        detached = x.detach().requires_grad_(x.requires_grad)
        with torch.enable_grad():
            out = ctx.run(detached)
        torch.set_rng_state(cpu_state)
        torch.set_rng_state(cuda_state)
        TRACKER.state = tracker_state
        torch.autograd.backward(out, grad)
        return None, detached.grad


def passes(layer: MegatronStyleLayer, recompute: bool) -> tuple[Any, Any]:
    """(forward, backward) callables of one micro-batch through the layer."""
    x = torch.randn(SEQ, BATCH, HIDDEN, requires_grad=True)
    box: dict[str, Any] = {}

    def forward() -> None:
        box["y"] = Checkpoint.apply(layer, x) if recompute else layer(x)

    def backward() -> None:
        box["y"].backward(torch.ones_like(box["y"]))

    return forward, backward


def count_ops(layer: MegatronStyleLayer, recompute: bool) -> tuple[int, int]:
    forward, backward = passes(layer, recompute)
    counts = []
    for run in (forward, backward):
        with CountOps() as counter:
            run()
        counts.append(counter.count)
    return counts[0], counts[1]


def host_seconds(layer: MegatronStyleLayer, recompute: bool, repeats: int = 300) -> tuple[float, float]:
    """Median of 5 means over `repeats` passes, forward and backward, on the host clock."""
    forward, backward = passes(layer, recompute)
    fwd_means, bwd_means = [], []
    for _ in range(5):
        fwd = bwd = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            forward()
            middle = time.perf_counter()
            backward()
            fwd, bwd = fwd + middle - start, bwd + time.perf_counter() - middle
        fwd_means.append(fwd / repeats)
        bwd_means.append(bwd / repeats)
    return sorted(fwd_means)[2], sorted(bwd_means)[2]


def engine_launches() -> tuple[int, int]:
    """(forward, backward) kernel launches dlperf counts for one `gpt` layer of this width."""
    return layer_launches("gpt", {"hidden": HIDDEN, "heads": HEADS, "seq": SEQ, "vocab": 64}, BATCH, 2)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layer = MegatronStyleLayer()
    fwd_launches, bwd_launches = engine_launches()
    print(f"dlperf launches per gpt layer: forward {fwd_launches}, backward {bwd_launches}")
    for recompute in (False, True):
        fwd_ops, bwd_ops = count_ops(layer, recompute)
        fwd_s, bwd_s = host_seconds(layer, recompute)
        label = "recompute (rerun in backward)" if recompute else "no recompute"
        print(f"{label}: ATen operators forward {fwd_ops} ({fwd_ops / fwd_launches:.2f} per launch), backward "
              f"{bwd_ops} ({bwd_ops / bwd_launches:.2f}); host {fwd_s * 1e6:.0f} us forward "
              f"({fwd_s / fwd_launches * 1e6:.1f} us per launch), {bwd_s * 1e6:.0f} us backward "
              f"({bwd_s / bwd_launches * 1e6:.1f} us per launch)")


if __name__ == "__main__":
    main()
