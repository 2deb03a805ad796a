"""Collectives the way NCCL runs them: algorithms (ring, tree, NVLS, PAT) x protocols (LL, LL128, Simple), costed
with NCCL's own tuning model and chosen as NCCL's tuner chooses (the minimum predicted time).

Source of every constant: NVIDIA/nccl src/graph/tuning.cc @5067397c2676d5aed50042fc39e5c8ee96eb0027
(ncclTunerConstantsDefaults, ncclTopoTuneModel, ncclTopoGetAlgoTime), src/enqueue.cc (channel and thread
tuning in topoGetAlgoInfo), src/include/comm.h and device.h (thread thresholds, thread counts) and
src/graph/topo.h (per-link bandwidths) at the same commit. The constants are re-derived here as data, not code.

The model, per (algorithm a, protocol p), time in us with sizes in bytes and bandwidths in GB/s as NCCL has them:

    T = latency(a, p) + n / (1000 * algbw(a, p, n))

- busBw for the Simple protocol is what the hardware file's levels give (bandwidth x efficiency, the busiest link
  of the placed ring: nccl-tests' large-message busbw), where NCCL uses graph bw x channels;
- protocol factors as tuning.cc: ring LL = min(llMaxBw, busBw/2) (8 B of data per 16 B line), ring LL128 =
  min(0.92 busBw, channels x perChMaxRingLL128Bw) (120 of 128 B), tree = min(0.92 busBw, channels x perChMaxTreeBw)
  then LL /3.8 and LL128 x 7/9 (one node) or 120/128; NVLS uses the measured NVLS busbw of the level;
- busBw -> algbw: ring x nRanks/nSteps (nSteps = 2(P-1) allreduce, P-1 reduce-scatter/allgather, P broadcast/
  reduce), tree x 1/2;
- latency: baseLat(a, p) + per-hop hwLat(link, a, p) x steps: ring (nSteps - nInterSteps) intra hops and
  nInterSteps = 2(nNodes-1) (allreduce) or nNodes-1 network hops; tree 2((ppn-1) intra + log2(nNodes) network)
  hops; NVLS one NVLS latency; the multi-node Simple ring plateau (x1.4, x1.9 before Ampere). A network hop also
  carries the latency the network transport reports (graphs[a]->latencyInter, the level's `net_latency`: 0 for
  NCCL's own IB transport, 75 us from AWS's plugin on p5 EFA), twice for Simple (the flush);
- message size: NCCL runs a message on fewer channels when it is small (enqueue.cc: channels drop while
  n < channels x threads x threadThreshold), so a medium message gets min(busBw, per-channel busBw x
  n / (threads x threshold)); continuous here (NCCL steps one channel at a time), which keeps time monotone in
  size. Channels = Simple busBw / the per-link bandwidth NCCL's search gives a channel (topo.h). The tree
  correction table (tuning.cc treeCorrectionFactor, per power of two) is interpolated in log2(size) for the
  same reason;
- outside the tuner's model, added after its choice: the per-call start-up every nccl-tests iteration pays
  (CALL_OVERHEAD) and, within one NVLink node, the pipeline fill of the ring's chunks (FILL), both fitted to the
  published nccl-tests tables of dlperf/data/nccl_tests/ by benchmarks/fit_collective_overhead.py.

The level `latency` of a hardware file is NCCL's Ring/Simple hop latency of its link class (as the built-in
files say); the other (algorithm, protocol) hop latencies scale with it by tuning.cc's ratios, so a file that
measures a lower latency lowers all of them. All-to-all, gather, scatter and send/recv are NCCL point-to-point
operations (P-1 concurrent sends through the peers' links), costed with the Ring LL/Simple constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from dlperf import mathx
from dlperf.comm.collectives import CommError
from dlperf.comm.topology import RAILS, Placed
from dlperf.spec.hardware import Hardware, link_kind

PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc baseLatencies (us), [algorithm][LL, LL128, Simple]
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0), "pat": (8.0, 8.0, 8.0)}
# tuning.cc hwLatencies (us), [link class][algorithm][LL, LL128, Simple]
HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0), "pat": (0.0, 0.0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0), "pat": (0.0, 0.0, 14.0)},
}
# tuning.cc per architecture (Volta, Ampere, Hopper, Blackwell) x node-count class (1, 2, >2 nodes), GB/s.
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
PER_CH_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
# tuning.cc treeCorrectionFactor [LL, LL128, Simple] for sizes 64 B * 2^i, i = 0..23
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
# device.h maximum threads per protocol and comm.h NCCL_*_THREAD_THRESHOLD (bytes per thread before a channel
# is worth using; the ring LL threshold is multiplied by nRanks in ncclTopoTuneModel).
THREADS = (512, 640, 512)
THREAD_THRESHOLD = (8, 8, 64)
MAX_CHANNELS = 32  # NCCL MAXCHANNELS
# topo.h per-link bandwidths (GB/s) a channel runs at: SM70/SM80_NVLINK_BW 20, SM90 20.6, SM100 40.1; PCI_BW 12.
CHANNEL_BW = {"nvlink": (20.0, 20.0, 20.6, 40.1), "pci": (12.0, 12.0, 12.0, 12.0)}
NET_OVERHEAD = 1.0  # us, getNetOverhead() for Intel x86 hosts (x3 for Simple)
P2P_LL_THRESHOLD = 16384  # NCCL_P2P_LL_THRESHOLD default: point-to-point messages up to 16 KiB use LL


# Blackwell device names (compute capability 10.x: B100/B200/GB200 sm_100, B300/GB300 Blackwell Ultra sm_103, GB10).
# tuning.cc takes every minCompCap >= 100 as Blackwell (compCapIndex), and topo.h gives such GPUs SM100_NVLINK_BW.
BLACKWELL_TAGS = ("B100", "B200", "B300", "GB10", "BLACKWELL")


def arch_index(device_name: str) -> int:
    """NCCL's compute-capability class from the device name: 0 Volta (and older), 1 Ampere, 2 Hopper, 3 Blackwell.
    An unknown device is taken as Ampere."""
    name = device_name.upper()
    if any(tag in name for tag in BLACKWELL_TAGS):
        return 3
    if any(tag in name for tag in ("H100", "H200", "H800", "H20")):
        return 2
    if any(tag in name for tag in ("V100", "P100", "P40", "K80", "T4")):
        return 0
    return 1


def has_ll128(device_name: str) -> bool:
    """LL128 needs compute capability 7.0+ (tuning.cc: disabled when minCompCap < 70)."""
    return not any(tag in device_name.upper() for tag in ("P100", "P40", "K80"))


@dataclass(frozen=True)
class Setup:
    """What NCCL's tuner knows about a communicator, derived from the placed group and the hardware."""

    P: int
    nodes: int
    ppn: int
    arch: int
    intra: str  # link class inside a node
    lat_scale_intra: float  # level latency / tuning.cc Ring-Simple latency of its class
    lat_scale_net: float
    ring_bw: float  # Simple ring busBw, GB/s
    tree_bw: float  # Simple tree busBw, GB/s
    channels: float
    nvls_bw: float | None  # measured NVLS allreduce busbw, GB/s (single node only)
    ll128: bool
    peer_bw: float  # mean bandwidth to the peers (GB/s), for point-to-point operations
    fill: tuple[float, float] | None = None  # one-node pipeline fill (bytes, half size), FILL of the device's class
    net_latency: float = 0.0  # us the outermost level's transport reports (NetworkLevel.net_latency), per network hop

    @property
    def n2(self) -> int:
        """tuning.cc index2: 0 one node, 1 two nodes, 2 more."""
        return min(self.nodes, 3) - 1


def _ratio(level_latency: float, kind: str) -> float:
    return level_latency * 1e6 / HW_LAT[kind]["ring"][2]


def make_setup(placed: Placed, hw: Hardware) -> Setup:
    """NCCL's view of `placed` on `hw` (memoised on the placed group)."""
    return placed.memo(("nccl", hw.device.name), lambda: _make_setup(placed, hw))


def _make_setup(placed: Placed, hw: Hardware) -> Setup:
    pl, levels = placed.placement, placed.levels
    ppn = pl.members[0]
    intra = link_kind(levels[0], 0)
    spanned = pl.spanned or (0,)
    outer = spanned[-1]
    ring = placed.ring_link(RAILS)
    members = (1, *pl.members)
    tree_beta = max(placed.link(j, RAILS).beta / members[j] for j in spanned)
    peer = placed.peer_link(RAILS)
    arch = arch_index(hw.device.name)
    ring_bw = 1e-9 / ring.beta
    speed = CHANNEL_BW.get(intra, CHANNEL_BW["nvlink"])[arch]
    nvls = levels[0].nvls_bandwidth if ppn == placed.size else None
    return Setup(
        P=placed.size, nodes=placed.size // ppn, ppn=ppn, arch=arch, intra=intra,
        lat_scale_intra=_ratio(levels[0].latency, intra),
        lat_scale_net=_ratio(levels[outer].latency, "net") if outer > 0 else 1.0,
        ring_bw=ring_bw, tree_bw=1e-9 / tree_beta,
        channels=_channels(placed, ring_bw / speed),
        nvls_bw=None if nvls is None else nvls * 1e-9, ll128=has_ll128(hw.device.name),
        peer_bw=1e-9 / peer.beta, fill=fill_constants(hw.device.name),
        net_latency=levels[outer].net_latency * 1e6 if outer > 0 else 0.0,
    )


def _channels(placed: Placed, derived: float) -> float:
    """NCCL's channel count for this communicator: what the hardware file says for the outermost level the group
    spans (a level's `channels`, sourced from NCCL logs), else the Simple busBw over the bandwidth NCCL's search
    gives one channel (topo.h), within 1..MAXCHANNELS."""
    spanned = placed.placement.spanned or (0,)
    given = [placed.levels[j].channels for j in reversed(spanned) if placed.levels[j].channels is not None]
    return float(given[0]) if given else min(float(MAX_CHANNELS), max(1.0, derived))


# ------------------------------------------------------------------------------------------ latencies


def _hop(s: Setup, kind: str, algo: str, p: int) -> float:
    scale = s.lat_scale_net if kind == "net" else s.lat_scale_intra
    return HW_LAT[kind][algo][p] * scale


def _nsteps(op: str, P: int) -> int:
    return 2 * (P - 1) if op == "allreduce" else (P - 1 if op in ("reduce_scatter", "allgather") else P)


def latency(op: str, algo: str, p: int, s: Setup) -> float:
    """tuning.cc ncclTopoTuneModel latency (us) of one (algorithm, protocol) for this communicator."""
    base = BASE_LAT[algo][p]
    intra = _hop(s, s.intra, algo, p)
    # tuning.cc: interLat = hwLat[NET] + graphs[a]->latencyInter, + latencyInter again for Simple ("the flush")
    inter = _hop(s, "net", "tree" if s.ppn == 1 else algo, p) + s.net_latency * (2 if p == 2 else 1)
    if algo == "ring":
        nsteps = _nsteps(op, s.P)
        if op in ("broadcast", "reduce"):
            # chunked pipeline along the ring; Simple uses the Tree hop latency ("waiting for proper chunk modeling")
            hop = _hop(s, s.intra if s.nodes == 1 else "net", "tree" if p == 2 else "ring", p)
            return base + nsteps * hop
        if s.nodes > 1:
            intra = max(intra, NET_OVERHEAD * (3 if p == 2 else 1))
        inter_steps = 0 if s.nodes == 1 else (2 * (s.nodes - 1) if op == "allreduce" else s.nodes - 1)
        return base + (nsteps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return base + 2 * ((s.ppn - 1) * intra + _log2i(s.nodes) * inter)
    if algo == "nvls":
        return intra
    if algo == "pat":  # allgather/reduce-scatter with one GPU per node
        return base + _log2i(s.nodes) * (inter / 3.5) + s.P * 2.8
    raise CommError(f"no latency for NCCL algorithm {algo!r}")


def _log2i(n: int) -> int:
    return n.bit_length() - 1


# ------------------------------------------------------------------------------------------ bandwidths


def bus_bandwidth(op: str, algo: str, p: int, s: Setup) -> float:
    """tuning.cc busBw (GB/s) of one (algorithm, protocol) at full channel count."""
    n2, arch, ch = s.n2, s.arch, s.channels
    ll_max = LL_MAX_BW[arch if s.nodes == 1 else 0][n2]
    if algo == "ring":
        bw = s.ring_bw
        if p == 0:
            return min(ll_max, bw * 0.5)
        if p == 1:
            return min(bw * 0.92, ch * PER_CH_RING_LL128[arch][n2])
        return bw
    if algo == "tree":
        bw = min(s.tree_bw * 0.92, ch * PER_CH_TREE[arch][n2])
        if p == 0:
            return min(bw / 3.8, ll_max)
        if p == 1:
            return min(bw * (7.0 / 9.0 if s.nodes == 1 else 120.0 / 128.0), ch * PER_CH_TREE_LL128[arch][n2])
        return bw
    if algo == "pat":
        return s.ring_bw * 0.75
    if algo == "nvls":
        return s.nvls_bw or 0.0
    raise CommError(f"no bandwidth for NCCL algorithm {algo!r}")


def algorithm_bandwidth(op: str, algo: str, p: int, s: Setup) -> float:
    """busBw -> algBw as tuning.cc converts it: ring and NVLS x nRanks/nSteps, tree x 1/2; PAT (allgather and
    reduce-scatter only) is not converted. The size it divides is nccl-tests' (and NCCL's tuner's) size: the
    whole buffer for allgather and reduce-scatter (enqueue.h ncclFuncMaxSendRecvCount)."""
    bus = bus_bandwidth(op, algo, p, s)
    if algo == "pat":
        return bus
    if algo in ("ring", "nvls"):
        return bus * s.P / _nsteps(op, s.P)
    return bus * 0.5


def _active_channels(n: Any, algo: str, p: int, s: Setup) -> Any:
    """Channels a message of n bytes runs on (enqueue.cc: drop channels while n < channels x threads x
    threshold), continuous here: min(channels, n / (threads x threshold))."""
    return mathx.minimum(s.channels, n / _unit(algo, p, s))


def _unit(algo: str, p: int, s: Setup) -> float:
    """Bytes one channel needs before NCCL uses it: threads x threadThreshold (x nRanks for ring LL)."""
    return THREADS[p] * THREAD_THRESHOLD[p] * (s.P if algo == "ring" and p == 0 else 1)


def _per_channel(op: str, algo: str, p: int, s: Setup) -> float:
    """busBw of one channel: the same protocol factors and caps applied to one channel's share of the links."""
    one = replace(s, ring_bw=s.ring_bw / s.channels, tree_bw=s.tree_bw / s.channels, channels=1.0)
    return bus_bandwidth(op, algo, p, one)


# ------------------------------------------------------------------------------------------ compiled costs

# treeCorrectionFactor at log2(n / 64) = 0, 1, ..., 22, then 1 from 2^23 x 64 B = 512 MiB on (NCCL applies the table
# for log2(n/64) < 23 only); linear in between.
_TREE_POINTS = tuple((*row[:23], 1.0) for row in TREE_CORRECTION)


@dataclass(frozen=True)
class Cost:
    """One (algorithm, protocol) of one op on one communicator, reduced to constants (us, GB/s, bytes):

        T(n) = lat x (plateau if n >= plateau_at) + share x n / (1000 x min(bw, per_channel x min(channels, n/unit))
               x tree_correction(n))

    and, for point-to-point LL (valid up to `ll_limit` bytes), no less than `simple` beyond that limit."""

    lat: float
    bw: float
    per_channel: float = 0.0  # 0: no channel limit (NVLS, PAT, point-to-point)
    unit: float = 1.0
    channels: float = 1.0
    tree: int = -1  # protocol row of the tree correction, -1: none
    plateau: float = 1.0
    plateau_at: float = float("inf")
    share: float = 1.0
    ll_limit: float = float("inf")
    simple: Cost | None = None


def compile_cost(op: str, algo: str, p: int, s: Setup) -> Cost:
    """The constants of one (algorithm, protocol): tuning.cc latency and bandwidth, enqueue.cc channels."""
    if algo == "p2p":
        kind = s.intra if s.nodes == 1 else "net"
        share = 1.0 if op == "sendrecv" else (s.P - 1) / s.P
        cost = Cost(lat=BASE_LAT["ring"][p] + _hop(s, kind, "ring", p), bw=s.peer_bw * (0.5 if p == 0 else 1.0),
                    share=share)
        if p == 0:  # LL up to NCCL_P2P_LL_THRESHOLD bytes per peer
            limit = P2P_LL_THRESHOLD * (1 if op == "sendrecv" else s.P)
            cost = replace(cost, ll_limit=limit, simple=compile_cost(op, "p2p", 2, s))
        return cost
    bw = algorithm_bandwidth(op, algo, p, s)
    cost = Cost(lat=latency(op, algo, p, s), bw=bw)
    if algo in ("ring", "tree"):
        ratio = bw / bus_bandwidth(op, algo, p, s)
        cost = replace(cost, per_channel=ratio * _per_channel(op, algo, p, s), unit=_unit(algo, p, s),
                       channels=s.channels)
    if algo == "tree" and op == "allreduce":
        cost = replace(cost, tree=p)
    if algo == "ring" and p == 2 and s.nodes > 1 and op == "allreduce":
        # plateau effect of multi-node rings once a channel carries >= 64 B per rank
        cost = replace(cost, plateau=1.4 if s.arch >= 1 else 1.9, plateau_at=64.0 * s.channels * s.P)
    return cost


def _bandwidth(c: Cost, n: Any) -> Any:
    """GB/s a message of n bytes gets, as float, numpy array or sympy expression."""
    if isinstance(n, float | int):
        bw = min(c.bw, c.per_channel * min(c.channels, n / c.unit)) if c.per_channel else c.bw
        if c.tree >= 0:
            x = math.log2(max(n, 64.0) / 64.0)
            i = int(x)
            points = _TREE_POINTS[c.tree]
            bw *= 1.0 if i >= 23 else points[i] + (points[i + 1] - points[i]) * (x - i)
        return max(bw, 1e-30)
    if isinstance(n, np.ndarray):
        bw = np.minimum(c.bw, c.per_channel * np.minimum(c.channels, n / c.unit)) if c.per_channel else c.bw
        if c.tree >= 0:
            bw = bw * np.interp(np.log2(np.maximum(n, 64.0) / 64.0), np.arange(24.0), _TREE_POINTS[c.tree])
        return np.maximum(bw, 1e-30)
    bw = mathx.minimum(c.bw, c.per_channel * mathx.minimum(c.channels, n / c.unit)) if c.per_channel else c.bw
    if c.tree >= 0:
        points, x = _TREE_POINTS[c.tree], mathx.log2(mathx.maximum(n, 64.0) / 64.0)
        out = points[0]
        for i in range(23):
            if points[i + 1] != points[i]:
                out = out + (points[i + 1] - points[i]) * mathx.minimum(mathx.maximum(x - i, 0.0), 1.0)
        bw = bw * out
    return bw


def cost_time(c: Cost, n: Any) -> Any:
    """Seconds of a compiled cost for n bytes (float, numpy array or sympy expression)."""
    lat = c.lat if c.plateau == 1.0 else mathx.where(n >= c.plateau_at, c.lat * c.plateau, c.lat)
    t = (lat + c.share * n / (1000.0 * _bandwidth(c, n))) * 1e-6
    if c.simple is not None:
        t = mathx.where(n <= c.ll_limit, t, mathx.maximum(t, cost_time(c.simple, n)))
    return t


@lru_cache(maxsize=4096)
def compiled(op: str, s: Setup) -> tuple[tuple[str, int, Cost], ...]:
    """(algorithm, protocol, cost) of every candidate NCCL considers for op on this communicator."""
    return tuple((a, p, compile_cost(op, a, p, s)) for a, p in candidates(op, s))


def time_us(op: str, algo: str, p: int, n: Any, s: Setup) -> Any:
    """Predicted time (us) of one (algorithm, protocol) for n bytes."""
    return cost_time(compile_cost(op, algo, p, s), n) * 1e6


# ------------------------------------------------------------------------------------------ candidates

P2P_OPS = ("alltoall", "gather", "scatter", "sendrecv")


def candidates(op: str, s: Setup) -> list[tuple[str, int]]:
    """(algorithm, protocol) pairs NCCL would consider for op on this communicator (tuning.cc rules)."""
    protos = [0, 1, 2] if s.ll128 else [0, 2]
    if op in P2P_OPS:
        return [("p2p", 0), ("p2p", 2)]
    out = [("ring", p) for p in protos]
    if op == "allreduce":
        out += [("tree", p) for p in protos]
        if s.nvls_bw:
            out.append(("nvls", 2))
    if op in ("allgather", "reduce_scatter") and s.ppn == 1 and s.nodes > 1:
        out.append(("pat", 2))
    return out


def label(algo: str, p: int) -> str:
    return f"nccl:{algo}/{PROTOCOLS[p]}"


def pair_time(op: str, algo: str, p: int, n: Any, s: Setup) -> Any:
    """Seconds of one (algorithm, protocol) for n bytes."""
    if s.P == 1:
        return n * 0
    for a, q, cost in compiled(op, s):
        if (a, q) == (algo, p):
            return cost_time(cost, n)
    return cost_time(compile_cost(op, algo, p, s), n)


def parse(op: str, text: str, s: Setup) -> list[tuple[str, int]]:
    """'nccl' (all candidates), 'nccl:ring' (its protocols) or 'nccl:ring/LL128' -> (algorithm, protocol) pairs."""
    _, _, rest = text.partition(":")
    algo, _, proto = rest.partition("/")
    pool = candidates(op, s)
    if algo:
        pool = [(a, p) for a, p in pool if a == algo]
    if proto:
        names = [x.lower() for x in PROTOCOLS]
        if proto.lower() not in names:
            raise CommError(f"unknown NCCL protocol {proto!r}", expected="LL, LL128 or Simple")
        pool = [(a, p) for a, p in pool if p == names.index(proto.lower())]
    if not pool:
        options = sorted({label(a, p) for a, p in candidates(op, s)})
        raise CommError(f"NCCL does not run {op} as {text!r} on this group", expected="one of " + ", ".join(options))
    return pool


# Time per collective call that the tuner's model leaves out (it prices algorithms against each other, and this
# term is common to all of them): the kernel launch and the collective's start-up on every rank, which every
# nccl-tests iteration pays. Median of (measured - modelled) over the rows up to 4 MiB of the published tables in
# dlperf/data/nccl_tests/ (benchmarks/fit_collective_overhead.py): 7.0 us over 3 tables across two nodes (A100
# InfiniBand, H100, H200 RoCE; 51 rows), 12.2 us over 4 within one node (8x A100 OCI, Galvatron and thanos, 8x H200
# ml-engineering; 48 rows; 15.9 us over the first two). One constant, the smaller: the one-node excess at small
# sizes (NCCL's NVLink latencies look low; largely the -g 8 single-process launch of OCI and Galvatron) is left
# unpriced, because a per-node figure would let a group spread over more nodes start faster; the excess that grows
# with the message within one node is the pipeline fill below (FILL). vTrain's tables are held out (their cluster
# ran the vTrain rows that `dlperf validate` scores). Microbenchmarks, never training runs.
CALL_OVERHEAD = 7.0e-6


# Pipeline fill of a collective within one NVLink node, which the tuner's model (latency + n / bandwidth) also
# leaves out. A ring (or NVLS) moves a message in chunks that NCCL sizes to the message (a channel's chunk, about
# n / (P x channels), grows with n up to the protocol's buffer slot), and the chunks cross all the ring's steps before
# the links stream, so the fill grows with the message and levels off once the chunks reach full size: measured
# one-node times exceed latency + n / bandwidth by a term that grows through the medium sizes and saturates.
# Priced as
#     fill(n) = FILL_BYTES / algBw x n / (n + FILL_HALF)
# with algBw = busBw x P / nSteps the algorithm bandwidth of the Simple protocol (NVLS for an all-reduce on a node
# that has it): one fill of FILL_BYTES carried at the collective's own rate, so it scales with the ring's step count
# (an all-gather or reduce-scatter, P-1 steps, pays half an all-reduce's 2(P-1); a pair pays 1/1.75 of 8 GPUs')
# and more bandwidth never costs more. (FILL_BYTES, FILL_HALF) per NCCL architecture class, fitted by
# benchmarks/fit_collective_overhead.py (least mean |log(model / measured)| over rows 64 KiB .. 1 GiB, with
# CALL_OVERHEAD in place) to the independent one-node nccl-tests tables run with one process per GPU, the way a
# training job runs NCCL (dlperf/data/nccl_tests/, launch: per-gpu):
#   Ampere: thanos-8x-a100-allreduce (8x A100 SXM4 80GB, mpirun -np 8, NCCL from the nvidia-nccl-cu12 wheel):
#     22.5 MB, half size 90.5 MiB = 483 KiB per chunk over 8 ranks x 24 channels, NCCL's Simple slot (4 MiB buffer
#     / NCCL_STEPS 8 = 512 KiB): the fill saturates where the chunks reach full size, at ~170 us on 8 A100s;
#   Hopper: mlengineering-8x-h200-allreduce (8x H200, NCCL 2.27.7, NVLS from 2 MiB; torch-timed): 13 MB, 3.36 MiB.
# Single-process runs (nccl-tests -g 8: oci-, galvatron-8x-a100-allreduce) are reported, not fitted: one thread
# launches the 8 GPUs' kernels in turn, 15-50 us more at 1-16 MiB than one process per GPU on the same node (the
# thanos source has both). vTrain's A100 tables (held out: their cluster ran scored rows) are reported, never fitted.
# Groups across nodes get no fill: there NCCL's network latencies (14 us per step, x1.4 plateau) already reach the
# measured crusoe/nebius/gke tables. Volta and Blackwell have no one-node table here and get none, nor does a device
# whose name names no fitted class (arch_index takes an unknown device as Ampere for the tuner's constants; the fill
# is only applied where it was measured: A100/A800, and H100/H200/H800, Hopper GPUs of the same NVLink 4 / NVSwitch
# generation as the H200 table's); broadcast, reduce and point-to-point get none.
FILL = {1: (22.5e6, 2**26.5), 2: (13.0e6, 2**21.75)}  # (bytes, bytes): 22.5 MB, 90.5 MiB; 13 MB, 3.36 MiB
FILL_DEVICES = {1: ("A100", "A800"), 2: ("H100", "H200", "H800")}
FILL_OPS = ("allreduce", "allgather", "reduce_scatter")


def fill_constants(device_name: str) -> tuple[float, float] | None:
    """(FILL_BYTES, FILL_HALF) of the device's architecture class, None where no one-node table measured it."""
    name = device_name.upper()
    for arch, tags in FILL_DEVICES.items():
        if any(tag in name for tag in tags):
            return FILL[arch]
    return None


def fill_time(op: str, n: Any, s: Setup) -> Any:
    """Seconds of pipeline fill for n bytes of `op` within one node (0 across nodes): FILL_BYTES / algBw x
    n / (n + FILL_HALF), algBw = busBw x P / nSteps of the Simple ring (or NVLS for an all-reduce)."""
    if s.nodes != 1 or s.P == 1 or op not in FILL_OPS or s.fill is None:
        return 0.0
    fill_bytes, half = s.fill
    bus = max(s.ring_bw, s.nvls_bw or 0.0) if op == "allreduce" else s.ring_bw
    alg = bus * s.P / _nsteps(op, s.P)
    return fill_bytes / (alg * 1e9) * n / (n + half)


def nccl_time(op: str, n: Any, s: Setup, which: str = "nccl") -> Any:
    """Minimum over the (algorithm, protocol) pairs `which` names (NCCL's tuner), elementwise for arrays, plus
    the per-call overhead and the one-node pipeline fill they share (added after the choice, which they leave
    unchanged)."""
    if s.P == 1:
        return n * 0
    costs = [c for _, _, c in compiled(op, s)] if which == "nccl" else \
        [compile_cost(op, a, p, s) for a, p in parse(op, which, s)]
    fill = fill_time(op, n, s)
    if isinstance(n, float | int):
        return min(cost_time(c, n) for c in costs) + CALL_OVERHEAD + fill
    return mathx.minimum(*(cost_time(c, n) for c in costs)) + CALL_OVERHEAD + fill


def nccl_choice(op: str, n: float, s: Setup, which: str = "nccl") -> str:
    """Label of the pair NCCL's tuner picks for a float size (first listed wins a tie)."""
    pairs = parse(op, which, s)
    times = [float(pair_time(op, a, p, n, s)) for a, p in pairs]
    a, p = pairs[times.index(min(times))]
    return label(a, p)


def nccl_times(op: str, n: Any, s: Setup) -> dict[str, Any]:
    """Every candidate pair's time, by label."""
    fill = fill_time(op, n, s)
    return {label(a, p): cost_time(c, n) + CALL_OVERHEAD + fill for a, p, c in compiled(op, s)}


def is_nccl(algorithm: str) -> bool:
    text = str(algorithm).strip().lower()
    return text == "nccl" or text.startswith("nccl:")



def sendrecv_time(n: Any, alpha: float, beta: float, kind: str) -> Any:
    """One NCCL send/recv of n bytes over a link (alpha s = its Ring/Simple hop latency, beta s/B): the faster of
    LL (up to NCCL_P2P_LL_THRESHOLD, half the bandwidth) and Simple, each with the Ring base latency."""
    scale = alpha * 1e6 / HW_LAT[kind]["ring"][2]
    simple = (BASE_LAT["ring"][2] + HW_LAT[kind]["ring"][2] * scale) * 1e-6 + n * beta
    ll = (BASE_LAT["ring"][0] + HW_LAT[kind]["ring"][0] * scale) * 1e-6 + 2 * n * beta
    return mathx.where(n <= P2P_LL_THRESHOLD, mathx.minimum(ll, simple), simple) + CALL_OVERHEAD
