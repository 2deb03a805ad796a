"""The cost record: work, depth and memory traffic of a piece of computation, as sympy expressions (or numbers).

Sequential composition adds everything (`a + b`); parallel composition (`par`) adds work and traffic but takes
the larger depth, as in the work-depth model (Ben-Nun & Hoefler 2019, section 2.5: T_1 = W, T_inf = D).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from dlperf import mathx

PHASES = ("forward", "backward_data", "backward_weight")


@dataclass(frozen=True)
class Cost:
    """FLOPs, bytes and depth per training phase; the optimizer update is costed on its own (engine)."""

    fwd_flops: Any = 0
    bwd_data_flops: Any = 0
    bwd_weight_flops: Any = 0
    fwd_bytes: Any = 0
    bwd_bytes: Any = 0
    depth: Any = 0          # forward critical path (operations)
    bwd_depth: Any = 0      # backward critical path (data gradient chain)

    @property
    def work(self) -> Any:
        """Total FLOPs of forward + backward (the W of one training pass, without the update)."""
        return self.fwd_flops + self.bwd_data_flops + self.bwd_weight_flops

    @property
    def total_depth(self) -> Any:
        return self.depth + self.bwd_depth

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def scale(self, k: Any) -> Cost:
        """k identical copies in sequence (a `repeat:`): everything, depth included, times k."""
        return Cost(*(getattr(self, f.name) * k for f in fields(self)))

    def par(self, other: Cost) -> Cost:
        """Run side by side (branches): work and bytes add, depth is the longer of the two."""
        added = self + other
        return Cost(
            added.fwd_flops, added.bwd_data_flops, added.bwd_weight_flops, added.fwd_bytes, added.bwd_bytes,
            mathx.maximum(self.depth, other.depth), mathx.maximum(self.bwd_depth, other.bwd_depth),
        )


ZERO = Cost()
