"""The `dlperf` command line: parse, call the library, render. Library errors become one line and exit 2."""

from __future__ import annotations

import importlib
import sys

import click

from dlperf.errors import DlperfError, safe_text

INTERNAL = "dlperf could not handle this input; please report it"

# command name -> "module:attribute"; imported only when that command runs, so `dlperf show` does not pay
# for matplotlib or the communication engine.
COMMANDS = {
    "list": "dlperf.commands.catalog:list_cmd",
    "show": "dlperf.commands.catalog:show",
    "predict": "dlperf.commands.predict:predict",
    "compare": "dlperf.commands.predict:compare",
    "comm": "dlperf.commands.comm:comm",
    "calibrate": "dlperf.commands.calibrate:calibrate",
    "search": "dlperf.commands.search:search",
    "sweep": "dlperf.commands.search:sweep",
    "explain": "dlperf.commands.search:explain",
    "validate": "dlperf.commands.validate:validate",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self._load(name) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._load(name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:  # command not built yet
                return None
            raise
        return getattr(module, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dlperf")
def cli() -> None:
    """dlperf: predict deep-learning training step time, memory and throughput on a cluster.

    Work-depth and alpha-beta models from Ben-Nun & Hoefler, "Demystifying Parallel and Distributed Deep
    Learning" (ACM CSUR 2019), made exact enough to compare with published measurements.
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning any dlperf error into one line on stderr and exit code 2."""
    try:
        code = cli.main(args=argv, prog_name="dlperf", standalone_mode=False)
    except DlperfError as err:
        click.echo(f"Error: {err}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.UsageError as err:  # bad option values: one line, like every other input error
        click.echo(f"Error: {safe_text(err.format_message())[:1000]}", err=True)
        sys.exit(2)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except OSError as err:  # a file that cannot be written or read: its name and the system's reason
        name = f"{safe_text(str(err.filename))}: " if err.filename else ""
        click.echo(f"Error: {name}{err.strerror or type(err).__name__}", err=True)
        sys.exit(2)
    except (ArithmeticError, ValueError, TypeError, LookupError, RecursionError, MemoryError) as err:
        # The last net under the promise "one line, never a traceback": an input no check anticipated. The fuzz
        # tests (tests/test_hostile.py) fail whenever any of their inputs reaches this line.
        click.echo(f"Error: {INTERNAL} ({type(err).__name__}: {safe_text(str(err))[:200]})", err=True)
        sys.exit(2)
    # with standalone_mode=False click returns a command's ctx.exit(code) instead of exiting
    if isinstance(code, int) and code:
        sys.exit(code)
