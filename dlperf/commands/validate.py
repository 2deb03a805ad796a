"""`dlperf validate`: predictions against published measurements, with the signed error of each row and a
summary per source (see dlperf.validate for the dataset format)."""

from __future__ import annotations

import sys

import click

from dlperf.commands.common import Finite, PlotPath, format_option, wrote
from dlperf.report import render, to_json

ROW_COLUMNS = ("id", "source", "unit", "measured", "predicted", "error_pct", "evidence", "tags")
PENDING_COLUMNS = ("id", "source", "model", "hardware", "unit", "measured", "waits_for", "evidence")


@click.command("validate")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--source", "sources", multiple=True, metavar="NAME",
              help="Only rows from this source (repeatable), e.g. --source narayanan2021-table1.")
@click.option("--tag", "tags", multiple=True, metavar="TAG",
              help="Only rows carrying this tag (repeatable; all given tags must match), e.g. --tag llm-hybrid.")
@format_option
@click.option("--plot", type=PlotPath(), default=None,
              help="Write a log-log parity plot (predicted vs measured, ±10% and ±25% bands) to this PNG.")
@click.option("--max-error", type=Finite(0), default=None, metavar="PERCENT",
              help="Exit with status 1 when the overall mean absolute error (over measured rows; over the "
                   "simulated ones only when no measured row is chosen) exceeds PERCENT.")
def validate(files: tuple[str, ...], sources: tuple[str, ...], tags: tuple[str, ...], fmt: str,
             plot: str | None, max_error: float | None) -> None:
    """Compare predictions with published measurements (the built-in dataset, or FILES in the same format).

    For each row: measured and predicted figure and the signed error (predicted - measured) / measured in
    percent; then the mean, median and maximum absolute error per source and overall, and the median Spearman
    rank correlation within groups of alternative plans (same source, model, hardware, device count, global
    batch and unit). Rows marked `pending:` (features dlperf does not model yet) are listed, not scored; rows
    whose figure is another model's output (evidence `simulated`) are summarised with their source but left out
    of the overall figures and of --max-error.
    `--format csv` holds the per-row table only; `json` holds the rows, the summary, the plan groups and the
    pending rows.
    """
    from dlperf.errors import DlperfError
    from dlperf.validate import (
        evaluate,
        is_layout_group,
        load_all,
        mean_abs_error,
        median_spearman,
        parity_plot,
        pending_rows,
        plan_groups,
        predicted_unfit,
        result_rows,
        select,
        simulated_line,
        summary,
        unfit_line,
        unscorable,
    )

    rows, pending = load_all(files or None)
    waiting = select(pending, sources, tags)
    chosen = select(rows, sources, tags)
    if not chosen and waiting:  # only rows that wait for a feature: list them, nothing to score
        _echo_pending(waiting, fmt)
        return
    if not chosen:
        known = ", ".join(dict.fromkeys(r.source for r in [*rows, *pending]))
        raise DlperfError("no rows match the --source/--tag filters", expected=f"a source among {known}",
                          found=",".join(sources + tags))
    results = evaluate(chosen, universe=rows)
    per_row, stats, groups = result_rows(results), summary(results), plan_groups(results)
    rho, layout_rho = median_spearman(results), median_spearman(results, layout_only=True)
    if fmt == "json":
        click.echo(to_json({"rows": per_row, "summary": stats, "groups": groups, "median_spearman": rho,
                            "median_spearman_layout": layout_rho, "pending": pending_rows(waiting),
                            "predicted_unfit": [r.row.id for r in predicted_unfit(results)]}))
    elif fmt == "csv":
        click.echo(render(per_row, "csv", ROW_COLUMNS), nl=False)
    else:
        click.echo(render(per_row, "table", ROW_COLUMNS, title="Predicted vs measured (error = signed %)"))
        click.echo()
        click.echo(render(stats, "table", title="Absolute % error per source"))
        ranked = [g for g in groups if g["spearman"] is not None and g["measured"]]
        click.echo(_spearman_line("median within-group Spearman over measured rows (alternative plans for one model, "
                                  "cluster and batch)",
                                  rho, ranked))
        click.echo(_spearman_line("  only groups at one precision (parallel layout, micro-batch, recomputation vary)",
                                  layout_rho, [g for g in ranked if is_layout_group(g)]))
        for line in (simulated_line(results), unfit_line(results)):
            if line:
                click.echo(line)
        if waiting:
            click.echo()
            _echo_pending(waiting, fmt)
    if plot:
        parity_plot(results, plot)
        wrote(plot)
    if max_error is None:
        return
    missing = unscorable(results)
    if missing:
        names = ", ".join(r.row.id for r in missing[:5]) + (" ..." if len(missing) > 5 else "")
        click.echo(f"{len(missing)} row(s) could not be scored (no finite prediction): {names}; --max-error fails",
                   err=True)
        sys.exit(1)
    if mean_abs_error(results) > max_error:
        click.echo(f"mean absolute error {mean_abs_error(results):.1f}% exceeds --max-error {max_error:g}%", err=True)
        # sys.exit, not click's Exit: with standalone_mode=False click returns Exit's code instead of exiting.
        sys.exit(1)


def _spearman_line(label: str, rho: float | None, groups: list) -> str:
    return f"{label}: " + (f"{rho:.2f} over {len(groups)} groups" if rho is not None else "no groups")


def _echo_pending(waiting: list, fmt: str) -> None:
    from dlperf.validate import pending_rows

    if fmt == "json":
        click.echo(to_json({"rows": [], "summary": [], "groups": [], "median_spearman": None,
                            "median_spearman_layout": None, "pending": pending_rows(waiting)}))
    elif fmt == "csv":
        click.echo(render(pending_rows(waiting), "csv", PENDING_COLUMNS), nl=False)
    else:
        click.echo(render(pending_rows(waiting), "table", PENDING_COLUMNS,
                          title=f"Pending: {len(waiting)} published rows dlperf does not model yet (not scored)"))
