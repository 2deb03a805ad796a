"""Per-layer costs under tensor parallelism: which layers are split across tp ranks, and which collectives
Megatron-style splitting puts on the critical path (Shoeybi et al. 2019, section 3; survey section 6).

The walk keeps one bit of state, whether the activation is sharded across the tp group. A linear layer on a
replicated input is column-parallel (its input gradient is allreduced backward) and leaves the activation
sharded; a linear layer on a sharded input is row-parallel (its output is allreduced forward). Element-wise ops
follow the sharding; ops that need the whole activation (norms, softmax over features) gather it first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dlperf.ops import OPS
from dlperf.ops.base import BYTES_PER_ELEMENT, Layer, numel
from dlperf.ops.fp8 import storage_dtype
from dlperf.spec.model import Branches, Model, Seq

Comm = tuple[str, str, Any]  # (phase: fwd | bwd, collective, elements per sample)


@dataclass(frozen=True)
class Use:
    """One distinct layer as it runs under tensor parallelism, with how often it runs per sample."""

    layer: Layer
    count: int
    sharded: bool
    comm: tuple[Comm, ...] = ()
    row: bool = False  # a row-parallel linear layer (its input arrives sharded): tp divides K, not N
    # inside a block (a repeated sequence or a residual group), which is what the stacks' full recomputation
    # checkpoints; the layers around the blocks (embeddings, final norm, output layer, loss) are not
    in_block: bool = True

    @property
    def tp_dim(self) -> str:
        return "k" if self.row else "n"


def _tp_layer(layer: Layer, sharded: bool, sp: bool) -> tuple[bool, bool, tuple[Comm, ...]]:
    """(runs split?, sharded after?, collectives) for one layer given the incoming sharding."""
    kind = OPS[layer.op].tp
    n_in, n_out = numel(layer.in_shape), numel(layer.out_shape)
    gather_in: tuple[Comm, ...] = (("fwd", "allgather", n_in),) if sharded else ()
    if kind == "linear":
        if not sharded:  # column-parallel: f operator (identity forward, allreduce backward)
            comm = (("fwd", "allgather", n_in), ("bwd", "reduce_scatter", n_in)) if sp else (
                ("bwd", "allreduce", n_in),)
            return True, True, comm
        comm = (("fwd", "reduce_scatter", n_out), ("bwd", "allgather", n_out)) if sp else (
            ("fwd", "allreduce", n_out),)  # row-parallel: g operator
        return True, False, comm
    if kind == "attention":
        both = (("fwd", "allgather", n_in), ("fwd", "reduce_scatter", n_out),
                ("bwd", "allgather", n_out), ("bwd", "reduce_scatter", n_in))
        return True, False, gather_in + (both if sp else (("fwd", "allreduce", n_out), ("bwd", "allreduce", n_in)))
    if kind == "conv":  # survey section 6: allgather of outputs forward, reduction of input gradients backward
        return True, False, gather_in + (("fwd", "allgather", n_out), ("bwd", "allreduce", n_in))
    if kind == "vocab" and layer.op == "embedding":
        return True, False, (("fwd", "reduce_scatter" if sp else "allreduce", n_out),)
    if kind == "vocab":
        return (True, False, _vocab_loss_comm(layer)) if sharded else (False, False, ())
    if kind == "full":
        return False, False, gather_in
    return sharded, sharded, ()


def _vocab_loss_comm(layer: Layer) -> tuple[Comm, ...]:
    """Vocabulary-parallel cross entropy's allreduces over the tp group. Comm sizes are elements of the model
    dtype: one fp32 value per token is 2 elements of a 16-bit model (the messages are latency-bound either way).
    Megatron-LM's loss issues three, of one fp32 value per token each (row max, predicted logit, sum of
    exponentials: megatron/mpu/cross_entropy.py); the other implementations keep the single message of 2 elements
    per token priced before implementations were told apart."""
    row = 2 * numel(layer.in_shape[:-1])
    if layer.get("impl") == "megatron":
        return (("fwd", "allreduce", row),) * 3
    return (("fwd", "allreduce", row),)


def tp_uses(nodes: Model | list[Any], sp: bool = False) -> list[Use]:
    """Distinct layers with counts and their tensor-parallel behaviour, in first-seen order. A list of nodes (a
    pipeline stage) is walked as one sequence: the sharding one node leaves is what the next receives, so the
    vocabulary-parallel loss after a column-parallel output layer runs split, as it does in the whole model."""
    uses: list[Use] = []
    sharded = False
    top = list(nodes.root.items) * nodes.root.repeat if isinstance(nodes, Model) else nodes
    for node in top:
        start = len(uses)
        sharded = _walk(node, 1, sharded, sp, uses)
        if isinstance(node, Layer):  # a bare layer at the top of the model or stage, outside every block
            uses[start:] = [replace(use, in_block=False) for use in uses[start:]]
    merged: dict[tuple, Use] = {}
    for use in uses:
        key = (use.layer, use.sharded, use.comm, use.in_block)
        old = merged.get(key)
        merged[key] = replace(use, count=use.count + (old.count if old else 0))
    return list(merged.values())


def _walk(node: Any, count: int, sharded: bool, sp: bool, out: list[Use]) -> bool:
    if isinstance(node, Layer):
        row = sharded and OPS[node.op].tp == "linear"
        split, sharded, comm = _tp_layer(node, sharded, sp)
        out.append(Use(node, count, split, comm, row))
        return sharded
    if isinstance(node, Seq):
        start = sharded
        for item in node.items:
            sharded = _walk(item, count * node.repeat, sharded, sp, out)
        if node.repeat > 1 and sharded != start:  # a repeated block must end as it started
            out.append(Use(_gather_marker(node), count * node.repeat, False, (("fwd", "allgather", 0),)))
            sharded = start
        return sharded
    ends = [_walk(path, count, sharded, sp, out) for path in node.paths]
    if isinstance(node, Branches) and node.merge.op == "add" and len(node.paths) == 1:
        ends.append(sharded)  # identity shortcut
    merged = all(ends) and node.merge.op != "concat"
    gathers = tuple(("fwd", "allgather", numel(node.merge.in_shape)) for end in ends if end and not merged)
    out.append(Use(node.merge, count, merged, gathers))
    return merged


def _gather_marker(seq: Seq) -> Layer:
    return Layer("flatten", (), (), (), f"{seq.name}.gather")


def element_bytes(dtype: str) -> int:
    """Bytes per stored element under `dtype`'s training recipe: FP8 training stores activations, gradients and
    messages in bf16 and casts only GEMM operands to FP8 (dlperf.ops.fp8)."""
    return BYTES_PER_ELEMENT[storage_dtype(dtype)]


def layer_table(model: Model, dtype: str, survey: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows for `dlperf show`: every layer in order with output shape, params, activation bytes, forward FLOPs
    (per sample, per occurrence), and a totals row that multiplies by the repeat counts. With `survey`, the
    survey's asymptotic forward work and depth (Ben-Nun & Hoefler Tables 4 and 6, per sample) side by side."""
    e = element_bytes(dtype)
    rows, total = [], {"params": 0, "act": 0, "flops": 0}
    for layer, count in model.layers():
        # model FLOPs: a causal fused kernel skips its masked blocks but counts the whole matrix (MFU's convention)
        flops = sum(k.cost.fwd_flops * k.model_work_scale for k in OPS[layer.op].kernels(layer, 1, e))
        act = e * numel(layer.out_shape)
        rows.append({"name": layer.name, "op": layer.op, "output": layer.out_shape, "count": count,
                     "params": layer.params, "activation_bytes": act, "forward_flops": flops})
        if survey:
            rule = OPS[layer.op].asymptotic
            work, depth = rule(layer, 1) if rule else (None, None)
            rows[-1].update(survey_work=work, survey_depth=depth)
        total["params"] += layer.params * count
        total["act"] += act * count
        total["flops"] += flops * count
    totals = {"name": "TOTAL", "op": "", "output": "", "count": None, "params": total["params"],
              "activation_bytes": total["act"], "forward_flops": total["flops"]}
    return rows, totals
