"""Communication costs in the alpha-beta model (survey section 2.5/7.2): collectives as small pure
functions (collectives.py), groups placed on hierarchical networks (topology.py, hierarchical.py),
algorithm choice and nccl-tests style reports (engine.py), and gradient compression (compression.py)."""

from dlperf.comm.collectives import ALGORITHMS, CommError, bus_factor
from dlperf.comm.compression import Compression, CompressionDetail, compressed_allreduce_time, parse_compression
from dlperf.comm.engine import (
    CollectiveReport,
    algorithm_times,
    best_algorithm,
    collective_report,
    collective_time,
    normalize_op,
    p2p_time,
)
from dlperf.comm.topology import Group, Link, Placed, place_group, twin_group

__all__ = [
    "ALGORITHMS", "CollectiveReport", "CommError", "Compression", "CompressionDetail", "Group", "Link", "Placed",
    "algorithm_times", "best_algorithm", "bus_factor", "collective_report", "collective_time",
    "compressed_allreduce_time", "normalize_op", "p2p_time", "parse_compression", "place_group", "twin_group",
]
