"""Where a group of devices sits on the network levels of a hardware file, and what each level costs it.

Devices are numbered so that they fill levels innermost first: device d lies in level-i domain
d // size_i (8 GPUs per NVSwitch node, then nodes on InfiniBand). A group is the ranks r0, r0 + stride,
r0 + 2*stride, ...; tensor-parallel groups have stride 1 and stay in a node, data-parallel groups of a
tp=8 plan have stride 8 and put one member in each node.

Each level j gives a link (alpha_j, beta_j): alpha_j its latency, beta_j = 1 / (bandwidth_j * efficiency_j
* share_j). `share_j` is contention: `links_per_domain` of level j says how many level-j links one
level-(j-1) domain has (None: one per device, i.e. full rails); when c devices of that domain cross level
j at once, each gets min(1, links / c) of a link.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from dlperf.comm.collectives import CommError
from dlperf.spec.hardware import Hardware, NetworkLevel

# Concurrency classes: how many devices of a domain cross the next level out at once.
RAILS = "rails"  # every member crosses with its share of the data (ring channels, butterflies)
LEADERS = "leaders"  # one member per group crosses (tree roots, node leaders)


@dataclass(frozen=True)
class Group:
    """A communicator: `size` ranks `stride` apart in the global device order. The group that starts at
    device 0 stands for every group of its kind (tp, dp, ...), which have the same shape.

    `concurrent` overrides how many devices of one inner domain cross each outer level at the same time
    (by default: all devices of the domain for algorithms where every member crosses, one per group for
    leader-based ones, assuming every device belongs to some group of this kind).

    `devices` names the members' device indices (ascending) when they are not one evenly strided run: DualPipe's
    two copies of a stage reduce their gradients over the replicas of two pipeline positions (`twin_group`).
    """

    size: int
    stride: int = 1
    concurrent: int | None = None
    devices: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("size", "stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise CommError(f"group {name}", expected="a positive integer", found=value)
        concurrent = self.concurrent
        if concurrent is not None and (isinstance(concurrent, bool) or not isinstance(concurrent, (int, np.integer))
                                       or concurrent < 1):
            raise CommError("group concurrent", expected="a positive integer or None", found=concurrent)
        devices = self.devices
        if devices is not None and (len(devices) != self.size or any(
                isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in devices)
                or any(b <= a for a, b in zip(devices[:-1], devices[1:], strict=True))):
            raise CommError("group devices", expected=f"{self.size} ascending device indices >= 0", found=devices)


@lru_cache(maxsize=1024)
def twin_group(size: int, stride: int, first: int, second: int) -> Group:
    """Two runs of `size` ranks `stride` apart, starting at devices `first` < `second`: the group over which
    DualPipe reduces a stage's gradients, the replicas of pipeline rank r and of its mirror rank pp-1-r (each
    holds the stage; DeepSeek-V3, arXiv:2412.19437, Sec. 3.2.1). Memoised: a search prices the same groups for
    many plans, and checking a long member list each time would cost more than the pricing."""
    run = tuple(i * stride for i in range(size))
    return Group(2 * size, 1, None, tuple(first + d for d in run) + tuple(second + d for d in run))


@dataclass(frozen=True)
class Placement:
    """Counts that describe a group's spread over the levels (index j = level j of the hardware).

    members[j]: most group members sharing one level-j domain (members[-1] == size).
    hops[j]: ring hops (rank k to k+1 mod size) whose two ends first share a level-j domain.
    peers[j]: ranks whose first shared domain with rank 0 is at level j.
    """

    size: int
    stride: int
    domain_sizes: tuple[int | None, ...]
    members: tuple[int, ...]
    hops: tuple[int, ...]
    peers: tuple[int, ...]
    devices: tuple[int, ...] | None = None  # the group's explicit devices (Group.devices), else None

    @cached_property
    def spanned(self) -> tuple[int, ...]:
        """Levels the group actually uses: those where members grow (inner to outer)."""
        inner = (1, *self.members[:-1])
        return tuple(j for j, (a, b) in enumerate(zip(inner, self.members, strict=True)) if b > a)

    @cached_property
    def factors(self) -> tuple[tuple[int, int], ...]:
        """(level, f) for each spanned level: f = ceil(members[j] / members[j-1]) ranks per step out."""
        inner = (1, *self.members[:-1])
        return tuple((j, -(-self.members[j] // inner[j])) for j in self.spanned)

    def level_of_round(self, distance: int, xor: bool) -> int:
        """The outermost level any pair of one round crosses: partners k and k XOR d (butterflies, binomial
        trees) or k and (k + d) mod size (Bruck)."""
        return _round_level(self.size, self.stride, self.domain_sizes, distance, xor, self.devices)


def _levels_between(a: np.ndarray, b: np.ndarray, sizes: tuple[int | None, ...]) -> np.ndarray:
    """Index of the innermost level whose domain holds both devices: domains nest, so it is the number of
    inner levels where they differ."""
    level = np.zeros(a.shape, dtype=np.int64)
    for size in sizes[:-1]:
        level += (a // size) != (b // size)
    return level


def _positions(size: int, stride: int, devices: tuple[int, ...] | None) -> np.ndarray:
    """Device index of each rank: the explicit `devices`, else 0, stride, ..., (size-1)*stride."""
    if devices is not None:
        return np.asarray(devices, dtype=np.int64)
    return np.arange(size, dtype=np.int64) * stride


@lru_cache(maxsize=1024)
def place(size: int, stride: int, domain_sizes: tuple[int | None, ...],
          devices: tuple[int, ...] | None = None) -> Placement:
    """Placement of ranks 0, stride, ..., (size-1)*stride (or of the given `devices`) on levels of the given
    domain sizes. Rings visit the ranks in order, so the hops of a two-run group cross between runs twice."""
    devices_at = _positions(size, stride, devices)
    members = []
    for dsize in domain_sizes:
        members.append(size if dsize is None else int(np.bincount(devices_at // dsize).max()))
    count = len(domain_sizes)
    ring = _levels_between(devices_at, np.roll(devices_at, -1), domain_sizes) if size > 1 else np.zeros(0, int)
    peer = _levels_between(devices_at[1:], np.full(size - 1, devices_at[0], dtype=np.int64), domain_sizes)
    return Placement(
        size=size, stride=stride, domain_sizes=domain_sizes, members=tuple(members),
        hops=tuple(int(np.sum(ring == j)) for j in range(count)),
        peers=tuple(int(np.sum(peer == j)) for j in range(count)), devices=devices,
    )


@lru_cache(maxsize=4096)
def _round_level(size: int, stride: int, sizes: tuple[int | None, ...], distance: int, xor: bool,
                 devices: tuple[int, ...] | None = None) -> int:
    ranks = np.arange(size, dtype=np.int64)
    partners = ranks ^ distance if xor else (ranks + distance) % size
    ok = partners < size
    at = _positions(size, stride, devices)
    levels = _levels_between(at[ranks[ok]], at[partners[ok]], sizes)
    return int(levels.max()) if levels.size else 0


@dataclass(frozen=True)
class Link:
    alpha: float
    beta: float


def level_link(level: NetworkLevel, crossing: int = 1) -> Link:
    """Link of one level when `crossing` devices of an inner domain use it at once:
    beta = 1 / (bandwidth * efficiency * min(1, links_per_domain / crossing))."""
    share = 1.0 if level.links_per_domain is None else min(1.0, level.links_per_domain / crossing)
    return Link(level.latency, 1.0 / (level.bandwidth * level.efficiency * share))


Round = tuple[int, float, bool]  # (partner distance, fraction of n sent, xor pairing)


class Placed:
    """A group placed on a hardware's levels: links per level and the effective links of ring-like
    algorithms that use several levels at once. Links and round sums are memoised per instance; `placed()`
    shares instances between calls with equal groups and levels."""

    def __init__(self, group: Group, levels: tuple[NetworkLevel, ...]) -> None:
        if not levels:
            raise CommError("hardware has no network levels")
        self.group = group
        self.levels = levels
        self.placement = place(int(group.size), int(group.stride), tuple(lv.size for lv in levels), group.devices)
        self._memo: dict[Any, Any] = {}

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """make(), computed once per key for this placed group."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def size(self) -> int:
        return self.placement.size

    def crossing(self, j: int, cls: str) -> int:
        """Devices of one level-(j-1) domain that cross level j at once."""
        if self.group.concurrent is not None:
            return int(self.group.concurrent)
        domain = self.levels[j - 1].size or 1
        if cls == RAILS:
            return domain
        # one member per group: the domain holds domain / members[j-1] groups of this kind
        return max(1, domain // self.placement.members[j - 1])

    def link(self, j: int, cls: str = RAILS) -> Link:
        """alpha and beta of level j for a group of this kind (contention from links_per_domain)."""
        return self.memo(("link", j, cls), lambda: level_link(self.levels[j], self.crossing(j, cls) if j > 0 else 1))

    def single_level(self) -> int | None:
        """The one level the group uses, or None when it spans several (or is a single device)."""
        spanned = self.placement.spanned
        return spanned[0] if len(spanned) == 1 else None

    def outer_level(self) -> int:
        spanned = self.placement.spanned
        return spanned[-1] if spanned else 0

    def ring_link(self, cls: str = RAILS) -> Link:
        """Effective link of a ring whose hops cross different levels, pipelined over channels.

        NCCL runs several rings (channels) rotated so that each device is the exit of some of them: a
        fraction h_j/P of every device's traffic then crosses level j, all levels at once. Per step:
        alpha = sum_j (h_j/P) alpha_j (average hop), beta = max_j (h_j/P) beta_j (the busiest link).
        One level: (alpha_j, beta_j).
        """
        return self.memo(("ring", cls), lambda: self._ring_link(cls))

    def _ring_link(self, cls: str) -> Link:
        P, hops = self.size, self.placement.hops
        used = [j for j, h in enumerate(hops) if h]
        alpha = sum(hops[j] / P * self.link(j, cls).alpha for j in used)
        beta = max(hops[j] / P * self.link(j, cls).beta for j in used)
        return Link(alpha, beta)

    def peer_link(self, cls: str = RAILS) -> Link:
        """Mean link over the P-1 peers of rank 0, for algorithms that talk to one peer per step in turn
        (pairwise exchange, linear gather): sum over steps = (P-1) * mean."""
        return self.memo(("peer", cls), lambda: self._peer_link(cls))

    def _peer_link(self, cls: str) -> Link:
        peers = self.placement.peers
        total = sum(peers)
        used = [j for j, q in enumerate(peers) if q]
        return Link(sum(peers[j] * self.link(j, cls).alpha for j in used) / total,
                    sum(peers[j] * self.link(j, cls).beta for j in used) / total)

    def rounds_cost(self, rounds: list[Round], cls: str) -> tuple[float, float]:
        """Sum over rounds (distance, fraction of n, xor pairing) of alpha_j + fraction*n*beta_j, j the
        outermost level that round crosses, as (latency, coefficient of n)."""
        latency, coefficient = 0.0, 0.0
        for distance, fraction, xor in rounds:
            link = self.link(self.placement.level_of_round(distance, xor), cls)
            latency, coefficient = latency + link.alpha, coefficient + fraction * link.beta
        return latency, coefficient



@lru_cache(maxsize=256)
def _placed(group: Group, levels: tuple[NetworkLevel, ...]) -> Placed:
    return Placed(group, levels)


def place_group(group: Group, hw: Hardware) -> Placed:
    """`group` placed on `hw`'s levels, shared between calls with the same group and levels."""
    return _placed(group, hw.network)
