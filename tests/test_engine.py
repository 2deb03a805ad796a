"""Predictions: invariants of the step-time model, plan validation, and single-device accuracy against
published measurements (../shared/reference/PUBLISHED_MEASUREMENTS.md)."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf.engine import predict
from dlperf.errors import PlanError
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

GPT_SMALL = {"layers": 8, "hidden": 1024, "heads": 16, "seq": 512, "vocab": 32000}


@pytest.fixture(scope="module")
def gpt():
    return load_model("gpt", GPT_SMALL)


def scaled(hw, peak=1.0, mem=1.0, net=1.0):
    device = replace(hw.device, peak_flops={k: v * peak for k, v in hw.device.peak_flops.items()},
                     memory_bandwidth=hw.device.memory_bandwidth * mem)
    network = tuple(replace(level, bandwidth=level.bandwidth * net) for level in hw.network)
    return replace(hw, device=device, network=network)


@settings(max_examples=25, deadline=None)
@given(st.floats(1.0, 4.0), st.floats(1.0, 4.0), st.floats(1.0, 4.0),
       st.sampled_from([(8, 1, 1), (2, 4, 1), (2, 2, 2)]))
def test_faster_hardware_never_slower(gpt, a100, peak, mem, net, degrees):
    dp, tp, pp = degrees
    plan = Plan(devices=8, dp=dp, tp=tp, pp=pp, global_batch=32, micro_batch=2 if pp > 1 else None)
    base = predict(gpt, a100, plan).step_time_s
    faster = predict(gpt, scaled(a100, peak, mem, net), plan).step_time_s
    assert faster <= base * (1 + 1e-12)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64))
def test_larger_batch_never_lowers_work(gpt, a100, b1, b2):
    small, large = sorted((b1, b2))
    w_small = predict(gpt, a100, Plan(global_batch=small)).work_flops
    w_large = predict(gpt, a100, Plan(global_batch=large)).work_flops
    assert w_large >= w_small


def test_one_device_plan_equals_single_device(gpt, a100):
    single = predict(gpt, a100, Plan(global_batch=8))
    explicit = predict(gpt, a100, Plan(devices=1, dp=1, tp=1, pp=1, global_batch=8, micro_batch=8))
    assert explicit.step_time_s == pytest.approx(single.step_time_s, rel=1e-12)
    assert single.breakdown_s["comm/dp_allreduce"] == 0 and single.breakdown_s["pipeline/bubble"] == 0


@pytest.mark.parametrize("m", [1, 4, 16])
def test_gpipe_bubble_is_the_other_stages_passes(gpt, a100, m):
    """Fill and drain cross every stage but the slowest once, at that stage's pace; with equal stages this is
    GPipe's (pp-1)/(m+pp-1) of the step (Huang et al. 2019, section 2.3), and never more."""
    from dlperf.engine.step import StepModel

    pp = 4
    plan = Plan(devices=4, pp=pp, global_batch=m, micro_batch=1, schedule="gpipe")
    engine = StepModel(gpt, a100)
    r = engine.predict(plan)
    stages, slow, _, _ = engine.stages(plan, "fp16", 2)
    passes = [engine._passes(plan, s, "fp16", m) for s in stages]
    slowest = engine._passes(plan, slow, "fp16", m)
    others = sum(p.fwd + p.bwd for p in passes) - (slowest.fwd + slowest.bwd)
    bubble = r.breakdown_s["pipeline/bubble"]
    assert bubble == pytest.approx(others, rel=1e-12)
    busy = m * (slowest.fwd + slowest.bwd)
    assert bubble / (busy + bubble) <= (pp - 1) / (m + pp - 1) * (1 + 1e-12)


def test_zero3_model_states_fall_as_one_over_dp(gpt, a100):
    def states(dp):
        mem = predict(gpt, a100, Plan(devices=dp, global_batch=dp * 2, zero=3)).memory
        return mem["weights"] + mem["gradients"] + mem["optimizer"]
    assert states(2) / states(8) == pytest.approx(4.0)


def test_mixed_precision_adam_is_16_bytes_per_parameter(gpt, a100):
    mem = predict(gpt, a100, Plan(global_batch=1, dtype="fp16")).memory
    params = float(gpt.total_params)
    assert (mem["weights"] + mem["gradients"] + mem["optimizer"]) / params == pytest.approx(16.0)


def test_plan_that_cannot_fit_says_so(a100):
    result = predict(load_model("gpt3-175b"), a100, Plan(global_batch=1))
    assert not result.fits and result.memory_bytes_per_device > a100.device.memory


def test_recompute_trades_time_for_memory(gpt, a100):
    none = predict(gpt, a100, Plan(global_batch=8))
    full = predict(gpt, a100, Plan(global_batch=8, recompute="full"))
    assert full.step_time_s > none.step_time_s
    assert full.memory["activations"] < none.memory["activations"]


def test_full_recompute_reruns_the_blocks_only(gpt, a100):
    """Megatron-LM and the FSDP stacks checkpoint each transformer block: the recomputed forward is the blocks'
    forward, not the embeddings', final norm's or output layer's; torchgpipe's except_last reruns the partition."""
    from dlperf.engine.layers import tp_uses
    from dlperf.engine.stage import _full_rerun

    rerun = {use.layer.name for use in tp_uses(gpt) if _full_rerun("full", use)}
    assert {"attention", "linear", "layernorm"} <= rerun
    assert not rerun & {"token_embedding", "position_embedding", "final_layernorm", "lm_head", "cross_entropy"}
    partition = {use.layer.name for use in tp_uses(gpt) if _full_rerun("except_last", use)}
    assert {"token_embedding", "final_layernorm", "lm_head"} <= partition
    full = predict(gpt, a100, Plan(global_batch=8, recompute="full")).breakdown_s
    assert full["compute/recompute"] < full["compute/forward"]


def test_breakdown_files_the_rerun_collectives_under_comm():
    """Full recomputation reruns the blocks' forward, their tp collectives, expert all-to-alls and cp exchange
    included (stage_cost). The breakdown files the forward's collectives under comm/*, so the rerun's go there too:
    compute/recompute is the rerun kernels, at most the forward's (the README's GPT-3 plan showed recompute 6.88 s
    over a forward of 6.20 s, its 1.02 s of rerun all-reduces counted as compute), and the parts still sum to the
    step."""
    gpt3, a100 = load_model("gpt3-175b"), load_hardware("dgx-a100")
    plan = Plan(devices=1024, tp=8, pp=16, global_batch=1536, micro_batch=1, recompute="full")
    full, none = predict(gpt3, a100, plan), predict(gpt3, a100, plan.with_(recompute="none"))
    b = full.breakdown_s
    assert 0 < b["compute/recompute"] < b["compute/forward"]
    # the extra tp time of the rerun is the blocks' forward all-reduces: more than a third of the forward's comm/tp
    extra = b["comm/tp"] - none.breakdown_s["comm/tp"]
    assert extra > 0.3 * none.breakdown_s["comm/tp"]
    assert sum(b.values()) == pytest.approx(full.step_time_s, rel=1e-12)
    moe = load_model("mixtral-8x7b", {"layers": 4, "seq": 1024})  # short: the ring exchange stays exposed
    h100 = load_hardware("dgx-h100")
    cp_ep = Plan(devices=64, pp=2, cp=4, ep=8, global_batch=64, micro_batch=1, recompute="full")
    with_rerun, without = predict(moe, h100, cp_ep), predict(moe, h100, cp_ep.with_(recompute="none"))
    for part in ("comm/ep", "comm/cp"):
        assert with_rerun.breakdown_s[part] > without.breakdown_s[part] > 0
    assert with_rerun.breakdown_s["compute/recompute"] <= with_rerun.breakdown_s["compute/forward"]
    assert sum(with_rerun.breakdown_s.values()) == pytest.approx(with_rerun.step_time_s, rel=1e-12)


def test_step_flops_count_the_recomputation_the_engine_reruns():
    """Narayanan et al. 2021 eq. 3 counts a transformer layer's GEMMs four times under full recomputation and the
    output layer's logits three times (6BshV: the head is not rerun): 96Bslh^2 (1 + s/6h + V/16lh). dlperf's matrix
    FLOPs meet it as closely as they meet the no-recomputation form, 72Bslh^2 (1 + s/6h + V/12lh)."""
    from dlperf.engine.step import step_flops

    B, s, layers, h, V = 1536, 2048, 96, 12288, 51200
    model = load_model("gpt", {"hidden": h, "heads": 96, "layers": layers, "seq": s, "vocab": V})
    full = step_flops(model, Plan(devices=8, global_batch=B, recompute="full"), 2)[2]
    none = step_flops(model, Plan(devices=8, global_batch=B, recompute="none"), 2)[2]
    eq3 = 96 * B * s * layers * h**2 * (1 + s / (6 * h) + V / (16 * layers * h))
    without = 72 * B * s * layers * h**2 * (1 + s / (6 * h) + V / (12 * layers * h))
    assert abs(none / without - 1) < 2e-5
    assert full / eq3 - 1 == pytest.approx(none / without - 1, abs=1e-5)


def test_a_model_without_blocks_reruns_nothing_in_time_or_flops(a100):
    """AlexNet is a plain sequence of layers, no block for full recomputation to checkpoint: the engine reruns
    nothing, so the FLOPs with recomputation are the FLOPs without."""
    from dlperf.engine.step import step_flops

    model = load_model("alexnet")
    full, none = (Plan(global_batch=64, recompute=r) for r in ("full", "none"))
    assert predict(model, a100, full).breakdown_s["compute/recompute"] == 0
    assert step_flops(model, full, 2) == step_flops(model, none, 2)


@pytest.mark.parametrize("name,pps", [("vgg16", (1, 2, 3)), ("bert-large", (1, 4, 5))])
def test_what_full_recompute_reruns_does_not_depend_on_the_pipeline_split(a100, name, pps):
    """A layer directly inside a block (a post-LN LayerNorm, a VGG convolution) stays inside it when a balanced
    split opens the block into units: the share of the forward that is rerun is the same at every pp."""
    from dlperf.engine.step import StepModel

    model = load_model(name)
    shares = []
    for pp in pps:
        plan = Plan(devices=pp, pp=pp, global_batch=64, micro_batch=8, recompute="full")
        stages = StepModel(model, a100).stages(plan, "fp16", 2)[0]
        shares.append(sum(s.recompute for s in stages) / sum(s.forward for s in stages))
    assert shares[0] > 0.5  # the blocks are most of the forward (VGG16 0.78: its classifier is not rerun)
    assert max(shares) - min(shares) < 1e-9


def test_layers_full_recompute_does_not_rerun_keep_their_activations_per_micro_batch_in_flight(a100):
    """GPT-2 XL on 4 GPipe stages of 16 micro-batches: the last stage's final LayerNorm, output layer and loss are
    not rerun, so their activations (over 200 MiB a micro-batch) are held 16 times."""
    from dlperf.engine.step import StepModel

    model = load_model("gpt2-xl")
    plan = Plan(devices=4, pp=4, global_batch=16, micro_batch=1, recompute="full", schedule="gpipe")
    last = StepModel(model, a100).stages(plan, "fp16", 2)[0][-1]
    assert last.saved_outside > 200 * 2**20
    assert predict(model, a100, plan).memory["activations"] > 16 * last.saved_outside


def test_more_dp_never_raises_per_device_compute(gpt, a100):
    two = predict(gpt, a100, Plan(devices=2, global_batch=64))
    eight = predict(gpt, a100, Plan(devices=8, global_batch=64))
    assert eight.breakdown_s["compute/forward"] < two.breakdown_s["compute/forward"]


@pytest.mark.parametrize("plan,message", [
    (Plan(devices=8, dp=2, tp=2, pp=1, global_batch=8), r"dp\*tp\*pp must equal"),
    (Plan(devices=32, tp=32, global_batch=8), "must divide the attention heads"),
    (Plan(devices=4, global_batch=6), "not divisible by dp"),
    (Plan(devices=64, pp=64, global_batch=64, micro_batch=1), "exceeds the number of layers"),
])
def test_bad_plans(gpt, a100, plan, message):
    with pytest.raises(PlanError, match=message):
        predict(gpt, a100, plan)


def test_bad_plan_on_cli_exits_2(run):
    code, _, err = run("predict", "gpt", "dgx-a100", "--gpus", "8", "--dp", "3", "--tp", "2")
    assert code == 2 and "dp*tp*pp" in err


# Single-device throughput, PUBLISHED_MEASUREMENTS.md section 10 (NVIDIA DeepLearningExamples @729963dd,
# PyTorch/Classification/ConvNets/resnet50v1.5/README.md and PyTorch/LanguageModeling/BERT/README.md).
# Tolerance 15% (issue 3). Rows the model misses stay visible as strict xfails with the measured error.
SINGLE_GPU = [
    ("resnet50", {}, "dgx1-v100", "fp32", 112, 367, None),
    ("resnet50", {}, "dgx1-v100", "fp16", 256, 1200, None),
    ("resnet50", {}, "dgx-a100", "tf32", 256, 938,
     "predicts ~1330 img/s (+42%) at the plan's default channels_last layout: DeepLearningExamples ran TF32 in "
     "NCHW, whose cuDNN layout transposes the validation row prices (memory_format nchw: 931 img/s, -0.8%)"),
    ("resnet50", {}, "dgx-a100", "fp16", 256, 2470, None),
    ("bert-large", {"seq": 128}, "dgx-a100", "fp16", 256, 580, None),
    ("bert-large", {"seq": 512}, "dgx-a100", "fp16", 32, 210,
     "predicts ~125 seq/s (-41%) for dense seq-512 samples; the measured run is not dense: its phase-2 data is "
     "binned by length (LDDL, bins of 64) and each mini-batch is padded only to its longest sequence, whose "
     "distribution is not published (the validation rows are pending for it). Its attention is unfused "
     "(DeepLearningExamples@729963dd modeling.py: bmm, softmax, dropout, bmm), as modelled"),
]


@pytest.mark.parametrize("model,sets,hardware,dtype,batch,measured,miss", SINGLE_GPU)
def test_single_gpu_throughput_within_15_percent(request, model, sets, hardware, dtype, batch, measured, miss):
    if miss:
        request.applymarker(pytest.mark.xfail(strict=True, reason=miss))
    result = predict(load_model(model, sets), load_hardware(hardware), Plan(global_batch=batch, dtype=dtype))
    assert result.throughput_samples_per_s == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize("args,message", [
    (("--gpus", "8", "--tp", "16"), "tp*pp = 16 must divide the device count 8"),
    (("--gpus", "0"), "Invalid value for '--gpus'"),
    (("--gpus", "8", "--dp", "3", "--tp", "2"), "dp*tp*pp must equal"),
])
def test_bad_degrees_on_cli_exit_2(run, args, message):
    code, _, err = run("predict", "gpt", "dgx-a100", *args)
    assert code == 2 and message in err


def test_one_weird_trick_allreduces_only_the_convolutions():
    # Krizhevsky 2014: data-parallel convolutions (few parameters), model-parallel FC layers (most of them).
    model, hw = load_model("alexnet"), load_hardware("dgx1-v100")
    data = predict(model, hw, Plan(devices=8, global_batch=1024, optimizer="momentum", overlap=False))
    hybrid = predict(model, hw, Plan(devices=8, global_batch=1024, optimizer="momentum", overlap=False,
                                     hybrid_fc=True))
    assert hybrid.breakdown_s["comm/dp_allreduce"] < 0.1 * data.breakdown_s["comm/dp_allreduce"]
    assert hybrid.breakdown_s["comm/tp"] > 0 and data.breakdown_s["comm/tp"] == 0
    assert hybrid.memory["weights"] < 0.2 * data.memory["weights"]  # the FC weights are split 8 ways


def test_hybrid_fc_needs_plain_data_parallel_degrees(run):
    code, _, err = run("predict", "alexnet", "dgx1-v100", "--gpus", "8", "--tp", "2", "--hybrid-fc")
    assert code == 2 and "hybrid-fc" in err


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 9000), st.integers(1, 9000), st.integers(1, 9000),
       st.sampled_from(["m", "n", "k", "batch"]), st.integers(1, 3000))
def test_a_larger_gemm_is_never_faster(batch, m, n, k, grow, extra):
    """Tile/wave quantization with split-K (engine/device.py) is a step function of the shape, but never steps
    down: every split choice's time grows with m, n, k and the batch, so their minimum does too."""
    from dlperf.engine.device import gemm_quantization, phase_time
    from dlperf.ops.dense import gemm
    from dlperf.spec.hardware import load_hardware

    device = load_hardware("dgx-a100").device

    def seconds(b: int, rows: int, cols: int, inner: int) -> float:
        kernel = gemm("g", rows, inner, cols, 2)
        kernel = replace(kernel, gemm=(b, rows, cols, inner))
        flops = b * kernel.cost.fwd_flops
        quantization = gemm_quantization(kernel, device, "fp16", 1, None)[0]
        return phase_time(flops, 0, 1, "matmul", device, "fp16", quantization)

    shape = {"batch": batch, "m": m, "n": n, "k": k}
    bigger = dict(shape, **{grow: shape[grow] + extra})
    larger = seconds(bigger["batch"], bigger["m"], bigger["n"], bigger["k"])
    assert larger >= seconds(batch, m, n, k) * (1 - 1e-12)


def test_a_slow_host_makes_the_pass_host_bound():
    """max(device, host) per pass: with a host that needs 1 ms per kernel (a slow CPU, or a calibrated file),
    the step waits for the host longer and the breakdown says so (LeNet-5 at batch 8 is host-bound on an A100
    even with the default constants: its kernels last microseconds)."""
    from dlperf.spec.hardware import load_hardware

    model, hw = load_model("lenet5"), load_hardware("dgx-a100")
    plan = Plan(global_batch=8)
    fast = predict(model, hw, plan)
    slow_host = replace(hw, device=replace(hw.device, dispatch_forward=1e-3, dispatch_backward=1e-3))
    slow = predict(model, slow_host, plan)
    assert slow.breakdown_s["overhead/host"] > fast.breakdown_s["overhead/host"] > 0
    assert slow.step_time_s > fast.step_time_s
    assert sum(slow.breakdown_s.values()) == pytest.approx(slow.step_time_s, rel=1e-12)


def test_zero3_counts_the_gathered_working_set():
    """ZeRO-3 holds two gathered blocks' parameters (computed + prefetched) and one block's full gradient: with
    llama2-7b's 32 blocks in bf16 that is (2*2 + 2) bytes x params / 32 on top of the sharded states."""
    from dlperf.spec.hardware import load_hardware

    model, hw = load_model("llama2-7b"), load_hardware("dgx-a100")
    plan = Plan(devices=8, dp=8, zero=3, global_batch=8, micro_batch=1, recompute="full")
    r = predict(model, hw, plan)
    assert r.memory["gathered"] == pytest.approx(model.total_params / 32 * 6, rel=0.02)
    assert "gathered" not in predict(model, hw, plan.with_(zero=1)).memory


@pytest.mark.parametrize("name, hardware, base, knobs", [
    ("resnet50", "dgx-a100", Plan(devices=8, global_batch=2048, micro_batch=256, dtype="fp16"),
     {"memory_format": "nchw", "zero": 2, "grad_dtype": "fp32", "optimizer": "sgd", "overlap": False,
      "optimizer_impl": "per-tensor", "dp_impl": "horovod-0.19"}),
    ("mixtral-8x7b", "dgx-h100", Plan(devices=16, ep=8, global_batch=64, micro_batch=1, dtype="bf16"),
     {"ep_overlap": True, "zero": 3, "grad_dtype": "fp32", "moe_imbalance": 1.0, "ep_dispatcher": "hybridep"}),
    ("mixtral-8x7b", "dgx-h100", Plan(devices=16, ep=8, global_batch=64, micro_batch=1, dtype="fp8",
                                      ep_dispatcher="deepep"),
     {"fp8_scaling": "current", "ep_dispatcher": "hybridep"}),
    ("llama3-8b", "dgx-h100", Plan(devices=8, global_batch=16, micro_batch=1, dtype="fp8"),
     {"fp8_scaling": "current", "zero": 1, "grad_dtype": "fp32"}),
    ("llama3-8b", "dgx-b200", Plan(devices=8, global_batch=16, micro_batch=1, dtype="mxfp8"),
     {"mx_swizzle": "gemm", "zero": 1}),
    # the fused-attention curve a plan's cuDNN version picks (Device.for_cudnn), and back to the default
    ("llama3-8b", "dgx-gb300", Plan(devices=8, global_batch=16, micro_batch=1, dtype="bf16"), {"cudnn": "9.13.1"}),
    ("llama3-8b", "dgx-gb300", Plan(devices=8, global_batch=16, micro_batch=1, dtype="bf16", cudnn="9.17.0"),
     {"cudnn": None}),
    # Megatron's overlapped parameter gather reads the schedule (an interleaved pipeline's first chunk is exposed)
    ("llama3-8b", "dgx-h100", Plan(devices=16, dp=4, pp=4, global_batch=64, micro_batch=1, zero=1, overlap=True,
                                   zero_impl="megatron", schedule="interleaved", virtual_stages=2),
     {"virtual_stages": 4}),
])
def test_memoised_stage_costs_never_leak_between_plans(name, hardware, base, knobs):
    """StepModel memoises stage costs by a key of the plan's fields; a plan that differs in one knob must be
    priced as a fresh engine prices it (the key once lacked the convolution memory format, so an engine that
    had seen nhwc priced nchw as nhwc)."""
    from dlperf.engine.step import StepModel

    model, hw = load_model(name), load_hardware(hardware)
    for field, value in knobs.items():
        plan = base.with_(**{field: value})
        engine = StepModel(model, hw)
        engine.predict(base)
        assert engine.predict(plan).step_time_s == predict(model, hw, plan).step_time_s, field


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 8.0]), min_size=1, max_size=24), st.integers(1, 8))
def test_balanced_partition_is_the_first_best_cut_of_the_plain_dynamic_programme(costs, pp):
    """The vectorised split equals the textbook DP that scans every cut and keeps the first one attaining the
    minimum (costs on a binary grid, so sums are exact and ties are real ties)."""
    from dlperf.engine.pipeline import balanced_partition

    pp = min(pp, len(costs))
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[math.inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                slowest = max(best[k - 1][i], prefix[j] - prefix[i])
                if slowest < best[k][j]:
                    best[k][j], cut[k][j] = slowest, i
    expected, j = [], n
    for k in range(pp, 0, -1):
        expected.append((cut[k][j], j))
        j = cut[k][j]
    split = balanced_partition(costs, pp)
    assert split == expected[::-1]
    assert max(prefix[j] - prefix[i] for i, j in split) == best[pp][n]
