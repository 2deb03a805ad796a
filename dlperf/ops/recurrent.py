"""LSTM and GRU layers (SURVEY_MODELS.md 2c): per step and layer, the gate GEMMs 2*N*G*H*(I + H) with G = 4 gates
(LSTM) or 3 (GRU), plus ~10*N*H element-wise FLOPs; backward ~2x forward. Depth O(T log(I + H)) per layer."""

from __future__ import annotations

from typing import Any

from dlperf.cost import Cost
from dlperf.ops.base import REQUIRED, Kernel, Layer, OpRule, clog2, need_rank

GATES = {"lstm": 4, "gru": 3}


def _recurrent(op: str) -> OpRule:
    gates = GATES[op]

    def layer_inputs(features: Any, a: dict) -> list[Any]:
        dirs = 2 if a["bidirectional"] else 1
        return [features] + [a["hidden"] * dirs] * (a["layers"] - 1)

    def shape(s: tuple, a: dict) -> tuple:
        need_rank(s, 2, op)
        return (s[0], a["hidden"] * (2 if a["bidirectional"] else 1))

    def params(s: tuple, a: dict) -> Any:
        dirs, h = (2 if a["bidirectional"] else 1), a["hidden"]
        bias = 2 * gates * h if a["bias"] else 0  # PyTorch keeps two bias vectors (b_ih, b_hh)
        return sum(dirs * (gates * h * (i + h) + bias) for i in layer_inputs(s[1], a))

    def kernels(layer: Layer, batch: Any, e: int) -> tuple[Kernel, ...]:
        steps, h = layer.in_shape[0], layer["hidden"]
        dirs = 2 if layer["bidirectional"] else 1
        out = []
        for index, i in enumerate(layer_inputs(layer.in_shape[1], dict(layer.attrs))):
            # Input GEMM for all steps at once (one launch), then one small recurrent GEMM per step.
            x_gemm = 2 * batch * steps * gates * h * i * dirs
            h_gemm = 2 * batch * steps * gates * h * h * dirs
            pointwise = 10 * batch * steps * h * dirs
            weights = e * dirs * gates * h * (i + h)
            acts = e * batch * steps * dirs * (i + (gates + 2) * h)
            out.append(Kernel(f"{op}{index}_input", "matmul", Cost(
                fwd_flops=x_gemm, bwd_data_flops=x_gemm, bwd_weight_flops=x_gemm,
                fwd_bytes=acts, bwd_bytes=2 * acts, depth=clog2(i), bwd_depth=clog2(gates * h))))
            out.append(Kernel(f"{op}{index}_recurrent", "matmul", Cost(
                fwd_flops=h_gemm + pointwise, bwd_data_flops=h_gemm + pointwise, bwd_weight_flops=h_gemm,
                fwd_bytes=steps * weights + 2 * acts, bwd_bytes=2 * steps * weights + 3 * acts,
                depth=steps * (clog2(h) + 2), bwd_depth=steps * (clog2(gates * h) + 2)),
                launches=steps * dirs))
        return tuple(out)

    def saved(layer: Layer, e: int) -> Any:
        steps, h = layer.in_shape[0], layer["hidden"]
        dirs = 2 if layer["bidirectional"] else 1
        return sum(e * steps * dirs * (i + (gates + 2) * h) for i in layer_inputs(layer.in_shape[1],
                                                                                   dict(layer.attrs)))

    return OpRule(attrs={"hidden": REQUIRED, "layers": 1, "bidirectional": False, "bias": True},
                  shape=shape, params=params, kernels=kernels, saved=saved, tp="full")


LSTM = _recurrent("lstm")
GRU = _recurrent("gru")
