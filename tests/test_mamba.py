"""The mamba2 operator (dlperf/ops/ssm.py) against hand counts, and the Nemotron 3 Nano built-in."""

import pytest

from dlperf.errors import ShapeError
from dlperf.ops import OPS
from dlperf.ops.ssm import SSD_FA2_CROSSOVER, ssd_flops
from dlperf.spec.model import load_model, model_from_dict
from dlperf.spec.yamlio import load_yaml_text

# Nemotron 3 Nano's mixer: d 2688, 64 heads of 64, state 128, 8 groups, chunk 128, conv 4, at 8192 tokens.
SPEC = """\
name: m
source: test
input: [8192]
params: {chunk: 128, groups: 8}
layers:
  - {op: embedding, vocab: 1000, dim: 2688}
  - {op: mamba2, heads: 64, head_dim: 64, state: 128, groups: groups, chunk: chunk}
"""


def mixer(**overrides):
    model = model_from_dict(load_yaml_text(SPEC, "m.yaml"), "m.yaml", overrides)
    return next(layer for layer, _ in model.counted() if layer.op == "mamba2")


def test_parameters_by_hand() -> None:
    layer = mixer()
    d, din, h, g, n = 2688, 4096, 64, 8, 128
    in_proj = d * (2 * din + 2 * g * n + h)       # 2688 x 10304
    conv = (din + 2 * g * n) * (4 + 1)           # depthwise taps and bias
    assert layer.params == in_proj + conv + 3 * h + din + din * d == 38_742_208
    assert layer.out_shape == (8192, 2688)


def test_ssd_flops_by_hand() -> None:
    t, q, h, p, n, g = 8192, 128, 64, 64, 128, 8
    forward, backward, recompute = ssd_flops(mixer(), 1)
    cb, states, intra = 2 * t * q * g * n, 2 * t * h * p * n, t * (q + 1) * h * p
    assert forward == cb + 2 * states + intra + states // q
    assert backward == 3 * intra + 4 * states + 2 * cb + states // q
    assert recompute == cb + states + states // q


def test_gemm_flops_and_model_work() -> None:
    layer = mixer()
    kernels = {k.name: k for k in OPS["mamba2"].kernels(layer, 1, 2)}
    assert kernels["in_proj"].cost.fwd_flops == 2 * 8192 * 2688 * 10304
    assert kernels["out_proj"].cost.fwd_flops == 2 * 8192 * 4096 * 2688
    ssd = kernels["ssd"]
    forward, backward, _ = ssd_flops(layer, 1)
    # priced as FlashAttention-2 over 2048 keys; MFU counts the SSD's own FLOPs
    assert ssd.cost.fwd_flops == 4 * 8192 * 64 * SSD_FA2_CROSSOVER * 64
    assert ssd.cost.work * ssd.model_work_scale == pytest.approx(forward + backward)


def test_ssd_time_work_grows_linearly_with_length() -> None:
    short = OPS["mamba2"].kernels(mixer(), 1, 2)
    spec = SPEC.replace("input: [8192]", "input: [16384]")
    model = model_from_dict(load_yaml_text(spec, "m.yaml"), "m.yaml", {})
    long = OPS["mamba2"].kernels(next(x for x, _ in model.counted() if x.op == "mamba2"), 1, 2)
    pick = {k.name: k.cost.fwd_flops for k in short}, {k.name: k.cost.fwd_flops for k in long}
    assert pick[1]["ssd"] == 2 * pick[0]["ssd"]


@pytest.mark.parametrize("overrides,message", [
    ({"groups": 3}, "mamba2 groups must divide heads"),
    ({"chunk": 100}, "mamba2 sequence must be a multiple of the chunk size"),
])
def test_bad_attribute_is_one_line(overrides, message) -> None:
    with pytest.raises(ShapeError) as info:
        mixer(**overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_nemotron_3_nano_parameters_match_the_model_card() -> None:
    model = load_model("nemotron-3-nano")
    assert model.total_params == 31_577_940_288  # model card: "31.6B total parameters"
    ops = [layer.op for layer, count in model.counted() for _ in range(count)]
    assert (ops.count("mamba2"), ops.count("moe"), ops.count("attention")) == (23, 23, 6)


def test_nemotron_3_super_parameters_by_hand() -> None:
    """Nemotron 3 Super: 40 Mamba-2, 40 LatentMoE and 8 attention layers (hybrid_override_pattern), each with its
    RMSNorm, untied embeddings and head, a final norm. LatentMoE (the moe op's `latent`): router h x 512 and its
    bias, fc1_latent_proj h x 1024, the routed experts on the 1024 latent, fc2_latent_proj 1024 x h, the shared
    expert on h (moe_layer.py @d98e8a64 :265-303); the checkpoint's counts exactly."""
    h, v, latent = 4096, 131072, 1024
    mamba = h * (2 * 8192 + 2 * 8 * 128 + 128) + (8192 + 2 * 8 * 128) * (4 + 1) + 3 * 128 + 8192 + 8192 * h + h
    moe = h + h * latent + h * 512 + 512 + 512 * 2 * latent * 2688 + latent * h + 2 * h * 5376
    attn = h + h * 32 * 128 + 2 * h * 2 * 128 + 32 * 128 * h
    backbone = 40 * mamba + 40 * moe + 8 * attn + 2 * v * h + h
    model = load_model("nemotron-3-super")
    # the checkpoint's backbone; model card: "Total Parameters 120B (12B active)"
    assert model.total_params == backbone == 120_668_707_840
    ops = [layer.op for layer, count in model.counted() for _ in range(count)]
    assert (ops.count("mamba2"), ops.count("moe"), ops.count("attention")) == (40, 40, 8)
    # one MTP depth ("*E", enorm, hnorm, eh_proj 2h x h, final norm): the checkpoint's 123,611,033,088 elements
    # (Megatron-Bridge examples/model_verification_cards/nemotron-3-super-120b-a12b/card.yaml @067f987d)
    mtp = load_model("nemotron-3-super", {"mtp_layers": 1})
    assert mtp.total_params == backbone + attn + moe + 2 * h * h + 3 * h == 123_611_033_088


def test_context_parallelism_over_mamba_layers_is_refused_in_one_line() -> None:
    """The SSD scan carries its state along the sequence; dlperf does not price a context-parallel Mamba layer, so a
    plan asking for one is refused, in one line, with exit code 2 (not priced as if the scan split for free)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "dlperf", "predict", "nemotron-3-nano", "dgx-h100", "--gpus", "16",
                          "--cp", "2", "--ep", "8", "--global-batch", "64"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "context parallelism over Mamba-2 layers" in run.stderr
