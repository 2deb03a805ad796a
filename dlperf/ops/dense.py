"""Matrix-multiply operators: linear (GEMM), embedding, attention, and the loss over a vocabulary.

Exact counts: a multiply-add is 2 FLOPs (SURVEY_MODELS.md 2c). Linear: forward 2*t*d*o, and backward data and
backward weight the same each, so training is 3x forward.
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx
from dlperf.cost import Cost
from dlperf.ops.base import INDEX_BYTES, MASK_BYTES, REQUIRED, Kernel, Layer, OpRule, clog2, numel
from dlperf.ops.elementwise import RANDOM_TENSOR_BYTES, random_tensor_kernel, xla_softmax_kernels

# ---- linear ---------------------------------------------------------------------------------------------


def _tokens(layer: Layer, batch: Any) -> Any:
    """Rows of the GEMM: batch times every leading dimension."""
    return batch * numel(layer.in_shape[:-1])


def gemm(name: str, m: Any, k: Any, n: Any, e: int, bias: bool = False, weight: bool = True,
         tp_dim: str | None = None) -> Kernel:
    """C[m,n] = A[m,k] B[k,n]: forward 2mkn; dA = dC B^T and dB = A^T dC cost 2mkn each (Table 4, FC rows).

    Depths: forward reduces over k, backward-data over n, backward-weight over m.
    """
    flops = 2 * m * k * n
    extra = m * n if bias else 0
    return Kernel(name, "matmul", weight_gemm=(m, k, n) if weight else None, cost=Cost(
        fwd_flops=flops + extra,      # the bias add rides in the GEMM's epilogue (addmm, cuBLASLt)
        bwd_data_flops=flops,
        bwd_weight_flops=flops if weight else 0,
        fwd_bytes=e * (m * k + k * n + m * n),
        bwd_bytes=e * 2 * (m * n + m * k + k * n),
        depth=clog2(k) + (1 if bias else 0),
        bwd_depth=clog2(n),
    ), gemm=(1, m, n, k), tp_dim=tp_dim)


def bias_grad(name: str, m: Any, n: Any, e: int) -> Kernel:
    """The bias gradient, dC summed over its m rows: a memory-bound reduction of its own in backward (PyTorch's
    and Megatron's linear layers compute grad_output.sum(0) after the GEMMs), as conv's bias is."""
    return Kernel(name, "memory", Cost(bwd_weight_flops=m * n, bwd_bytes=e * (m * n + n), bwd_depth=1),
                  launches=0, bwd_launches=1)


def _linear_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    d, o, rows = layer.in_shape[-1], layer["out"], _tokens(layer, batch)
    main = gemm("gemm", rows, d, o, e, bias=layer["bias"])
    return (main, bias_grad("bias_grad", rows, o, e)) if layer["bias"] else (main,)


def _linear_params(shape: tuple, a: dict) -> Any:
    if a["tied"]:
        return a["out"] if a["bias"] else 0
    return shape[-1] * a["out"] + (a["out"] if a["bias"] else 0)


def _fc_asymptotic(layer: Layer, batch: Any) -> tuple[Any, Any]:
    # Table 4: W = O(C_out * C_in * N), D = O(log C_in)
    return batch * numel(layer.in_shape[:-1]) * layer.in_shape[-1] * layer["out"], clog2(layer.in_shape[-1])


def _linear_check(shape: tuple, a: dict) -> None:
    from dlperf.errors import ShapeError

    if a["in"] is not None and isinstance(shape[-1], int) and a["in"] != shape[-1]:
        raise ShapeError("linear input width does not match", expected=f"in = {a['in']}", found=shape[-1])


def _linear_saved(layer: Layer, e: int) -> Any:
    """The input, for the weight gradient; nothing with `fused_input`: the layer is one GEMM with the linear
    before it on a sibling branch, over the same input, which that one keeps for both. Megatron-Core computes a
    gated MLP's gate and up projections as one linear_fc1 of twice the width (megatron/core/transformer/mlp.py
    @d98e8a64, `ffn_hidden_size *= 2` if gated_linear_unit), whose Transformer Engine module saves its input
    once (ln_out in LayerNormLinear, transformer_engine/pytorch/module/layernorm_linear.py @d0067d0d)."""
    return 0 if layer["fused_input"] else e * numel(layer.in_shape)


LINEAR = OpRule(
    attrs={"out": REQUIRED, "in": None, "bias": True, "tied": False, "fused_input": False},
    check=_linear_check,
    shape=lambda s, a: (*s[:-1], a["out"]),
    params=_linear_params,
    kernels=_linear_kernels,
    saved=_linear_saved,
    asymptotic=_fc_asymptotic,
    tp="linear",
)

# ---- embedding ------------------------------------------------------------------------------------------


def _embedding_positions(shape: tuple, a: dict) -> tuple:
    """The per-sample positions looked up: the token ids [seq]; a `tied` lookup sits on the running [seq, d]
    activation and looks up the sample's (shifted) token ids at its positions, so d is not a position."""
    return tuple(shape[:-1]) if a["tied"] else tuple(shape)


def _embedding_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    tokens = batch * numel(_embedding_positions(layer.in_shape, dict(layer.attrs)))
    n = tokens * layer["dim"]
    # A gather: read one row per token, write it. Backward scatter-adds the rows into the table gradient.
    return (Kernel("gather", "memory", Cost(
        fwd_bytes=2 * e * n + 8 * tokens, bwd_weight_flops=n, bwd_bytes=3 * e * n, depth=1, bwd_depth=1,
    )),)


def _embedding_check(shape: tuple, a: dict) -> None:
    from dlperf.errors import ShapeError

    if a["tied"] and len(shape) < 2:
        raise ShapeError("a tied embedding sits on a [seq, d] activation", expected="rank 2 or more",
                         found=list(shape))


# `tied`: a second lookup in the table of the model's input embedding, which owns the parameters. DeepSeek-V3's
# multi-token prediction embeds the shifted tokens with the shared embedding (arXiv:2412.19437 Sec. 2.2: "the
# embedding layer ... shared with the main model"; Megatron-Core's MTP layer calls the GPT model's embedding on
# the rolled input ids, megatron/core/transformer/multi_token_prediction.py @3758b54b _get_embeddings :850-893).
EMBEDDING = OpRule(
    attrs={"vocab": REQUIRED, "dim": REQUIRED, "tied": False},
    check=_embedding_check,
    shape=lambda s, a: (*_embedding_positions(s, a), a["dim"]),
    params=lambda s, a: 0 if a["tied"] else a["vocab"] * a["dim"],
    kernels=_embedding_kernels,
    saved=lambda layer, e: 8 * numel(_embedding_positions(layer.in_shape, dict(layer.attrs))),  # int64 token ids
    tp="vocab",
)


def _gather_check(shape: tuple, a: dict) -> None:
    from dlperf.errors import ShapeError

    if len(shape) < 2:
        raise ShapeError("gather needs a [seq, d] input per sample", expected="rank 2 or more", found=list(shape))
    rows, seq = a["rows"], shape[0]
    if isinstance(rows, int) and (rows < 1 or (isinstance(seq, int) and rows > seq)):
        raise ShapeError("gather takes between 1 and seq rows", expected=f"1 <= rows <= {seq}", found=rows)


def _gather_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    """torch.index_select of `rows` positions per sample: forward copies them out (read and write); backward
    zero-fills the input gradient (every position) and index-adds the rows' gradients into it (read, write)."""
    width = numel(layer.in_shape[1:])
    picked, whole = batch * layer["rows"] * width, batch * numel(layer.in_shape)
    return (Kernel("index_select", "memory", Cost(
        fwd_bytes=2 * e * picked + 8 * batch * layer["rows"], bwd_bytes=e * (whole + 2 * picked),
        depth=1, bwd_depth=1,
    ), bwd_launches=2),)


GATHER = OpRule(
    attrs={"rows": REQUIRED},
    check=_gather_check,
    shape=lambda s, a: (a["rows"], *s[1:]),
    kernels=_gather_kernels,
    saved=lambda layer, e: 8 * layer["rows"],  # the int64 indices; the input itself is not needed backward
    tp="elementwise",
)


def _positional_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    n = batch * numel(layer.in_shape)
    return (Kernel("add_table", "memory", Cost(
        fwd_flops=n, fwd_bytes=3 * e * n, bwd_weight_flops=n, bwd_bytes=2 * e * n, depth=1, bwd_depth=1,
    ), split=False),)


POSITIONAL = OpRule(
    attrs={"length": REQUIRED},
    shape=lambda s, a: s,
    params=lambda s, a: a["length"] * s[-1],
    kernels=_positional_kernels,
    saved=lambda layer, e: 0,
    tp="elementwise",
)

# ---- attention ------------------------------------------------------------------------------------------


def _attention_dims(layer: Layer) -> tuple[Any, Any, Any, Any, Any, Any]:
    s, d = layer.in_shape[-2], layer.in_shape[-1]
    heads, kv_heads = layer["heads"], layer["kv_heads"]
    head_dim = layer["head_dim"]
    return s, d, heads, kv_heads, head_dim, layer["kv_seq"]


# Rotary embeddings (`rope`) on the query and the key, as three training stacks apply them. Each is one memory-bound
# kernel entry per attention layer whose bytes and launches are counted from the code the validation runs executed;
# the few FLOPs per element (3.5 forward) are left out: the kernels are bound by their bytes, and model FLOPs do not
# count rotary embeddings. None of them saves activations beyond its small frequency tables.
#
# eager: Megatron-Core's unfused `_apply_rotary_pos_emb_bshd`, read at the Megatron-LM commits Megatron-Bridge's
# GPT-OSS rows pin (NVIDIA/Megatron-LM @92c8482e, @3758b54b, @24bad8e6, megatron/core/models/common/embeddings/
# rope_utils.py). Megatron-Core takes it instead of Transformer Engine's fused RoPE kernel when the rotary tensor
# carries a YaRN concentration factor: apply_rotary_pos_emb sets use_unfused when `mscale != 1.0` (@3758b54b
# rope_utils.py:279-284, "mscale=... is not supported by TE's fused RoPE"), and attention.py passes
# mscale=_yarn_get_concentration_factor_from_config(config) for the query and the key (@3758b54b attention.py:1111,
# 1124), which is 0.1 ln(factor) + 1 = 1.35 when yarn_mscale or yarn_mscale_all_dim is None
# (yarn_rotary_pos_embedding.py _yarn_get_concentration_factor, :267-268): Megatron-Bridge's GPT-OSS bridge sets
# yarn_rotary_scaling_factor 32 with both None (src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py @0a25f911
# lines 94-100; gpt_oss_provider.py @97ad8cc6f lines 61-67). (Megatron-Bridge also turns apply_rope_fusion off for
# any position_embedding_type but "rope": utils/fusions.py validate_rope_fusion_compatibility @0a25f911.)
# Per rotated tensor t (the query, then the key; rot_dim = head_dim, so t_pass is empty):
#   forward: cos(freqs) * mscale -> bf16 and sin likewise (6 kernels on the [s, head_dim] fp32 frequencies,
#   ROPE_TABLE_BYTES per frequency), then over t: t*cos (read, write), -x2 (half read, half write), cat((-x2, x1))
#   (read, write), *sin (read, write), + (2 reads, write), cat((t, t_pass)) (read, write): 6 kernels,
#   ROPE_FWD_PASSES = 12 element-sized passes over t.
#   backward (PyTorch autograd): t_pass's SliceBackward allocates a zero gradient of t's full size (write;
#   slice_backward in aten/src/ATen/native/TensorShape.cpp), *sin (read, write), the neg (half, half), the chunk's
#   gradient is a cat (read, write), *cos (read, write), and t's three gradients summed by two adds (2 reads, write
#   each): 7 kernels, ROPE_BWD_PASSES = 14 passes. t[..., :rot_dim] spanning the whole axis is t itself (PyTorch's
#   applySlice shortcut), no kernel either way. Nothing is saved but the small cos/sin tables.
#
# fused: Transformer Engine's fused RoPE, which Megatron-Core runs when apply_rope_fusion is set and mscale is 1
# (rope_utils.py apply_rotary_pos_emb -> fused_apply_rotary_pos_emb, @3758b54b :268-287; megatron/core/extensions/
# transformer_engine.py :2587-2606 calls TE's apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=True)), on
# the query and on the key separately (attention.py :1106-1126; the single-QKV variant needs fused_single_qkv_rope,
# which no Llama, Qwen3 or DeepSeek recipe sets). Every Megatron-Bridge performance run sets apply_rope_fusion=True
# (scripts/performance/run_script.py @fa0315ae2 line 171; scripts/performance/utils/overrides.py
# _set_common_perf_overrides @97ad8cc6f line 54, @0a25f911 line 64, @74695a06d line 66, @63b08b397 line 68,
# @4ab94dfad line 82; src/megatron/bridge/perf_recipes/_common.py @4ab94dfad line 69), and non-YaRN models get
# mscale 1.0 (Megatron-Bridge patches _yarn_get_concentration_factor_from_config to return 1.0 when
# yarn_rotary_scaling_factor is None: src/megatron/bridge/models/gpt_provider.py @0a25f911 lines 388-419; at
# @fa0315ae2 and @97ad8cc6f the provider has no such field, and Megatron-Core's hasattr check returns 1.0). TE
# (transformer_engine/pytorch/attention/rope.py FusedRoPEFunc, @71bbefbf, Megatron-Bridge's pin at 0a25f911, lines
# 112-175; the same at release_v2.7 0289e763) launches one kernel forward (tex.fused_rope_forward) and one backward
# (tex.fused_rope_backward) per tensor: transformer_engine/common/fused_rope/fused_rope.cu @71bbefbf
# fused_rope_block_forward/backward (lines 20-130) read each element of t, and its rotate-half partner from the same
# head row, and write it once to a new tensor (apply_rope.cpp at::empty(input.sizes())): 2 element-sized passes
# each way. Each (position, sample) block loads its [head_dim] fp32 frequencies into shared memory (sincosf,
# :29 and :84): 4 bytes per position and rotary dimension, counted once per position (the micro-batch's blocks of
# one position share it in L2). The frequency table itself is built once per model forward (RotaryEmbedding.forward
# is lru_cached, rotary_pos_embedding.py @3758b54b :177-206), not per layer.
#
# complex: torchtitan's apply_rotary_emb (torchtitan/models/llama/model.py @9dec370, lines 87-113, the commit its
# published Llama 3.1 runs name), eager PyTorch over complex numbers. Per tensor forward: xq.float() (bf16 read,
# fp32 write), view_as_complex(reshape) a view, xq_ * freqs_cis (complex64 read and write, 4 + 4 bytes per
# element, and the [s, head_dim/2] complex64 table: 4 bytes per position and dimension), view_as_real/flatten views,
# type_as(xq) (fp32 read, bf16 write): 3 kernels, 16 + 2e bytes per element. Backward (PyTorch autograd): the
# type_as's ToCopyBackward casts the bf16 gradient to fp32 (e + 4), the views' backwards are views,
# MulBackward0 computes grad * freqs_cis.conj() (torch/csrc/autograd/FunctionsManual.cpp mul_tensor_backward; 4 + 4
# per element, the table read again), where the lazily conjugated table is materialised first because mul is not
# among the Conjugate dispatch key's fallthrough operators (aten/src/ATen/ConjugateFallback.cpp, native/
# MathBitFallThroughLists.h: resolve_conj, one copy of the table, 4 + 4 per position and dimension), and
# .float()'s ToCopyBackward casts back to bf16 (4 + e): 4 kernels, 16 + 2e bytes per element. freqs_cis is a
# buffer, so no gradient is computed for it.
ROPE_IMPLS = ("eager", "fused", "complex")
ROPE_FWD_PASSES, ROPE_BWD_PASSES = 12, 14          # eager, element-sized passes over each rotated tensor
ROPE_TABLE_BYTES = 2 * ((4 + 4) + (4 + 4) + (4 + 2))  # eager: cos and sin: fp32 op, fp32 multiply, cast to bf16
ROPE_LAUNCHES = {"eager": (12, 7), "fused": (1, 1), "complex": (3, 4)}  # per rotated tensor (forward, backward)

# Megatron-Core's split of the fused QKV projection (`qkv_split`). SelfAttention.get_query_key_value_tensors
# (megatron/core/transformer/attention.py, NVIDIA/Megatron-LM @3758b54b lines 1429-1474; the same code at @92c8482e6,
# @23265d2d, @00225507, @24bad8e6) views linear_qkv's output as [sq, b, ng, (np/ng + 2) * hn] and splits it along
# the last dimension (torch.split: the `from transformer_engine.pytorch.attention import _SplitAlongDim` of
# megatron/core/extensions/transformer_engine.py fails at TE @71bbefbf, whose attention/__init__.py exports no such
# name, so SplitAlongDim is None); query.reshape(sq, b, -1, hn) of that strided view copies the query (one read,
# one write) unless a rank holds one query group or one query head per group (the view then merges). Key and value
# stay strided views: the key becomes a new tensor in the RoPE kernel (TE's fused RoPE reads any strides,
# apply_rope.cpp), or, with Qwen3's QK-norm, in TE's RMSNorm op, which runs input_.contiguous() first
# (transformer_engine/pytorch/ops/basic/rmsnorm.py @71bbefbf line 182): one more copy (`mcore_qk_norm`). The value
# reaches TE's DotProductAttention strided; get_qkv_layout (attention/dot_product_attention/utils.py @71bbefbf
# lines 1956-2055, the same at f031cf87 and f8a01cd5) finds k and v with unequal strides, "not_supported", and
# runs x.contiguous() on q, k and v: a copy of the value. Backward: the views' and copies' backwards pass the
# gradient through, and torch.split's backward (split_with_sizes_backward) concatenates dq, dk and dv (separate
# tensors from the attention and RoPE backwards) into one [sq, b, ng, (np/ng + 2) * hn] gradient: one torch.cat
# kernel, reading and writing Q, K and V once each.
QKV_SPLIT_IMPLS = ("mcore", "mcore_qk_norm")


def _qkv_split_kernel(layer: Layer, batch: Any, e: int, query_copy: bool = True) -> Kernel:
    """Megatron-Core's query reshape copy, key (QK-norm) and value contiguous copies forward, and the split's
    torch.cat backward (the comment above); `query_copy` False where the reshape is a view on the rank."""
    s, _, h, kv, hd, skv = _attention_dims(layer)
    q, k = batch * s * h * hd, batch * skv * kv * hd
    kv_copies = 2 if layer["qkv_split"] == "mcore_qk_norm" else 1  # the value, and the key under QK-norm
    copied = (q if query_copy else 0) + k * kv_copies
    return Kernel("qkv_split", "memory", Cost(fwd_bytes=2 * e * copied, bwd_bytes=2 * e * (q + 2 * k),
                                              depth=1, bwd_depth=1), launches=int(query_copy) + kv_copies,
                  bwd_launches=1)


def qkv_split_for_rank(layer: Layer, kernels: list[Kernel], batch: Any, e: int, tp: Any) -> list[Kernel]:
    """The `qkv_split` kernel as one tensor-parallel rank runs it: the query reshape is a view (no copy) where the
    rank holds one query group (kv_heads / tp == 1) or each group one query head (heads == kv_heads)."""
    if layer.op != "attention" or not layer["qkv_split"] or not _whole(tp):
        return kernels
    _, _, h, kv, _, _ = _attention_dims(layer)
    if not (_whole(h) and _whole(kv)):
        return kernels
    if int(kv) > int(tp) and int(h) != int(kv):
        return kernels
    return [_qkv_split_kernel(layer, batch, e, query_copy=False) if k.name == "qkv_split" else k for k in kernels]


def rope_bytes(impl: str, e: int) -> tuple[int, int, int, int]:
    """(forward, backward) bytes per rotated element, then (forward, backward) bytes per position and rotary
    dimension of its frequency tables, for each `rope` implementation (the comment above)."""
    if impl == "eager":
        return ROPE_FWD_PASSES * e, ROPE_BWD_PASSES * e, ROPE_TABLE_BYTES, 0
    if impl == "fused":
        return 2 * e, 2 * e, 4, 4
    complex_pass = 4 + 4 + 4 + 4 + 2 * e  # fp32 cast (e + 4), complex multiply (4 + 4), cast back (4 + e)
    return complex_pass, complex_pass, 4, 4 + (4 + 4)


def _rope_kernel(layer: Layer, batch: Any, e: int) -> Kernel:
    """The rotary embedding of the query and the key, as `rope` names its implementation (constants above)."""
    s, _, h, kv, hd, skv = _attention_dims(layer)
    impl = layer["rope"]
    rotated = batch * (s * h + skv * kv) * hd  # elements of Q and K
    fwd, bwd, fwd_table, bwd_table = rope_bytes(impl, e)
    launches, bwd_launches = ROPE_LAUNCHES[impl]
    return Kernel(f"rope_{impl}", "memory", Cost(
        fwd_bytes=fwd * rotated + fwd_table * (s + skv) * hd,
        bwd_bytes=bwd * rotated + bwd_table * (s + skv) * hd, depth=1, bwd_depth=1),
        launches=2 * launches, bwd_launches=2 * bwd_launches)


def _attention_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    """Q, K, V projections, scores QK^T, softmax, AV, output projection (Vaswani et al. 2017, eq. 1).

    The fused (FlashAttention, Dao et al. 2022) variant does the same FLOPs but never writes the
    heads*s*s_kv score matrix to memory: its traffic is only Q, K, V and the output.
    """
    s, d, h, kv, hd, skv = _attention_dims(layer)
    bias, out = layer["bias"], layer["out"]
    in_bias = bias or layer["qkv_bias"]
    q_rows, kv_rows = batch * s, batch * skv
    scores = batch * h * s * skv
    projections = (
        gemm("q_proj", q_rows, d, h * hd, e, in_bias, tp_dim="n"),
        gemm("kv_proj", kv_rows, d, 2 * kv * hd, e, in_bias, tp_dim="n"),
    )
    if layer["qkv_split"]:
        projections += (_qkv_split_kernel(layer, batch, e, query_copy=h != kv),)
    if layer["rope"]:
        projections += (_rope_kernel(layer, batch, e),)
    out_proj = gemm("out_proj", q_rows, h * hd, out, e, bias, tp_dim="k")
    biases = ((bias_grad("q_bias_grad", q_rows, h * hd, e), bias_grad("kv_bias_grad", kv_rows, 2 * kv * hd, e))
              if in_bias else ()) + ((bias_grad("out_bias_grad", q_rows, out, e),) if bias else ())
    qk = Cost(fwd_flops=2 * scores * hd, bwd_data_flops=4 * scores * hd, depth=clog2(hd), bwd_depth=clog2(skv))
    av = Cost(fwd_flops=2 * scores * hd, bwd_data_flops=4 * scores * hd, depth=clog2(skv), bwd_depth=clog2(hd))
    softmax = Cost(fwd_flops=5 * scores, bwd_data_flops=4 * scores, depth=2 * clog2(skv), bwd_depth=clog2(skv))
    q_bytes, k_bytes = e * batch * s * h * hd, e * batch * skv * kv * hd  # V has K's size
    qkv_bytes = q_bytes + 2 * k_bytes
    if layer["flash"]:
        out_bytes = e * batch * s * h * hd
        flash = _flash_kernel(layer, qk + av + softmax, qkv_bytes, out_bytes, 2 * scores * hd + 5 * scores)
        unpad = (_unpad_kernel(qkv_bytes, out_bytes),) if _unpads(layer) else ()
        return (*projections, *unpad, flash, out_proj, *biases)
    score_bytes = e * scores
    # Splitting Q, K, V into heads and merging the context back are transposed copies in unfused
    # implementations (PyTorch's multi-head attention makes each contiguous): read + write of q, k, v and the
    # output, forward and backward.
    heads_bytes = 2 * (qkv_bytes + e * batch * s * h * hd)
    kernels = [
        *projections,
        Kernel("head_transposes", "memory", Cost(fwd_bytes=heads_bytes, bwd_bytes=heads_bytes, depth=1, bwd_depth=1),
               launches=4),
        Kernel("scores", "matmul", qk + Cost(fwd_bytes=q_bytes + k_bytes + score_bytes,
                                              bwd_bytes=2 * score_bytes + 2 * qkv_bytes),
               gemm=(batch * h, s, skv, hd), tp_dim="batch"),
    ]
    if layer["xla"]:
        # TensorFlow 1 under XLA auto-clustering: the scale, mask add, softmax and dropout as XLA's five kernels
        # (dlperf.ops.elementwise.xla_softmax_kernels); the RandomUniform stays outside the cluster
        if layer["dropout"] and layer["random_tensor"]:
            kernels.append(random_tensor_kernel("attn_random_uniform", scores))
        kernels += xla_softmax_kernels(batch * h * s, skv, e, bool(layer["dropout"]))
    else:
        kernels.append(Kernel("softmax", "transcendental", softmax + Cost(fwd_bytes=2 * score_bytes,
                                                                          bwd_bytes=3 * score_bytes)))
    if layer["dropout"] and not layer["xla"]:
        # dropout on the attention probabilities as its own pass (Megatron-LM 2021, BERT, GPT-2): reads and
        # writes the s^2 matrix and a one-byte mask, forward and backward; with `random_tensor` (TensorFlow's
        # tf.nn.dropout) a RandomUniform kernel first writes the s^2 uniform numbers, which the dropout reads back
        # (dlperf.ops.elementwise.random_tensor_kernel)
        drawn = RANDOM_TENSOR_BYTES * scores if layer["random_tensor"] else 0
        if layer["random_tensor"]:
            kernels.append(random_tensor_kernel("attn_random_uniform", scores))
        kernels.append(Kernel("attn_dropout", "memory", Cost(
            fwd_flops=3 * scores, bwd_data_flops=scores, fwd_bytes=2 * score_bytes + MASK_BYTES * scores + drawn,
            bwd_bytes=2 * score_bytes + MASK_BYTES * scores, depth=1, bwd_depth=1)))
    kernels += [
        Kernel("attend", "matmul", av + Cost(fwd_bytes=score_bytes + k_bytes + e * batch * s * h * hd,
                                              bwd_bytes=2 * score_bytes + qkv_bytes),
               gemm=(batch * h, s, hd, skv), tp_dim="batch"),
        out_proj,
        *biases,
    ]
    return tuple(kernels)


SOFTMAX_IMPLS = ("fused", "megatron")
# Megatron's FusedScaleMaskSoftmax (`softmax: megatron`) runs its fused scale-mask-softmax kernel only when
# is_kernel_available says so, and otherwise the softmax in PyTorch ops (microsoft/Megatron-DeepSpeed
# megatron/model/fused_softmax.py @f4157bea, FusedScaleMaskSoftmax.is_kernel_available and forward_torch_softmax;
# the same test in vTrain's copy, VIA-Research/vTrain src/model/fused_softmax.py @f8dda847): fp16/bf16 input,
# 16 < sk <= 4096, sq % 4 == 0, sk % 4 == 0 and b x heads-per-rank % 4 == 0, and for the causal kernel also
# b x heads-per-rank a multiple of batches_per_block (get_batch_per_block in megatron/fused_kernels/
# scaled_masked_softmax.h: 128 threads / min(32, 2^ceil(log2 sk)) warps x (2 rows per warp if 2^ceil(log2 sk)
# <= 128, else 1)). Older Megatron-LM copies cap sk at 2048; the @f4157bea bound is used.
FUSED_SOFTMAX_THREADS = 128
WARP = 32


def _batches_per_block(sk: int) -> int:
    """get_batch_per_block of Megatron's scaled_masked_softmax.h: rows one 128-thread block handles."""
    power = 1 << max(sk - 1, 0).bit_length()
    warp = min(power, WARP)
    return (FUSED_SOFTMAX_THREADS // warp) * (2 if power <= 128 else 1)


def megatron_fused_softmax(batch: int, heads: int, sq: int, sk: int, e: int, causal: bool) -> bool:
    """FusedScaleMaskSoftmax.is_kernel_available (constants above): whether Megatron runs its fused kernel for
    attention scores [batch, heads (per rank), sq, sk] of e-byte elements."""
    rows = batch * heads
    if e != 2 or not 16 < sk <= 4096 or sq % 4 or sk % 4 or rows % 4:
        return False
    return (rows if causal else sq) % _batches_per_block(sk) == 0


def megatron_torch_softmax(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    """forward_torch_softmax, Megatron's fallback (fused_softmax.py @f4157bea), with the scale its GPT layers
    always pass (apply_query_key_layer_scaling is on by default, which turns softmax_in_fp32 on): the fp16/bf16
    scores are cast to fp32, multiplied by the scale, masked in place (attention_mask_func's masked_fill_), put
    through torch's softmax and cast back; fp32 scores skip the casts. Autograd runs one kernel per step
    backward (the casts' copies, softmax_backward_data, masked_fill of the gradient, the scalar multiply). n =
    scores elements: forward bytes (e+4) + 8 + 8 + 8 + (4+e) per element, backward (e+4) + 12 + 8 + 8 + (4+e)
    (the mask, one byte per sq x sk broadcast over batch and heads, left out); each step is one ATen operator."""
    s, _, h, _, _, skv = _attention_dims(layer)
    n = batch * h * s * skv
    casts = 2 if e < FP32 else 0
    cast_bytes = casts * (e + FP32) * n
    steps = Kernel("softmax_torch_steps", "memory", Cost(
        fwd_flops=n, bwd_data_flops=n, fwd_bytes=cast_bytes + 2 * 2 * FP32 * n,
        bwd_bytes=cast_bytes + 2 * 2 * FP32 * n, depth=1, bwd_depth=1),
        launches=2 + casts, bwd_launches=2 + casts)
    softmax = Kernel("softmax", "transcendental", Cost(
        fwd_flops=5 * n, bwd_data_flops=4 * n, fwd_bytes=2 * FP32 * n, bwd_bytes=3 * FP32 * n,
        depth=2 * clog2(skv), bwd_depth=clog2(skv)), bwd_launches=1)
    return steps, softmax


def softmax_for_rank(layer: Layer, kernels: list[Kernel], batch: Any, e: int, tp: Any) -> list[Kernel]:
    """An unfused attention layer's kernels with `softmax: megatron` at micro-batch `batch` on tp ranks: the
    fused softmax kernel swapped for Megatron's PyTorch fallback where is_kernel_available refuses it (2 heads
    per rank at micro-batch 1, e.g.). Unchanged for other layers and implementations, and where batch or tp
    is not a number (a closed form in B keeps the fused kernel)."""
    if layer.op != "attention" or layer["flash"] or layer["softmax"] != "megatron":
        return kernels
    if not (_whole(batch) and _whole(tp)):
        return kernels
    s, _, h, _, _, skv = _attention_dims(layer)
    if not (_whole(s) and _whole(skv) and _whole(h)) or int(h) % int(tp):
        return kernels
    if megatron_fused_softmax(int(batch), int(h) // int(tp), int(s), int(skv), e, bool(layer["causal"])):
        return kernels
    out: list[Kernel] = []
    for kernel in kernels:
        out.extend(megatron_torch_softmax(layer, batch, e) if kernel.name == "softmax" else (kernel,))
    return out


def _whole(value: Any) -> bool:
    """A concrete whole number (an int, an integral float, a sympy Integer), not a symbol."""
    try:
        return float(value) == int(value)
    except TypeError:
        return False


# FlashAttention in Triton (Tri Dao's flash_attn_triton.py on Phil Tillet's Triton kernel) against FlashAttention-2,
# measured on an A100 80GB SXM4 over seqlen 512-16k, head dim 64/128, with and without the causal mask:
# "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x faster
# in the backward pass" (Dao 2023, arXiv:2307.08691, section 4.1). (forward, backward) time of the Triton kernel
# over the FlashAttention-2 curve's: the midpoint 1.4, and 2.
# Carried over to H100, where no published figure times a Triton FlashAttention: FlashAttention-2's H100 figure
# (assets/flash2_h100_fwd_bwd_benchmark.png @4f285b35) has no Triton bars. Both figures time FlashAttention v1, the
# other kernel without Hopper instructions, and FlashAttention-2 leads it by as much on H100 as on A100 (geometric
# means 1.94 and 1.93 over head dims 64 and 128, no mask and causal, 512-16k; dlperf/data/kernels/
# fa2paper-fa1-speed.csv, tests/test_flash_causal.py): the evidence does not have such a kernel catch up on H100.
# Two things the figure does not settle: the slowdown is one for both head dims, while at head dim 128 alone the A100
# panels put the Triton kernel at 2.07x (no mask) and 2.24x (causal) FlashAttention-2's forward + backward time
# (geometric means over 512-16k) against the 1.83x and ~2.0x priced here; and flash-attn's benchmark script
# (benchmarks/benchmark_flash_attention.py @60499abc, added eleven days after the figure) times OpenAI Triton's
# triton.ops.flash_attention as its "Triton" method, so the bars may be of that kernel rather than of
# flash_attn_triton.py on the pre-MLIR Triton that llm-foundry runs.
TRITON_SLOWDOWN = (1.4, 2.0)


def _flash_kernel(layer: Layer, core: Cost, qkv_bytes: Any, out_bytes: Any, recompute: Any) -> Kernel:
    """FlashAttention (Dao et al. 2022; Dao 2023, FlashAttention-2): QK^T, softmax and AV in one tiled kernel
    that never writes the s x s_kv scores to memory: it reads Q, K, V and writes the output (forward), and reads
    Q, K, V, O, dO and writes dQ, dK, dV (backward). Its backward recomputes S = QK^T and P = softmax(S) from the
    saved row log-sum-exp: 5 matmuls against the forward's 2, so the backward executes 2.5x the forward's
    attention matmul FLOPs (Dao 2023, section 4.1), of which the recomputed QK^T is not model work.

    With a causal mask the kernel skips the blocks above the diagonal, which "leads to around 1.7-1.8x speedup
    compared to attention without the causal mask" (Dao 2023, section 3.1.1) at long sequences and less at short
    ones: the kernel's executed work is the full score work times causal_fraction(key length), timed at the
    non-causal efficiency the papers tabulate, while its model FLOPs stay those of the whole matrix, the
    convention of MFU figures (Dao 2023 section 4.2 follows Megatron-LM "without dividing the attention FLOPs by
    2"; `model_work_scale`).

    `flash_version` picks the kernel generation and with it the device curve:
    2 = FlashAttention-2 (the flash-attn 2 package, PyTorch SDPA's flash backend), class `attention`;
    3 = FlashAttention-3 class kernels for Hopper (Shah et al. 2024; Transformer Engine's cuDNN fused attention is
    of that generation), class `attention_fa3`, which falls back to `attention` on devices without one.
    `triton` is FlashAttention written in Triton (llm-foundry's attn_impl: triton runs a copy of Tri Dao's
    flash_attn_triton.py): the FlashAttention-2 curve stretched by TRITON_SLOWDOWN per pass. That ratio was
    measured on an A100; on an H100 it is carried over, both kernels running there without Hopper's own
    instructions (FlashAttention-2 "using no special instructions", Dao 2023 section 4.1; the Triton kernel is
    compiled by the pre-MLIR Triton, which predates Hopper's wgmma), as FlashAttention v1's ratio to
    FlashAttention-2 carries over between the two GPUs' figures (TRITON_SLOWDOWN's comment).

    The curves are measured at head dim 128; the kernel carries its head dim for the rate the curve's family runs
    at another (dlperf.ops.headdim; none for the Triton kernel, whose slowdown was read over head dims 64 and 128)."""
    skip, model_scale, keys = _flash_skip(layer)
    flops = (core.fwd_flops / skip, core.bwd_data_flops / skip, core.bwd_weight_flops)
    fused = Cost(*flops, fwd_bytes=qkv_bytes + out_bytes, bwd_bytes=2 * qkv_bytes + 2 * out_bytes,
                 depth=core.depth, bwd_depth=core.bwd_depth)
    cls = "attention_fa3" if layer["flash_version"] == 3 and not layer["triton"] else "attention"
    triton = bool(layer["triton"])
    return Kernel("flash_attention", cls, fused, bwd_recompute_flops=recompute / skip, model_work_scale=model_scale,
                  slowdown=TRITON_SLOWDOWN if triton else (1.0, 1.0), seq=keys,
                  head_dim=None if triton else layer["head_dim"])


# flash-attn's padding helpers (Dao-AILab/flash-attention flash_attn/bert_padding.py @v2.4.2), as llm-foundry's MPT
# calls them with attn_impl: flash (mosaicml/llm-foundry llmfoundry/models/layers/attention.py flash_attn_fn
# @5e85bd62): unpad_input on Q, on K and on V, then flash_attn_varlen_func, then pad_input on the output.
# unpad_input runs attention_mask.sum, torch.nonzero (the host waits for the count), seqlens.max().item() (the host
# waits again), torch.cumsum, F.pad, and IndexFirstAxis (torch.gather of the kept rows; the einops rearrange/repeat
# are views): 7 operators and 2 host synchronisations each. pad_input is IndexPutFirstAxis: torch.zeros and
# output[indices] = values, 2 operators. Backward: IndexPutFirstAxis.backward is grad_output[indices] (1 operator),
# each IndexFirstAxis.backward torch.zeros and scatter_ (2). Each operator is counted as one launch (nonzero
# launches more than one cub kernel: a lower bound).
UNPAD_CALLS = 3                      # Q, K, V
UNPAD_OPS, UNPAD_SYNCS = 7, 2        # per unpad_input, forward
PAD_OPS = 2                          # pad_input, forward
UNPAD_BWD_OPS, PAD_BWD_OPS = 2, 1    # per IndexFirstAxis / IndexPutFirstAxis backward


def _unpads(layer: Layer) -> bool:
    """Whether the flash-attn package kernel runs behind bert_padding's unpad/pad (`unpad: true`); a Triton kernel
    (`triton: true`, llm-foundry's triton_flash_attn_fn) takes the padded batch and unpads nothing."""
    return bool(layer["unpad"]) and bool(layer["flash"]) and not layer["triton"]


def _unpad_kernel(qkv_bytes: Any, out_bytes: Any) -> Kernel:
    """bert_padding's unpad of Q, K, V and pad of the output around a varlen FlashAttention call (constants above):
    memory-bound copies of every row (a batch without padding keeps them all). Forward: each gather reads and
    writes its tensor (2 x QKV); pad_input zero-fills the output and writes the rows into it (write, read, write).
    Backward: each IndexFirstAxis zero-fills its input's gradient and scatters into it (write, read, write: 3 x QKV),
    the output's gradient is gathered back (read, write). The host waits for the device twice per unpad_input."""
    return Kernel("unpad", "memory", Cost(fwd_bytes=2 * qkv_bytes + 3 * out_bytes,
                                          bwd_bytes=3 * qkv_bytes + 2 * out_bytes, depth=1, bwd_depth=1),
                  launches=UNPAD_CALLS * UNPAD_OPS + PAD_OPS, bwd_launches=UNPAD_CALLS * UNPAD_BWD_OPS + PAD_BWD_OPS,
                  syncs=UNPAD_CALLS * UNPAD_SYNCS)


# A sliding-window FlashAttention kernel visits, for each block of queries, only the key blocks that meet its
# window: the window plus at most one partly masked block. FlashAttention-2 tiles keys in blocks of 64 or 128
# ("block sizes {64, 128} x {64, 128}", Dao 2023, arXiv:2307.08691, section 3.3); the larger is taken, so a
# query row costs `window + WINDOW_TILE` keys (flash-attn's window_size=(w, 0), local attention since v2.3).
WINDOW_TILE = 128

# Causal masking. On A100 and H100, FlashAttention-2 tiles the score matrix in blocks of 128 queries forward and
# 128 keys backward at head dims 64 and 128 (Dao-AILab/flash-attention @0251105a, csrc/flash_attn/src/
# flash_fwd_launch_template.h run_mha_fwd_hdim64/128: Flash_fwd_kernel_traits<Headdim, 128, ...>;
# flash_bwd_launch_template.h run_mha_bwd_hdim64/128 with 144 KB of shared memory: kBlockN 128), and skips the
# blocks above the diagonal: with n = s / 128 blocks a side it runs n(n+1)/2 of the n^2 blocks, the diagonal ones
# computed and masked. Each query block also pays a cost the mask does not shrink (loading Q, rescaling and
# writing O, masking its diagonal block), worth c = CAUSAL_BLOCK_COST key-block iterations, so the causal kernel
# takes f(s) = (c + (n + 1) / 2) / (c + n) of the no-mask kernel's time: 1 for one tile, tending to 1/2.
# c is fitted (least squares on log f; tests/test_flash_causal.py refits it) to the causal / no-mask time ratios
# of the ten head-dim 64 and 128 panels of dlperf/data/kernels/flash-causal-speed.csv, 512-16k tokens:
# FlashAttention-2 forward + backward on A100 and H100 (Dao 2023, arXiv:2307.08691, section 4.1 figures), and
# FlashAttention-2, FlashAttention-3 and cuDNN forward on H100 (Shah et al. 2024, arXiv:2407.08608, section 4.1).
# f = 0.78 at 512, 0.60 at 2k, 0.53 at 8k, 0.515 at 16k; all 60 points within 0.061, the 36 FlashAttention-2
# points within 0.04. The measured ratios sit ~0.017 above the form at 8k-16k (the causal kernel's CTAs are of
# unequal length, which leaves a tail the block count does not see). One form for both passes and every device
# and kernel: the A100 and H100 FlashAttention-2 panels agree within 0.025 at every length, and NVIDIA's GB200
# and GB300 cuDNN tables (dlperf/data/kernels/cudnn-gb*-sdpa-bf16.csv, 2k-32k, held out of the fit) lie within
# 0.04 over a training pass and 0.05 per pass. Dao 2023's "around 1.7-1.8x" (section 3.1.1) is this form at
# 2.5k-4k keys.
CAUSAL_BLOCK_COST = 2.96
# FlashAttention in Triton (Dao-AILab/flash-attention flash_attn/flash_attn_triton.py @f1a73d07, the kernel
# llm-foundry's attn_impl triton copies) also visits n(n+1)/2 blocks (end_n = (start_m + 1) * BLOCK_M forward,
# begin_m from start_n backward, BLOCK_M = BLOCK_N = 128) but masks every block it visits, not only the diagonal
# ones ("if IS_CAUSAL: qk += tl.where(...)" inside both block loops), so each visited block costs 1 + m iterations:
# f(s) = (c + (1 + m)(n + 1) / 2) / (c + n), tending to (1 + m) / 2, not 1/2. (c, m) fitted the same way to the
# A100 figure's two FlashAttention Triton panels (head dim 64 and 128, 512-16k; flash-causal-speed.csv): c = 0.14,
# m = 0.216; f = 0.77 at 512, 0.63 at 4k, 0.61 at 16k, every point within 0.029. Measured on A100 only; carried
# over to H100, where the pre-Hopper Triton compiler runs the same code (TRITON_SLOWDOWN).
TRITON_CAUSAL = (0.14, 0.216)


def causal_fraction(keys: Any, triton: bool = False) -> Any:
    """A causal fused-attention kernel's time over `keys` keys as a fraction of the no-mask kernel's (the block
    count above; `triton`: FlashAttention in Triton, which masks every block); a number, sympy expression or
    array, as `keys` is. Capped at 1: causal attention is never slower than the whole matrix."""
    c, m = TRITON_CAUSAL if triton else (CAUSAL_BLOCK_COST, 0.0)
    n = keys / WINDOW_TILE
    return mathx.minimum((c + (1 + m) * (n + 1) / 2) / (c + n), 1)


def causal_speedup(keys: Any, triton: bool = False) -> Any:
    """Full score work over the work a causal fused kernel over `keys` keys executes: 1 / causal_fraction."""
    return 1 / causal_fraction(keys, triton)


def _window_binds(window: Any, skv: Any) -> bool:
    """Whether a sliding window leaves the kernel fewer keys than the whole sequence (assumed when the sequence
    is a symbol or an array of lengths: the closed form then keeps the windowed cost)."""
    try:
        return bool(window + WINDOW_TILE < skv)
    except (TypeError, ValueError):
        return True


def _flash_skip(layer: Layer) -> tuple[Any, Any, Any]:
    """(full score work / executed work, model work / executed work, key length the kernel loops over) of a
    fused attention kernel: causal masking skips the blocks above the diagonal (causal_speedup); a causal sliding
    window of w keys (Beltagy et al. 2020; Mistral 7B; gpt-oss) leaves w + WINDOW_TILE keys per query, never more
    than the causal kernel's share. Its model work follows the causal convention (the whole matrix for causal
    attention, i.e. twice the pairs attended): 2(w*s - w(w-1)/2) of the s x s_kv matrix, capped at all of it, so
    that a window as long as the sequence is plain causal attention, in work and in model FLOPs."""
    s, skv, window = layer.in_shape[-2], layer["kv_seq"] or layer.in_shape[-2], layer["window"]
    causal = causal_speedup(skv, bool(layer["triton"])) if layer["causal"] and layer["kv_seq"] == s else 1
    if window is None or not _window_binds(window, skv):
        return causal, causal, skv
    keys = window + WINDOW_TILE
    skip = mathx.maximum(skv / keys, causal)
    model = mathx.minimum(2 * (window * s - window * (window - 1) / 2) / (s * skv), 1)
    return skip, model * skip, mathx.minimum(keys, skv)


def _attention_params(s: tuple, a: dict) -> Any:
    d, h, kv, hd, out = s[-1], a["heads"], a["kv_heads"], a["head_dim"], a["out"]
    weights = d * h * hd + 2 * d * kv * hd + h * hd * out
    in_bias = (h * hd + 2 * kv * hd) if (a["bias"] or a["qkv_bias"]) else 0
    sinks = h if a["sinks"] else 0  # one learned softmax logit per head (gpt-oss "attention sinks")
    return weights + in_bias + (out if a["bias"] else 0) + sinks


def _attention_saved(layer: Layer, e: int) -> Any:
    """Korthikanti et al. 2022, section 4.1: input, Q, K, V, softmax output, dropout mask and dropped scores,
    output-projection input: 11sbh + 5as^2b bytes in 16-bit with attention dropout. The fused
    kernel keeps no s^2 terms (only a per-row log-sum-exp)."""
    s, d, h, kv, hd, skv = _attention_dims(layer)
    linear_terms = e * (s * d + s * h * hd + 2 * skv * kv * hd + s * h * hd)
    if layer["flash"]:
        # unpadded: pad_input's output is a copy beside the kernel's saved output, and each unpad keeps its int64
        # row indices (torch.nonzero), one per token
        unpad = e * s * h * hd + UNPAD_CALLS * INDEX_BYTES * s if _unpads(layer) else 0
        return linear_terms + 4 * h * s + unpad
    return linear_terms + quadratic_attention_bytes(layer, e)


def quadratic_attention_bytes(layer: Layer, e: int) -> Any:
    """The per-sample s^2 activations of unfused attention (softmax output, and with dropout its mask and the
    dropped scores): what selective recomputation drops (Korthikanti et al. 2022, section 5)."""
    if layer.op != "attention" or layer["flash"]:
        return 0
    s, _, h, _, _, skv = _attention_dims(layer)
    return (e + ((e + MASK_BYTES) if layer["dropout"] else 0)) * h * s * skv


def _attention_check(shape: tuple, a: dict) -> None:
    from dlperf.errors import ShapeError

    if isinstance(a["heads"], int) and isinstance(a["kv_heads"], int) and a["heads"] % a["kv_heads"]:
        raise ShapeError(expected="heads divisible by kv_heads", found=f"{a['heads']} heads, {a['kv_heads']}")
    if a["triton"] and not a["flash"]:
        raise ShapeError("triton", expected="flash: true (FlashAttention in Triton is a fused kernel)",
                         found="flash: false")
    if a["flash_version"] not in (2, 3):
        raise ShapeError("flash_version", expected="2 (FlashAttention-2) or 3 (FlashAttention-3)",
                         found=a["flash_version"])
    if a["unpad"] and not a["flash"]:
        raise ShapeError("unpad", expected="flash: true (bert_padding unpads the batch around the flash-attn kernel)",
                         found="flash: false")
    if a["window"] is not None and not (a["flash"] and a["causal"]):
        raise ShapeError("window", expected="flash: true and causal: true (a sliding window is priced as "
                         "FlashAttention's causal local attention)", found=f"flash {a['flash']}, causal {a['causal']}")
    if a["softmax"] not in SOFTMAX_IMPLS:
        raise ShapeError("softmax", expected=" or ".join(SOFTMAX_IMPLS), found=a["softmax"])


def _attention_asymptotic(layer: Layer, batch: Any) -> tuple[Any, Any]:
    s, d, h, kv, hd, skv = _attention_dims(layer)
    return batch * (s * d * h * hd + h * s * skv * hd), clog2(d) + clog2(skv) + clog2(hd)


ATTENTION = OpRule(
    attrs={"heads": REQUIRED, "head_dim": None, "kv_heads": None, "causal": False, "bias": True,
           "flash": False, "kv_seq": None, "out": None, "dropout": 0.0, "random_tensor": False, "qkv_bias": False,
           "flash_version": 2, "triton": False, "softmax": "fused", "window": None, "sinks": False, "unpad": False,
           "rope": None, "qkv_split": None, "xla": False},
    shape=lambda s, a: (*s[:-1], a["out"]),
    params=_attention_params,
    kernels=_attention_kernels,
    saved=_attention_saved,
    asymptotic=_attention_asymptotic,
    tp="attention",
    check=_attention_check,
)

# ---- loss -----------------------------------------------------------------------------------------------

FP32 = 4                # bytes of an fp32 element: the unfused losses run on an fp32 copy of the logits
LOSS_IMPLS = ("fused", "torch", "megatron", "te")

# Megatron's vocab-parallel loss, counted per logit element (n = tokens x vocab/tp, fp32 after the upcast) from
# _VocabParallelCrossEntropy in microsoft/Megatron-DeepSpeed megatron/mpu/cross_entropy.py @34ed99d1 (the
# 2021-2023 code our GPT validation sources ran; NVIDIA/Megatron-LM's 2020 megatron/mpu/cross_entropy.py @5281919
# and Megatron-Core's megatron/core/tensor_parallel/cross_entropy.py @d98e8a64 run the same steps, the latter with
# the .float() moved inside the function). Forward passes over the logits:
# max (read), sub_ (read, write in place), exp out= (read, write in place), sum (read), div_ (read, write in
# place; the softmax saved for backward): 8 passes, 5 launches, 1 FLOP each; exp is the transcendental one.
# Backward: the saved softmax is the gradient buffer (no pass), the scatter-subtract of one at the target touches
# one element per row, then mul_ by the incoming gradient (read, write): 2 passes, 1 launch.
MEGATRON_FWD = {"passes": 6, "launches": 4, "flops": 4}          # max, sub_, sum, div_
MEGATRON_EXP = {"passes": 2, "launches": 1, "flops": 1}          # exp(out=)
MEGATRON_BWD = {"passes": 2, "launches": 1, "flops": 1}          # mul_
# Kernels over the [tokens] vectors (targets int64, row values fp32): forward target < start, target >= end, |,
# clone, - start, masked_target[mask] = 0 (masked_fill), arange, the predicted-logit gather, clone,
# predicted[mask] = 0, log, - predicted; backward arange, mask.float(), 1 - it, the gather, -=, the index_put back.
# Bytes per token: the int64/fp32/bool operands each kernel reads and writes, summed over those kernels.
MEGATRON_ROW = {"launches": 12, "bwd_launches": 6, "bytes": 139, "bwd_bytes": 81}


# Transformer Engine's Triton parallel cross entropy, which Megatron-Core runs when cross_entropy_loss_fusion is set
# with cross_entropy_fusion_impl 'te' (compute_language_model_loss, NVIDIA/Megatron-LM
# megatron/core/models/common/language_module/language_module.py @3758b54b lines 141-162, passing the logits in
# the model dtype: no .float() before it, megatron/core/models/gpt/gpt_model.py line 709). Kernels per logit
# element, from transformer_engine/pytorch/triton/cross_entropy.py cross_entropy_forward / cross_entropy_backward
# at the versions Megatron-Bridge pins (release_v2.7 @0289e763, release_v2.9 @70f53666, 2.14 @71bbefbf and
# @f031cf87, 2.16 @f8a01cd5, 2.17.1 @4329ff84, all the same): forward online_softmax_kernel reads the logits (row
# max, sum of exponentials, target logit: max, subtract, exp, add), cross_entropy_kernel reads them again and writes
# the gradient softmax - onehot in place in the logits' dtype (subtract, exp, divide): 3 passes, 2 launches, 7
# FLOPs with 2 exps. Backward element_mul_kernel scales that gradient by grad_output in place (read, write, 1
# FLOP): 2 passes, 1 launch (its torch.equal(grad_output, 1.0) shortcut never fires: grad_output is [b, s], the
# scalar's size differs). TE >= 2.18 writes an fp32 gradient instead (@01bbe3ee, "Fix the numerical issue with the
# Fused CE loss"), after every pinned version.
TE_FWD = {"passes": 3, "launches": 2, "flops": 7}
TE_BWD = {"passes": 2, "launches": 1, "flops": 1}
# Forward torch.zeros fills of the per-token buffers: loss_1d (1 fp32) and m_d_X_y (3 fp32), written once each.
TE_ROW = {"launches": 2, "bytes": 4 * FP32}


def _upcast(n: Any, e: int) -> Kernel | None:
    """The logits' fp16/bf16 -> fp32 copy and, backward, its gradient cast back: one read of e bytes and one write
    of 4 (reversed backward) per element. Megatron-LM calls `.float()` on the logits unless --fp16-lm-cross-entropy
    (NVIDIA/Megatron-LM megatron/model/gpt2_model.py @5281919; Megatron-DeepSpeed's pipeline model casts with
    float16_to_fp32, megatron/model/gpt_model.py @34ed99d1; Megatron-Core casts inside the loss); PyTorch's
    autocast runs cross_entropy in fp32 (torch.amp docs, "CUDA Ops that can autocast to float32"), as do
    torchtitan's and Hugging Face's losses with an explicit `.float()`. None when the model already runs in fp32."""
    if e >= FP32:
        return None
    return Kernel("loss_upcast", "memory", Cost(fwd_bytes=(e + FP32) * n, bwd_bytes=(FP32 + e) * n, depth=1,
                                                bwd_depth=1), bwd_launches=1)


def _fused_loss(n: Any, depth: Any, e: int) -> tuple[Kernel, ...]:
    """One kernel per pass in the model dtype (flash-attn's and llm-foundry's fused xentropy): forward reads the
    logits and writes the loss/statistics, backward reads them and writes p - onehot, 2 passes each. Transformer
    Engine's parallel_cross_entropy, which Megatron-Core's 'te' fusion runs, is `te` (_te_loss); the 'native'
    fusion torch.compiles Megatron's own steps with one allreduce fewer (megatron/core/fusions/
    fused_cross_entropy.py @3758b54b), not modelled apart."""
    return (Kernel("softmax_nll", "transcendental", Cost(
        fwd_flops=5 * n, bwd_data_flops=n, fwd_bytes=2 * e * n, bwd_bytes=2 * e * n, depth=depth, bwd_depth=1,
    ), launches=1, bwd_launches=1),)


def _torch_loss(n: Any, depth: Any, e: int) -> tuple[Kernel, ...]:
    """PyTorch's F.cross_entropy = log_softmax + nll_loss, on fp32 logits (autocast or an explicit upcast): 2
    forward kernels (log_softmax reads and writes the logits, nll_loss gathers one value per row). nll_loss's
    backward writes a zero-filled gradient and scatters -1/N into it, then log_softmax's backward reads it and the
    saved output and writes the input gradient, recomputing exp(output): 4 passes in 3 kernels, the exp counted."""
    cast = _upcast(n, e)
    loss = Kernel("log_softmax_nll", "transcendental", Cost(
        fwd_flops=5 * n, bwd_data_flops=3 * n, fwd_bytes=2 * FP32 * n, bwd_bytes=4 * FP32 * n, depth=depth,
        bwd_depth=1), launches=2, bwd_launches=3)
    return (cast, loss) if cast else (loss,)


def _te_loss(n: Any, rows: Any, depth: Any, e: int) -> tuple[Kernel, ...]:
    """Transformer Engine's parallel cross entropy (the TE_* counts above): 3 passes over the logits in the model
    dtype in 2 kernels forward, 2 in 1 backward, no fp32 copy; the two zero-filled per-token buffers are kernels
    tensor parallelism does not divide (every rank holds every token)."""
    loss = Kernel("te_cross_entropy", "transcendental", Cost(
        fwd_flops=TE_FWD["flops"] * n, bwd_data_flops=TE_BWD["flops"] * n, fwd_bytes=TE_FWD["passes"] * e * n,
        bwd_bytes=TE_BWD["passes"] * e * n, depth=depth, bwd_depth=1), launches=TE_FWD["launches"],
        bwd_launches=TE_BWD["launches"])
    buffers = Kernel("loss_buffers_zero", "memory", Cost(fwd_bytes=TE_ROW["bytes"] * rows, depth=1),
                     launches=TE_ROW["launches"], bwd_launches=0, split=False)
    return (loss, buffers)


def _megatron_loss(n: Any, rows: Any, depth: Any, e: int) -> tuple[Kernel, ...]:
    """Megatron-LM's vocab-parallel loss (the MEGATRON_* counts above): the upcast, 5 separate element-wise and
    reduction kernels over the fp32 logits forward and 1 backward, and 12 + 6 small kernels over one value per
    token, which tensor parallelism does not divide (every rank holds every token). Its three all-reduces of a
    [tokens] fp32 vector (max, predicted logit, sum) are tensor-parallel collectives (engine.layers)."""
    fwd, exp, bwd, row = MEGATRON_FWD, MEGATRON_EXP, MEGATRON_BWD, MEGATRON_ROW
    passes = Kernel("softmax_passes", "memory", Cost(
        fwd_flops=fwd["flops"] * n, bwd_data_flops=bwd["flops"] * n, fwd_bytes=fwd["passes"] * FP32 * n,
        bwd_bytes=bwd["passes"] * FP32 * n, depth=depth, bwd_depth=1), launches=fwd["launches"],
        bwd_launches=bwd["launches"])
    exps = Kernel("softmax_exp", "transcendental", Cost(
        fwd_flops=exp["flops"] * n, fwd_bytes=exp["passes"] * FP32 * n, depth=1), launches=exp["launches"],
        bwd_launches=0)
    rowwise = Kernel("target_gather", "memory", Cost(
        fwd_bytes=row["bytes"] * rows, bwd_bytes=row["bwd_bytes"] * rows, depth=1, bwd_depth=1),
        launches=row["launches"], bwd_launches=row["bwd_launches"], split=False)
    cast = _upcast(n, e)
    return (cast, passes, exps, rowwise) if cast else (passes, exps, rowwise)


def _cross_entropy_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    """Softmax over classes (max, subtract, exp, sum, divide: 5 FLOPs/element) + negative log-likelihood, as the
    training stack named by `impl` runs it: `fused` (one kernel per pass in the model dtype), `torch`
    (F.cross_entropy on fp32 logits), `megatron` (Megatron-LM's vocab-parallel loss, separate fp32 kernels) or `te`
    (Transformer Engine's Triton kernels in the model dtype, Megatron-Core's 'te' loss fusion)."""
    n = batch * numel(layer.in_shape)
    depth = 2 * clog2(layer.in_shape[-1])
    impl = layer["impl"]
    rows = batch * numel(layer.in_shape[:-1])
    if impl == "megatron":
        loss = _megatron_loss(n, rows, depth, e)
    elif impl == "te":
        loss = _te_loss(n, rows, depth, e)
    elif impl == "torch":
        loss = _torch_loss(n, depth, e)
    else:
        loss = _fused_loss(n, depth, e)
    return (*loss, _metric_kernel(layer["metrics"], n, e, depth)) if layer["metrics"] else loss


def _metric_kernel(metrics: Any, n: Any, e: int, depth: Any) -> Kernel:
    """Training metrics that recompute the loss from the logits after every micro-batch's backward pass, without
    gradient: composer's trainer calls `_eval_train_metrics` after `loss.backward()` in `_train_microbatch`
    (composer/trainer/trainer.py @1c9d8d17 = v0.16.4, and @7e0e40a7 = v0.17.2), and llm-foundry's MPT registers
    LanguageCrossEntropy and LanguagePerplexity (llmfoundry/models/mpt/modeling_mpt.py @v0.3.0, and @5e85bd62
    with use_train_metrics defaulting to true), each a torch.nn.CrossEntropyLoss(reduction='sum') over the
    logits (composer/metrics/nlp.py), which autocast runs in fp32. Per metric, 3 kernels over the n logits: the
    cast to fp32 (read e, write 4 bytes), log_softmax (read and write 4 bytes, ~5 FLOPs) and nll_loss (reads one
    entry a row). It runs after the backward pass, so it is timed with it and never recomputed; it is not model
    work."""
    cost = Cost(bwd_data_flops=metrics * 5 * n, bwd_bytes=metrics * (e + 3 * FP32) * n, depth=0, bwd_depth=depth)
    return Kernel("train_metrics", "transcendental", cost, bwd_launches=3 * metrics, model_work_scale=0)


def _cross_entropy_saved(layer: Layer, e: int) -> Any:
    """What the backward reads: the softmax (megatron) or log-softmax (torch) of the fp32 copy, the fused
    kernel's logits or TE's in-place gradient, in the model dtype."""
    return (e if layer["impl"] in ("fused", "te") else max(e, FP32)) * numel(layer.in_shape)


def _cross_entropy_check(shape: tuple, a: dict) -> None:
    from dlperf.errors import ShapeError

    if a["impl"] not in LOSS_IMPLS:
        raise ShapeError("impl", expected=" or ".join(LOSS_IMPLS), found=a["impl"])


CROSS_ENTROPY = OpRule(
    attrs={"impl": "fused", "metrics": 0},
    shape=lambda s, a: (1,),
    kernels=_cross_entropy_kernels,
    saved=_cross_entropy_saved,
    tp="vocab",
    check=_cross_entropy_check,
)
