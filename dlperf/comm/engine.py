"""Placement-aware entry points: the time of a collective for a group on a hardware, the algorithm `auto` picks
and the nccl-tests style report (algorithm bandwidth = size / time, bus bandwidth = algbw * bus factor).

`auto` (and `auto:nccl`) is what NCCL's tuner picks among what NCCL implements (dlperf.comm.nccl: ring, tree,
NVLS, PAT, point-to-point x LL, LL128, Simple, costed with NCCL's tuning.cc model). `auto:textbook` is the
fastest of the textbook alpha-beta algorithms (recursive doubling, Rabenseifner, hierarchical, ...), which stay
selectable by name; `nccl:ring`, `nccl:tree/LL128`, ... force one NCCL algorithm and/or protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlperf import mathx
from dlperf.comm import collectives as C
from dlperf.comm import nccl as N
from dlperf.comm.hierarchical import CATALOGUE, Algorithm
from dlperf.comm.topology import Group, Placed, level_link, place_group
from dlperf.spec.hardware import Hardware, link_kind
from dlperf.spec.yamlio import closest

AUTO = "auto"
# Candidate sets for `auto:SET`: `nccl` is NCCL's own tuner (the default), `textbook` the fastest of the
# alpha-beta algorithms of collectives.py/hierarchical.py.
CANDIDATE_SETS = {"nccl": None, "textbook": None}


def auto_set(algorithm: str) -> str | None:
    """'auto' and 'auto:nccl' -> 'nccl', 'auto:textbook' -> 'textbook', anything else (forced) -> None."""
    text = str(algorithm).strip().lower()
    if text == AUTO:
        return "nccl"
    if text.startswith(AUTO + ":"):
        name = text.split(":", 1)[1]
        if name not in CANDIDATE_SETS:
            raise C.CommError(f"unknown candidate set in {algorithm!r}",
                              expected="auto or " + ", ".join(f"auto:{k}" for k in CANDIDATE_SETS))
        return name
    return None


def normalize_op(op: str) -> str:
    """Canonical collective name ('all-reduce' -> 'allreduce'); CommError with a suggestion otherwise."""
    key = str(op).strip().lower().replace("-", "_")
    key = C.OP_ALIASES.get(key, key)
    if key not in CATALOGUE:
        names = list(CATALOGUE)
        hint = closest(key, names + list(C.OP_ALIASES))
        hint = C.OP_ALIASES.get(hint, hint)
        raise C.CommError(f"unknown collective {op!r}" + (f" (did you mean {hint!r}?)" if hint else ""),
                          expected="one of " + ", ".join(names))
    return key


def resolve_algorithm(op: str, algorithm: str) -> tuple[str, int]:
    """(canonical algorithm name, parameter) for `op`; the parameter is the server count of 'ps:4'."""
    text = str(algorithm).strip().lower().replace("-", "_")
    name, _, param = text.partition(":")
    names = list(CATALOGUE[op])
    if name not in names:
        name = C.ALGORITHM_ALIASES.get(name, name)
    if name not in names:
        hint = closest(name, names + [AUTO])
        raise C.CommError(f"unknown {op} algorithm {algorithm!r}" + (f" (did you mean {hint!r}?)" if hint else ""),
                          expected="one of " + ", ".join([AUTO, *names]))
    if not param:
        return name, 1
    if name != "ps" or not param.isdigit() or int(param) < 1:
        raise C.CommError(f"bad algorithm parameter in {algorithm!r}",
                          expected="'ps:S' with S >= 1 servers; no parameter for other algorithms")
    return name, int(param)


def _time(op: str, name: str, n: Any, placed: Placed, param: int = 1) -> Any:
    """One algorithm's time: its closed form on the single level the group uses, else its placed cost."""
    alg: Algorithm = CATALOGUE[op][name]
    if placed.size == 1:
        return n * 0
    extra = {"servers": param} if name == "ps" else {}
    level = placed.single_level()
    if level is not None and alg.formula is not None:
        link = placed.link(level, alg.cls)
        return alg.formula(n, placed.size, link.alpha, link.beta, **extra)
    return alg.placed(n, placed, **extra)


def candidates(op: str, placed: Placed, which: str = "textbook") -> list[str]:
    """Textbook algorithms `auto:textbook` chooses among: all but the parameter server, and the explicit
    hierarchical compositions only when the group spans more than one level."""
    multi = len(placed.placement.spanned) > 1
    return [name for name, alg in CATALOGUE[op].items() if alg.auto and (multi or not alg.multi_level_only)]


def _setup(op: str, group: Group | int, hw: Hardware) -> tuple[str, Placed]:
    if not isinstance(group, Group):
        group = Group(group)
    return normalize_op(op), place_group(group, hw)


def algorithm_times(op: str, nbytes: Any, group: Group | int, hw: Hardware) -> dict[str, Any]:
    """Time of every applicable algorithm: NCCL's (algorithm, protocol) pairs ('nccl:ring/LL', ...), then the
    textbook ones (the `auto:textbook` candidates, plus the central parameter server)."""
    op, placed = _setup(op, group, hw)
    times = N.nccl_times(op, nbytes, N.make_setup(placed, hw)) if placed.size > 1 else {}
    names = candidates(op, placed) + [n for n, a in CATALOGUE[op].items() if not a.auto]
    return times | {name: _time(op, name, nbytes, placed) for name in names}


def collective_time(op: str, nbytes: Any, group: Group | int, hw: Hardware, algorithm: str = AUTO) -> Any:
    """Time (s) of collective `op` on `nbytes` bytes (float or numpy array, and a sympy expression for the
    textbook algorithms; the result is the same kind) for `group` placed on `hw`. `auto` is NCCL's choice
    (the elementwise minimum over NCCL's algorithm x protocol pairs), `auto:textbook` the textbook minimum."""
    op, placed = _setup(op, group, hw)
    which = auto_set(algorithm)
    if placed.size == 1:
        return nbytes * 0
    if which == "nccl" or (which is None and N.is_nccl(algorithm)):
        return N.nccl_time(op, nbytes, N.make_setup(placed, hw), "nccl" if which else str(algorithm).strip())
    if which is not None:
        return mathx.minimum(*(_time(op, name, nbytes, placed) for name in candidates(op, placed)))
    name, param = resolve_algorithm(op, algorithm)
    return _time(op, name, nbytes, placed, param)


def best_algorithm(op: str, nbytes: float, group: Group | int, hw: Hardware, algorithm: str = AUTO) -> str:
    """Name of the pick of `auto` ('nccl:ring/LL128', ...) or `auto:textbook` for a float size; ties go to the
    first listed."""
    op, placed = _setup(op, group, hw)
    which = auto_set(algorithm) or "nccl"
    if which == "nccl":
        if placed.size == 1:
            return "none"
        return N.nccl_choice(op, float(nbytes), N.make_setup(placed, hw))
    times = {name: float(_time(op, name, nbytes, placed)) for name in candidates(op, placed)}
    return min(times, key=times.__getitem__)


def bandwidths(op: str, P: int, nbytes: float, time: float) -> tuple[float | None, float | None]:
    """nccl-tests' algbw = size / time and busbw = algbw * bus factor (None when the time is 0)."""
    if time <= 0:
        return None, None
    algbw = nbytes / time
    return algbw, algbw * C.bus_factor(op, P)


@dataclass(frozen=True)
class CollectiveReport:
    """Per-algorithm times and the chosen one, with nccl-tests' algbw and busbw (bytes/s)."""

    op: str
    nbytes: float
    group: Group
    hardware: str
    levels: tuple[str, ...]
    times: dict[str, float]
    chosen: str
    time: float
    algbw: float | None
    busbw: float | None
    lower_bound: float | None = None
    auto_candidates: tuple[str, ...] = field(default_factory=tuple)

    def bandwidths(self, time: float) -> tuple[float | None, float | None]:
        return bandwidths(self.op, self.group.size, self.nbytes, time)

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for name, t in self.times.items():
            algbw, busbw = self.bandwidths(t)
            rows.append({"algorithm": name, "time_s": t, "algbw_Bps": algbw, "busbw_Bps": busbw,
                         "auto_candidate": name in self.auto_candidates})
        return {
            "op": self.op, "bytes": self.nbytes, "gpus": self.group.size, "stride": self.group.stride,
            "hardware": self.hardware, "levels": list(self.levels), "chosen": self.chosen, "time_s": self.time,
            "algbw_Bps": self.algbw, "busbw_Bps": self.busbw, "lower_bound_s": self.lower_bound,
            "algorithms": rows,
        }


def collective_report(op: str, nbytes: float, group: Group | int, hw: Hardware,
                      algorithm: str = AUTO) -> CollectiveReport:
    """Everything `dlperf comm` prints for one size."""
    op, placed = _setup(op, group, hw)
    nbytes = float(nbytes)
    times = {k: float(v) for k, v in algorithm_times(op, nbytes, placed.group, hw).items()}
    which = auto_set(algorithm)
    nccl_names = tuple(k for k in times if N.is_nccl(k))
    auto = nccl_names if which in ("nccl", None) else tuple(candidates(op, placed))
    if which is not None and placed.size == 1:
        chosen, time = "none", 0.0
    elif which is not None:
        chosen = min(auto, key=times.__getitem__)
        time = times[chosen]
    elif N.is_nccl(algorithm):
        chosen = best_algorithm(op, nbytes, placed.group, hw) if str(algorithm).strip().lower() == "nccl" else \
            N.nccl_choice(op, nbytes, N.make_setup(placed, hw), str(algorithm).strip())
        time = times[chosen]
    else:
        chosen, param = resolve_algorithm(op, algorithm)
        time = float(_time(op, chosen, nbytes, placed, param))
        chosen = f"{chosen}:{param}" if param != 1 else chosen
        times[chosen] = time
    level = placed.single_level()
    bound = None
    if op == "allreduce" and level is not None:
        link = placed.link(level)
        bound = float(C.allreduce_lower_bound(nbytes, placed.size, link.alpha, link.beta))
    algbw, busbw = bandwidths(op, placed.size, nbytes, time)
    return CollectiveReport(
        op=op, nbytes=nbytes, group=placed.group, hardware=hw.name,
        levels=tuple(hw.network[j].name for j in placed.placement.spanned), times=times, chosen=chosen,
        time=time, algbw=algbw, busbw=busbw, lower_bound=bound, auto_candidates=auto,
    )


def p2p_time(nbytes: Any, hw: Hardware, crosses_level: int, concurrent: int = 1) -> Any:
    """Point-to-point message between pipeline stages whose devices first share a level-`crosses_level`
    domain (0: same node), as NCCL sends it (dlperf.comm.nccl.sendrecv_time: LL up to 16 KiB, else Simple), over
    level j's link with `concurrent` devices of one inner domain sending at once (contention through
    links_per_domain)."""
    if isinstance(crosses_level, bool) or not isinstance(crosses_level, int) or \
            not 0 <= crosses_level < len(hw.network):
        raise C.CommError("crosses_level", expected=f"a level index 0..{len(hw.network) - 1}", found=crosses_level)
    if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
        raise C.CommError("concurrent", expected="a positive integer", found=concurrent)
    link = level_link(hw.network[crosses_level], concurrent if crosses_level > 0 else 1)
    kind = link_kind(hw.network[crosses_level], crosses_level)
    return N.sendrecv_time(nbytes, link.alpha, link.beta, kind)
