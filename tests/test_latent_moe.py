"""LatentMoE (the moe op's `latent`), as Megatron-Core's MoELayer runs it (NVIDIA/Megatron-LM @d98e8a64
megatron/core/transformer/moe/moe_layer.py): the router on the hidden d (route, :444-452), fc1_latent_proj d ->
latent before the dispatcher (preprocess, :488-490), the routed experts, permutation and dispatch on the latent,
fc2_latent_proj latent -> d after the combine and the shared experts on d added (postprocess, :591-595); both
projections TELinear parallel_mode "duplicated" (:279-303): whole on each tensor-parallel rank, no collective."""

from __future__ import annotations

from dlperf.engine.context import Parallel
from dlperf.engine.layers import tp_uses
from dlperf.engine.stage import _tp_collectives, kernel_split
from dlperf.ops import OPS
from dlperf.ops.base import INDEX_BYTES
from dlperf.ops.fp8 import OPERAND_BYTES
from dlperf.ops.fp8 import saved_bytes as fp8_saved_bytes
from dlperf.ops.moe import ROUTER_BYTES, dispatch_elements, routed_width
from dlperf.spec.model import load_model, model_from_dict

S, D, W, E, K, F, SF = 64, 32, 8, 4, 2, 16, 24  # seq, hidden, latent, experts, top_k, expert ffn, shared ffn
MOE = {"op": "moe", "experts": E, "top_k": K, "ffn": F, "gated": False, "shared_experts": 1, "shared_ffn": SF,
       "router_bias": True}


def _layer(**attrs):
    doc = {"name": "t", "input": ["seq"], "dtype": "bf16", "params": {"seq": S, "hidden": D, "vocab": 100},
           "layers": [{"op": "embedding", "vocab": "vocab", "dim": "hidden"}, {**MOE, **attrs},
                      {"op": "linear", "out": "vocab", "bias": False}, {"op": "cross_entropy"}]}
    model = model_from_dict(doc, "t.yaml", {})
    return model, next(layer for layer, _ in model.counted() if layer.op == "moe")


def _kernels(layer, e: int = 2) -> dict:
    return {k.name: k for k in OPS["moe"].kernels(layer, 1, e)}


def test_latent_kernel_list_in_megatron_order() -> None:
    """route (router, top-k), preprocess (fc1_latent_proj, then the permute), experts, combine, postprocess
    (fc2_latent_proj), the bookkeeping, the shared experts and their add."""
    _, layer = _layer(latent=W)
    names = [k.name for k in OPS["moe"].kernels(layer, 1, 2)]
    assert names == ["router", "topk_gating", "fc1_latent_proj", "permute", "expert_up", "expert_gelu",
                     "expert_down", "combine", "fc2_latent_proj", "row_id_map", "aux_loss", "grad_accumulate",
                     "dispatch_counts", "chunk_sort", "shared_up", "shared_gelu", "shared_down", "shared_add"]
    assert "fc1_latent_proj" not in [k.name for k in OPS["moe"].kernels(_layer()[1], 1, 2)]


def test_latent_widths_by_hand() -> None:
    """The router and the shared experts on d (:444-452, :507-534), the projections d <-> latent duplicated
    (split=False), the experts, permute and combine on the latent."""
    _, layer = _layer(latent=W)
    k, t, routed = _kernels(layer), S, S * K
    assert k["router"].gemm == (1, t, E, D)                      # (batch, m, n, k)
    assert k["fc1_latent_proj"].gemm == (1, t, W, D) and not k["fc1_latent_proj"].split
    assert k["fc2_latent_proj"].gemm == (1, t, D, W) and not k["fc2_latent_proj"].split
    assert k["fc1_latent_proj"].tp_dim == k["fc2_latent_proj"].tp_dim == "m"
    assert k["expert_up"].weight_gemm == (routed, W, F) and k["expert_down"].weight_gemm == (routed, F, W)
    assert k["shared_up"].weight_gemm == (t, D, SF) and k["shared_down"].weight_gemm == (t, SF, D)
    assert k["permute"].cost.fwd_bytes == 2 * 2 * routed * W + INDEX_BYTES * routed
    assert k["combine"].cost.fwd_bytes == 2 * (routed * W + t * W)
    assert k["shared_add"].cost.fwd_bytes == _kernels(_layer()[1])["shared_add"].cost.fwd_bytes  # on d
    assert routed_width(layer) == W and routed_width(_layer()[1]) == D


def test_latent_routed_part_is_the_plain_op_on_the_latent() -> None:
    """The experts, permutation and combine of a latent layer are those of a plain moe op on a latent-wide input."""
    _, latent = _layer(latent=W)
    doc = {"name": "t", "input": ["seq"], "dtype": "bf16", "params": {"seq": S, "vocab": 100},
           "layers": [{"op": "embedding", "vocab": "vocab", "dim": W}, MOE,
                      {"op": "linear", "out": "vocab", "bias": False}, {"op": "cross_entropy"}]}
    plain = next(layer for layer, _ in model_from_dict(doc, "t.yaml", {}).counted() if layer.op == "moe")
    a, b = _kernels(latent), _kernels(plain)
    for name in ("permute", "expert_up", "expert_gelu", "expert_down", "combine"):
        assert a[name] == b[name], name


def test_latent_parameters_and_dispatch_by_hand() -> None:
    _, layer = _layer(latent=W)
    router, experts, shared, projections = D * E + E, E * 2 * W * F, 2 * D * SF, 2 * D * W
    assert layer.params == router + experts + shared + projections
    assert OPS["moe"].expert_params(layer) == experts
    assert dispatch_elements(layer) == S * K * W


def test_latent_saved_activations_by_hand() -> None:
    """Input d, fp32 probabilities, per routed copy the latent token, up output and activation (2f) and output
    (latent), the shared experts' 2 x shared_ffn, and fc2_latent_proj's input, the combined latent."""
    _, layer = _layer(latent=W)
    e = 2
    expected = e * S * D + ROUTER_BYTES * S * E + e * S * K * (W + 2 * F + W) + e * S * 2 * SF + e * S * W
    assert OPS["moe"].saved(layer, e) == expected


def test_latent_projections_duplicated_under_tensor_parallelism() -> None:
    """Under sequence parallelism the dispatcher's all-gather and reduce-scatter move the routed copies on the
    latent, the shared experts keep their pair on d, and the projections add none: whole weights, each rank's
    own tokens (kernel_split divides them by tp under sp only, as for the router)."""
    model, _ = _layer(latent=W)
    use = next(u for u in tp_uses(model, sp=True) if u.layer.op == "moe")
    comm = _tp_collectives(use, 1, "alltoall").comm
    routed = [n for phase, op, n in comm if op in ("allgather", "reduce_scatter") and n == K * S * W]
    assert len(routed) == 4
    assert sorted(n for _, _, n in comm if n == S * D) == [S * D] * 4  # the shared experts' pair each way
    fc1 = _kernels(use.layer)["fc1_latent_proj"]
    assert kernel_split(fc1, 4, True, 1, Parallel()) == 4 and kernel_split(fc1, 4, False, 1, Parallel()) == 1


def test_nemotron_3_super_uses_the_latent_moe() -> None:
    """models/nemotron-3-super.yaml: moe_latent_size 1024 on hidden 4096, the router 4096 x 512."""
    model = load_model("nemotron-3-super")
    layer = next(layer for layer, _ in model.counted() if layer.op == "moe")
    k = _kernels(layer)
    assert layer["latent"] == 1024 and k["router"].gemm[2:] == (512, 4096)
    assert k["fc1_latent_proj"].gemm[2:] == (1024, 4096) and k["fc2_latent_proj"].gemm[2:] == (4096, 1024)
    assert k["expert_up"].weight_gemm[1:] == (1024, 2688) and k["shared_up"].weight_gemm[1:] == (4096, 5376)


def test_latent_fp8_keeps_the_projections_inputs_in_fp8() -> None:
    """An FP8 recipe keeps the routed GEMM inputs (latent tokens, activations), the shared experts' activation and
    fc2_latent_proj's input in FP8 instead of 16 bits, and fc1_latent_proj's FP8 cast of the layer input besides
    the router's 16-bit copy (TE Linear saves its quantized input)."""
    _, layer = _layer(latent=W)
    e, b = 2, OPERAND_BYTES["fp8"]
    saved = OPS["moe"].saved(layer, e)
    inputs = S * (K * (W + F) + SF) + S * W
    assert fp8_saved_bytes(layer, saved, e, "fp8") == saved - (e - b) * inputs + b * S * D
