"""`dlperf list` and `dlperf show`: what is built in, and a per-layer table of a model or a hardware spec."""

from __future__ import annotations

import click

from dlperf import builtins
from dlperf.commands.common import format_option, parse_sets, set_option, shape_text
from dlperf.plan import DTYPES
from dlperf.report import render
from dlperf.units import format_quantity


@click.command("list")
@format_option
def list_cmd(fmt: str) -> None:
    """List the built-in models and hardware, one line each with a summary."""
    from dlperf.spec.yamlio import load_yaml_file

    rows = []
    for kind in ("models", "hardware"):
        for name in builtins.builtin_names(kind):
            data = load_yaml_file(builtins.data_dir(kind) / f"{name}.yaml")
            summary = data.get("description", "") if isinstance(data, dict) else ""
            rows.append({"kind": kind[:-1] if kind == "models" else kind, "name": name, "summary": summary})
    click.echo(render(rows, fmt))


@click.command("show")
@click.argument("name")
@set_option
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="Storage dtype for activation bytes (default: the model's).")
@click.option("--survey", is_flag=True,
              help="Add the survey's asymptotic work and depth per layer (Tables 4 and 6) beside exact FLOPs.")
@format_option
def show(name: str, sets: tuple[str, ...], dtype: str | None, survey: bool, fmt: str) -> None:
    """Show a model (per-layer table with totals) or a hardware spec, by built-in name or YAML path."""
    from dlperf.spec.hardware import load_hardware

    if builtins.is_builtin(name, "hardware") or _looks_like_hardware(name):
        click.echo(_hardware_text(load_hardware(name), fmt))
        return
    from dlperf.engine.layers import layer_table
    from dlperf.spec.model import load_model

    model = load_model(name, parse_sets(sets))
    rows, totals = layer_table(model, dtype or model.dtype, survey)
    if fmt == "table":
        for row in rows:
            row["output"] = shape_text(row["output"])
        click.echo(render(rows + [totals], fmt, title=f"{model.name}: {model.description}\n(activation bytes and "
                                                       f"forward FLOPs are per sample; --format json for raw numbers)"))
    else:
        click.echo(render(rows + [totals], fmt))


def _looks_like_hardware(name: str) -> bool:
    if not name.endswith((".yaml", ".yml")):
        return False
    from pathlib import Path

    from dlperf.spec.yamlio import load_yaml_file

    data = load_yaml_file(Path(name))
    return isinstance(data, dict) and ("device" in data or "extends" in data)


# What a class borrows when `Device.curve_key` resolves it to another curve (or to dlperf's default).
_BORROWED = {"matmul": "the 16-bit curve's", "matmul/fp8": "the per-tensor FP8 curve's",
             "attention": "the FlashAttention-2 curve's",
             "attention_fa3": "the fused-attention curve's, an upper bound"}


def _borrowed(device, cls: str, dtype: str | None) -> str:  # noqa: ANN001 - Device, imported lazily
    """', ... none measured' when the class has no measured curve of its own for this dtype, else ''."""
    key = device.curve_key(cls, dtype)
    if cls == "conv" and device.derived_conv(dtype, key):
        return ", the GEMM curve's x V100's cuDNN-over-GEMM ratio: none measured"
    if key not in device.efficiency:
        return ", dlperf's default: none measured"
    own = (cls, f"{cls}/{dtype}") if cls != "matmul" or dtype in ("bf16", "fp16") else (f"{cls}/{dtype}",)
    if key in own:  # the class curve is measured in 16-bit; other GEMM dtypes borrow it unless they have one
        return ""
    return ", " + _BORROWED.get(key, "the GEMM curve's") + ": none measured"


def _efficiency_rows(device) -> list[dict[str, str]]:  # noqa: ANN001 - Device, imported lazily
    """The sustained rates the engine prices kernels at (each curve's asymptote, before per-kernel startup and
    tile quantization), so a user sees what a hardware file assumes, and where a class has no measured curve of
    its own and borrows another's."""
    def rate(cls: str, dtype: str) -> str:
        eff = device.eff(cls, dtype)
        length = f" x s / (s + {eff.seq_half:g}) over s keys" if eff.seq_half else ""
        head = (f"; head dim 64 at {eff.head_dim_64[0]:g} forward, {eff.head_dim_64[1]:g} backward of that"
                if eff.head_dim_64 else "")
        return (f"{format_quantity(eff.peak * device.peak(dtype), 'flop_rate')}{length} "
                f"({eff.peak:.3f} of peak{_borrowed(device, cls, dtype)}){head}")

    rows = [{"item": f"GEMM rate {dt}", "value": rate("matmul", dt)} for dt in device.peak_flops]
    conv_dtype = next((dt for dt in ("fp16", "bf16", "fp32") if dt in device.peak_flops), "fp32")
    rows.append({"item": f"convolution rate {conv_dtype}", "value": rate("conv", conv_dtype)})
    if "bf16" in device.peak_flops:
        rows += [{"item": "fused attention bf16 (cuDNN / FA3 class)", "value": rate("attention_fa3", "bf16")},
                 {"item": "FlashAttention-2 bf16", "value": rate("attention", "bf16")}]
    memory = device.eff("memory")
    rows.append({"item": "element-wise memory rate",
                 "value": f"{format_quantity(memory.peak * device.memory_bandwidth, 'bandwidth')} "
                          f"({memory.peak:.3f} of peak{_borrowed(device, 'memory', None)})"})
    return rows


def _hardware_text(hw, fmt: str) -> str:  # noqa: ANN001 - Hardware, imported lazily
    device = hw.device
    rows = [{"item": f"peak {dt}", "value": format_quantity(v, "flop_rate")} for dt, v in device.peak_flops.items()]
    rows += [
        {"item": "memory", "value": format_quantity(device.memory, "bytes")},
        {"item": "memory bandwidth", "value": format_quantity(device.memory_bandwidth, "bandwidth")},
        {"item": "launch latency", "value": format_quantity(device.launch_latency, "time")},
        {"item": "host time per launch", "value": f"{format_quantity(device.dispatch_forward, 'time')} forward, "
                                                  f"{format_quantity(device.dispatch_backward, 'time')} backward "
                                                  f"on {device.host_label}"},
    ]
    rows += _efficiency_rows(device)
    for level in hw.network:
        size = f"{level.size} devices" if level.size else "cluster"
        rows.append({"item": f"network {level.name} ({size})",
                     "value": f"{format_quantity(level.bandwidth, 'bandwidth')}/device, "
                              f"{format_quantity(level.latency, 'time')}, efficiency {level.efficiency:g}"})
    return render(rows, fmt, title=f"{hw.name}: {device.name}  (source: {hw.source})")
