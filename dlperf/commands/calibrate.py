"""`dlperf calibrate`: time real kernels here, fit the model's constants, write a hardware YAML; `--check`
times real training steps between the calibration's sweeps and compares dlperf's predictions with them;
`dlperf calibrate comm` fits alpha-beta for gloo collectives."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from dlperf.calibrate.calibration import BACKENDS, DEVICES, Calibration
from dlperf.commands.common import EXIT_NO, Count, Finite, PlotPath, warn, wrote
from dlperf.errors import CalibrationError
from dlperf.report import FORMATS, render, to_json
from dlperf.units import format_quantity

# A used fit whose points scatter more than this (median relative residual) is reported as noisy: half of
# --check's default tolerance, so that noise alone could not fail the check.
NOISY_FIT = 0.10
# More threads than 4 per core only oversubscribes the machine (and --threads 100000 exhausted it, issue #15).
MAX_THREADS = 4 * (os.cpu_count() or 1)


class Progress:
    """A progress bar on stderr when it is a terminal; silent when piped (and in tests)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=True,
                                         item_show_func=lambda item: item)
            self.bar.__enter__()
        self.bar.length = total  # (the total can shrink once a series stops early)
        self.bar.current_item = what[:48]
        self.bar.update(done - self.bar.pos)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def _fit_rows(cal: Calibration) -> list[dict[str, Any]]:
    rows = []
    for f in cal.fits:
        memory = f.cls == "memory"
        kind = "bandwidth" if memory else "flop_rate"
        rows.append({
            "constant": f.name + ("" if f.used else "  (detail)"),
            "r_inf": format_quantity(f.fit.rate, kind),
            "best measured": format_quantity(f.fit.best_rate, kind),
            "n_1/2": format_quantity(f.fit.half, "bytes" if memory else "flops") if f.fit.half > 0 else "0",
            "R^2 (log t)": f.fit.r2, "R^2 (rate)": f.fit.r2_rate,
            "median |res|": f"{100 * f.fit.median_rel:.1f}%", "max |res|": f"{100 * f.fit.max_rel:.1f}%",
            "points": f.fit.points,
        })
    if cal.launch is not None:
        rows.append({"constant": "launch latency", "r_inf": format_quantity(cal.launch.median, "time"),
                     "median |res|": f"spread {100 * cal.launch.spread:.0f}%", "points": cal.launch.repeats})
    return rows


def _print_calibration(cal: Calibration, fmt: str) -> None:
    env = cal.environment
    title = (f"{cal.device_name}: {cal.backend} on {cal.device}, {env.get('threads')} threads, "
             f"{cal.seconds:.1f} s{' (--quick)' if cal.quick else ''}")
    click.echo(render(_fit_rows(cal), fmt, title=title))
    if fmt == "table":
        for line in cal.skipped + cal.notes:
            click.echo(f"  note: {line}")


def _comm_rows(comm: Any) -> list[dict[str, Any]]:
    return [{"collective": op, "alpha": format_quantity(f.alpha, "time") if f.alpha > 0 else "0 s",
             "bandwidth (1/beta)": format_quantity(f.bandwidth, "bandwidth"), "R^2 (log t)": f.fit.r2,
             "median |res|": f"{100 * f.fit.median_rel:.1f}%", "max |res|": f"{100 * f.fit.max_rel:.1f}%",
             "points": f.fit.points} for op, f in comm.fits.items()]


def _name_for(output: str | None, name: str | None) -> str:
    if name:
        return name
    return Path(output).stem if output else "calibrated"


@click.group("calibrate", invoke_without_command=True)
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
              help="Device to time: the CPU, or the first CUDA GPU (torch backend).")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="Library that runs the kernels; auto = torch when installed, else numpy.")
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats (under a minute on a 2-core CPU).")
@click.option("--threads", type=Count(1, MAX_THREADS), default=None,
              help="Threads for BLAS/OpenMP/torch (default: as configured; at most 4 per core).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the calibrated hardware YAML here (atomically).")
@click.option("--name", default=None, help="Hardware name in the YAML (default: the output file's stem).")
@click.option("--network-from", default=None, metavar="NAME|PATH",
              help="Copy the network levels from a built-in hardware or a YAML file (default: a measured "
                   "loopback level with --comm or --check, else the built-in cpu-local).")
@click.option("--comm", "with_comm", is_flag=True,
              help="Also time gloo collectives between 2 local processes (torch) for the network level.")
@click.option("--plot", type=PlotPath(), default=None,
              help="Save measured-vs-fitted curves to this image (PNG, SVG or PDF).")
@click.option("--check", is_flag=True,
              help="Also time real training steps in torch between the sweeps (MLP, CNN, transformer; MLP with "
                   "dp=2) and compare them with dlperf's predictions from the calibrated file.")
@click.option("--tolerance", type=Finite(0, low_open=True), default=0.20, show_default=True,
              help="--check fails when a model's |relative error| exceeds this.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format.")
@click.pass_context
def calibrate(ctx: click.Context, device: str, backend: str, quick: bool, threads: int | None, output: str | None,
              name: str | None, network_from: str | None, with_comm: bool, plot: str | None, check: bool,
              tolerance: float, fmt: str) -> None:
    """Time GEMM, convolution, memory and launch on this machine, fit the model's constants and write a
    hardware YAML (-o) that `dlperf predict` reads."""
    if ctx.invoked_subcommand is not None:
        return
    from dlperf.calibrate import calibration, hwfile, network
    from dlperf.calibrate import check as check_mod

    for destination in (output, plot):  # before minutes of timing, not after
        if destination:
            hwfile.check_destination(hwfile.output_target(destination))
    if network_from:
        network.template_levels(network_from)  # an unknown template, too

    if check:
        check_mod.require_torch()
        if backend == "numpy":
            raise CalibrationError("--check times torch training steps, so it needs --backend torch (or auto)")
        if device != "cpu":
            raise CalibrationError("--check runs its training steps on the CPU; use --device cpu")
    comm = None
    if with_comm or check:
        comm = _run_comm(quick)
    rounds = check_mod.single_process_rounds(quick) if check else None  # timed between the sweeps
    progress = Progress("calibrating" + (" (and timing the --check steps)" if check else ""))
    cal = calibration.calibrate(backend, device, quick, threads, progress, between_sweeps=rounds,
                                passes=calibration.CHECK_PASSES if check else None)
    progress.close()
    _print_calibration(cal, fmt)
    for f in cal.fits:
        if f.used and f.fit.median_rel > NOISY_FIT:
            warn(f"the {f.name} points scatter {100 * f.fit.median_rel:.0f}% around their fit (median): this machine "
                 f"was too noisy for a trustworthy curve; rerun when it is idle")
    levels = network.network_levels(network_from, comm)
    extra = comm.stamp() if comm else {}
    hw = hwfile.check_text(hwfile.render(cal, _name_for(output, name), levels, extra), output or "<calibrated>")
    if comm is not None:
        click.echo(render(_comm_rows(comm), fmt, title="gloo collectives, 2 local processes (alpha-beta fits)"))
    result = None
    if check:
        result = _run_check(hw, rounds.best, comm, quick, tolerance, fmt)
        extra = {**extra, **result.stamp()}
    if output:
        hwfile.write_hardware(output, cal, _name_for(output, name), levels, extra)
        linked = Path(output).is_symlink()
        wrote(output + (f" (through the symlink, to {hwfile.output_target(output)})" if linked else ""))
    elif fmt == "table":
        click.echo("(no hardware file written: pass -o FILE)", err=True)
    if plot:
        from dlperf.calibrate.plot import plot_calibration

        plot_calibration(cal, plot, comm)
        wrote(plot)
    if result is not None:
        noisy = too_noisy(result, cal, tolerance)
        if noisy:  # an error that the noise alone could explain is not a verdict on the model
            warn(f"check inconclusive: {noisy}")
            raise SystemExit(EXIT_NO)
        if result.failures:
            for line in result.failures:
                click.echo(f"check failed: {line}", err=True)
            raise SystemExit(EXIT_NO)


def too_noisy(result: Any, cal: Calibration, tolerance: float) -> str | None:
    """Why the machine was too noisy for the check to judge, or None.

    A measured step whose middle half of samples spreads over more than half the tolerance (or a fitted curve
    whose median residual does) cannot tell a model error of `tolerance` from the machine's own variation."""
    limit = tolerance / 2
    spreads = {f"{r.model} ({r.setup}) step": r.measured.spread for r in result.rows}
    spreads.update({f"{f.name} fit": f.fit.median_rel for f in cal.fits if f.used})
    worst = max(spreads, key=spreads.get, default=None)
    if worst is None or spreads[worst] <= limit:
        return None
    return (f"this machine was too noisy to judge a {100 * tolerance:.0f}% tolerance: the {worst} varied by "
            f"{100 * spreads[worst]:.0f}% (limit {100 * limit:.0f}%, half the tolerance); rerun when the machine is "
            f"idle (load average, other jobs)")


def _run_comm(quick: bool) -> Any:
    from dlperf.calibrate.comm import calibrate_comm

    click.echo("timing gloo allreduce / allgather / send-recv between 2 processes ...", err=True)
    return calibrate_comm(quick)


def _run_check(hw: Any, measured: dict[str, Any], comm: Any, quick: bool, tolerance: float, fmt: str) -> Any:
    """Calibrate a data-parallel rank's device (1 thread, beside a second process doing the same) while timing
    the data-parallel step between its sweeps, then predict every measured step."""
    from dlperf.calibrate import check as check_mod
    from dlperf.calibrate import hwfile, network

    click.echo("calibrating a data-parallel rank (2 processes of 1 thread at once) and timing its step ...",
               err=True)
    one, dp_measured = check_mod.data_parallel_rank(quick)
    dp_hw = hwfile.check_text(hwfile.render(one, "calibrated-1-thread", network.network_levels(None, comm)),
                              "<calibrated, 1 thread>")
    result = check_mod.run_check(hw, measured, dp_hw, dp_measured, tolerance)
    rows = [r.to_dict() for r in result.rows]
    title = (f"--check: predicted vs measured training step (SGD, fp32, CPU); median |error| "
             f"{100 * result.median_error:.1f}%")
    click.echo(render(rows, fmt, title=title))
    return result


@calibrate.command("comm")
@click.option("--quick", is_flag=True, help="Fewer message sizes and repeats.")
@click.option("--update", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Replace the network of this hardware YAML with the fitted loopback level (atomically).")
@click.option("--plot", type=PlotPath(), default=None, help="Save time-vs-size fits to this image.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format.")
def comm_cmd(quick: bool, update: str | None, plot: str | None, fmt: str) -> None:
    """Time allreduce, allgather and send/recv between 2 local processes (torch.distributed, gloo over loopback)
    and fit alpha (latency) and beta (1 / bandwidth) per collective."""
    from dlperf.calibrate.comm import calibrate_comm

    try:
        comm = calibrate_comm(quick)
    except CalibrationError as err:
        if "not installed" in str(err):
            click.echo(f"skipped: {err}")
            return
        raise
    rows = _comm_rows(comm)
    if fmt == "json":
        click.echo(to_json({"fits": rows, "stamp": comm.stamp()}))
    else:
        click.echo(render(rows, fmt, title="gloo collectives, 2 local processes (alpha-beta fits)"))
    if update:
        _update_network(update, comm)
        click.echo(f"updated the network of {update}", err=fmt != "table")
    if plot:
        _plot_comm(comm, plot)
        wrote(plot)


def _update_network(path: str, comm: Any) -> None:
    """Swap the `network:` of an existing hardware file for the measured loopback level, keep the rest."""
    import yaml

    from dlperf.calibrate import hwfile, network
    from dlperf.spec.yamlio import load_yaml_file

    data = dict(load_yaml_file(Path(path)))
    if not isinstance(data, dict):
        raise CalibrationError(f"{path} is not a hardware mapping")
    data["network"] = [network.loopback_level(comm)]
    calibration = dict(data.get("calibration") or {})
    calibration.update(comm.stamp())
    data["calibration"] = calibration
    text = "# network level measured by `dlperf calibrate comm`\n" + yaml.safe_dump(hwfile._plain(data),
                                                                                     sort_keys=False, width=110)
    hwfile.check_text(text, path)
    hwfile.write_atomic(path, text)


def _plot_comm(comm: Any, path: str) -> None:
    from dlperf.calibrate.plot import _panel, panel_grid, save

    fig, axes = panel_grid(len(comm.fits), 5.0, 3.8)
    for ax, (op, f) in zip(axes, comm.fits.items(), strict=True):
        _panel(ax, f"gloo {op}", None, f, 0.0)
    save(fig, path)
