"""Counting the ATen operators a piece of eager PyTorch issues (benchmarks/host_ops.py, benchmarks/moe_host.py):
torch only, so that a benchmark run in another virtual environment can import it from this folder."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    """Counts every ATen operator call, kernel-launching or not."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))
