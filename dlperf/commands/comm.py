"""`dlperf comm OP`: predicted time, algorithm and nccl-tests style bandwidths of one collective."""

from __future__ import annotations

from typing import Any

import click

from dlperf.comm import CommError, Group, collective_report, normalize_op
from dlperf.comm.engine import auto_set
from dlperf.comm.nccl import is_nccl
from dlperf.commands.common import Count
from dlperf.errors import DlperfError
from dlperf.report import FORMATS, render, to_json
from dlperf.spec.hardware import load_hardware
from dlperf.units import format_quantity, parse_quantity

GB = 1e9  # nccl-tests reports GB/s = 1e9 bytes/s
# rank counts: the bound is dlperf.plan.MAX_DEVICES; values below 1 get the command's own one-line error
RANKS = Count(-(2**20), 2**20)
MAX_SIZE_POINTS = 64  # a --sizes sweep; 1B..8GiB is 34


def parse_sizes(text: str) -> list[float]:
    """'1KiB..8GiB' -> powers of two from the first size up to the last (as nccl-tests -f 2 does)."""
    if ".." not in text:
        raise CommError(f"bad size range {text!r}", expected="LOW..HIGH, e.g. 1KiB..8GiB")
    low_text, high_text = text.split("..", 1)
    low, high = parse_quantity(low_text.strip(), "bytes"), parse_quantity(high_text.strip(), "bytes")
    if low > high:
        raise CommError(f"bad size range {text!r}", expected="LOW <= HIGH")
    if high / low > 2.0**MAX_SIZE_POINTS:  # checked before the doubling loop, which would not end at infinity
        raise CommError(f"bad size range {text!r}", expected=f"at most {MAX_SIZE_POINTS} powers of two "
                        "(commands.comm.MAX_SIZE_POINTS)")
    sizes = [low]
    while sizes[-1] * 2 <= high * (1 + 1e-12):
        sizes.append(sizes[-1] * 2)
    return sizes


def _located(parse: Any, text: str, option: str, *args: Any) -> Any:
    """Parse an option's value; a bad value names the option."""
    try:
        return parse(text, *args)
    except DlperfError as err:
        raise err.located(field=option) from None


def _bandwidth(value: float | None) -> float | None:
    return None if value is None else value / GB


def _algorithm_rows(report: Any) -> list[dict[str, Any]]:
    rows = []
    for name, time in report.times.items():
        algbw, busbw = report.bandwidths(time)
        rows.append({
            "algorithm": name + (" *" if name == report.chosen else ""),
            "time (us)": time * 1e6, "algbw (GB/s)": _bandwidth(algbw), "busbw (GB/s)": _bandwidth(busbw),
            "auto": name in report.auto_candidates,
        })
    return rows


def _sweep_row(report: Any) -> dict[str, Any]:
    return {
        "size (B)": int(report.nbytes), "size": format_quantity(report.nbytes, "bytes"),
        "time (us)": report.time * 1e6, "algbw (GB/s)": _bandwidth(report.algbw),
        "busbw (GB/s)": _bandwidth(report.busbw), "algorithm": report.chosen,
    }


def _title(report: Any, gpus: int, stride: int) -> str:
    levels = " + ".join(report.levels) or "one device"
    return (f"{report.op} of {format_quantity(report.nbytes, 'bytes')} on {gpus} GPUs (stride {stride}) "
            f"of {report.hardware}, over {levels}")


def _check_servers(algorithm: str, gpus: int) -> None:
    """'ps:S' runs S server shards on S of the group's ranks; more servers than ranks would be links that do
    not exist (and would beat the network's bandwidth)."""
    name, _, param = str(algorithm).strip().partition(":")
    if name.strip().lower() != "ps" or not param:
        return
    if not (param.isascii() and param.isdigit()) or not 1 <= int(param) <= gpus:
        raise CommError(field="--algorithm", expected=f"'ps:S' with 1 <= S <= --gpus ({gpus})", found=algorithm)


@click.command()
@click.argument("op")
@click.option("--size", default="1GiB", show_default=True, help="Message size, e.g. 64MiB (nccl-tests' size).")
@click.option("--sizes", "sizes", default=None, help="Sweep powers of two from LOW to HIGH, e.g. 1KiB..8GiB.")
@click.option("--gpus", type=RANKS, default=8, show_default=True, help="Number of ranks in the group.")
@click.option("--hardware", default="dgx-a100", show_default=True, help="Built-in hardware name or YAML path.")
@click.option("--algorithm", default="auto", show_default=True,
              help="auto (NCCL's tuner: fastest of NCCL's algorithm x protocol pairs), auto:textbook (fastest "
                   "textbook algorithm), nccl:ALGO[/PROTO] (nccl:ring, nccl:tree/LL128, nccl:nvls, ...), or a "
                   "textbook one: ring, tree, double_tree, recursive_doubling, rabenseifner, hierarchical, ps:S, ...")
@click.option("--stride", type=RANKS, default=1, show_default=True,
              help="Distance between ranks in device order (8 = one rank per 8-GPU node).")
@click.option("--concurrent", type=RANKS, default=None,
              help="Devices of one node crossing the network at once (default: from the placement).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format.")
def comm(op: str, size: str, sizes: str | None, gpus: int, hardware: str, algorithm: str, stride: int,
         concurrent: int | None, fmt: str) -> None:
    """Predict one collective OP (allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, gather,
    scatter, sendrecv) as NCCL runs it (algorithm/protocol chosen by NCCL's cost model), or a textbook
    alpha-beta algorithm, as nccl-tests would report it."""
    op = normalize_op(op)
    for name, value in (("--gpus", gpus), ("--stride", stride), ("--concurrent", concurrent)):
        if value is not None and value < 1:
            raise CommError(field=name, expected="at least 1", found=value)
    _check_servers(algorithm, gpus)
    group = Group(gpus, stride, concurrent)
    hw = load_hardware(hardware)
    if sizes is not None:
        reports = [collective_report(op, n, group, hw, algorithm) for n in _located(parse_sizes, sizes, "--sizes")]
        title = f"{op} on {gpus} GPUs (stride {stride}) of {hw.name}, over " + " + ".join(reports[0].levels)
        click.echo(render([_sweep_row(r) for r in reports], fmt, title=title))
        return
    report = collective_report(op, _located(parse_quantity, size, "--size", "bytes"), group, hw, algorithm)
    if fmt == "json":
        click.echo(to_json(report.to_dict()))
        return
    click.echo(render(_algorithm_rows(report), fmt, title=_title(report, gpus, stride)))
    if fmt == "table":
        forced = not auto_set(algorithm) and not (is_nccl(algorithm) and "/" not in algorithm)
        chosen_by = " (forced)" if forced else f" (fastest of {algorithm})"
        click.echo(f"chosen: {report.chosen}{chosen_by}")
