"""Options shared by several commands (sqlite-utils style decorators) and small parsing helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from dlperf.errors import SpecError
from dlperf.report import FORMATS


def format_option(fn: Callable) -> Callable:
    return click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                        help="Output format.")(fn)


def set_option(fn: Callable) -> Callable:
    return click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
                        help="Override a model parameter (repeatable), e.g. --set layers=24.")(fn)


def parse_sets(sets: tuple[str, ...]) -> dict[str, int | bool]:
    """'--set layers=24' pairs into {'layers': 24}; values are positive integers, or true/false for a switch
    such as `--set flash=true` (the model file says which its parameter is)."""
    out: dict[str, int | bool] = {}
    for item in sets:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise SpecError("--set", expected="NAME=VALUE", found=item)
        if value.lower() in ("true", "false"):
            out[name] = value.lower() == "true"
            continue
        try:
            number = int(value)
        except ValueError:
            raise SpecError(f"--set {name}", expected="a positive integer or true/false", found=value) from None
        if number < 1:
            raise SpecError(f"--set {name}", expected="a positive integer", found=value)
        out[name] = number
    return out


# Exit codes (README): 0 done; 1 done, but the answer is "no" (the plan does not fit, no plan fits, the error
# is above --max-error, the calibration check failed or the machine was too noisy to judge); 2 bad input.
EXIT_NO = 1


def warn(text: str) -> None:
    """One warning line on stderr, so that a pipe reading stdout still sees it on the terminal."""
    click.echo(f"warning: {text}", err=True)


def exit_unless_fits(result: Any) -> None:
    """A prediction of a plan that does not fit is printed, then said on stderr and ends with exit code 1."""
    if not result.fits:
        warn(next((n for n in result.notes if n.startswith("DOES NOT FIT")), "the plan does not fit in memory"))
        raise SystemExit(EXIT_NO)


def wrote(path: str) -> None:
    """Every command that writes a file says which, on stderr (stdout stays the result)."""
    click.echo(f"wrote {path}", err=True)


def shape_text(shape: tuple[Any, ...]) -> str:
    return "x".join(str(d) for d in shape)
