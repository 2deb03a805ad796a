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


def _activation(op: str) -> OpRule:
    fwd, bwd = ACTIVATION_FLOPS[op]
    # only ReLU may run in place: the others' backward reads their input, which an in-place op would destroy
    return OpRule(
        attrs={"fused_glu": False, **({"inplace": False} if op == "relu" else {})},
        shape=lambda s, a: s,
        kernels=lambda layer, b, e: (elementwise_kernel(op, _n(layer, b), e, fwd, bwd,
                                                        cls="transcendental" if op in TRANSCENDENTAL else "memory"),),
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


def _dropout_kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
    n = _n(layer, batch)
    drawn = RANDOM_TENSOR_BYTES * n if layer["random_tensor"] else 0  # read back from a RandomUniform kernel
    # random draw + compare + scale; writes the output and a one-byte mask, backward reads the mask.
    kernel = Kernel("dropout", "memory", Cost(
        fwd_flops=3 * n, bwd_data_flops=n, fwd_bytes=2 * e * n + MASK_BYTES * n + drawn,
        bwd_bytes=2 * e * n + MASK_BYTES * n, depth=1, bwd_depth=1,
    ))
    return (random_tensor_kernel("random_uniform", n), kernel) if layer["random_tensor"] else (kernel,)


DROPOUT = OpRule(
    attrs={"p": 0.1, "random_tensor": False},
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
        flops = 5 if rms else 8
        return (Kernel("rmsnorm" if rms else "layernorm", "memory", Cost(
            fwd_flops=flops * n, bwd_data_flops=(flops + 2) * n, bwd_weight_flops=2 * n,
            fwd_bytes=2 * e * n, bwd_bytes=4 * e * n, depth=clog2(d) + 2, bwd_depth=clog2(d) + 2,
        ), split=False),)

    def params(s: tuple, a: dict) -> Any:
        return s[-1] * (1 if rms or not a["bias"] else 2)

    return OpRule(attrs={} if rms else {"bias": True, "eps": None}, shape=lambda s, a: s, params=params,
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
