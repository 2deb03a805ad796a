"""Memory-bound operators: activations, dropout, normalizations, softmax, pooling, shape ops and merges.

Counts follow SURVEY_MODELS.md 2c: activation N*C*H*W forward and backward; batch norm ~8 NCHW forward and
~12 NCHW backward; pooling N*C*H'*W'*Ky*Kx forward and N*C*H'*W' backward (max pooling).
"""

from __future__ import annotations

from typing import Any

from dlperf.cost import Cost
from dlperf.errors import ShapeError
from dlperf.ops.base import MASK_BYTES, REQUIRED, Kernel, Layer, OpRule, clog2, elementwise_kernel, need_rank, numel

# FLOPs per element, forward and backward: relu is a compare; gelu's tanh form ~ 8 mul/add + tanh; silu and
# sigmoid need an exp and a divide.
ACTIVATION_FLOPS = {"relu": (1, 1), "gelu": (8, 12), "silu": (4, 6), "tanh": (4, 2), "sigmoid": (4, 2)}
TRANSCENDENTAL = ("gelu", "silu", "tanh", "sigmoid")  # evaluate exp or tanh per element


def _n(layer: Layer, batch: Any) -> Any:
    return batch * numel(layer.in_shape)


def _activation_saved(layer: Layer, e: int) -> Any:
    """The activation's input, which its backward reads. With `fused_glu` the activation is the gate of a fused
    gated-linear-unit kernel: Megatron-Core's bias_swiglu_impl (SwiGLUFunction, megatron/core/fusions/
    fused_bias_swiglu.py @d98e8a64, line 235: ctx.save_for_backward(input)) keeps only its input [gate; up]
    and recomputes the activation in backward. The multiply merge after it keeps both its factors (the
    activation's output and the up half): they stand for that input, the gate half in the place of the
    activation's output of the same size, so the activation adds nothing of its own.

    An `inplace` ReLU (PyTorch nn.ReLU(inplace=True), as torchvision's and DeepLearningExamples' ResNets use)
    overwrites its input, and its backward reads its output (pytorch/pytorch tools/autograd/derivatives.yaml,
    relu: `threshold_backward(grad, result, 0)`): that output is the very tensor the next layer keeps as its
    input (a convolution, pooling or linear layer saves its input), so it is counted there, not a second time."""
    if layer["fused_glu"] or layer.get("inplace", False):
        return 0
    return e * numel(layer.in_shape)


def _activation_kernels(op: str, layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    """The activation's kernel. As the gate of a fused gated-linear unit (`fused_glu`) it moves no bytes and
    launches nothing of its own: Megatron-Core's bias_swiglu_impl is one kernel (SwiGLUFunction,
    megatron/core/fusions/fused_bias_swiglu.py @2d1fa8d3, swiglu / swiglu_back) reading [gate; up] and writing the
    product forward, reading both halves and the output gradient and writing both halves' gradients backward:
    the traffic and launch of the `multiply` merge after it (3 and 5 tensors of the product's size,
    _multiply_kernels). The activation keeps its FLOPs (the same math runs fused or not)."""
    fwd, bwd = ACTIVATION_FLOPS[op]
    if layer["fused_glu"]:
        n = _n(layer, batch)
        return (Kernel(op, "transcendental", Cost(fwd_flops=fwd * n, bwd_data_flops=bwd * n), launches=0,
                       bwd_launches=0),)
    if layer.get("xla", False):
        return xla_gelu_kernels(_n(layer, batch), e)
    return (elementwise_kernel(op, _n(layer, batch), e, fwd, bwd,
                               cls="transcendental" if op in TRANSCENDENTAL else "memory"),)


def _activation(op: str) -> OpRule:
    # only ReLU may run in place: the others' backward reads their input, which an in-place op would destroy;
    # only GELU has an XLA form (`xla`: TensorFlow 1 BERT's tanh GELU in an XLA cluster, xla_gelu_kernels)
    extra = {"inplace": False} if op == "relu" else {"xla": False} if op == "gelu" else {}
    return OpRule(
        attrs={"fused_glu": False, **extra},
        shape=lambda s, a: s,
        kernels=lambda layer, b, e: _activation_kernels(op, layer, b, e),
        saved=_activation_saved,
        asymptotic=lambda layer, b: (_n(layer, b), 1),  # Table 4: O(NCHW), O(1)
    )


# Bytes per element of the uniform random tensor TensorFlow 1 materialises for tf.nn.dropout (`random_tensor`):
# NVIDIA/tensorflow @91fc0fc3 (tag r1.15.2+nv20.06, the TensorFlow 1.15.2 of NVIDIA's 20.06 container)
# python/ops/nn_ops.py:4387-4394, dropout_v2: `random_tensor = random_ops.random_uniform(noise_shape, ...,
# dtype=x.dtype)`, `keep_mask = random_tensor >= rate`, `ret = x * scale * cast(keep_mask)`. The graph is built in
# fp32 (AMP rewrites it afterwards), and grappler's AMP pass paints only ops on its lists
# (core/grappler/optimizers/auto_mixed_precision.cc:1543 AddWhitelistOps, :1618
# AddClearAndGrayToWhiteIfBetweenWhite, :1674 PropagateWhiteThroughClear; auto_mixed_precision_lists.h names no
# random op), so the tensor stays float32 under AMP too.
RANDOM_TENSOR_BYTES = 4


def random_tensor_kernel(name: str, n: Any) -> Kernel:
    """The kernel that draws a dropout's `n` uniform numbers when they are drawn apart from it (op attribute
    `random_tensor`): TensorFlow's RandomUniform writes them to memory as float32 (RANDOM_TENSOR_BYTES each), one
    launch, forward only; the dropout then reads them back (the caller adds those bytes to the dropout's own
    forward). XLA does not fuse the draw into the dropout even with auto-clustering on (NVIDIA/tensorflow @91fc0fc3):
    compiler/jit/compilability_check_util.cc:345 rejects IsStatefulRandomOp nodes (RandomUniform among them,
    compilability_check_util.h:217) unless the device's registration sets cluster_stateful_rng_ops (:439), which
    defaults to false (compiler/tf2xla/xla_op_registry.h:104) and which the GPU device's registration
    (compiler/tf2xla/xla_op_registry.cc:157-163) leaves unset. PyTorch draws inside its dropout kernel and keeps only
    the one-byte mask (the dropout kernel's own bytes). A lower bound: whatever XLA keeps for the backward in
    place of the mask is taken as that mask."""
    return Kernel(name, "memory", Cost(fwd_bytes=RANDOM_TENSOR_BYTES * n), launches=1, bwd_launches=0)


# ---- TensorFlow 1 BERT under XLA auto-clustering and the AMP graph rewrite (op attribute `xla`) -------------------
#
# What runs: NVIDIA DeepLearningExamples @729963dd TensorFlow/LanguageModeling/BERT builds the graph in fp32
# (run_pretraining.py:281 compute_type fp32 unless --manual_fp16) and turns on the AMP rewrite
# (optimization.py:100 enable_mixed_precision_graph_rewrite) and XLA auto-clustering (run_pretraining.py:588
# global_jit_level ON_1). Each sublayer ends `layer_norm(dropout(dense(x)) + residual)` (modeling.py:870-875,
# 887-892): tf.layers.dense is MatMul + BiasAdd, layer_norm is tf.contrib.layers.layer_norm on an fp32 input
# (modeling.py:370-383), i.e. nn.moments (two Mean) and nn.batch_normalization (NVIDIA/tensorflow @91fc0fc3
# contrib/layers/python/layers/layers.py:2360-2367, python/ops/nn_impl.py moments / batch_normalization: Rsqrt,
# Mul, Sub, Add); gelu is 0.5x(1 + tanh(c(x + 0.044715 pow(x, 3)))) (modeling.py:283-285).
#
# The AMP rewrite (core/grappler/optimizers/auto_mixed_precision.cc @91fc0fc3, lists in
# auto_mixed_precision_lists.h) paints MatMul/BatchMatMul white (lists.h:82, 86-87), then black forward from Mean
# and Pow (black list, lists.h:177-178) through gray ops (BiasAdd, Mul, Add/AddV2, Sub, Tanh: lists.h:115-152)
# (.cc:1568 PropagateBlackFwdThroughClearAndGray); gray ops become white only between white ops through non-black
# ones (.cc:1618). So: the residual adds, every op of the LayerNorms and the whole GELU are black (fp32); the
# BiasAdds and dropouts after the output and FFN MatMuls are downstream of white but reach the next MatMul only
# through black ops, so they stay fp32 too; Casts sit at each MatMul's output and input (.cc:1882
# ChangeTypeAttrsAndAddCasts). The attention's bias adds, softmax and its dropout lie between MatMuls: fp16 (their
# gradient and XLA's kernels for them: above xla_softmax_kernels). The
# gradients of the fp32 ops are fp32 too (their Sum reductions and the forward's black tensors they read are
# black). Under TF32 the whole section is fp32 anyway.
#
# What XLA makes of it (tensorflow/compiler/xla/service @91fc0fc3; fusion passes gpu/gpu_compiler.cc:262-265):
# the Casts are converts that fuse into their neighbours (a widening convert is always duplicated into its
# consumers: instruction_fusion.cc:49-56), so no Cast kernel of its own; GEMMs are library calls, so their outputs
# and inputs are materialised at the plan's width; a reduction roots an input fusion, and one fusion holds
# reductions of one shape and dimensions only (gpu/ir_emission_utils.cc:493-519), so row reductions (LayerNorm
# statistics) and column reductions (gamma, beta and bias gradients) never share a kernel; tanh, rsqrt and pow are
# expensive and never duplicated (instruction_fusion.cc:162-176, 678-682; gpu/fusion_merger.cc:219-227), so a tanh
# whose output the backward reads (python/ops/math_grad.py:709-714, _TanhGrad reads op.outputs[0]) is
# materialised, and multi-output fusion writes it from the forward GELU's own kernel
# (gpu/multi_output_fusion.cc:127-222: a producer joins a consumer it does not reach). An HLO profile of
# NVIDIA's TensorFlow 1 BERT under XLA and AMP shows that forward LayerNorm section (NVIDIA/tensorflow issue
# #36, 2021, BERT-base inference): one input fusion computes the residual sum as f32 from the f16 GEMM output,
# bias and f32 residual and writes it with the row means ("moments/mean", outputs (f32[1024], f32[1024,768])); one
# reads it for the variance; a small one turns the variance into the inverse deviation (an f32[1024] fusion); one
# writes the LayerNorm output twice, f16 for the next GEMM and f32 for the residual
# ("batchnorm/add_1-0-CastToFp16-AutoMixedPrecision", outputs (f16[1024,768], f32[1024,768])).
FP32_SECTION_BYTES = 4  # bytes per element of the tensors the AMP rewrite leaves float32 (above)


def xla_residual_norm_kernels(n: Any, d: Any, e: int) -> tuple[Kernel, ...]:
    """The bias-add + tf.nn.dropout + residual add + LayerNorm section after a GEMM, as XLA's kernels run it
    (layernorm attribute `xla`; its dropout's `xla` and its residual's `fused` leave their work here). `n`
    elements of width `d` per row; GEMM-side tensors (the GEMM output read forward, its gradient read and the
    next GEMM's input written backward, the LayerNorm output copy for the next GEMM) at the plan's width `e`,
    the section's own tensors (the residual stream, the residual sum x, its gradient) at FP32_SECTION_BYTES, the
    dropout's random tensor at RANDOM_TENSOR_BYTES. Forward (the profile above): x and mean (reads GEMM output,
    random tensor, residual; writes x), variance (reads x), inverse deviation (per row), normalize (reads x,
    writes the f32 output and, below fp32, the GEMM's copy). Backward (TensorFlow's gradients of these ops,
    math_grad.py @91fc0fc3 _MulGrad, _MeanGrad, _RsqrtGrad, _SquaredDifferenceGrad: row sums for the mean and
    inverse deviation, column sums for gamma and beta, then the input gradient that needs the row sums): the row
    sums (read the incoming gradient, the residual's gradient, x), the column sums (the same), the input
    gradient (the same and the random tensor for the dropout's mask; writes the residual's gradient and, at the
    plan's width, the GEMM's input gradient). The GEMM's bias gradient, a column sum of the same shape, joins the
    column sums by sibling multi-output fusion (gpu/multi_output_fusion.cc:73-85 allows two input fusions) and
    reads the random tensor there too: the linear (or attention) layer's own bias-gradient pass stands for it, 2
    bytes per element short at fp16. Also short: the incoming gradient is taken as one GEMM's, where the Q, K and
    V GEMMs each return one before the output LayerNorm."""
    f, r = FP32_SECTION_BYTES, RANDOM_TENSOR_BYTES
    rows = n / d
    copy = e if e != f else 0  # the normalize kernel's second output, for the next GEMM (none when it reads fp32)
    grad_in = e + 2 * f  # incoming GEMM gradient, the residual's gradient, x
    return (
        Kernel("xla_residual_mean", "memory", Cost(
            fwd_flops=6 * n, fwd_bytes=n * (e + r + 2 * f) + f * rows, depth=clog2(d) + 3), launches=1,
            bwd_launches=0),
        Kernel("xla_variance", "memory", Cost(fwd_flops=3 * n, fwd_bytes=n * f + 2 * f * rows, depth=clog2(d) + 1),
               launches=1, bwd_launches=0),
        Kernel("xla_inverse_deviation", "memory", Cost(fwd_flops=2 * rows, fwd_bytes=2 * f * rows, depth=2),
               launches=1, bwd_launches=0),
        Kernel("xla_normalize", "memory", Cost(fwd_flops=4 * n, fwd_bytes=n * (2 * f + copy) + 2 * f * rows,
                                               depth=2), launches=1, bwd_launches=0),
        Kernel("xla_grad_row_sums", "memory", Cost(bwd_data_flops=4 * n, bwd_bytes=n * grad_in, bwd_depth=clog2(d)),
               launches=0, bwd_launches=1),
        Kernel("xla_grad_column_sums", "memory", Cost(bwd_weight_flops=4 * n, bwd_bytes=n * grad_in,
                                                      bwd_depth=clog2(rows)), launches=0, bwd_launches=1),
        Kernel("xla_grad_input", "memory", Cost(bwd_data_flops=8 * n, bwd_bytes=n * (grad_in + r + f + e),
                                                bwd_depth=3), launches=0, bwd_launches=1),
    )


def xla_gelu_kernels(n: Any, e: int) -> tuple[Kernel, ...]:
    """TensorFlow 1 BERT's tanh GELU on `n` elements in an XLA cluster (gelu attribute `xla`; section comment
    above): forward, one multi-output fusion reads the GEMM output (plan width `e`), writes the GELU for the next
    GEMM (`e`) and the float32 tanh the backward reads; backward, one fusion reads the incoming GEMM gradient
    (`e`), the GEMM output again (the bias add and its convert are recomputed) and the tanh, and writes the
    gradient for the GEMM before it (`e`). The bias gradient is a column sum of that same float32 gradient,
    which no loop fusion can hold (a reduction's fusion is an input fusion, and sibling multi-output fusion
    joins fusions of one kind only: gpu/multi_output_fusion.cc:73-85), so it reads the same three tensors
    again: the linear layer's own bias-gradient pass stands for its launch and its read of one `e`-wide tensor,
    `xla_gelu_bias_grad_reads` adds the other two (no launch of its own)."""
    fwd, bwd = ACTIVATION_FLOPS["gelu"]
    f = FP32_SECTION_BYTES
    return (
        Kernel("xla_gelu", "transcendental", Cost(
            fwd_flops=fwd * n, bwd_data_flops=bwd * n, fwd_bytes=n * (2 * e + f), bwd_bytes=n * (3 * e + f),
            depth=1, bwd_depth=1), launches=1, bwd_launches=1),
        Kernel("xla_gelu_bias_grad_reads", "memory", Cost(bwd_bytes=n * (e + f)), launches=0, bwd_launches=0),
    )


# The attention's scale, mask add, softmax and tf.nn.dropout (attention attribute `xla`). What runs: DLE @729963dd
# modeling.py:713-736, BatchMatMul, Mul by 1/sqrt(head dim), AddV2 of a [B, 1, 1, T] mask adder (the mask is
# [B, 1, T], modeling.py:564), Softmax, dropout, BatchMatMul. In the 20.06 container's lists Softmax, Mul and AddV2
# are gray (auto_mixed_precision_lists.h @91fc0fc3:147, 141, 117), so between the two white BatchMatMuls the
# forward runs fp16 under AMP. Its gradient is not: _SoftmaxGrad (python/ops/nn_grad.py:302-304) is
# `(g - reduce_sum(g * softmax, -1)) * softmax`, and Sum is black (lists.h:182), so the Sub and Mul after it are
# painted black too (auto_mixed_precision.cc:1568) and the Mul before it is not between white ops: fp32. Under XLA
# that precision never reaches memory but in the row sums: what decides the traffic is which tensors XLA's fusion
# passes materialise (gpu/gpu_compiler.cc:262-265: instruction fusion without, then with duplication, the fusion
# merger, multi-output fusion), from tf2xla's lowering of Softmax (tf2xla/kernels/softmax_op.cc:61-82: reduce-max,
# subtract, exp, reduce-sum of its f32 convert, divide):
# - the scaled, masked scores have two users (the max and the subtract): the first pass will not duplicate them
#   (instruction_fusion.cc:678-681), so they become a loop fusion, which the second pass never fuses further (a
#   fusion as producer, gpu/instruction_fusion.cc:45-48) and the fusion merger cannot merge (its user the max is a
#   bare reduce, not a fusion: gpu/fusion_merger.cc:204); multi-output fusion joins it to the max
#   (gpu/multi_output_fusion.cc:167-217): one kernel reads the GEMM output and writes the scores back with the max;
# - exp is expensive (instruction_fusion.cc:153) and has two users (the sum, the divide): never duplicated, it is a
#   loop fusion that multi-output fusion joins to the sum; one kernel reads the scores and writes exp and the sum;
# - the divide (cheap on the GPU, gpu/instruction_fusion.cc:31-38), the dropout's compare, convert and multiplies
#   form the kernel that reads exp and the random tensor and writes the dropped probabilities for the next GEMM;
#   the softmax itself is not written, the fusion merger folds the divide into its backward users too
#   (fusion_merger.cc: bytes ratio 0.6, under the 1.10 of :239).
# That forward is what an HLO profile of NVIDIA's TensorFlow BERT under XLA shows (NVIDIA/tensorflow issue #36,
# 2021): the Softmax as an input fusion with outputs (f16[8,12,128], f16[8,12,128,128]) reading the score GEMM's
# output, then one reading that tensor and the row max with outputs (f16[8,12,128], f16[8,12,128,128]) and
# transcendental work (the exp). Backward, the dropout's gradient g = dprobs * mask * scale is needed by the row
# sum of g * softmax and by the elementwise (g - sum) * softmax; the merger duplicates it into both (bytes ratio
# 0.67), so each of the two kernels reads the incoming gradient, the random tensor (the mask is recomputed from
# it, as in the LayerNorm sections above) and exp; the second writes the scores' gradient for the two GEMMs.


XLA_SOFTMAX_KERNELS = ("xla_softmax_max", "xla_softmax_exp_sum", "xla_softmax_probs", "xla_softmax_grad_sum",
                       "xla_softmax_grad")  # xla_softmax_kernels' names, in that order


def xla_softmax_kernels(rows: Any, width: Any, e: int, dropout: bool) -> tuple[Kernel, ...]:
    """The attention core between its two GEMMs on `rows` rows of `width` scores, as XLA's kernels run it (section
    comment above): forward the scores-and-max, exp-and-sum and probabilities kernels, backward the row sum and the
    scores' gradient. Full tensors at the plan's width `e`, the random tensor at RANDOM_TENSOR_BYTES (read
    wherever the dropout's mask is needed; nothing when the layer has no dropout), the row max and sum at `e` and
    the gradient's row sum at float32 (Sum is black). FLOPs are the unfused softmax's and dropout's (5 + 3
    forward, 4 + 1 backward per element)."""
    n = rows * width
    r = RANDOM_TENSOR_BYTES if dropout else 0
    f = FP32_SECTION_BYTES
    return (
        Kernel("xla_softmax_max", "memory", Cost(fwd_flops=3 * n, fwd_bytes=2 * e * n + e * rows,
                                                 depth=clog2(width) + 2), launches=1, bwd_launches=0),
        Kernel("xla_softmax_exp_sum", "transcendental", Cost(fwd_flops=3 * n, fwd_bytes=2 * e * n + 2 * e * rows,
                                                             depth=clog2(width) + 1), launches=1, bwd_launches=0),
        Kernel("xla_softmax_probs", "memory", Cost(fwd_flops=2 * n, fwd_bytes=(2 * e + r) * n + e * rows, depth=2),
               launches=1, bwd_launches=0),
        Kernel("xla_softmax_grad_sum", "memory", Cost(bwd_data_flops=2 * n, bwd_bytes=(2 * e + r) * n
                                                      + (e + f) * rows, bwd_depth=clog2(width) + 1),
               launches=0, bwd_launches=1),
        Kernel("xla_softmax_grad", "memory", Cost(bwd_data_flops=3 * n, bwd_bytes=(3 * e + r) * n + (e + f) * rows,
                                                  bwd_depth=2), launches=0, bwd_launches=1),
    )


def _dropout_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    n = _n(layer, batch)
    if layer["xla"]:
        # inside an XLA cluster, fused into the section that follows it (the layernorm with `xla`, which reads
        # the GEMM output and the random tensor there and recomputes the mask from it in backward): only the
        # RandomUniform, which XLA does not cluster, stays a kernel of its own
        return (random_tensor_kernel("random_uniform", n),) if layer["random_tensor"] else ()
    drawn = RANDOM_TENSOR_BYTES * n if layer["random_tensor"] else 0  # read back from a RandomUniform kernel
    # random draw + compare + scale; writes the output and a one-byte mask, backward reads the mask.
    kernel = Kernel("dropout", "memory", Cost(
        fwd_flops=3 * n, bwd_data_flops=n, fwd_bytes=2 * e * n + MASK_BYTES * n + drawn,
        bwd_bytes=2 * e * n + MASK_BYTES * n, depth=1, bwd_depth=1,
    ))
    return (random_tensor_kernel("random_uniform", n), kernel) if layer["random_tensor"] else (kernel,)


DROPOUT = OpRule(
    attrs={"p": 0.1, "random_tensor": False, "xla": False},
    shape=lambda s, a: s,
    kernels=_dropout_kernels,
    saved=lambda layer, e: MASK_BYTES * numel(layer.in_shape),
)


def _batchnorm_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    n = _n(layer, batch)
    reduce_over = batch * numel(layer.in_shape[1:])  # N*H*W per channel
    # Forward reads x twice (statistics, then normalize) and writes y; backward reads x and dy twice.
    return (Kernel("batchnorm", "memory", Cost(
        fwd_flops=8 * n, bwd_data_flops=8 * n, bwd_weight_flops=4 * n,
        fwd_bytes=3 * e * n, bwd_bytes=5 * e * n, depth=clog2(reduce_over), bwd_depth=clog2(reduce_over),
    ), split=True),)


BATCHNORM = OpRule(
    attrs={"eps": None},
    shape=lambda s, a: s,
    params=lambda s, a: 2 * s[0],
    kernels=_batchnorm_kernels,
    asymptotic=lambda layer, b: (_n(layer, b), clog2(b)),  # Table 4 as printed: O(NCHW), O(log N)
)


def _norm(rms: bool) -> OpRule:
    def kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
        n, d = _n(layer, batch), layer.in_shape[-1]
        if not rms and layer["xla"]:
            return xla_residual_norm_kernels(n, d, e)
        flops = 5 if rms else 8
        return (Kernel("rmsnorm" if rms else "layernorm", "memory", Cost(
            fwd_flops=flops * n, bwd_data_flops=(flops + 2) * n, bwd_weight_flops=2 * n,
            fwd_bytes=2 * e * n, bwd_bytes=4 * e * n, depth=clog2(d) + 2, bwd_depth=clog2(d) + 2,
        ), split=False),)

    def params(s: tuple, a: dict) -> Any:
        return s[-1] * (1 if rms or not a["bias"] else 2)

    return OpRule(attrs={} if rms else {"bias": True, "eps": None, "xla": False}, shape=lambda s, a: s, params=params,
                  kernels=kernels, tp="full")


def _softmax_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    kernel = elementwise_kernel("softmax", _n(layer, batch), e, 5, 4, cls="transcendental")
    d = layer.in_shape[-1]
    return (Kernel(kernel.name, kernel.cls, Cost(kernel.cost.fwd_flops, kernel.cost.bwd_data_flops, 0,
                                                 kernel.cost.fwd_bytes, kernel.cost.bwd_bytes,
                                                 2 * clog2(d), clog2(d)), split=False),)


SOFTMAX = OpRule(attrs={}, shape=lambda s, a: s, kernels=_softmax_kernels,
                 saved=lambda layer, e: e * numel(layer.out_shape), tp="full")

FLATTEN = OpRule(attrs={}, shape=lambda s, a: (numel(s),), kernels=lambda layer, b, e: (), saved=lambda l, e: 0,
                 tp="full")

# ---- pooling --------------------------------------------------------------------------------------------


def _pair(value: Any) -> tuple[Any, Any]:
    return (value[0], value[1]) if isinstance(value, (list, tuple)) else (value, value)


def pool_out(size: Any, kernel: Any, stride: Any, padding: Any, dilation: Any = 1) -> Any:
    """H' = floor((H + 2p - d(K-1) - 1)/s) + 1 (SURVEY_MODELS.md 2c)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    if isinstance(span, int) and span < 0:
        raise ShapeError(f"kernel {kernel} (dilation {dilation}) is larger than its padded input {size + 2 * padding}",
                         expected="a kernel no larger than the input")
    return span // stride + 1


def _pool_shape(s: tuple, a: dict) -> tuple:
    need_rank(s, 3, "pooling")
    (kh, kw), (sh, sw), (ph, pw) = _pair(a["kernel"]), _pair(a["stride"] or a["kernel"]), _pair(a["padding"])
    return (s[0], pool_out(s[1], kh, sh, ph), pool_out(s[2], kw, sw, pw))


def _pool_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    kh, kw = _pair(layer["kernel"])
    outputs = batch * numel(layer.out_shape)
    inputs = batch * numel(layer.in_shape)
    return (Kernel("pool", "memory", Cost(
        fwd_flops=outputs * kh * kw, bwd_data_flops=outputs,
        fwd_bytes=e * (inputs + outputs), bwd_bytes=e * (inputs + outputs) + 4 * outputs,
        depth=clog2(kh) + clog2(kw), bwd_depth=1,
    )),)


def _pool_asymptotic(layer: Layer, batch: Any) -> tuple[Any, Any]:
    kh, kw = _pair(layer["kernel"])
    return batch * numel(layer.in_shape), clog2(kh) + clog2(kw)  # Table 4: O(NCHW), O(log Kx + log Ky)


POOL = OpRule(attrs={"kernel": REQUIRED, "stride": None, "padding": 0}, shape=_pool_shape,
              kernels=_pool_kernels, asymptotic=_pool_asymptotic, tp="elementwise")


def _adaptive_shape(s: tuple, a: dict) -> tuple:
    need_rank(s, 3, "adaptive_avgpool")
    oh, ow = _pair(a["output"])
    return (s[0], oh, ow)


def _avg_all_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    inputs = batch * numel(layer.in_shape)
    return (Kernel("avgpool", "memory", Cost(
        fwd_flops=inputs, bwd_data_flops=inputs, fwd_bytes=e * (inputs + batch * numel(layer.out_shape)),
        bwd_bytes=e * (inputs + batch * numel(layer.out_shape)), depth=clog2(numel(layer.in_shape[1:])),
        bwd_depth=1,
    )),)


ADAPTIVE_AVGPOOL = OpRule(attrs={"output": [1, 1]}, shape=_adaptive_shape, kernels=_avg_all_kernels)
GLOBAL_AVGPOOL = OpRule(attrs={}, shape=lambda s, a: (need_rank(s, 3, "global_avgpool"), s[0])[1:],
                        kernels=_avg_all_kernels)

# ---- merges (residual add, concat, multiply) ------------------------------------------------------------


def _add_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    if layer.get("fused", False):
        # a residual entry's `fused`: the add runs inside the kernels of the op after it (an XLA cluster's
        # fusion, the layernorm with `xla`), which price its reads and writes, and its gradient's accumulation
        return ()
    n = batch * numel(layer.out_shape)
    # y = a + b reads two, writes one. Its gradient passes to both inputs unchanged, but the fork that fed the
    # two paths (a residual's skip and branch) sums their gradients in backward: autograd's accumulation reads
    # two and writes one, counted here as the merge's backward (one kernel). Only `add` merges count it so far:
    # the forks before concat and multiply merges (Inception, gated MLPs) and the k-1 sums of a k-way fork
    # are not yet priced.
    return (Kernel("add", "memory", Cost(fwd_flops=n, bwd_data_flops=n, fwd_bytes=3 * e * n, bwd_bytes=3 * e * n,
                                         depth=1, bwd_depth=1), bwd_launches=1),)


def _multiply_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    n = batch * numel(layer.out_shape)
    return (Kernel("multiply", "memory", Cost(fwd_flops=n, bwd_data_flops=2 * n, fwd_bytes=3 * e * n,
                                              bwd_bytes=5 * e * n, depth=1, bwd_depth=1)),)


def _concat_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    n = batch * numel(layer.out_shape)
    return (Kernel("concat", "memory", Cost(fwd_bytes=2 * e * n, bwd_bytes=2 * e * n, depth=1, bwd_depth=1)),)


ADD = OpRule(attrs={}, shape=lambda s, a: s, kernels=_add_kernels, saved=lambda layer, e: 0)
MULTIPLY = OpRule(attrs={}, shape=lambda s, a: s, kernels=_multiply_kernels,
                  saved=lambda layer, e: 2 * e * numel(layer.out_shape))
CONCAT = OpRule(attrs={}, shape=lambda s, a: s, kernels=_concat_kernels, saved=lambda layer, e: 0, tp="full")
