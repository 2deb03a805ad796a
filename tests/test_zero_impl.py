"""ZeRO-3 as DeepSpeed v0.3 runs it (plan key zero_impl: deepspeed-0.3; dlperf/engine/zero_impl.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dlperf.engine import zero_impl
from dlperf.engine.step import StepModel
from dlperf.errors import DlperfError
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model
from dlperf.validate import _predict, load_dataset
from tests.test_monotone import CONSTANTS, faster
from tests.test_validate import TINY, write

GPT3 = {"hidden": 12288, "heads": 96, "layers": 96, "seq": 2048, "vocab": 51200}


@pytest.fixture(scope="module")
def hw():
    return load_hardware("dgx-a100")


@pytest.fixture(scope="module")
def gpt3():
    return load_model("gpt", GPT3)


def ds(plan: Plan) -> Plan:
    return plan.with_(zero_impl="deepspeed-0.3")


def traffic(hw, nbytes: float, passes: int) -> float:
    """Seconds of `passes` sweeps over `nbytes` of device memory at the A100's BabelStream bandwidth (1.70 TB/s)."""
    return passes * nbytes / (2039e9 * 0.834)


def test_gathers_and_reductions_pay_their_copies_in_device_memory(hw):
    """A gather zero-fills its output (1 sweep, PP L607-609), then PyTorch copies the flattened result back (2); a
    gradient bucket is flattened, divided and copied back (6 sweeps, S3 L1794-1827): 1.70 TB/s on an A100."""
    assert (zero_impl.ZERO_FILL, zero_impl.COPY_BACK) == (1, 2)
    assert zero_impl._traffic(hw, 1e9, 3) == pytest.approx(3e9 / 1.7005e12, rel=1e-3)
    assert zero_impl._traffic(hw, 1e9, zero_impl.REDUCE_TRAFFIC) == pytest.approx(6e9 / 1.7005e12, rel=1e-3)


@pytest.mark.parametrize(("hidden", "heads", "layers"), [(20480, 128, 105), (12288, 96, 96)])
def test_the_working_set_is_what_the_prefetch_cap_lets_live(hidden, heads, layers):
    """530B (h 20480): qkv 3h^2 = 1.26e9 and fc1/fc2 4h^2 = 1.68e9 each exceed stage3_max_live_parameters, so
    only dense (h^2) prefetches fc1: 5h^2 weights live; the gradients of the largest tensor, fc1, and its
    flattened copy 8h^2. 175B (h 12288): every tensor is under 1e9, so fc1 prefetches fc2 (8h^2 live); the word
    embedding (51200 x 12288 = 6.29e8 > 4h^2) holds the largest gradient. fp16: 2 bytes each."""
    model = load_model("gpt", {"hidden": hidden, "heads": heads, "layers": layers, "seq": 2048, "vocab": 51200})
    plan = Plan(devices=640, dp=640, zero=3, global_batch=640, recompute="full", zero_impl="deepspeed-0.3")
    live = zero_impl.working_set(zero_impl.tensors(model, plan), plan, 2, 2)
    h2 = float(hidden) ** 2
    expected = 2 * (5 * h2 + 8 * h2) if hidden == 20480 else 2 * (8 * h2 + 2 * 51200 * hidden)
    assert live == pytest.approx(expected)


def test_the_530b_zero3_row_that_ran_is_predicted_to_fit():
    """Narayanan et al. 2021 Table 2: ZeRO-3 ran the 530B model on 640 GPUs at micro-batch 4 (not on 560)."""
    row = next(r for r in load_dataset() if r.id == "narayanan2021-t2-530b-zero3-640")
    assert _predict(row)[0].memory_bytes_per_device < 80 * 2**30


def test_tensors_follow_the_persistence_threshold_and_megatrons_modules(gpt3):
    parted, persistent, total = zero_impl.tensors(gpt3, Plan(devices=8, zero=3, global_batch=8))
    h = 12288
    # per block: query_key_value (3h^2), dense (h^2), the two MLP weights (4h^2); norms and biases (< 1e5) persist
    assert [n / h**2 for n, c in parted if c == 96] == [3.0, 1.0, 4.0, 4.0]
    assert [c for n, c in parted if c == 1] == [1, 1]  # token and position embeddings
    # two norms (weight, bias) and four biases per block, the final norm once
    assert [n / h for n, c in persistent if c == 96] == [1, 1, 3, 1, 1, 1, 4, 1]  # ln1, qkv/dense/fc1/fc2 bias
    assert [(n, c) for n, c in persistent if c == 1] == [(h, 1), (h, 1)]
    assert total == pytest.approx(gpt3.total_params)


def test_a_tensor_stays_gathered_after_its_rerun_only_within_the_reuse_distance():
    # DeepSpeed's trace between a tensor's rerun and its backward holds the rerun of every later tensor and then
    # their backward (S3 L222-271 @12a53b43): fc2 is used right after its rerun (0 < 1e9), fc1 after fc2's rerun
    # and backward (2 x 6e8 = 1.2e9: released), dense after both MLP weights twice, query_key_value after three
    assert zero_impl._kept_after_rerun([4.5e8, 1.5e8, 6e8, 6e8]) == [False, False, False, True]
    # 2 x 4.9e8 = 9.8e8 is within the distance, 2 x 5.1e8 is not
    assert zero_impl._kept_after_rerun([1e8, 4.9e8]) == [True, True]
    assert zero_impl._kept_after_rerun([1e8, 5.1e8]) == [False, True]


class PerByte:
    """A communicator whose gathers take 1 s per 1e9 bytes and whose allreduce is free."""

    Group = staticmethod(lambda size, stride=1: type("G", (), {"size": size})())

    @staticmethod
    def collective_time(op, nbytes, *_args):
        return nbytes / 1e9 if op == "allgather" else 0.0


def test_the_prefetch_cap_counts_every_gathered_tensor_not_the_issuers_alone(hw):
    """stage3_max_live_parameters caps the live total of gathered elements (S3 L319 `total_available_parameter_
    numel`, which a tensor kept from its rerun stays in): in the rerun of a block [8e8, 2.4e8, 2.4e8], all three
    are kept (2 x 4.8e8 < 1e9), so when the second tensor's module prefetches the third 8e8 + 2.4e8 >= 1e9
    elements are live: that gather is not prefetched and shows, though the issuer alone holds only 2.4e8."""
    plan = Plan(devices=8, dp=8, zero=3, global_batch=8, recompute="full", zero_impl="deepspeed-0.3")
    block = [(8e8, 2), (2.4e8, 2), (2.4e8, 2)]
    slices = zero_impl._slices(hw, PerByte.Group(8))
    big = 1e6  # compute windows long enough to hide any prefetched gather
    total, shown = zero_impl.per_micro(PerByte, hw, plan, PerByte.Group(8), 1.0, 2.0, (block, [], 2.56e9),
                                       big, big, big)
    # forward and rerun gather all three in both blocks, the backward none (all kept): 12 gathers
    reduce = traffic(hw, 2.56e9 * 2.0, zero_impl.REDUCE_TRAFFIC)  # the gradient bucket's copies, exposed
    fills = traffic(hw, 2 * 2 * 1.28e9, 1)  # every gather's zero-fill, which the device waits for
    assert total == pytest.approx(2 * 2 * (0.8 + 0.24 + 0.24) + 12 * slices + 3 * fills + reduce)
    # the third tensor's rerun gather, in both blocks, with its copy-back
    assert shown == pytest.approx(2 * (0.24 + traffic(hw, 2.4e8, 2)) + 12 * slices + fills + reduce)
    # under the cap (the first tensor 7e8: 7e8 + 2.4e8 < 1e9) every gather hides
    _, hidden = zero_impl.per_micro(PerByte, hw, plan, PerByte.Group(8), 1.0, 2.0,
                                    ([(7e8, 2), (2.4e8, 2), (2.4e8, 2)], [], 2.36e9), big, big, big)
    assert hidden == pytest.approx(12 * slices + traffic(hw, 2 * 2 * 1.18e9, 1)
                                   + traffic(hw, 2.36e9 * 2.0, zero_impl.REDUCE_TRAFFIC))


def test_gpt3_175b_regathers_fc1_after_its_rerun(hw):
    """GPT-3 175B at tp 1: fc1 (4h^2 = 6.04e8) is used again after fc2's rerun and backward (1.21e9 > 1e9), so
    the backward pass gathers query_key_value, dense and fc1 again: 3 of the 4 tensors, every block."""
    gpt3 = load_model("gpt", GPT3)
    plan = Plan(devices=64, dp=64, zero=3, global_batch=64, recompute="full", zero_impl="deepspeed-0.3")
    tensors = zero_impl.tensors(gpt3, plan)
    total, _ = zero_impl.per_micro(NoLink, hw, plan, NoLink.Group(64), 2, 2, tensors, 1.0, 1.0, 1.0)
    per_rank = zero_impl._slices(hw, NoLink.Group(64))
    (wte, _), (wpe, _), (qkv, _), (dense, _), (fc1, _), (fc2, _) = tensors[0]
    gathered = 96 * (2 * (qkv + dense + fc1 + fc2) + qkv + dense + fc1) + 2 * (wte + wpe)
    copies = traffic(hw, 2 * gathered, 3) + traffic(hw, 2 * tensors[2],
                                                                            zero_impl.REDUCE_TRAFFIC)
    # forward 4 + rerun 4 + backward 3, in 96 blocks; the two embeddings forward and backward
    assert total == pytest.approx((96 * 11 + 4) * per_rank + copies)


class NoLink:
    """A communicator whose collectives are free: what is left is the per-rank host cost."""

    Group = staticmethod(lambda size, stride=1: type("G", (), {"size": size})())

    @staticmethod
    def collective_time(*_args):
        return 0.0


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_every_gather_costs_a_python_op_and_a_copy_per_rank(hw, recompute):
    model = load_model("gpt", {"hidden": 256, "heads": 4, "layers": 3, "seq": 512, "vocab": 1000})
    plan = Plan(devices=64, dp=64, zero=3, global_batch=64, recompute=recompute, zero_impl="deepspeed-0.3")
    tensors = zero_impl.tensors(model, plan)
    # at hidden 256 query_key_value (3h^2) and the MLP weights (4h^2) are gathered in each of the 3 blocks, the
    # two embeddings once each; the output projection (h^2 = 65,536), the biases and the norms persist
    assert tensors[0] == [(256000, 1), (131072, 1), (196608, 3), (262144, 3), (262144, 3)]
    # forward + backward; with the rerun, forward + rerun, and the three stay gathered for the backward pass
    # (every reuse distance is far below 1e9): 3 tensors x 3 blocks x 2 + 2 embeddings x 2
    gathers = 22
    per_rank = zero_impl.SLICE_PYTHON_OP_S + hw.device.launch_latency
    for ranks in (64, 512):
        total, shown = zero_impl.per_micro(NoLink, hw, plan, NoLink.Group(ranks), 2, 2, tensors, 1.0, 1.0, 1.0)
        # every tensor gathered twice; the copies do not depend on the ranks
        gathered = 2 * 2 * sum(n * c for n, c in tensors[0])
        copies = traffic(hw, gathered, 3) + traffic(hw, 2 * tensors[2], zero_impl.REDUCE_TRAFFIC)
        assert total == pytest.approx(gathers * ranks * per_rank + copies)
        # the host issues the slices while the device waits; the blocks' copy-backs hide behind the 1 s windows,
        # the embeddings' (gathered outside the block, fetched synchronously) do not
        blocks = 2 * 2 * sum(n * c for n, c in tensors[0] if c == 3)
        assert shown == pytest.approx(total - traffic(hw, blocks, 2))


def test_the_optimizer_step_unpacks_every_persistent_tensor_rank_by_rank(hw):
    model = load_model("gpt", {"hidden": 256, "heads": 4, "layers": 3, "seq": 512, "vocab": 1000})
    tensors = zero_impl.tensors(model, Plan(devices=64, zero=3, global_batch=64))
    persistent = sum(c for _, c in tensors[1])
    assert persistent == 3 * 9 + 2  # per block: 2 norms x 2, dense weight, 4 biases; the final norm's 2
    per_piece = zero_impl.POST_STEP_OPS * zero_impl.SLICE_PYTHON_OP_S + hw.device.launch_latency
    per_rank = zero_impl.SLICE_PYTHON_OP_S + hw.device.launch_latency
    # 64 ranks: every persistent tensor (>= 256 elements) has a piece on every rank
    assert zero_impl.post_step(NoLink, hw, NoLink.Group(64), 2, tensors) == pytest.approx(
        persistent * 64 * per_piece + 64 * per_rank)
    # 2048 ranks: a 256-element tensor sits on 256 ranks, a 768-element bias on 768 ranks (shards of 1), a
    # 1024-element one on 1024; the 65,536-element dense weight (shards of 32) on all 2048
    assert [zero_impl._pieces(n, 2048) for n in (256, 768, 1024, 65536)] == [256, 768, 1024, 2048]
    assert zero_impl._pieces(20480, 2240) == 2048  # 530B's norms on 2240 GPUs: shards of 10, the last 192 empty


def test_default_is_fsdp_and_unchanged(gpt3, hw):
    plan = Plan(devices=768, dp=768, global_batch=1536, micro_batch=2, zero=3, recompute="full", dtype="fp16")
    assert plan.zero_impl == "fsdp"
    fsdp = StepModel(gpt3, hw).predict(plan.with_(zero_impl="fsdp"))
    assert fsdp.step_time_s == StepModel(gpt3, hw).predict(plan).step_time_s
    deepspeed = StepModel(gpt3, hw).predict(ds(plan))
    assert deepspeed.step_time_s > fsdp.step_time_s
    assert deepspeed.breakdown_s["compute/forward"] == fsdp.breakdown_s["compute/forward"]


def test_the_rank_count_grows_the_exposed_communication(gpt3, hw):
    # one micro-batch of one sample per GPU: the gathered bytes are the same at every size, the slices are not
    exposed = []
    for gpus in (384, 768, 1536):
        plan = Plan(devices=gpus, dp=gpus, global_batch=gpus, micro_batch=1, zero=3, recompute="full",
                    dtype="fp16", zero_impl="deepspeed-0.3")
        exposed.append(StepModel(gpt3, hw).predict(plan).breakdown_s["comm/dp_allreduce"])
    assert exposed[0] < exposed[1] < exposed[2]


@pytest.mark.parametrize("constant", CONSTANTS)
@pytest.mark.parametrize(("model", "dp", "recompute"), [("gpt2-xl", 64, "full"), ("bert-large", 16, "none")])
def test_more_bandwidth_or_peak_never_makes_deepspeed_zero3_slower(hw, constant, model, dp, recompute):
    m = load_model(model)
    plan = Plan(devices=dp, dp=dp, global_batch=4 * dp, micro_batch=2, zero=3, recompute=recompute,
                zero_impl="deepspeed-0.3")
    before = StepModel(m, hw).predict(plan).step_time_s
    for factor in (1.1, 2.0, 10.0):
        after = StepModel(m, faster(hw, constant, factor)).predict(plan).step_time_s
        assert after <= before * (1 + 1e-9), (constant, factor, before, after)


def test_the_zero3_rows_of_narayanan_table2_name_deepspeed():
    rows = [r for r in load_dataset() if r.id.startswith("narayanan2021-t2-")]
    impls = {r.id: r.plan.zero_impl for r in rows}
    assert {i for i, v in impls.items() if v == "deepspeed-0.3"} == {i for i in impls if "-zero3-" in i}
    assert len(impls) == 12


@pytest.mark.parametrize(("plan", "message"), [
    (Plan(devices=8, global_batch=8, zero=3, zero_impl="colossalai"),
     "expected one of fsdp, megatron-fsdp, deepspeed-0.3, megatron"),
    (Plan(devices=8, global_batch=8, zero=3, zero_impl="megatron"), "distributed optimizer, ZeRO stage 1"),
    (Plan(devices=8, global_batch=8, zero=1, zero_impl="deepspeed-0.3"), "describes ZeRO stage 3"),
    (Plan(devices=8, pp=2, global_batch=8, zero=3, zero_impl="deepspeed-0.3"), "without pipeline"),
])
def test_bad_plans_are_refused(plan, message):
    with pytest.raises(DlperfError, match=message):
        validate(plan)


@pytest.mark.parametrize(("new", "message"), [
    ("zero_impl: colossalai, ", "expected one of fsdp, megatron-fsdp, deepspeed-0.3, megatron"),
    ("zero_impl: megatron, ", "distributed optimizer, ZeRO stage 1"),
    ("zero_impl: 3, ", "expected a name"),
    ("zero_impl: deepspeed-0.3, ", "describes ZeRO stage 3"),
    ("zero_impl: megatron-fsdp, ", "describes ZeRO stage 3"),
    # the other plan field added with megatron-fsdp's memory: MXFP8's scale swizzles (dlperf.ops.fp8)
    ("mx_swizzle: sideways, ", "expected one of quantize, gemm"),
    ("mx_swizzle: [gemm], ", "expected a name"),
    ("mx_swizzle: gemm, ", "is how the MXFP8 recipe lays out its block scales"),
])
def test_bad_rows_give_one_located_line(tmp_path, new, message):
    path = write(tmp_path, TINY.replace("dp: 8, global_batch", f"dp: 8, {new}global_batch", 1))
    with pytest.raises(DlperfError) as err:
        load_dataset([path])
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith(f"{path}:")
    proc = subprocess.run([sys.executable, "-m", "dlperf", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--zero-impl", "bogus", "--zero", "3"), "'--zero-impl'"),
    (("--zero-impl", "deepspeed-0.3"), "describes ZeRO stage 3"),
    (("--zero-impl", "megatron-fsdp"), "describes ZeRO stage 3"),
    (("--mx-swizzle", "sideways"), "'--mx-swizzle'"),
    (("--mx-swizzle", "gemm"), "is how the MXFP8 recipe lays out its block scales"),
])
def test_bad_cli_options_exit_2_with_one_line(args, message):
    proc = subprocess.run([sys.executable, "-m", "dlperf", "predict", "gpt2-xl", "dgx-a100", "--gpus", "8", *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_deepspeed_step_holds_for_any_micro_batch_count() -> None:
    """The persistent tensors' re-gathers (m - 1 per step) sit in the per-micro-batch part, so a StepModel that
    priced one batch prices another right and grid() agrees with timeline() (reviewer: 67.661 s stale vs 68.994)."""
    import numpy as np

    model, hw = load_model("gpt3-175b"), load_hardware("dgx-a100")

    def plan(batch: int) -> Plan:
        return Plan(devices=128, dp=16, tp=8, global_batch=batch, micro_batch=1, zero=3, zero_impl="deepspeed-0.3",
                    recompute="full")

    shared = StepModel(model, hw)
    shared.timeline(plan(16))
    fresh = float(StepModel(model, hw).timeline(plan(128)).step_time_s)
    assert float(shared.timeline(plan(128)).step_time_s) == pytest.approx(fresh, rel=1e-12)
    small, big = (StepModel(model, hw).grid(plan(b), np.array([16, 128]))["step_time_s"] for b in (16, 128))
    assert small == pytest.approx(big, rel=1e-12)
    assert big[1] == pytest.approx(fresh, rel=1e-12)
