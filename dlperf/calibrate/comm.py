"""Communication calibration: allreduce, allgather and send/recv between 2 local processes (torch.distributed,
gloo over loopback) across message sizes, and an alpha-beta fit per collective.

What the fitted line means for each collective with P = 2 (dlperf.comm.collectives; survey section 3):
- allreduce of n bytes: the fastest algorithm at P = 2 is recursive doubling, log2(2) (alpha + n beta) =
  alpha + n beta, so the fit's intercept is alpha and its slope is beta;
- allgather to n bytes in total: ring / doubling, alpha + (P-1)/P n beta = alpha + n beta / 2, so beta = 2 x slope;
- send/recv: half a ping-pong round trip, alpha + n beta.
The loopback network level written to a hardware file takes alpha and beta from the allreduce fit, the
collective data parallelism uses, so that dlperf predicts that allreduce as measured.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlperf.calibrate.fit import LineFit, fit_alpha_beta
from dlperf.calibrate.timing import TimingConfig, inner_calls, summarize
from dlperf.errors import CalibrationError

OPS = ("allreduce", "allgather", "sendrecv")
# slope of the fitted line -> link beta, at P = 2 (see module doc)
BETA_FACTOR = {"allreduce": 1.0, "allgather": 2.0, "sendrecv": 1.0}
SIZES_FULL = tuple(2**k for k in range(2, 27, 2))    # 4 B .. 64 MiB
SIZES_QUICK = tuple(2**k for k in range(2, 25, 2))   # 4 B .. 16 MiB
WORLD = 2
# Collectives over loopback wake gloo's I/O threads and both processes for every message, so a sample spans
# more calls than a kernel's (5 ms, 3 ms with --quick) to average out the scheduler's jitter.
COMM_FULL = TimingConfig(warmup=2, repeats=7, min_sample_s=5e-3)
COMM_QUICK = TimingConfig(warmup=2, repeats=5, min_sample_s=3e-3)


@dataclass(frozen=True)
class CommFit:
    op: str
    fit: LineFit
    sizes: tuple[float, ...]
    medians: tuple[float, ...]

    @property
    def alpha(self) -> float:
        return self.fit.t0

    @property
    def beta(self) -> float:
        return BETA_FACTOR[self.op] / self.fit.rate

    @property
    def bandwidth(self) -> float:
        """Link bandwidth 1 / beta (bytes/s)."""
        return 1.0 / self.beta


@dataclass
class CommCalibration:
    fits: dict[str, CommFit]
    started: str
    seconds: float
    torch_version: str
    notes: list[str]

    def stamp(self) -> dict[str, Any]:
        from dlperf.units import format_quantity as fq

        return {"comm": {
            "measured_at": self.started, "duration_s": round(self.seconds, 1), "backend": "torch.distributed gloo",
            "processes": WORLD, "transport": "TCP loopback (127.0.0.1)", "torch": self.torch_version,
            "level_from": "allreduce",
            "fits": {op: {"alpha": fq(f.alpha, "time") if f.alpha > 0 else "0 s",
                          "bandwidth": fq(f.bandwidth, "bandwidth"), "r2": round(f.fit.r2, 4),
                          "median_rel_residual": round(f.fit.median_rel, 4),
                          "max_rel_residual": round(f.fit.max_rel, 4), "points": f.fit.points}
                     for op, f in self.fits.items()},
        }}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_gloo(rank: int, port: int, threads: int = 1, timeout_s: float = 120.0) -> Any:
    """Join a 2-process gloo group over loopback (the TCP store and the gloo transport both on 127.0.0.1)."""
    import torch
    import torch.distributed as dist

    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=dt.timedelta(seconds=timeout_s))
    return dist


def _entry(target: Callable[..., Any], rank: int, port: int, args: tuple, queue: Any) -> None:
    """Process body: run target(rank, port, *args); rank 0 reports its result, any rank its failure."""
    try:
        result = target(rank, port, *args)
        if rank == 0:
            queue.put(("ok", result))
    except BaseException:  # noqa: BLE001 - reported to the parent as text, never lost
        queue.put(("error", f"rank {rank}: " + traceback.format_exc(limit=3).strip().splitlines()[-1]))


def _wait(q: Any, procs: list[Any], timeout_s: float) -> tuple[str, Any]:
    """rank 0's report, or an error as soon as a process dies without reporting (or the time runs out)."""
    import queue as queue_mod
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return q.get(timeout=0.2)
        except queue_mod.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                return "error", f"a worker process exited with code {dead[0].exitcode} before reporting"
    raise CalibrationError(f"the 2-process run did not finish within {timeout_s:.0f} s")


def spawn_pair(target: Callable[..., Any], args: tuple = (), timeout_s: float = 600.0) -> Any:
    """Run `target(rank, port, *args)` in 2 fresh processes (spawn) and return rank 0's result."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(target, r, port, args, q), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        status, payload = _wait(q, procs, timeout_s)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    if status != "ok":
        raise CalibrationError(f"the 2-process run failed: {payload}")
    return payload


def sync_timing(dist: Any, fn: Callable[[], object], rank: int, config: TimingConfig) -> Any:
    """time_kernel for a collective: both ranks must make the same number of calls, so rank 0 chooses the
    inner count and broadcasts it; a barrier starts every sample together; rank 0's clock is the result."""
    import time

    import torch

    fn()  # warm-up: connection set-up, buffer registration
    start = time.perf_counter()
    fn()
    first = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.broadcast(first, src=0)
    inner = inner_calls(float(first.item()), config)
    samples = []
    for _ in range(config.repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return summarize(samples, inner) if rank == 0 else None


def collective(dist: Any, op: str, nbytes: int, rank: int) -> Callable[[], object]:
    import torch

    n = max(1, nbytes // 4)
    if op == "allreduce":
        buf = torch.ones(n)
        return lambda: dist.all_reduce(buf)
    if op == "allgather":  # n bytes gathered in total: each rank contributes n / 2
        part = torch.ones(max(1, n // WORLD))
        out = [torch.empty_like(part) for _ in range(WORLD)]
        return lambda: dist.all_gather(out, part)
    buf = torch.ones(n)
    other = 1 - rank

    def ping_pong() -> None:  # one call = a round trip; halved below
        if rank == 0:
            dist.send(buf, other)
            dist.recv(buf, other)
        else:
            dist.recv(buf, other)
            dist.send(buf, other)

    return ping_pong


def _comm_worker(rank: int, port: int, ops: tuple[str, ...], sizes: tuple[int, ...], quick: bool) -> Any:
    dist = init_gloo(rank, port)
    config = COMM_QUICK if quick else COMM_FULL
    out: dict[str, list[tuple[float, float]]] = {}
    try:
        for op in ops:
            for nbytes in sizes:
                timing = sync_timing(dist, collective(dist, op, nbytes, rank), rank, config)
                if rank == 0:
                    median = timing.median / (2 if op == "sendrecv" else 1)
                    out.setdefault(op, []).append((float(nbytes), median))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return out


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def calibrate_comm(quick: bool = False, ops: tuple[str, ...] = OPS, sizes: tuple[int, ...] | None = None,
                   timeout_s: float = 600.0) -> CommCalibration:
    """Measure `ops` between 2 local processes and fit alpha-beta for each (CalibrationError without torch)."""
    import time

    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise CalibrationError("communication calibration needs PyTorch (torch.distributed), which is not "
                               "installed (pip install torch)") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise CalibrationError(f"torch {torch.__version__} was built without the gloo distributed backend")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise CalibrationError(f"unknown collective {unknown[0]!r}", expected=" | ".join(OPS))
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    clock = time.perf_counter()
    chosen = sizes or (SIZES_QUICK if quick else SIZES_FULL)
    raw = spawn_pair(_comm_worker, (tuple(ops), tuple(chosen), quick), timeout_s)
    return fit_collectives(raw, started, time.perf_counter() - clock, [])


def fit_collectives(raw: dict[str, list[tuple[float, float]]], started: str, seconds: float,
                    notes: list[str]) -> CommCalibration:
    """An alpha-beta fit per collective from its (bytes, seconds) points."""
    fits = {}
    for op, points in raw.items():
        n, t = zip(*points, strict=True)
        fits[op] = CommFit(op, fit_alpha_beta(n, t, f"gloo {op}"), tuple(n), tuple(t))
    return CommCalibration(fits, started, seconds, torch_version(), notes)
