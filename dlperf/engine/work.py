"""Work W and depth D of a training pass over the layer tree (survey section 2.5): sequences add, branches run
in parallel (depth = the longer path), a repeated block is its cost times the repeat count."""

from __future__ import annotations

from typing import Any

from dlperf.cost import Cost
from dlperf.engine.layers import element_bytes
from dlperf.ops import OPS
from dlperf.spec.model import Branches, Model, Seq


def model_cost(model: Model, batch: Any, dtype: str) -> Cost:
    """Work and depth of forward + backward over the layer tree: sequences add, branches run in parallel."""
    e = element_bytes(dtype)

    def cost(node: Any) -> Cost:
        if isinstance(node, Seq):
            total = Cost()
            for item in node.items:
                total = total + cost(item)
            return total.scale(node.repeat) if node.repeat > 1 else total
        if isinstance(node, Branches):
            paths = [cost(p) for p in node.paths]
            merged = paths[0]
            for other in paths[1:]:
                merged = merged.par(other)
            return merged + cost(node.merge)
        total = Cost()
        for kernel in OPS[node.op].kernels(node, batch, e):
            total = total + kernel.cost
        return total

    return cost(model.root)
