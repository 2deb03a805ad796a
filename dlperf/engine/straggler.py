"""The slowest of N synchronising devices: a synchronous step waits for its slowest rank.

Devices of one SKU differ in speed (manufacturing variation, power management): Sinha et al., "Not All GPUs Are
Created Equal", SC22 (arXiv:2208.11035). With each device's compute time t_i = median * (1 + sigma * Z_i), Z_i
standard normal and independent, the group of N devices that synchronise every step (all of them under data
parallelism: every step ends in a gradient reduction) finishes its compute after

    E[max_i t_i] = median * (1 + sigma * z_N),    z_N = E[max of N standard normals]

z_N by Blom's approximation of the largest normal order statistic (Blom 1958, "Statistical Estimates and
Transformed Beta-Variables"): z_N ~= Phi^-1((N - 0.375) / (N + 0.25)); z_1 = 0, and z_N grows with N.
sigma is the hardware file's device.speed_spread (0 where no per-device measurement is cited).
"""

from __future__ import annotations

from statistics import NormalDist

BLOM_ALPHA = 0.375  # Blom (1958): E[Z_(N:N)] ~= Phi^-1((N - alpha) / (N - 2 alpha + 1))


def expected_max_normal(n: int) -> float:
    """z_N: the expected largest of n independent standard normals (Blom's approximation; 0 for n = 1)."""
    if n < 1:
        raise ValueError(f"a synchronising group has at least one device, got {n}")
    return NormalDist().inv_cdf((n - BLOM_ALPHA) / (n - 2 * BLOM_ALPHA + 1))


def straggler_factor(speed_spread: float, devices: int) -> float:
    """How much longer the slowest of `devices` ranks computes than the median device: 1 + sigma * z_N (1 when
    no spread is cited, without the inverse normal: the step calls this for every plan a search prices)."""
    if speed_spread == 0:
        return 1.0
    return 1.0 + speed_spread * expected_max_normal(devices)
