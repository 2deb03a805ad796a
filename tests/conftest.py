import contextlib
import io

import pytest


@pytest.fixture(scope="module")
def a100():
    from dlperf.spec.hardware import load_hardware

    return load_hardware("dgx-a100")


@pytest.fixture
def run():
    """Run the CLI entry point exactly as the console script does; returns (exit code, stdout, stderr)."""
    from dlperf.cli import main

    def invoke(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
        return code, out.getvalue(), err.getvalue()

    return invoke
