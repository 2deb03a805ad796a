"""CUDA graphs (plan `cuda_graphs`): which kernels Megatron-Core captures per scope, and what replaying them costs.

A captured kernel costs the host nothing at replay: the framework operator and launch call that dlperf charges
each eager kernel (DEFAULT_DISPATCH, dlperf.engine.device.dispatch_times) are paid once, at capture. Each replay
is one graph launch. No measured host time of a graph replay from the stacks these rows run was found; a replay
is priced as one dispatched operator (the device's dispatch_forward / dispatch_backward: TE's graphed callable
is one autograd Function whose forward and backward each launch one graph, transformer_engine/pytorch/graph.py
Graphed.forward/backward), an upper bound on the cudaGraphLaunch call alone.

What each scope captures, read at NVIDIA/Megatron-LM @3758b54b (the Megatron-LM Megatron-Bridge @0a25f911 pins):
- transformer_layer.py:1008-1033 `_get_submodules_under_cudagraphs`: "attn" = input_layernorm + self_attention
  (its linear_qkv, core attention, linear_proj and their TP collectives); "mlp" (dense layers) and "moe" (MoE
  layers) = pre_mlp_layernorm + mlp; "moe_router" = pre_mlp_layernorm + mlp.router (+ shared experts when they do
  not overlap, left eager here: a lower bound on what is graphed);
- transformer_layer.py:1035-1065 `_te_cuda_graph_capture`: attention then the MLP part run in one captured
  callable, so a layer has one graph per micro-batch and pass however many of its scopes are on; the rest of the
  layer runs eagerly around it (`_te_cuda_graph_replay`, lines 1067-1135);
- enums.py:64-70: "moe" captures drop-and-pad MoE layers only (dropless routing sizes its buffers on the host);
  "moe_preprocess" requires "moe_router";
- moe/moe_layer.py:411-429 `preprocess` = token_dispatcher.dispatch_preprocess: for the all-to-all dispatcher
  (token_dispatcher.py:594-649) the routing metadata and the first permutation (TE's row-id map and permute); the
  device-to-host copy of the split sizes moves out of the graph to "before_ep_alltoall" (token_dispatcher.py:440-
  445), so dlperf's `dispatch_counts` (the counts and their copies) stays eager. The flex dispatcher's
  preprocessing (token_dispatcher.py:1418-1442) only records metadata for its own kernels, left eager here.
- "mamba" (CudaGraphScope.mamba, enums.py: "Captures Mamba layers") captures a hybrid stack's Mamba layers, norm
  and mixer; in such a stack (MambaStack) each layer is one sublayer with its own graph;
- "full_iteration" (cuda_graph_impl local, megatron/core/full_cuda_graph.py FullCudaGraphWrapper) captures the
  whole forward-backward of every micro-batch: one replay per step.
A kernel that synchronises with the host (`Kernel.syncs`) cannot be captured and stays eager in every scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlperf.engine.context import ATTENTION_OPS
from dlperf.engine.layers import Use
from dlperf.ops.base import Kernel

ATTN_OPS = (*ATTENTION_OPS, "qk_norm")  # inside self_attention (q/k layernorms are its submodules)
DENSE_MLP_OPS = ("linear", "silu", "gelu", "multiply", "swiglu", "geglu", "relu")  # a dense layer's MLP, in a block
SUBLAYER_OPS = ("rmsnorm", "layernorm", "add")  # one per sublayer: its pre-norm and its residual add
ROUTER_KERNELS = ("router", "topk_gating", "aux_loss")  # TopKRouter (moe/router.py): GEMM, fused top-k, aux loss
# all-to-all dispatch_preprocess: TE permute's map and permute; LatentMoE's fc1_latent_proj runs in the same
# MoELayer.preprocess (moe_layer.py @d98e8a64 :454-490, captured under "moe_preprocess")
PREPROCESS_KERNELS = ("row_id_map", "permute", "fc1_latent_proj")


@dataclass(frozen=True)
class Graphs:
    """A plan's graphed scopes and, for full_iteration, the step's micro-batches (one replay per step)."""

    scopes: tuple[str, ...] = ()
    micro_batches: int = 1

    @property
    def full(self) -> bool:
        return "full_iteration" in self.scopes

    @property
    def moe_side(self) -> bool:
        """A MoE layer's MLP part is (partly) captured."""
        return self.full or "moe" in self.scopes or "moe_router" in self.scopes


def layer_counts(uses: list[Use]) -> tuple[Any, Any]:
    """(transformer layers, MoE layers) among a stage's uses: one attention per layer."""
    layers = sum(use.count for use in uses if use.layer.op in ATTENTION_OPS)
    moe = sum(use.count for use in uses if use.layer.op == "moe")
    return layers, moe


def mamba_layers(uses: list[Use]) -> Any:
    """Mamba-2 layers among a stage's uses. A stage that has them is a hybrid stack (Megatron-Core's MambaStack):
    each of its layers is one sublayer, a Mamba mixer, an attention or an MLP / MoE, with its own norm and add."""
    return sum(use.count for use in uses if use.layer.op == "mamba2")


def graphed_layers(graphs: Graphs, uses: list[Use]) -> Any:
    """Layers of the stage with a per-layer graph (one replay each per micro-batch and pass); in a hybrid stack
    every captured layer is a graph of its own."""
    if not graphs.scopes or graphs.full:
        return 0
    layers, moe = layer_counts(uses)
    mamba = mamba_layers(uses)
    if mamba:
        return _captured(graphs, layers, moe, 0, mamba)
    if "attn" in graphs.scopes:
        return layers
    return _captured(graphs, 0, moe, layers - moe, 0)


def _captured(graphs: Graphs, attention: Any, moe: Any, dense: Any, mamba: Any) -> Any:
    """How many of these sublayers the scopes capture: attention under "attn", MoE MLPs under moe_router or moe,
    dense MLPs under mlp, Mamba mixers under "mamba" (CudaGraphScope.mamba, megatron/core/transformer/enums.py)."""
    return ((attention if "attn" in graphs.scopes else 0) + (moe if graphs.moe_side else 0)
            + (dense if "mlp" in graphs.scopes else 0) + (mamba if "mamba" in graphs.scopes else 0))


def sublayer_share(graphs: Graphs, uses: list[Use]) -> Any:
    """The captured share of a block's norms and residual adds (dlperf merges a layer's two of each into one use):
    the attention sublayer's under "attn", a MoE layer's MLP sublayer under moe_router or moe, a dense one's under
    mlp (its residual add is captured only with the whole MLP: an upper bound for moe_router). In a hybrid stack
    each layer has one norm and add, captured with its layer."""
    layers, moe = layer_counts(uses)
    mamba = mamba_layers(uses)
    if mamba:
        return _captured(graphs, layers, moe, 0, mamba) / (layers + moe + mamba)
    if not layers:
        return 0.0
    return _captured(graphs, layers, moe, layers - moe, 0) / (2 * layers)


def use_share(graphs: Graphs, use: Use, sublayers: Any) -> Any:
    """The share of a use's occurrences whose kernels run captured (before kernel-level exceptions); `sublayers`
    is sublayer_share for the use's stage."""
    if graphs.full:
        return 1.0
    op = use.layer.op
    if not use.in_block or not graphs.scopes:
        return 0.0
    if op in ATTN_OPS:
        return 1.0 if "attn" in graphs.scopes else 0.0
    if op == "mamba2":
        return 1.0 if "mamba" in graphs.scopes else 0.0
    if op in SUBLAYER_OPS:
        return sublayers
    if op in DENSE_MLP_OPS:
        return 1.0 if "mlp" in graphs.scopes else 0.0
    return 0.0


def kernel_graphed(graphs: Graphs, use: Use, kernel: Kernel, dispatcher: str) -> bool:
    """Whether a MoE layer's kernel runs captured (other ops: use_share); a synchronising kernel never does."""
    if kernel.syncs:
        return False
    if graphs.full:
        return True
    if use.layer.op != "moe" or not use.in_block:
        return False
    if "moe" in graphs.scopes:  # drop-and-pad layers only: a dropless one runs eagerly
        return bool(use.layer.get("capacity_factor"))
    if "moe_router" not in graphs.scopes:
        return False
    return kernel.name in ROUTER_KERNELS or ("moe_preprocess" in graphs.scopes and dispatcher == "alltoall"
                                             and kernel.name in PREPROCESS_KERNELS)


def eager_use_share(graphs: Graphs, use: Use, sublayers: Any) -> Any:
    """The share of a use's occurrences run eagerly: its kernels' host cost and its tensor-parallel collectives'
    (those of a captured attention or dense MLP are in its graph: NCCL kernels are captured with the layer's)."""
    return 1.0 - use_share(graphs, use, sublayers)


def eager_share(graphs: Graphs, use: Use, kernel: Kernel, dispatcher: str, sublayers: Any) -> Any:
    """The share of a kernel's host cost still paid eagerly (1: none of it captured)."""
    if not graphs.scopes or kernel.syncs:
        return 1.0
    if use.layer.op == "moe" and not graphs.full:
        return 0.0 if kernel_graphed(graphs, use, kernel, dispatcher) else 1.0
    return eager_use_share(graphs, use, sublayers)


def replays(graphs: Graphs, uses: list[Use]) -> tuple[Any, Any]:
    """(forward, backward) graph launches per micro-batch: per graphed layer one each way (TE graphs a layer per
    micro-batch, its backward as a graph of its own); full_iteration one per step, spread over its micro-batches."""
    if graphs.full:
        return 1 / graphs.micro_batches, 0.0
    n = graphed_layers(graphs, uses)
    return n, n
