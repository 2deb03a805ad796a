"""Options shared by several commands (sqlite-utils style decorators) and small parsing helpers."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import click

from dlperf.errors import SpecError
from dlperf.report import FORMATS

_INT = re.compile(r"^[ \t]*[-+]?[0-9]+[ \t]*$")
_FLOAT = re.compile(r"^[ \t]*[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?[ \t]*$")


class Count(click.ParamType):
    """A whole number written in ASCII digits within [low, high] (the budget is named in the error): click's INT
    would take '١٠' (Arabic-Indic digits), '1_000' and numbers of any size."""

    name = "integer"

    def __init__(self, low: int = 1, high: int | None = None) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _INT.match(value) and len(value.strip()) <= 30:
            number = int(value)
        else:
            self.fail(f"expected a whole number in ASCII digits, found {_clip(value)}", param, ctx)
        if number < self.low or (self.high is not None and number > self.high):
            bound = f"at least {self.low:,}" if number < self.low else f"at most {self.high:,}"
            self.fail(f"expected {bound}, found {number:,}", param, ctx)
        return number


class Finite(click.ParamType):
    """A finite decimal number within a range: float('nan') and float('inf') pass click's FloatRange."""

    name = "number"

    def __init__(self, low: float | None = None, high: float | None = None, low_open: bool = False) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            number = value
        elif isinstance(value, str) and _FLOAT.match(value):
            number = float(value)
        else:
            self.fail(f"expected a finite decimal number, found {_clip(value)}", param, ctx)
        below = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        if not math.isfinite(number) or below or (self.high is not None and number > self.high):
            bound = f"{'>' if self.low_open else '>='} {self.low:g}" if self.low is not None else ""
            if self.high is not None:
                bound += (" and " if bound else "") + f"<= {self.high:g}"
            self.fail(f"expected a finite number{' ' + bound if bound else ''}, found {_clip(value)}", param, ctx)
        return number


def _clip(value: Any) -> str:
    from dlperf.errors import _short

    return _short(value)


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


class PlotPath(click.ParamType):
    """An image path whose suffix names the format: matplotlib would silently write 'x' as 'x.png', and an
    empty path used to be ignored without a word."""

    name = "path"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from pathlib import Path

        text = str(value)
        if not text.strip():
            self.fail("expected an image path such as breakdown.png, found an empty path", param, ctx)
        if Path(text).suffix.lower() not in PLOT_SUFFIXES:
            self.fail(f"expected a path ending in {', '.join(PLOT_SUFFIXES)} (the suffix picks the format), "
                      f"found {_clip(text)}", param, ctx)
        if Path(text).is_dir():
            self.fail(f"expected a file path, found the directory {_clip(text)}", param, ctx)
        return text


def format_option(fn: Callable) -> Callable:
    return click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                        help="Output format.")(fn)


def set_option(fn: Callable) -> Callable:
    return click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
                        help="Override a model parameter (repeatable), e.g. --set layers=24.")(fn)


def name_list(text: str | None) -> tuple[str, ...]:
    """A comma-separated CLI list (--recompute-modules, --input-ops, --grad-passes, --cuda-graphs) as a tuple of
    its non-empty names."""
    return tuple(name.strip() for name in (text or "").split(",") if name.strip())


def parse_sets(sets: tuple[str, ...]) -> dict[str, int | bool]:
    """'--set layers=24' pairs into {'layers': 24}; values are whole numbers (ASCII digits, at most 2**53; the model
    refuses 0 for a count whose file default is not 0), or true/false for a switch such as `--set flash=true` (the
    model file says which its parameter is). A name given twice is refused rather than silently keeping the last."""
    from dlperf.spec.expr import MAX_INT

    out: dict[str, int | bool] = {}
    for item in sets:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise SpecError("--set", expected="NAME=VALUE", found=item)
        if name in out:
            raise SpecError(f"--set {name} is given twice", expected="each name once", found=item)
        if value.lower() in ("true", "false"):
            out[name] = value.lower() == "true"
            continue
        if not _INT.match(value) or len(value) > 20:
            raise SpecError(f"--set {name}", expected="a whole number or true/false", found=value)
        if not 0 <= int(value) <= MAX_INT:
            raise SpecError(f"--set {name}", expected="a whole number from 0 to 2**53", found=value)
        out[name] = int(value)
    return out


# Exit codes (README): 0 done; 1 done, but the answer is "no" (the plan does not fit, no plan fits, the error
# is above --max-error, the calibration check failed or the machine was too noisy to judge); 2 bad input.
EXIT_NO = 1


def warn(text: str) -> None:
    """One warning line on stderr, so that a pipe reading stdout still sees it on the terminal."""
    click.echo(f"warning: {text}", err=True)


def folded_note(plan: dict[str, Any]) -> str:
    """The " etp=N" of a plan dict whose experts run on a grid of their own (etp below tp, dlperf.plan.folded), for
    the one-line plan summaries; "" otherwise."""
    etp = plan.get("etp")
    return f" etp={etp}" if etp is not None and etp != plan.get("tp") else ""


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
