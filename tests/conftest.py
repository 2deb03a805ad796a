import pytest
from click.testing import CliRunner

from dlperf.cli import cli


@pytest.fixture(scope="module")
def a100():
    from dlperf.spec.hardware import load_hardware

    return load_hardware("dgx-a100")


@pytest.fixture
def run():
    """Invoke the CLI the way a user would; returns (exit_code, stdout, stderr)."""
    from dlperf.cli import main

    def invoke(*args: str):
        runner = CliRunner()
        result = runner.invoke(cli, list(args), standalone_mode=False, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            # route through main() so library errors become exit code 2 with one line
            try:
                main(list(args))
            except SystemExit as exit_:
                return exit_.code, result.stdout, str(result.exception)
            raise result.exception
        return result.exit_code, result.stdout, result.stderr

    return invoke
