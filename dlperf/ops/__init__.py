"""Operator rule table: adding a layer type means adding one entry here (see docs/model-format.md)."""

from __future__ import annotations

from dlperf.ops import conv, dense, elementwise, moe, recurrent, ssm
from dlperf.ops.base import Kernel, Layer, OpRule

OPS: dict[str, OpRule] = {
    "conv2d": conv.CONV2D,
    "linear": dense.LINEAR,
    "embedding": dense.EMBEDDING,
    "positional_embedding": dense.POSITIONAL,
    "gather": dense.GATHER,
    "attention": dense.ATTENTION,
    "cross_entropy": dense.CROSS_ENTROPY,
    "maxpool": elementwise.POOL,
    "avgpool": elementwise.POOL,
    "adaptive_avgpool": elementwise.ADAPTIVE_AVGPOOL,
    "global_avgpool": elementwise.GLOBAL_AVGPOOL,
    "batchnorm": elementwise.BATCHNORM,
    "layernorm": elementwise._norm(rms=False),
    "rmsnorm": elementwise._norm(rms=True),
    "dropout": elementwise.DROPOUT,
    "softmax": elementwise.SOFTMAX,
    "flatten": elementwise.FLATTEN,
    "add": elementwise.ADD,
    "multiply": elementwise.MULTIPLY,
    "concat": elementwise.CONCAT,
    "lstm": recurrent.LSTM,
    "gru": recurrent.GRU,
    "moe": moe.MOE,
    "mla": moe.MLA,
    "qk_norm": moe.QK_NORM,
    "mamba2": ssm.MAMBA2,
    **{name: elementwise._activation(name) for name in elementwise.ACTIVATION_FLOPS},
}
MERGE_OPS = ("add", "concat", "multiply")

__all__ = ["OPS", "MERGE_OPS", "Kernel", "Layer", "OpRule"]
