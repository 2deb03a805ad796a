"""NCCL's algorithms x protocols (dlperf.comm.nccl): tuning.cc constants by hand, the tuner's choice, published
nccl-tests tables (dlperf/data/nccl_tests/), and the invariants any collective model must keep."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.comm import CommError, Group, best_algorithm, collective_report, collective_time, p2p_time
from dlperf.comm import nccl as N
from dlperf.comm.collectives import bus_factor
from dlperf.comm.topology import place_group
from dlperf.errors import SpecError
from dlperf.spec.hardware import hardware_from_dict, load_hardware
from dlperf.spec.yamlio import load_yaml_file

TABLES = sorted((Path(__file__).parents[1] / "dlperf" / "data" / "nccl_tests").glob("*.yaml"))

# Mean |predicted / measured - 1| of time over every row of each published table, as the model achieves it
# (a fact about the model, measured when the tables were added; not loosened to pass).
MEAN_ERROR = {  # with the per-call start-up (dlperf.comm.nccl.CALL_OVERHEAD) and the one-node pipeline fill
    # (nccl.FILL, fitted to the one-process-per-GPU thanos and mlengineering tables only), both fitted by
    # benchmarks/fit_collective_overhead.py; figures in brackets: without the fill
    "crusoe-2x8-a100-allreduce": 0.14,  # 2 nodes x 8 A100, 8 B .. 2 GiB: 13.5% (14.2% without the start-up)
    "gke-2x8-h200-allgather": 0.12,  # 2 nodes x 8 H200 (RoCE), all_gather 4 KiB .. 2 GiB: 11.9% (15.6%)
    "nebius-2x8-h100-allreduce": 0.15,  # 2 nodes x 8 H100, 8 B .. 8 GiB: 14.3% (20.8%; NVLS-Tree above 128 MiB
    # unmodelled)
    "oci-8x-a100-allreduce": 0.17,  # 1 node, 8 A100, 64 B .. 8 GiB: 16.8% (18.2%); -g 8: one process launches all
    "galvatron-8x-a100-allreduce": 0.19,  # 1 node, 8 A100, 1 MiB .. 1 GiB, -g 8: 18.8% (24.6%)
    "thanos-8x-a100-allreduce": 0.10,  # 1 node, 8 A100, one process per GPU, 8 B .. 4 GiB: 10.0% (10.9%)
    "mlengineering-8x-h200-allreduce": 0.08,  # torch-timed, 32 KiB .. 16 GiB: 7.5% (18.6%)
    # vTrain's A100 node (trace/a100), 1 MiB .. 1 GiB at powers of two; held out of both fits. 8 GPUs still measure
    # a flat ~93 us at 1-4 MiB, more than the model (45-89 us).
    "vtrain-2x-a100-allreduce": 0.21,  # 2 GPUs: 20.5% (27.0%); -13% at 1 GiB (197 GB/s busbw measured, 231 modelled)
    "vtrain-4x-a100-allreduce": 0.08,  # 4 GPUs: 7.4% (14.4%)
    "vtrain-8x-a100-allreduce": 0.11,  # 8 GPUs: 10.7% (14.3%)
    # OpenXLA's default collective perf table @ad6eaee1 (benchmarks/extract_xla_collectives.py), held out of both
    # fits: GPU-event median of one collective per run, F32, 1 KiB up. "AxB": A concurrent groups of B GPUs, the
    # rows one group's. Figures: mean over all rows (<= 1 MiB / above); the model is fast (signed medians below 0)
    # except where noted.
    # H100 node (sm_90, 5 runs per point): ~30-50 us measured at small sizes against the model's ~25
    "xla-8x-h100-allreduce": 0.20,  # 19.1% (26% / 12%); NVLS plateau 402 GB/s busbw measured, 480 in dgx-h100
    "xla-8x-h100-allgather": 0.21,  # 20.4% (28% / 13%)
    "xla-8x-h100-reducescatter": 0.25,  # 24.1% (30% / 18%)
    "xla-8x-h100-alltoall": 0.40,  # 39.8% (59% / 20%): all-to-all's P-1 sends priced as one send's latency
    # B200 node (sm_100_B200, 5 runs per point): 30-80 us at small sizes, ring plateau ~615 GB/s busbw vs 720
    # (efficiency 0.80 from NCCL's SM100 link model; no B200 ring busbw measurement found)
    "xla-8x-b200-allreduce": 0.46,  # 45.3% (52% / 38%; 38.6% before dgx-b200 had NVLS): this node's all-reduce
    # reaches 614 GB/s busbw at 2 GiB, ring-like, where 8 B200 with NVLS report 830+ (NVIDIA/nccl#1807)
    "xla-8x-b200-allgather": 0.32,  # 31.0% (42% / 20%)
    "xla-8x-b200-reducescatter": 0.34,  # 33.4% (48% / 19%)
    "xla-8x-b200-alltoall": 0.49,  # 48.5% (61% / 36%)
    # GB200 NVL72 (sm_100_GB200, 20 runs per point). The rack is one NCCL node (MNNVL): all-reduces inside it run
    # NVLS at 835 GB/s busbw (coreweave/nccl-tests#43, 72 GPUs) and rings at 0.755 of 900 GB/s (Azure ND GB200 v6,
    # 4 GPUs, NCCL_ALGO=Ring); figures in braces: before, with no NVLS and the ring at NCCL's 0.80.
    # 72 ranks: NVLS's tuning.cc latency (25 us) against 51-73 us measured up to 2 MiB, and its busbw still rising
    # at 2-8 GiB (601 us measured at 151 MB, 389 modelled): the model is now fast up to ~1 GiB.
    "xla-1x72-gb200-allreduce": 0.38,  # 37.9% (48% / 30%) {50.5%, model slow: 72-rank tree/ring}
    "xla-1x72-gb200-allgather": 0.25,  # 24.0% (38% / 15%) {23.6%}
    "xla-1x72-gb200-reducescatter": 0.25,  # 24.4% (34% / 18%) {23.8%}
    "xla-1x72-gb200-alltoall": 0.57,  # 56.5% (79% / 42%) {58.2%}
    # 8 and 4 ranks: NVLS at 835 fits 8 ranks' plateau (839 GB/s at 32 GiB) but not 4 ranks' (679 GB/s busbw,
    # the ring's figure: NVLS gains little on 4 ranks, as on H100, NVIDIA/nccl#1455); both too fast at 4-256 MiB
    "xla-8x8-gb200-allreduce": 0.17,  # 16.3% (16% / 17%) {13.3%}
    "xla-8x8-gb200-allgather": 0.05,  # 4.5% (4% / 5%) {6.1%}
    "xla-8x8-gb200-reducescatter": 0.05,  # 4.8% (4% / 6%) {5.9%}
    "xla-8x8-gb200-alltoall": 0.17,  # 16.4% (20%, model slow / 14%) {18.6%}
    "xla-16x4-gb200-allreduce": 0.13,  # 12.3% (4% / 19%) {6.4%}
    "xla-16x4-gb200-allgather": 0.12,  # 11.8% (11% / 13%) {13.8%}
    "xla-16x4-gb200-reducescatter": 0.10,  # 9.8% (8% / 11%) {11.9%}
    "xla-16x4-gb200-alltoall": 0.25,  # 25.0% (34% / 19%) {27.0%}
    # GB300 NVL72 (sm_103, 20 runs per point), priced with NCCL's Blackwell constants (nccl.BLACKWELL_TAGS) and
    # GB200's measured NVLS and ring busbw (dgx-gb300.yaml)
    "xla-1x72-gb300-allreduce": 0.37,  # 36.3% (46% / 29%) {54.2%, model slow as on GB200}
    "xla-1x72-gb300-allgather": 0.23,  # 22.6% (33% / 16%) {22.5%}
    "xla-1x72-gb300-reducescatter": 0.25,  # 24.5% (33% / 18%) {24.0%}
    "xla-1x72-gb300-alltoall": 0.56,  # 55.9% (78% / 41%) {57.6%}
    "xla-8x8-gb300-allreduce": 0.17,  # 16.2% (16% / 16%) {13.2%}
    "xla-8x8-gb300-allgather": 0.06,  # 5.6% (5% / 6%) {6.9%}
    "xla-8x8-gb300-reducescatter": 0.06,  # 5.1% (4% / 6%) {6.0%}
    "xla-8x8-gb300-alltoall": 0.18,  # 17.0% (23%, model slow / 13%) {19.2%}
    "xla-16x4-gb300-allreduce": 0.13,  # 12.3% (5% / 18%) {6.5%}
    "xla-16x4-gb300-allgather": 0.10,  # 9.8% (7% / 12%) {11.9%}
    "xla-16x4-gb300-reducescatter": 0.10,  # 9.5% (8% / 11%) {11.6%}
    "xla-16x4-gb300-alltoall": 0.30,  # 29.2% (42% / 20%) {31.3%}
    # AWS p5.48xlarge (8x H100, 32x 100 Gb/s EFA v2; NCCL 2.27.7, aws-ofi-nccl 1.16.3 and its tuner), 32 MiB up, on
    # aws-p5: NCCL's tuner model with the 75 us network latency aws-ofi-nccl reports (net_latency); efficiency from
    # the 8 GiB all-reduce plateau, nothing fitted to the 16-512 MiB rows the latency decides. Figures: mean (rows
    # <= 256 MiB / above), signed median; [in brackets: the same rows priced on dgx-h100, InfiniBand's zero plugin
    # latency, too fast everywhere but 2 nodes' all-reduce, and more so with more nodes]
    "aws-p5-2x8-h100-allgather": 0.08,  # 7.6% (9% / 6%), -5% [24.5%, -23%]
    "aws-p5-4x8-h100-allgather": 0.09,  # 9.0% (9% / 8%), +6% [28.8%, -25%]
    "aws-p5-8x8-h100-allgather": 0.14,  # 13.7% (16% / 10%), +13% [36.3%, -34%]
    "aws-p5-16x8-h100-allgather": 0.16,  # 15.9% (17% / 14%), +15% [42.5%, -43%]
    "aws-p5-32x8-h100-allgather": 0.19,  # 18.2% (15% / 23%), +16%: the ring overlaps its hops' latency with the
    # streaming that the tuner model adds to it [50.5%, -57%]
    "aws-p5-2x8-h100-allreduce": 0.25,  # 24.3% (13% / 34%), +30%: NVLS-Tree from 128 MiB (478 GB/s at 8 GiB),
    # unmodelled [20.4%, +13%]
    "aws-p5-4x8-h100-allreduce": 0.07,  # 6.8% (8% / 6%), +4% [19.4%, -16%]
    "aws-p5-8x8-h100-allreduce": 0.09,  # 8.1% (10% / 7%), +1% [26.6%, -21%]
    "aws-p5-16x8-h100-allreduce": 0.13,  # 12.7% (20% / 7%), -8% [34.0%, -30%]
    "aws-p5-32x8-h100-allreduce": 0.17,  # 16.3% (21% / 13%), -15% [39.9%, -51%]
}


def setup(hw_name: str, gpus: int, stride: int = 1) -> N.Setup:
    hw = load_hardware(hw_name)
    return N.make_setup(place_group(Group(gpus, stride), hw), hw)


# ------------------------------------------------------------------------------ tuning.cc by hand


def test_single_node_a100_latencies_and_bandwidths_follow_tuning_cc() -> None:
    s = setup("dgx-a100", 8)
    assert (s.nodes, s.ppn, s.intra, s.arch) == (1, 8, "nvlink", 1)
    # ring: baseLat + 2(P-1) NVLink hops; tree: baseLat + 2 (ppn-1) hops (tuning.cc, NVLINK rows)
    assert N.latency("allreduce", "ring", 0, s) == pytest.approx(6.6 + 14 * 0.6)
    assert N.latency("allreduce", "ring", 2, s) == pytest.approx(8.4 + 14 * 3.4)
    assert N.latency("allreduce", "tree", 1, s) == pytest.approx(14.0 + 2 * 7 * 1.25)
    assert N.latency("allgather", "ring", 2, s) == pytest.approx(8.4 + 7 * 3.4)
    # busBw: Simple = level 300 GB/s x 0.77; LL = min(llMaxBw Ampere 1 node 87.7, busBw / 2)
    assert N.bus_bandwidth("allreduce", "ring", 2, s) == pytest.approx(231.0)
    assert N.bus_bandwidth("allreduce", "ring", 0, s) == pytest.approx(87.7)
    assert N.bus_bandwidth("allreduce", "ring", 1, s) == pytest.approx(231.0 * 0.92)
    assert N.bus_bandwidth("allreduce", "tree", 0, s) == pytest.approx(231.0 * 0.92 / 3.8)
    # algBw: ring x P / 2(P-1), tree x 1/2
    assert N.algorithm_bandwidth("allreduce", "ring", 2, s) == pytest.approx(231.0 * 8 / 14)
    assert N.algorithm_bandwidth("allreduce", "tree", 2, s) == pytest.approx(231.0 * 0.92 / 2)


def test_every_blackwell_hardware_file_gets_nccls_blackwell_constants() -> None:
    """tuning.cc indexes its constants by minCompCap >= 100 as Blackwell: sm_100 B200/GB200 and sm_103 B300/GB300
    alike."""
    for name in ("dgx-b200", "gb200-nvl72", "dgx-gb300", "dgx-b300"):
        assert setup(name, 8).arch == 3, name
    assert N.bus_bandwidth("allreduce", "ring", 0, setup("dgx-gb300", 8)) == pytest.approx(282.0)  # llMaxBw
    assert (setup("dgx-h100", 8).arch, setup("dgx-a100", 8).arch, N.arch_index("MI300X-OAM-192GB")) == (2, 1, 1)


def test_multi_node_ring_counts_network_steps_and_net_overhead() -> None:
    s = setup("dgx-a100", 32)  # 4 nodes of 8
    assert (s.nodes, s.ppn) == (4, 8)
    # 2(P-1) = 62 steps of which 2(nNodes-1) = 6 cross the network; intra hops at least the 1 us net overhead
    assert N.latency("allreduce", "ring", 0, s) == pytest.approx(6.6 + 56 * 1.0 + 6 * 2.7)
    assert N.latency("allreduce", "ring", 2, s) == pytest.approx(8.4 + 56 * 3.4 + 6 * 14.0)
    assert N.latency("allreduce", "tree", 0, s) == pytest.approx(6.8 + 2 * (7 * 0.6 + 2 * 5.0))
    # with one GPU per node NCCL takes the Tree network latency for the ring's hops
    one = setup("dgx-a100", 4, stride=8)
    assert one.ppn == 1 and N.latency("allgather", "ring", 0, one) == pytest.approx(6.6 + 3 * 5.0)
    # PAT (one GPU per node, allgather/reduce-scatter): base 8 + log2(nodes) x netLat / 3.5 + 2.8 us per rank,
    # 0.75 of the ring's busBw taken as the algorithm bandwidth
    assert ("pat", 2) in N.candidates("allgather", one) and ("pat", 2) not in N.candidates("allgather", s)
    assert N.latency("allgather", "pat", 2, one) == pytest.approx(8.0 + 2 * 14.0 / 3.5 + 4 * 2.8)
    assert N.algorithm_bandwidth("allgather", "pat", 2, one) == pytest.approx(0.75 * one.ring_bw)


def test_network_transport_latency_is_added_to_every_network_hop() -> None:
    """tuning.cc: interLat = hwLat[NET][a][p] + graphs[a]->latencyInter, and latencyInter once more for Simple (the
    flush). NCCL's own IB transport reports 0 (dgx-h100 unchanged); aws-ofi-nccl reports 75 us on p5.48xlarge."""
    ib, efa = setup("dgx-h100", 256), setup("aws-p5", 256)
    assert (ib.net_latency, efa.net_latency) == (0.0, pytest.approx(75.0))
    assert (efa.nodes, efa.ppn, efa.arch) == (32, 8, 2)
    # ring all-gather: 255 steps, 31 across the network; NVLink hops at least the 1 us net overhead (x3 Simple)
    assert N.latency("allgather", "ring", 1, efa) == pytest.approx(14.0 + 224 * 1.9 + 31 * (4.0 + 75.0))
    assert N.latency("allgather", "ring", 2, efa) == pytest.approx(8.4 + 224 * 3.4 + 31 * (14.0 + 2 * 75.0))
    assert N.latency("allgather", "ring", 1, ib) == pytest.approx(14.0 + 224 * 1.9 + 31 * 4.0)
    # tree all-reduce: 2 ((ppn-1) NVLink hops + log2(nodes) network hops)
    assert N.latency("allreduce", "tree", 1, efa) == pytest.approx(14.0 + 2 * (7 * 1.25 + 5 * (8.5 + 75.0)))
    # the bandwidths do not move
    plain = replace(efa, net_latency=0.0)
    for op, algo in (("allgather", "ring"), ("allreduce", "tree")):
        assert N.bus_bandwidth(op, algo, 2, efa) == pytest.approx(N.bus_bandwidth(op, algo, 2, plain))


def test_p5_tables_need_the_plugin_latency() -> None:
    """AWS p5 all-gathers at 16-256 GPUs (dlperf/data/nccl_tests/aws-p5-*, 32 MiB .. 2 GiB): at a fixed size the
    measured time grows ~10 us per added rank (2.70 ms at 32 MiB on 256 GPUs), which NCCL's model reaches only with
    the 75 us aws-ofi-nccl reports per network hop. Priced as InfiniBand (dgx-h100, no plugin latency) the model is
    fast by a median factor that grows with the GPU count; with it, each GPU count's median is within 15%."""
    ib, efa = load_hardware("dgx-h100"), load_hardware("aws-p5")
    fast = []
    for path in sorted(p for p in TABLES if p.stem.startswith("aws-p5-") and p.stem.endswith("allgather")):
        table = load_yaml_file(path)
        rows = np.array(table["rows"], dtype=float)
        sizes, measured, group = rows[:, 0], rows[:, 1] * 1e-6, Group(int(table["gpus"]))
        on_ib = np.median(measured / collective_time("allgather", sizes, group, ib))
        on_efa = np.median(measured / collective_time("allgather", sizes, group, efa))
        assert 0.85 <= on_efa <= 1.15, f"{path.stem}: median measured / model {on_efa:.2f}"
        fast.append((int(table["gpus"]), on_ib))
    fast.sort()
    assert [g for g, _ in fast] == [16, 32, 64, 128, 256]
    ratios = [r for _, r in fast]
    assert ratios[0] > 1.2 and ratios[-1] > 2.0 and ratios == sorted(ratios)


@pytest.mark.parametrize("hw_name", ["dgx-h100", "aws-p5", "dgx-a100"])
@pytest.mark.parametrize(("op", "algorithm"), [("allgather", "auto"), ("reduce_scatter", "auto"),
                                               ("allreduce", "nccl:ring")])
def test_more_gpus_never_make_a_ring_collective_faster_per_byte(hw_name, op, algorithm) -> None:
    """Across nodes (8 GPUs each, 2 to 128 nodes), at every size from 1 MiB to 4 GiB, a ring's nccl-tests busbw
    (bytes each rank moves per second) never rises with the GPU count: more steps over the same links. (A tree's
    busbw may: nccl-tests scales its algbw by the ring's 2(P-1)/P.)"""
    hw = load_hardware(hw_name)
    sizes = 2.0 ** np.arange(20, 33)
    previous = None
    for gpus in (16, 32, 64, 128, 256, 512, 1024):
        t = collective_time(op, sizes, Group(gpus), hw, algorithm)
        bus = sizes / t * bus_factor(op, gpus)
        if previous is not None:
            assert np.all(bus <= previous * (1 + 1e-9)), (op, gpus, sizes[bus > previous * (1 + 1e-9)])
        previous = bus


def test_auto_is_nccls_choice_small_latency_bound_large_ring_simple() -> None:
    hw, group = load_hardware("dgx-a100"), Group(8)
    assert best_algorithm("allreduce", 8, group, hw).startswith("nccl:") and "/LL" in best_algorithm(
        "allreduce", 8, group, hw)
    assert best_algorithm("allreduce", 2**30, group, hw) == "nccl:ring/Simple"
    for op in ("allgather", "reduce_scatter", "broadcast", "reduce"):
        assert best_algorithm(op, 2**30, group, hw) == "nccl:ring/Simple"
    assert best_algorithm("alltoall", 2**30, group, hw) == "nccl:p2p/Simple"
    # recursive doubling / Rabenseifner are never the default, but stay selectable
    for n in (1e3, 1e6, 1e9):
        assert best_algorithm("allreduce", n, Group(64), hw) not in ("recursive_doubling", "rabenseifner")
    assert collective_time("allreduce", 1e6, group, hw, "rabenseifner") > 0
    assert best_algorithm("allreduce", 1e4, group, hw, "auto:textbook") in ("recursive_doubling", "rabenseifner",
                                                                            "double_tree", "tree", "ring")


def test_nvls_only_on_nvlink_sharp_nodes_and_forced_names() -> None:
    h100 = load_hardware("dgx-h100")
    assert best_algorithm("allreduce", 2**30, Group(8), h100) == "nccl:nvls/Simple"
    assert best_algorithm("allreduce", 2**30, Group(8), load_hardware("dgx-a100")) == "nccl:ring/Simple"
    assert "nccl:nvls/Simple" not in collective_report("allreduce", 2**30, Group(16), h100).times  # 2 nodes
    forced = collective_report("allreduce", 2**20, Group(8), h100, "nccl:tree/LL128")
    assert forced.chosen == "nccl:tree/LL128"
    assert collective_report("allreduce", 2**20, Group(8), h100, "nccl:ring").chosen.startswith("nccl:ring/")
    with pytest.raises(CommError, match="protocol"):
        collective_time("allreduce", 1e6, Group(8), h100, "nccl:ring/LL64")
    with pytest.raises(CommError, match="does not run"):
        collective_time("allgather", 1e6, Group(8), h100, "nccl:tree")


def test_nvls_on_blackwell_nodes_and_the_whole_nvl72_rack() -> None:
    """An NVL72 rack is one NCCL node (MNNVL), so any group inside it, up to all 72 GPUs, may run NVLS; groups
    across racks do not (NVLS-Tree is not modelled). At 8 GiB the NVLS time is the cited busbw's: 835 GB/s on 72
    GB200 (coreweave/nccl-tests#43), 830 on 8 B200 (NVIDIA/nccl#1807; carried over to 8 B300)."""
    for name, gpus, busbw in (("gb200-nvl72", 72, 835e9), ("dgx-gb300", 72, 835e9), ("dgx-b200", 8, 830e9),
                              ("dgx-b300", 8, 830e9)):
        hw = load_hardware(name)
        n = 8 * 2.0**30
        assert best_algorithm("allreduce", n, Group(gpus), hw) == "nccl:nvls/Simple"
        t = collective_time("allreduce", n, Group(gpus), hw)
        assert n / t * 2 * (gpus - 1) / gpus == pytest.approx(busbw, rel=0.01)  # + latency and call overhead
    nvl72 = load_hardware("gb200-nvl72")
    assert "nccl:nvls/Simple" not in collective_report("allreduce", 2**30, Group(144), nvl72).times  # 2 racks


def test_vectorised_equals_scalar_for_every_op() -> None:
    hw = load_hardware("dgx-a100")
    sizes = np.geomspace(1.0, 2.0**33, 97)
    for op in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"):
        for group in (Group(8), Group(64), Group(8, 8)):
            vec = collective_time(op, sizes, group, hw)
            scalar = [collective_time(op, float(n), group, hw) for n in sizes]
            np.testing.assert_allclose(vec, scalar, rtol=1e-12)


def test_p2p_time_is_nccl_sendrecv() -> None:
    hw = load_hardware("dgx-a100")
    # Simple: Ring base 8.4 us + NVLink hop 3.4 us + n / (231 GB/s); LL below 16 KiB: 6.6 + 0.6 + 2n / 231; each
    # also pays the per-call start-up every NCCL call does (nccl.CALL_OVERHEAD)
    start = N.CALL_OVERHEAD
    assert p2p_time(2**30, hw, 0) == pytest.approx(11.8e-6 + 2**30 / 231e9 + start)
    assert p2p_time(1024, hw, 0) == pytest.approx(7.2e-6 + 2048 / 231e9 + start)


def test_link_key_is_checked(tmp_path) -> None:
    data = {"name": "x", "device": {"name": "d", "peak_flops": {"fp32": "1 TFLOP/s"}, "memory": "1 GiB",
                                    "memory_bandwidth": "1 GB/s"},
            "network": [{"name": "a", "bandwidth": "1 GB/s", "latency": "1 us", "link": "ethernet"}]}
    with pytest.raises(SpecError, match="nvlink, pci, net"):
        hardware_from_dict(data, "x.yaml")


# ------------------------------------------------------------------------------ published nccl-tests tables


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_published_table_within_stated_error(path: Path) -> None:
    table = load_yaml_file(path)
    assert table["source"] and table["name"] in MEAN_ERROR
    hw = load_hardware(table["hardware"])
    rows = np.array(table["rows"], dtype=float)
    sizes, measured = rows[:, 0], rows[:, 1] * 1e-6
    predicted = collective_time(table["op"], sizes, Group(int(table["gpus"])), hw)
    error = np.abs(predicted / measured - 1)
    assert float(np.mean(error)) <= MEAN_ERROR[table["name"]], f"{table['name']}: {np.mean(error):.1%}"
    # sanity of the data: algbw = size / time as published (2-3 significant digits)
    algbw = rows[:, 2]
    big = algbw >= 1
    np.testing.assert_allclose(sizes[big] / measured[big] / 1e9, algbw[big], rtol=0.02)


def test_large_a100_ring_rows_within_five_percent() -> None:
    """From 128 MiB up NCCL runs the Simple ring at the links' rate, which the hardware file's efficiency gives."""
    table = load_yaml_file(next(p for p in TABLES if p.stem == "crusoe-2x8-a100-allreduce"))
    rows = np.array(table["rows"], dtype=float)
    big = rows[rows[:, 0] >= 2**27]
    predicted = collective_time("allreduce", big[:, 0], Group(16), load_hardware("dgx-a100"))
    assert np.all(np.abs(predicted / (big[:, 1] * 1e-6) - 1) <= 0.05)


# ------------------------------------------------------------------------------ invariants (hypothesis)

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "gather", "scatter")
HARDWARE = ("dgx-a100", "dgx-h100", "dgx1-v100", "p100-roce", "aws-p5")
_HW = {name: load_hardware(name) for name in HARDWARE}


def _scaled(hw, bandwidth: float = 1.0, latency: float = 1.0):
    levels = tuple(replace(lv, bandwidth=lv.bandwidth * bandwidth, latency=lv.latency * latency,
                           nvls_bandwidth=None if lv.nvls_bandwidth is None else lv.nvls_bandwidth * bandwidth)
                   for lv in hw.network)
    return replace(hw, network=levels)


groups = st.tuples(st.integers(min_value=1, max_value=64), st.sampled_from([1, 8]))
sizes = st.floats(min_value=1.0, max_value=2.0**36)


@settings(max_examples=80, deadline=None)
@given(n1=sizes, n2=sizes, group=groups, hw=st.sampled_from(HARDWARE), op=st.sampled_from(OPS + ("sendrecv",)))
def test_larger_message_never_takes_less_time(n1, n2, group, hw, op) -> None:
    lo, hi = sorted((n1, n2))
    g = Group(*group) if op != "sendrecv" else Group(min(group[0], 2), group[1])
    t = collective_time(op, np.array([lo, hi]), g, _HW[hw])
    assert t[0] <= t[1] * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(n=sizes, group=groups, hw=st.sampled_from(HARDWARE), op=st.sampled_from(OPS),
       factor=st.floats(min_value=1.0, max_value=8.0))
def test_more_bandwidth_or_less_latency_never_slower(n, group, hw, op, factor) -> None:
    base = collective_time(op, n, Group(*group), _HW[hw])
    assert collective_time(op, n, Group(*group), _scaled(_HW[hw], bandwidth=factor)) <= base * (1 + 1e-12)
    assert collective_time(op, n, Group(*group), _scaled(_HW[hw], latency=1 / factor)) <= base * (1 + 1e-12)
