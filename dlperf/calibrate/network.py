"""The `network:` levels of a calibrated hardware file: copied from a template, or one loopback level fitted
by the communication calibration."""

from __future__ import annotations

from typing import Any

from dlperf.calibrate.comm import CommCalibration
from dlperf.calibrate.hwfile import level_dict
from dlperf.errors import CalibrationError
from dlperf.spec.hardware import NetworkLevel, load_hardware

DEFAULT_TEMPLATE = "cpu-local"
MIN_LATENCY = 1e-9  # the loader needs a positive latency; a fitted intercept of 0 is written as 1 ns


def template_levels(spec: str) -> list[dict[str, Any]]:
    """The levels of a built-in hardware (`dgx-a100`) or a hardware YAML path, with where they came from."""
    hw = load_hardware(spec)
    return [level_dict(level, f"copied from {hw.name} ({hw.path})") for level in hw.network]


def loopback_level(comm: CommCalibration) -> dict[str, Any]:
    """One level spanning all local processes, alpha and beta from the gloo allreduce fit (see calibrate.comm)."""
    if "allreduce" not in comm.fits:
        raise CalibrationError("a loopback network level needs the allreduce measurement")
    f = comm.fits["allreduce"]
    level = NetworkLevel("loopback", None, f.bandwidth, max(f.alpha, MIN_LATENCY))
    return level_dict(level, f"dlperf calibrate comm {comm.started}: gloo allreduce between 2 local processes, "
                             f"alpha-beta fit R^2 {f.fit.r2:.3f}, median |residual| {100 * f.fit.median_rel:.1f}%")


def network_levels(network_from: str | None, comm: CommCalibration | None) -> list[dict[str, Any]]:
    """--network-from wins; else a measured loopback level; else the built-in cpu-local template."""
    if network_from:
        return template_levels(network_from)
    if comm is not None and "allreduce" in comm.fits:
        return [loopback_level(comm)]
    return template_levels(DEFAULT_TEMPLATE)
