"""What the measurements ran on: CPU model, cache sizes, RAM, thread counts, library versions."""

from __future__ import annotations

import contextlib
import os
import platform
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The 'model name' line of /proc/cpuinfo, else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def physical_memory() -> float:
    """Bytes of RAM (sysconf); 0.0 when the platform does not say."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


_SIZE = re.compile(r"^(\d+)([KMG]?)$")


def cache_sizes() -> dict[str, float]:
    """Per-instance data/unified cache sizes by level ('L1d', 'L2', 'L3') from sysfs; {} where absent."""
    out: dict[str, float] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        match = _SIZE.match(size)
        if kind == "Instruction" or not match:
            continue
        scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]
        out[f"L{level}" + ("d" if kind == "Data" else "")] = float(int(match.group(1)) * scale)
    return out


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's view of the BLAS/OpenMP pools (library, version, threads); [] without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("user_api", "internal_api", "version", "num_threads", "architecture", "threading_layer")
    return [{k: info.get(k) for k in keep if info.get(k) is not None} for info in threadpool_info()]


def torch_module() -> Any | None:
    """torch if it can be imported, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def library_versions() -> dict[str, str]:
    import numpy

    import dlperf

    versions = {"python": platform.python_version(), "numpy": numpy.__version__,
                "dlperf": getattr(dlperf, "__version__", "unknown")}
    torch = torch_module()
    if torch is not None:
        versions["torch"] = str(torch.__version__)
    return versions


def current_threads(backend: str) -> int:
    """Threads the compute library will use: torch's intra-op pool, else the BLAS pool, else the core count."""
    if backend == "torch":
        torch = torch_module()
        if torch is not None:
            return int(torch.get_num_threads())
    pools = [p.get("num_threads") for p in blas_info() if p.get("user_api") == "blas"]
    return int(pools[0]) if pools else (os.cpu_count() or 1)


@contextlib.contextmanager
def limit_threads(threads: int | None) -> Iterator[None]:
    """Run the block with BLAS/OpenMP pools (threadpoolctl) and torch's intra-op pool set to `threads`."""
    if threads is None:
        yield
        return
    torch = torch_module()
    before = torch.get_num_threads() if torch is not None else None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        limiter: Any = contextlib.nullcontext()
    else:
        limiter = threadpool_limits(limits=threads)
    with limiter:
        if torch is not None:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if torch is not None and before is not None:
                torch.set_num_threads(before)


def describe(backend: str, device: str, device_name: str) -> dict[str, Any]:
    """The 'measured on' part of the calibration stamp."""
    return {
        "device": device, "device_name": device_name, "cpu": cpu_model(), "cores": os.cpu_count(),
        "threads": current_threads(backend), "backend": backend, "platform": platform.platform(),
        "libraries": library_versions(), "blas": blas_info(),
        "caches": {k: int(v) for k, v in cache_sizes().items()},
    }
