"""The command line: every command and option has help, built-ins resolve, output formats parse."""

import json
import subprocess
import sys

import click
import pytest

from dlperf.cli import COMMANDS, LazyGroup, cli


def _commands():
    return [name for name in COMMANDS if LazyGroup._load(name) is not None]


@pytest.mark.parametrize("name", _commands())
def test_every_command_and_option_has_help(name):
    command = LazyGroup._load(name)
    assert command.help, f"{name} has no help"
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts} has no help"


def test_list_shows_builtins(run):
    code, out, _ = run("list")
    assert code == 0
    for name in ("resnet50", "gpt3-175b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "dgx-a100",
                 "p100-roce", "cpu-local", "dgx-b200", "gb200-nvl72", "h800", "mi300x"):
        assert name in out


def test_show_json_totals(run):
    code, out, _ = run("show", "resnet50", "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert rows[-1]["params"] == 25_557_032


def test_show_hardware(run):
    code, out, _ = run("show", "dgx-a100")
    assert code == 0 and "312 TFLOP/s" in out


def test_predict_json_keys(run):
    code, out, _ = run("predict", "resnet50", "dgx-a100", "--global-batch", "64", "--format", "json")
    assert code == 0
    data = json.loads(out)
    for key in ("step_time_s", "throughput_samples_per_s", "model_tflops_per_device", "mfu", "breakdown_s",
                "work_flops", "memory_bytes_per_device", "fits", "plan"):
        assert key in data
    assert data["throughput_samples_per_s"] == pytest.approx(64 / data["step_time_s"])


def test_predict_ep_dispatchers(run):
    """Each dispatcher is accepted and lands in the plan; HybridEP's BF16 dispatch under an FP8 recipe moves more
    expert bytes than DeepEP's FP8 one, so its exposed comm/ep is longer."""
    args = ("predict", "mixtral-8x7b", "dgx-h100", "--gpus", "64", "--tp", "2", "--ep", "8", "--micro-batch", "1",
            "--global-batch", "64", "--dtype", "fp8", "--zero", "1", "--format", "json")
    ep = {}
    for dispatcher in ("deepep", "hybridep"):
        code, out, _ = run(*args, "--ep-dispatcher", dispatcher)
        assert code == 0
        data = json.loads(out)
        assert data["plan"]["ep_dispatcher"] == dispatcher
        ep[dispatcher] = data["breakdown_s"]["comm/ep"]
    assert ep["hybridep"] > ep["deepep"]


def test_python_m_and_bad_unit_file(tmp_path):
    hw = tmp_path / "hw.yaml"
    hw.write_text("name: x\ndevice: {name: d, peak_flops: {fp32: 1 TFLOP/s}, memory: 1 GiB, "
                  "memory_bandwidth: 300 GBs}\nnetwork:\n  - {name: n, bandwidth: 1 GB/s, latency: 1 us}\n")
    proc = subprocess.run([sys.executable, "-m", "dlperf", "show", str(hw)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "hw.yaml:2: device.memory_bandwidth" in proc.stderr and "300 GBs" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_set_must_be_a_whole_number_and_a_count_positive(run):
    code, _, err = run("show", "gpt", "--set", "layers=abc")
    assert code == 2 and "whole number" in err
    code, _, err = run("show", "gpt", "--set", "layers=0")  # a count the model needs
    assert code == 2 and "positive integer" in err
    code, _, _ = run("show", "deepseek-v3", "--set", "mtp_layers=0")  # an optional part, off by default
    assert code == 0
    # a negative value was told "expected a whole number (at most 2**53)", as if it were too large
    code, out, err = run("show", "gpt", "--set", "layers=-1")
    assert (code, out, err) == (2, "", "Error: --set layers; expected a whole number from 0 to 2**53, found '-1'\n")


def test_predict_help_says_what_is_filled_in(run):
    # --global-batch and --micro-batch said nothing of their defaults, --dp "devices/(tp*pp)" though a plan with
    # no degree given is searched for
    code, out, _ = run("predict", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "--global-batch INTEGER Samples per step over all replicas (default: one per device)." in text
    assert ("--micro-batch INTEGER Samples per micro-batch per replica (default: 1 with pipelining, else the whole "
            "per-replica batch in one pass).") in text
    assert ("With none of --dp, --tp, --pp, --ep, --etp and --cp given, the degrees are filled in: pure data "
            "parallelism when the model fits, else the fastest plan that fits; a note says which.") in text


def test_help_lists_commands():
    from click.testing import CliRunner

    out = CliRunner().invoke(cli, ["--help"]).output
    for name in ("predict", "show", "list"):
        assert name in out


@pytest.mark.parametrize("args,message", [
    (("search", "gpt", "dgx-a100", "--gpus", "8", "--global-batch", "0"), "'--global-batch'"),
    (("compare", "gpt", "dgx-a100", "--gpus", "0", "--global-batch", "8"), "'--gpus'"),
    (("sweep", "resnet50", "dgx-a100", "--gpus", "1..8", "--micro-batch", "-1"), "'--micro-batch'"),
    (("sweep", "resnet50", "dgx-a100", "--gpus", "2..8", "--weak", "--global-batch", "1"), "no sample per device"),
    (("explain", "resnet50", "dgx-a100", "--step", "-1"), "'--step'"),
    (("predict", "gpt", "dgx-a100", "--symbolic", "--gpus", "8", "--tp", "3"), "must divide the device count"),
    (("predict", "gpt2-xl", "dgx-a100", "--gpus", "8", "--compression", "bogus"), "unknown compression"),
    (("predict", "resnet50", "dgx-a100", "--plot", "/nonexistent-dir/x.png"), "cannot write the plot"),
    (("predict", "gpt", "dgx-a100", "--gpus", "16", "--pp", "8", "--schedule", "interleaved",
      "--virtual-stages", "100", "--global-batch", "64", "--micro-batch", "1"), "exceeds the layers"),
    (("predict", "gpt", "dgx-a100", "--gpus", "8", "--hybrid-fc"), "needs a convolutional body"),
    (("predict", "gpt", "dgx-a100", "--gpus", "8", "--pp", "2", "--p2p-overlap"), "needs --schedule interleaved"),
    (("predict", "gpt", "dgx-a100", "--gpus", "8", "--zero", "2", "--zero-impl", "megatron"), "expected zero: 1"),
    (("predict", "gpt", "dgx-a100", "--cuda-graphs", "attn,bogus"), "expected distinct names among attn"),
    (("predict", "gpt", "dgx-a100", "--cuda-graphs", "moe_preprocess"), "it needs moe_router"),
    (("predict", "gpt", "dgx-a100", "--cuda-graphs", "full_iteration,attn"), "full_iteration alone"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "dlperf", *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_show_hardware_lists_the_rates_kernels_are_priced_at(run):
    """`show HARDWARE` prints each curve's sustained rate and says when a kernel class borrows another's curve
    (no measurement of its own), so a user sees what a file assumes."""
    code, out, _ = run("show", "dgx-b200")
    assert code == 0
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    attention = lines["fused attention bf16 (cuDNN / FA3 class)"]  # the fit to cuDNN's measured B200 rates
    assert "x s / (s + 2355) over s keys (0.587 of peak)" in attention
    assert "the fused-attention curve's, an upper bound: none measured" in lines["FlashAttention-2 bf16"]
    assert "0.619 of peak)" in lines["GEMM rate fp8"]  # B200's own FP8 curve, the fit to XLA's B200 table
    code, out, _ = run("show", "dgx-h100")
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "none measured" not in lines["FlashAttention-2 bf16"] and "0.345 of peak)" in lines["FlashAttention-2 bf16"]
    assert "341.2 TFLOP/s x s / (s + 229) over s keys" in lines["FlashAttention-2 bf16"]
    # the measured head-dim-64 rates (dlperf.ops.headdim); Blackwell's cuDNN curve has none
    fused = lines["fused attention bf16 (cuDNN / FA3 class)"]
    assert fused.endswith("; head dim 64 at 0.688 forward, 0.847 backward of that")
    assert "head dim 64" not in attention
