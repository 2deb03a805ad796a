"""From fitted constants to a hardware YAML that `load_hardware` accepts as it stands, written atomically.

Mapping the fits onto the loader's model (dlperf/spec/hardware.py, dlperf/engine/device.py). The engine charges a
kernel of `size` FLOPs

    t = launch_latency + t0 + size / (peak_flops[dtype] * eff.peak),   t0 = eff.half / (top * eff.peak)

with top = the largest peak_flops entry. A measured kernel obeys t = T0 + size / r_inf (calibrate.fit), so
peak_flops[dtype] * eff.peak = r_inf and eff.half = (T0 - launch_latency) * top * eff.peak: the launch cost
is already its own term and must not be counted twice.

Memory: memory_bandwidth is the STREAM copy rate (the bandwidth figure STREAM and datasheets quote) and
efficiency.memory.peak = (element-wise rate: scale/add/triad/ReLU/GELU/tanh/softmax) / (copy rate), the
fraction a network's memory-bound layers reach; the engine charges bytes / (memory_bandwidth * that).

Choice of scale: peak_flops is written as the *fitted* GEMM rate r_inf with efficiency.matmul.peak = 1.0 (and
conv relative to it), not as a datasheet peak with efficiency < 1. A CPU's sustained clock under turbo, AVX-512
licence or a hypervisor, and its FMA-unit count, cannot be read reliably from user space, so a "theoretical"
peak would be a guess; r_inf is what the file can stand behind. MFU computed against this file is therefore
the fraction of *achievable* GEMM throughput. (If convolution outruns GEMM, peak_flops is scaled up by that
ratio so that every efficiency stays <= 1.)
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dlperf.calibrate.calibration import Calibration
from dlperf.errors import CalibrationError, DlperfError
from dlperf.spec.hardware import DEFAULT_LAUNCH_LATENCY, Hardware, NetworkLevel, hardware_from_dict
from dlperf.spec.yamlio import load_yaml_text
from dlperf.units import format_quantity

REFERENCE_DTYPE = "fp32"  # the dtype whose GEMM and conv fits define the efficiency curves


@dataclass(frozen=True)
class Curve:
    peak: float
    half: float
    source: str
    startup: float | None = None                 # Hockney t0 beyond the launch, when given directly
    dtypes: dict[str, Curve] | None = None       # per-dtype curves (matmul on CUDA: fp32 SIMT, tf32, fp16...)


@dataclass(frozen=True)
class DeviceConstants:
    peak_flops: dict[str, float]
    memory_bandwidth: float
    launch_latency: float
    efficiency: dict[str, Curve]
    comments: dict[str, str]


def _fit_note(cal: Calibration, name: str) -> str:
    f = cal.fit(name)
    return (f"{name}: R^2 {f.r2:.3f}, median |residual| {100 * f.median_rel:.1f}%, max {100 * f.max_rel:.1f}%, "
            f"{f.points} points")


def device_constants(cal: Calibration) -> DeviceConstants:
    """The numbers for `device:` (see the module doc for how fits map onto the loader's curves)."""
    ref = f"matmul {REFERENCE_DTYPE}"
    for name in (ref, "memory copy", "memory elementwise"):
        if not cal.has(name):
            why = next((n for n in cal.notes if n.startswith(f"{name}: not fitted")), f"{name}: not measured")
            raise CalibrationError(f"cannot write a hardware file without the {name} fit ({why}); a busy or slow "
                                   f"machine can leave too few or too noisy points: rerun when it is idle")
    launch = cal.launch.median if cal.launch is not None else DEFAULT_LAUNCH_LATENCY
    rates = {d: cal.fit(f"matmul {d}").rate for d in cal.dtypes}
    conv = cal.fit(f"conv {REFERENCE_DTYPE}") if cal.has(f"conv {REFERENCE_DTYPE}") else None
    scale = max(1.0, conv.rate / rates[REFERENCE_DTYPE]) if conv else 1.0
    peak_flops = {d: r * scale for d, r in rates.items()}
    top = max(peak_flops.values())
    mm = cal.fit(ref)
    per_dtype = {d: Curve(1.0 / scale, 0.0, _fit_note(cal, f"matmul {d}"),
                          startup=max(cal.fit(f"matmul {d}").t0 - launch, 0.0))
                 for d in rates if d != REFERENCE_DTYPE}
    efficiency = {"matmul": Curve(1.0 / scale, max(mm.t0 - launch, 0.0) * top / scale, _fit_note(cal, ref),
                                  dtypes=per_dtype or None)}
    comments = {d: _fit_note(cal, f"matmul {d}") for d in rates}
    if conv:
        peak = conv.rate / (rates[REFERENCE_DTYPE] * scale)
        efficiency["conv"] = Curve(peak, max(conv.t0 - launch, 0.0) * top * peak,
                                   _fit_note(cal, f"conv {REFERENCE_DTYPE}"))
    copy, elementwise = cal.fit("memory copy"), cal.fit("memory elementwise")
    fraction = min(1.0, elementwise.rate / copy.rate)
    efficiency["memory"] = Curve(fraction, max(elementwise.t0 - launch, 0.0) * copy.rate * fraction,
                                 _fit_note(cal, "memory elementwise") + " (rate relative to copy)")
    transcendental = _transcendental_curve(cal, copy.rate, launch)
    if transcendental is not None:
        efficiency["transcendental"] = transcendental
    comments["memory_bandwidth"] = (f"STREAM copy at working sets >= {format_quantity(cal.dram_floor, 'bytes')}; "
                                    + _fit_note(cal, "memory copy"))
    comments["launch_latency"] = "median of a one-element op" if cal.launch else "not measured: dlperf default"
    return DeviceConstants(peak_flops, copy.rate, launch, efficiency, comments)


TRANSCENDENTAL_FAMILIES = ("gelu", "tanh", "softmax")


def _transcendental_curve(cal: Calibration, copy_rate: float, launch: float) -> Curve | None:
    """The curve for exp/tanh-bound element-wise kernels (GELU, tanh, softmax; the engine's 'transcendental'
    class): the median of their measured rates relative to copy, and their median startup time."""
    fits = [cal.fit(f"memory {f}") for f in TRANSCENDENTAL_FAMILIES if cal.has(f"memory {f}")]
    if not fits:
        return None
    rates = sorted(f.rate for f in fits)
    fraction = min(1.0, rates[len(rates) // 2] / copy_rate)
    t0 = sorted(f.t0 for f in fits)[len(fits) // 2]
    names = "/".join(f for f in TRANSCENDENTAL_FAMILIES if cal.has(f"memory {f}"))
    return Curve(fraction, max(t0 - launch, 0.0) * copy_rate * fraction,
                 f"median of the memory {names} fits (rate relative to copy)")


def _q(value: float, kind: str) -> str:
    return format_quantity(float(value), kind, digits=5)


def _scalar(value: Any) -> str:
    """A YAML scalar on one line (quoted where YAML needs it)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.strip().removesuffix("...").strip()


def _efficiency_lines(curves: dict[str, Curve], sms: int | None) -> list[str]:
    lines = ["  efficiency:"]
    for cls, c in curves.items():
        kind = "bytes" if cls in ("memory", "transcendental") else "flops"
        fields = _curve_fields(c, kind)
        if cls == "matmul" and sms:
            fields.insert(-1, f"tile: {list(GPU_TILE)}")
        if c.dtypes:
            inner = ", ".join(f"{d}: {{{', '.join(_curve_fields(sub, kind))}}}" for d, sub in c.dtypes.items())
            fields.insert(-1, f"dtypes: {{{inner}}}")
        lines.append(f"    {cls}: {{{', '.join(fields)}}}")
    return lines


# The output tile of the engine's GEMM quantization on a GPU (NVIDIA "Matrix Multiplication Background User's
# Guide", DU-09799-001, wave quantization example: 256x128 tiles, one per SM), written with the measured SM count.
GPU_TILE = (256, 128)


def _curve_fields(c: Curve, kind: str) -> list[str]:
    fields = [f"peak: {min(1.0, round(c.peak, 4)) or 1e-4:g}"]
    if c.half > 0:
        fields.append(f"half: {_q(c.half, kind)}")
    if c.startup is not None:
        fields.append(f"startup: {_q(c.startup, 'time') if c.startup > 0 else '0 s'}")
    fields.append(f"source: {json.dumps(c.source)}")  # double-quoted: safe inside a flow mapping
    return fields


def _host_lines(cal: Calibration) -> list[str]:
    lines = [f"  sms: {cal.sms}   # torch.cuda.get_device_properties().multi_processor_count"] if cal.sms else []
    if cal.dispatch:
        fwd, bwd = cal.dispatch
        note = ("host time per counted kernel launch of an eager transformer layer at width 8, forward and backward "
                "(dlperf calibrate: backend_torch.dispatch_times; it replaces device.host's estimate)")
        lines.append(f"  dispatch: {{forward: {_q(fwd, 'time')}, backward: {_q(bwd, 'time')}, "
                     f"source: {json.dumps(note)}}}")
    return lines


def level_dict(level: NetworkLevel, source: str) -> dict[str, Any]:
    """A network level as the YAML mapping the loader reads (quantities as unit strings)."""
    out: dict[str, Any] = {"name": level.name}
    if level.size is not None:
        out["size"] = level.size
    out["bandwidth"] = _q(level.bandwidth, "bandwidth")
    out["latency"] = _q(level.latency, "time")
    if level.efficiency != 1.0:
        out["efficiency"] = level.efficiency
    if level.links_per_domain is not None:
        out["links_per_domain"] = level.links_per_domain
    if level.link is not None:
        out["link"] = level.link
    if level.nvls_bandwidth is not None:
        out["nvls_bandwidth"] = _q(level.nvls_bandwidth, "bandwidth")
    if level.net_latency:
        out["net_latency"] = _q(level.net_latency, "time")
    out["source"] = source
    return out


def _plain(value: Any) -> Any:
    """numpy scalars and tuples into plain YAML types."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)  # str subclasses such as torch's TorchVersion
    if hasattr(value, "item"):
        return value.item()
    return value


def stamp(cal: Calibration, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `calibration:` mapping: what was measured, when, on what, and how well each constant fits."""
    fits = {}
    for f in cal.fits:
        kind = "bandwidth" if f.cls == "memory" else "flop_rate"
        unit = "bytes" if f.cls == "memory" else "flops"
        fits[f.name] = {
            "written": f.used, "rate": _q(f.fit.rate, kind), "best_measured": _q(f.fit.best_rate, kind),
            "t0": _q(f.fit.t0, "time") if f.fit.t0 > 0 else "0 s",
            "n_half": _q(f.fit.half, unit) if f.fit.half > 0 else "0",
            "r2": round(f.fit.r2, 4), "median_rel_residual": round(f.fit.median_rel, 4),
            "max_rel_residual": round(f.fit.max_rel, 4), "points": f.fit.points,
        }
    out: dict[str, Any] = {
        "tool": "dlperf calibrate", "measured_at": cal.started, "duration_s": round(cal.seconds, 1),
        "quick": cal.quick, **cal.environment,
        "fit_method": "t = t0 + size / r_inf by relative least squares; R^2 on achieved rate (dlperf.calibrate.fit)",
        "memory_fit_min_working_set": _q(cal.dram_floor, "bytes") if cal.dram_floor else "-",
        "fits": fits,
    }
    if cal.dispatch is not None:
        out["dispatch"] = {"forward": _q(cal.dispatch[0], "time"), "backward": _q(cal.dispatch[1], "time")}
    if cal.launch is not None:
        out["launch"] = {"median": _q(cal.launch.median, "time"), "p25": _q(cal.launch.p25, "time"),
                         "p75": _q(cal.launch.p75, "time")}
    if cal.skipped:
        out["skipped"] = list(cal.skipped)
    if cal.notes:
        out["notes"] = list(cal.notes)
    out.update(extra or {})
    return _plain(out)


HEADER = """\
# Written by `dlperf calibrate`: every device figure below was measured on this machine ({when}); the
# `calibration:` section says how, on what, and how well each constant fits.
# peak_flops = fitted asymptotic GEMM rate (Hockney r_inf), not a datasheet peak: a CPU's sustained clock and
# FMA width cannot be read reliably from user space, so efficiency.matmul.peak is 1.0 and MFU against this file
# is the fraction of achievable GEMM throughput (see dlperf/calibrate/hwfile.py).
"""


def render(cal: Calibration, name: str, levels: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> str:
    """The whole hardware file as text."""
    c = device_constants(cal)
    env = cal.environment
    what = f"{cal.backend} on {cal.device} ({env.get('threads')} threads)"
    lines = [
        HEADER.format(when=cal.started).rstrip("\n"),
        f"name: {_scalar(name)}",
        f"source: {_scalar(f'measured by dlperf calibrate, {what}, {cal.started}')}",
        f"description: {_scalar(f'Calibrated: {cal.device_name}, {what}')}",
        "device:",
        f"  name: {_scalar(cal.device_name)}",
        f"  source: {_scalar(f'dlperf calibrate {cal.started}: fitted Hockney curves, see calibration.fits')}",
        "  peak_flops:",
        *(f"    {d}: {_q(r, 'flop_rate')}   # {c.comments[d]}" for d, r in c.peak_flops.items()),
        f"  memory: {_q(cal.device_memory, 'bytes')}   # physical memory of the device",
        f"  memory_bandwidth: {_q(c.memory_bandwidth, 'bandwidth')}   # {c.comments['memory_bandwidth']}",
        f"  launch_latency: {_q(c.launch_latency, 'time')}   # {c.comments['launch_latency']}",
        *_host_lines(cal),
        *_efficiency_lines(c.efficiency, cal.sms),
        "network:",
        *(f"  - {_scalar(level)}" for level in levels),
        yaml.safe_dump({"calibration": stamp(cal, extra)}, sort_keys=False, width=110).rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def check_text(text: str, path: str) -> Hardware:
    """Load the text exactly as `load_hardware` would; a failure here is a bug, reported before any write."""
    try:
        return hardware_from_dict(load_yaml_text(text, path), path)
    except DlperfError as err:
        raise CalibrationError(f"refusing to write {path}: the generated file does not load ({err})") from None


def output_target(path: str | Path) -> Path:
    """The file an output path will really write: a symlink is written through (its target is replaced, the
    link stays), so that `-o` never turns a link into a plain file; a device or other non-regular file is
    refused. Checked before any measuring, with check_destination."""
    given = Path(path)
    if not str(path).strip():
        raise CalibrationError("cannot write to an empty path")
    target = Path(os.path.realpath(given))
    if target.exists() and not target.is_file() and not target.is_dir():
        raise CalibrationError(f"cannot write {given}: it is not a regular file")
    return target


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, fsync it and rename it over `path` (all or nothing). A
    symlink is written through (see output_target)."""
    target = output_target(path)
    check_destination(target)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise CalibrationError(f"cannot write {target}: {err.strerror or err}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates the file 0600; give it the mode a plain open() would (an existing file keeps its own)
        os.chmod(tmp, target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise CalibrationError(f"cannot write {target}: {err.strerror or err}") from None
        raise
    return target


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def check_destination(path: str | Path) -> None:
    """A file can be written at `path`: its folder exists and is writable. Checked before a long run, so that a
    typo does not cost the run (and no folder is created behind the user's back)."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise CalibrationError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise CalibrationError(f"cannot write {path}: the folder {folder} is not writable")
    if Path(path).is_dir():
        raise CalibrationError(f"cannot write {path}: it is a folder")


def write_hardware(path: str | Path, cal: Calibration, name: str, levels: list[dict[str, Any]],
                   extra: dict[str, Any] | None = None) -> Hardware:
    """Render, check that the loader accepts it, and write atomically; returns the loaded Hardware."""
    text = render(cal, name, levels, extra)
    hw = check_text(text, str(path))
    write_atomic(path, text)
    return hw
