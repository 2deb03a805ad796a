"""Host time of Megatron-Core's own MoE layer, forward and backward, on the CPU device at the smallest widths.

dlperf prices a MoE layer's host time as (operators it counts) x (per-operator host cost of a dense Megatron layer,
benchmarks/host_ops.py). This script measures the MoE layer itself: Megatron-Core's MoELayer (TopKRouter,
MoEAlltoAllTokenDispatcher, GroupedMLP) built from the Megatron-LM source tree given by --mcore (exported from
NVIDIA/Megatron-LM @92c8482e, the commit Megatron-Bridge @97ad8cc6f pins for its Qwen3 recipes, dlperf/ops/moe.py),
with Qwen3-30B-A3B's routing settings (Megatron-Bridge models/qwen/qwen3_moe_bridge.py: moe_grouped_gemm,
moe_router_load_balancing_type aux_loss, moe_aux_loss_coeff 1e-3, moe_router_pre_softmax False,
moe_token_dispatcher_type alltoall; the performance recipes' moe_router_force_load_balancing True; router in fp32
as dlperf's ROUTER_DTYPE), 128 experts top-8, dropless, SwiGLU experts, bf16 parameters, at hidden 16 and expert
ffn 16 over a few tokens so the CPU's arithmetic is negligible: what is timed is Python, ATen dispatch and
autograd. One thread (torch.set_num_threads(1)); each figure is the median over --runs runs of the mean of
--passes passes. It also counts the ATen operators each pass issues (TorchDispatchMode), as host_ops.py does.

    python3 -m venv /tmp/mcore-venv && /tmp/mcore-venv/bin/pip install <torch 2.13 CPU wheel> numpy packaging
    git --git-dir=<Megatron-LM mirror> archive 92c8482e megatron/core | tar -x -C /tmp/mcore-92c
    /tmp/mcore-venv/bin/python benchmarks/moe_host.py --mcore /tmp/mcore-92c

Printed on the Intel Emerald Rapids VM (family 6 model 207, 2 vCPUs shared with other jobs; spec/hardware.py
speed 0.966 of the reference), Megatron-LM @92c8482e, torch 2.13.0+cpu, 7 runs x 50 passes:
    128 experts top-8, 32 tokens:  77 / 457 ATen ops, host ms per layer forward 2.572, backward 2.238
    128 experts top-8, 128 tokens: 77 / 457 ATen ops, forward 2.725, backward 1.915
    16 experts top-8, 32 tokens:   77 / 120 ATen ops, forward 1.320, backward 1.106
    16 experts top-8, 128 tokens:  77 / 120 ATen ops, forward 1.752, backward 1.446
The VM was loaded (load average ~2.9 on its 2 vCPUs) and the same settings varied up to 1.5x between runs
(128 experts, 32 tokens: forward 1.81-2.75 ms, backward 1.45-2.24; 16 experts: forward 1.17-2.02, backward
0.90-1.71): interference only adds time, so the smallest figures are the nearest to a quiet host.
Forward sections at 128 experts, 32 tokens (perf_counter around the module methods, median of 100 passes, us):
router 724 (gating 147, routing 493),
dispatch_preprocess 234, token_dispatch 48, dispatch_postprocess (permute +
chunk sort) 693, experts 534 (SwiGLU with probabilities 251), combine_preprocess (chunk sort) 275, token_combine
34, combine_postprocess (unpermute) 86; in the quietest run (forward 1.81, backward 1.45 ms): 95, 344,
157, 27, 436, 374 (173), 172, 21, 63; at 16 experts (forward 1.17, backward 0.90 ms): 77, 260, 130, 28, 91,
350 (166), 52, 17, 60.

How the measurement differs from the GPU run (each shim is a difference):
- Expert parallelism 1: one process cannot run the all-to-alls, so the dispatcher's ep > 1 work (the splits'
  sums and device-to-host copies, the collectives' Python) is not in it (the chunk sorts run: 128 local experts); with
  --experts 128 the layer holds all 128 experts (--experts 16 runs the 16 per rank of EP 8 as a 16-expert layer
  with the same top-k: the same ATen operator count forward, fewer chunks in the unfused chunk sort).
- No Transformer Engine (a CPU build has none): the router and permutation run unfused (moe_router_fusion and
  moe_permute_fusion False: Megatron-Core's PyTorch top-k, aux-loss and permute/unpermute in ATen operators) where
  the GPU runs call TE's fused Triton/CUDA kernels; the experts are Megatron-Core's GroupedMLP (legacy grouped
  GEMM path) instead of TEGroupedMLP, with `grouped_gemm.ops.gmm` shimmed by GroupedGemmShim (one ATen GEMM per
  GEMM forward and two backward, as the grouped_gemm package's one C++ call, against one expert's weight):
  TE's per-expert C++ loop and GroupedLinear's per-expert Python are not in it (dlperf charges the C++ part
  separately, per_expert_gemm_host). With moe_permute_fusion off, the chunk sort by local expert
  (token_dispatcher.py sort_chunks_by_idxs) splits the tokens into experts x ep chunks and concatenates them
  (torch.split + torch.cat over 128 pieces at 128 experts; backward the matching narrows and cat), per-chunk
  host work the fused TE sort (one kernel each way) does not have: most of the difference between the
  128-expert and 16-expert figures above.
- torch.cuda stream shims (FakeStream): the dispatcher's side stream for its device-to-host copies, current_stream,
  the stream context and record_event/synchronize are no-ops here; on a GPU each is a small CUDA runtime call.
- torch.cuda.current_device returns "cpu" (only used to place parameters; use_cpu_initialization is set anyway).
- moe_utils.te_general_gemm defined as None (patch_router_gemm): Megatron-Core leaves it undefined without TE.
- A gloo process group of world size 1 and parallel_state initialised with tp = pp = ep = 1.
- The SwiGLU-with-probabilities is Megatron-Core's jit_fuser (torch.compile on torch >= 2.2), compiled for the
  CPU: the compiled function's guard check and call are timed, as on a GPU, but its C++ kernel stands in for a
  Triton launch.
- No CUDA launch call and no CUDA caching allocator: the backward in particular runs cheaper than on a GPU host
  (spec/hardware.py BACKWARD_HOST_RATIO).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HIDDEN, FFN = 16, 16  # small enough that 128 experts' weight gradients (128 x 3 x 16 x 16) cost next to nothing


class CountOps(TorchDispatchMode):
    """Counts every ATen operator call, kernel-launching or not (as benchmarks/host_ops.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


class GroupedGemmShim(torch.autograd.Function):
    """grouped_gemm.ops.gmm(a, b, batch_sizes, trans_b) (fanshiqing/grouped_gemm: an autograd.Function around one
    C++ grouped GEMM forward, two backward) as one ATen GEMM each against the first expert's weight: the shapes
    of the real call, but not its per-expert work. CPU torch._grouped_mm loops over the groups in C++ (an
    aten::mm, slices and an item() per expert: 80% of the layer's host time at 128 experts under the profiler),
    a cost a GPU grouped GEMM does not have in that form; dlperf prices the per-expert launches of TE's grouped
    GEMM separately (per_expert_gemm_host), so what is measured here is the operator dlperf's DEFAULT_DISPATCH
    covers: one call per GEMM and pass."""

    @staticmethod
    def forward(ctx: Any, a: Any, b: Any, batch_sizes: Any, trans_b: bool) -> Any:
        ctx.save_for_backward(a, b)
        ctx.trans_b = trans_b
        first = b[0].t() if trans_b else b[0]
        return torch.mm(a, first)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        a, b = ctx.saved_tensors
        first = b[0].t() if ctx.trans_b else b[0]
        grad_a = torch.mm(grad, first.t())
        grad_first = torch.mm(a.t(), grad)
        grad_b = (grad_first.t() if ctx.trans_b else grad_first).expand(b.shape)
        return grad_a, grad_b, None, None


class FakeStream:
    """torch.cuda.Stream / Event stand-in: every call a no-op."""

    def wait_stream(self, other: Any) -> None:
        return None

    def record_event(self) -> FakeStream:
        return self

    def synchronize(self) -> None:
        return None

    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def install_shims() -> None:
    """The shims the module docstring lists: grouped_gemm, torch.cuda streams and current_device."""
    gg = types.ModuleType("grouped_gemm")
    gg.ops = types.SimpleNamespace(gmm=lambda a, b, batch_sizes, trans_b=False: GroupedGemmShim.apply(
        a, b, batch_sizes, trans_b))
    sys.modules["grouped_gemm"] = gg
    stream = FakeStream()
    torch.cuda.Stream = lambda *a, **k: stream
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.stream = lambda s: stream
    torch.cuda.current_device = lambda: "cpu"


def patch_router_gemm() -> None:
    """moe_utils.py @92c8482e imports te_general_gemm under `try` and leaves the name undefined without TE
    (line 29; RouterGatingLinearFunction tests `te_general_gemm is not None`, line 971): define it as None, so the
    router GEMM takes its PyTorch branch (casts to fp32 and torch.mm) instead of TE's one general_gemm call."""
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def init_parallel() -> None:
    """A world of one process (gloo) and Megatron-Core's parallel state at tp = pp = ep = 1."""
    from megatron.core import parallel_state
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1, create_gloo_process_groups=False)


def build_layer(experts: int, top_k: int, aux_loss: str, router_dtype: str | None, force_balance: bool) -> Any:
    """Megatron-Core's MoELayer with GroupedMLP experts (local spec, legacy grouped GEMM) and Qwen3's routing."""
    import torch.nn.functional as F  # noqa: N812
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, ffn_hidden_size=FFN, moe_ffn_hidden_size=FFN, num_attention_heads=4,
        num_moe_experts=experts, moe_router_topk=top_k, moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=True, moe_use_legacy_grouped_gemm=True, moe_router_load_balancing_type=aux_loss,
        moe_aux_loss_coeff=1e-3 if aux_loss != "none" else 0.0, moe_router_pre_softmax=False,
        moe_router_dtype=router_dtype, moe_router_force_load_balancing=force_balance, moe_permute_fusion=False,
        moe_router_fusion=False, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=True, hidden_dropout=0.0,
        bias_activation_fusion=False)
    spec = get_moe_module_spec(use_te=False, num_experts=experts, moe_grouped_gemm=True,
                               moe_use_legacy_grouped_gemm=True)
    layer = build_module(spec, config=config, layer_number=1)
    layer.train()
    return layer


def one_pass(layer: Any, x: Any) -> tuple[float, float]:
    """Host seconds of one forward and one backward of the layer (the CPU device runs synchronously)."""
    start = time.perf_counter()
    out, _ = layer(x)
    mid = time.perf_counter()
    out.backward(torch.ones_like(out))
    return mid - start, time.perf_counter() - mid


def count_ops(layer: Any, x: Any) -> tuple[int, int]:
    """ATen operators one forward and one backward issue."""
    fwd, bwd = CountOps(), CountOps()
    with fwd:
        out, _ = layer(x)
    with bwd:
        out.backward(torch.ones_like(out))
    return fwd.count, bwd.count


def measure(layer: Any, x: Any, runs: int, passes: int) -> tuple[float, float]:
    """Median over runs of the mean forward and backward host seconds over passes."""
    fwds, bwds = [], []
    for _ in range(runs):
        times = [one_pass(layer, x) for _ in range(passes)]
        fwds.append(sum(t[0] for t in times) / passes)
        bwds.append(sum(t[1] for t in times) / passes)
    return statistics.median(fwds), statistics.median(bwds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mcore", required=True, help="directory holding megatron/core (a Megatron-LM export)")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--aux-loss", default="aux_loss", help="moe_router_load_balancing_type")
    parser.add_argument("--router-dtype", default="fp32")
    parser.add_argument("--no-force-balance", action="store_true")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--passes", type=int, default=50)
    args = parser.parse_args()
    sys.path.insert(0, args.mcore)
    torch.set_num_threads(1)
    install_shims()
    init_parallel()
    patch_router_gemm()
    torch.manual_seed(0)
    layer = build_layer(args.experts, args.top_k, args.aux_loss, args.router_dtype or None,
                        not args.no_force_balance)
    x = torch.randn(args.tokens, 1, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(5):  # warm-up: torch.compile of the SwiGLU, allocator, lazy inits
        one_pass(layer, x)
    ops = count_ops(layer, x)
    fwd, bwd = measure(layer, x, args.runs, args.passes)
    print(f"Megatron-Core MoELayer at {args.mcore}: {args.experts} experts top-{args.top_k}, {args.tokens} tokens, "
          f"hidden {HIDDEN}, ffn {FFN}, aux {args.aux_loss}, router {args.router_dtype}, "
          f"force_balance {not args.no_force_balance}, torch {torch.__version__}, 1 thread")
    print(f"ATen operators per layer: forward {ops[0]}, backward {ops[1]}")
    print(f"host ms per layer: forward {fwd * 1e3:.3f}, backward {bwd * 1e3:.3f} "
          f"(median of {args.runs} runs x {args.passes} passes)")
    print(f"host us per ATen operator: forward {fwd / ops[0] * 1e6:.2f}, backward {bwd / ops[1] * 1e6:.2f}")


if __name__ == "__main__":
    main()
