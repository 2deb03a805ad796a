"""`dlperf calibrate` on the command line: exit codes, one-line refusals, the file it writes, help on every option."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from dlperf.calibrate import calibration as C
from dlperf.calibrate import probes
from dlperf.calibrate.timing import TimingConfig
from dlperf.cli import cli, main
from dlperf.spec.hardware import load_hardware


@pytest.fixture
def tiny_sweep(monkeypatch):
    """Shrink the --quick tables so that a real numpy calibration takes about a second."""
    monkeypatch.setattr(probes, "SQUARE_QUICK", (16, 32, 64))
    monkeypatch.setattr(probes, "LINEAR_ROWS_QUICK", (64, 128))
    monkeypatch.setattr(probes, "BATCHED_QUICK", (16, 32))
    monkeypatch.setattr(probes, "CONV_QUICK", ("cifar-3x3-32",))
    monkeypatch.setattr(probes, "CONV_BATCH_QUICK", (1, 2))
    monkeypatch.setattr(probes, "MEMORY_QUICK", tuple(2**k for k in range(12, 19)))
    monkeypatch.setattr(C, "QUICK", TimingConfig(warmup=1, repeats=3, min_sample_s=2e-4))


def run_main(capsys, *args):
    """Run through main() as the console script does; returns (exit code, stdout, stderr)."""
    code = 0
    try:
        main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_quick_numpy_run_writes_a_loadable_file_and_a_plot(tiny_sweep, tmp_path, capsys):
    out, png = tmp_path / "mine.yaml", tmp_path / "calib.png"
    code, stdout, stderr = run_main(capsys, "calibrate", "--backend", "numpy", "--quick", "-o", str(out),
                                    "--plot", str(png), "--threads", "1")
    assert code == 0, stderr
    assert "matmul fp32" in stdout and "memory copy" in stdout and "launch latency" in stdout
    assert f"wrote {out}" in stderr
    hw = load_hardware(out)
    assert hw.name == "mine" and hw.calibration["backend"] == "numpy" and hw.calibration["threads"] == 1
    assert [lv.name for lv in hw.network] == [lv.name for lv in load_hardware("cpu-local").network]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "\x1b[" not in stderr  # no progress bar when stderr is not a terminal


def test_json_output_is_machine_readable(tiny_sweep, capsys):
    import json

    # one BLAS thread, as the test above: threads that contend with a loaded machine scatter the points
    code, stdout, _err = run_main(capsys, "calibrate", "--backend", "numpy", "--quick", "--format", "json",
                                  "--name", "x", "--threads", "1")
    assert code == 0, _err
    rows = json.loads(stdout)
    assert any(r["constant"] == "matmul fp32" for r in rows)


def test_network_from_a_built_in(tiny_sweep, tmp_path, capsys):
    out = tmp_path / "cpu-dgx.yaml"
    code, _, stderr = run_main(capsys, "calibrate", "--backend", "numpy", "--quick", "-o", str(out),
                               "--network-from", "dgx-a100")
    assert code == 0, stderr
    assert [lv.name for lv in load_hardware(out).network] == [lv.name for lv in load_hardware("dgx-a100").network]


def test_unknown_network_template_is_one_line_exit_2(tiny_sweep, tmp_path, capsys):
    out = tmp_path / "x.yaml"
    code, _, stderr = run_main(capsys, "calibrate", "--backend", "numpy", "--quick", "-o", str(out),
                               "--network-from", "dgx-a10")
    assert code == 2
    assert stderr.startswith("Error: unknown hardware 'dgx-a10'") and stderr.count("\n") == 1
    assert not out.exists()


def test_cuda_with_numpy_is_refused(capsys):
    code, _, stderr = run_main(capsys, "calibrate", "--device", "cuda", "--backend", "numpy")
    assert code == 2
    assert stderr == "Error: --device cuda needs --backend torch (numpy runs on the CPU only)\n"


def test_missing_torch_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    code, _, stderr = run_main(capsys, "calibrate", "--backend", "torch", "--quick")
    assert code == 2 and "needs PyTorch, which is not installed" in stderr and stderr.count("\n") == 1
    code, _, stderr = run_main(capsys, "calibrate", "--check", "--quick")
    assert code == 2 and stderr.startswith("Error: --check trains real models in PyTorch")


def test_comm_without_torch_says_what_it_skipped(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    code, stdout, _ = run_main(capsys, "calibrate", "comm", "--quick")
    assert code == 0
    assert stdout.startswith("skipped: communication calibration needs PyTorch")


def test_cuda_without_a_gpu_is_refused(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, _, stderr = run_main(capsys, "calibrate", "--device", "cuda", "--quick")
    assert code == 2 and "sees no CUDA device" in stderr


def test_every_option_has_help():
    group = cli.get_command(None, "calibrate")
    for command in (group, group.get_command(None, "comm")):
        for param in command.params:
            if param.name != "help":
                assert getattr(param, "help", None), f"{command.name} {param.name} has no help"
    result = CliRunner().invoke(cli, ["calibrate", "--help"])
    assert result.exit_code == 0 and "--network-from" in result.output and "comm" in result.output
