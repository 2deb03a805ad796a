"""Plan search, scaling sweeps, explain and the figures: numbers checked against predict and by hand."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest

from dlperf.engine import predict
from dlperf.engine.step import StepModel
from dlperf.errors import PlanError
from dlperf.plan import Plan
from dlperf.search import (
    SearchSpace,
    enumerate_plans,
    explain,
    parse_gpu_list,
    search,
    sweep,
    terminal_progress,
)
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

SMALL = SearchSpace(max_micro_batch=4)


GPT_SMALL = {"layers": 8, "hidden": 2048, "heads": 16, "seq": 1024}  # 0.51 B parameters
SETS = [arg for k, v in GPT_SMALL.items() for arg in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def gpt():
    return load_model("gpt", GPT_SMALL)


@pytest.fixture(scope="module")
def gpt_search(gpt, a100):
    return search(gpt, a100, 8, 32, max_memory=3 * 2**30, space=SMALL)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def test_fast_evaluator_matches_predict_on_random_plans(gpt, a100):
    fast = StepModel(gpt, a100)
    plans = list(enumerate_plans(Plan(devices=16, global_batch=64), 8, fast.heads, fast.layers,
                                 replace(SMALL, uneven_stages=True)))
    sample = random.Random(6).sample(plans, 40)
    assert {p.tp for p in sample} > {1} and {p.pp for p in sample} > {1}
    for plan in sample:
        ev, ref = fast.timeline(plan), predict(gpt, a100, plan)
        assert _close(ev.step_time_s, ref.step_time_s), plan
        assert _close(ev.memory_bytes_per_device, ref.memory_bytes_per_device), plan
        for key, value in ref.breakdown_s.items():
            assert _close(ev.breakdown_s[key], value), (plan, key)


def test_fast_evaluator_matches_predict_gpt3_at_1024(a100):
    model = load_model("gpt3-175b")
    fast = StepModel(model, a100)
    plans = list(enumerate_plans(Plan(devices=1024, global_batch=1536), 8, fast.heads, fast.layers))
    sample = random.Random(1).sample(plans, 12)
    for plan in sample:  # evaluate after other plans warmed the caches, in both orders
        fast.timeline(plan)
    for plan in reversed(sample):
        ev, ref = fast.timeline(plan), predict(model, a100, plan)
        assert _close(ev.step_time_s, ref.step_time_s), plan
        assert _close(ev.memory_bytes_per_device, ref.memory_bytes_per_device), plan


def test_enumeration_count_by_hand():
    # devices 4, batch 8, one schedule/zero/recompute value: (tp, pp) -> micro-batches that divide the per-replica
    # batch: (1,1) per 2 -> {1,2}; (1,2) per 4 -> {1,2,4}; (1,4) per 8 -> {1,2,4,8}; (2,1) per 4 -> 3;
    # (2,2) per 8 -> 4; (4,1) per 8 -> 4. Total 20.
    space = SearchSpace(schedules=("1f1b",), zero=(0,), recompute=("none",), sequence_parallel=(False,))
    plans = list(enumerate_plans(Plan(devices=4, global_batch=8), 8, None, 10, space))
    assert len(plans) == 20
    assert len(set(plans)) == 20
    assert all(p.data_parallel * p.tp * p.pp == 4 for p in plans)


def test_enumeration_respects_heads_and_node():
    plans = list(enumerate_plans(Plan(devices=16, global_batch=16), 4, 6, 40, SMALL))
    assert {p.tp for p in plans} == {1, 2}  # 4 does not divide 6 heads; 8, 16 exceed the node
    assert all(p.virtual_stages == 1 or p.schedule == "interleaved" for p in plans)


def test_search_returns_only_fitting_plans_sorted(gpt_search):
    ranked = gpt_search.ranked
    # interleaved plans with pp*v > layers are not enumerated (impossible); GPipe at one micro-batch is 1F1B (folded)
    assert gpt_search.considered == 1242 and gpt_search.folded == 63
    assert 0 < gpt_search.feasible == len(ranked) < gpt_search.considered
    assert all(ev.memory_bytes_per_device <= 3 * 2**30 for ev in ranked)
    times = [ev.step_time_s for ev in ranked]
    assert times == sorted(times)


def test_search_best_equals_predict(gpt_search, gpt, a100):
    best = gpt_search.ranked[0]
    assert _close(predict(gpt, a100, best.plan).step_time_s, best.step_time_s)


def test_cost_objective_uses_price(gpt, a100):
    result = search(gpt, a100, 8, 32, objective="cost", space=SMALL)
    assert {ev.plan.devices for ev in result.ranked} <= {1, 2, 4, 8}
    best = result.ranked[0]
    assert _close(result.objective_value(best), best.plan.devices * best.step_time_s / 3600 * 3.4309)
    values = [result.objective_value(ev) for ev in result.ranked]
    assert values == sorted(values)


def test_bad_objective(gpt, a100):
    with pytest.raises(PlanError):
        search(gpt, a100, 8, 32, objective="speed")


def test_parse_gpu_list():
    assert parse_gpu_list("1..256") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert parse_gpu_list("8,1,2") == [1, 2, 8]
    assert parse_gpu_list("3..10") == [4, 8]
    for bad in ("x", "0,1", "8..2"):
        with pytest.raises(PlanError):
            parse_gpu_list(bad)


@pytest.fixture(scope="module")
def resnet_sweep():
    return sweep(load_model("resnet50"), load_hardware("dgx1-v100"), [1, 2, 4, 8], weak=True)


def test_weak_sweep_numbers(resnet_sweep):
    hw, model = load_hardware("dgx1-v100"), load_model("resnet50")
    rows = resnet_sweep.rows()
    assert [r["global_batch"] for r in rows] == [32, 64, 128, 256]
    one = predict(model, hw, Plan(devices=1, dp=1, global_batch=32, micro_batch=32))
    eight = predict(model, hw, Plan(devices=8, dp=8, global_batch=256, micro_batch=32))
    assert _close(rows[0]["step_time_s"], one.step_time_s)
    assert _close(rows[3]["speedup"], eight.throughput_samples_per_s / one.throughput_samples_per_s)
    assert _close(rows[3]["efficiency"], rows[3]["speedup"] / 8)
    assert rows[0]["efficiency"] == 1.0


def test_strong_sweep_keeps_batch(a100, gpt):
    result = sweep(gpt, a100, [4, 8], strategy="data", global_batch=64)
    rows = result.rows()
    assert [r["global_batch"] for r in rows] == [64, 64]
    assert rows[0]["speedup"] == 1.0
    assert _close(rows[1]["speedup"], rows[0]["step_time_s"] / rows[1]["step_time_s"])


def test_scaling_chart_data_and_file(resnet_sweep, tmp_path):
    from dlperf.plot import scaling_chart, scaling_data

    path = tmp_path / "scaling.png"
    fig = scaling_chart([resnet_sweep], str(path))
    assert path.stat().st_size > 10_000
    (curve,) = scaling_data([resnet_sweep]).values()
    rows = resnet_sweep.rows()
    assert curve["gpus"] == [1.0, 2.0, 4.0, 8.0]
    assert curve["samples_per_s"] == [r["samples_per_s"] for r in rows]
    assert curve["ideal_samples_per_s"] == [rows[0]["samples_per_s"] * n for n in (1, 2, 4, 8)]
    assert curve["efficiency"] == [r["efficiency"] for r in rows]
    throughput, efficiency = fig.axes
    assert list(throughput.lines[0].get_ydata()) == curve["samples_per_s"]
    assert list(efficiency.lines[0].get_ydata()) == [100 * e for e in curve["efficiency"]]


@pytest.mark.parametrize("suffix", ["svg", "pdf"])
def test_breakdown_chart_formats(gpt, a100, tmp_path, suffix):
    from dlperf.plot import breakdown_chart, breakdown_data

    result = predict(gpt, a100, Plan(devices=8, tp=2, pp=2, global_batch=32, micro_batch=2))
    path = tmp_path / f"b.{suffix}"
    fig = breakdown_chart([result], ["gpt2-xl"], str(path))
    assert path.stat().st_size > 1000
    data = breakdown_data([result])
    assert data == {k: [v] for k, v in result.breakdown_s.items() if v}
    assert [p.get_width() for p in fig.axes[0].patches] == pytest.approx([v[0] for v in data.values()], rel=1e-12)


def test_explain_rescales_one_constant(gpt, a100):
    plan = Plan(devices=8, tp=2, pp=2, global_batch=32, micro_batch=2)
    out = explain(gpt, a100, plan)
    rows = {r["change"]: r for r in out["sensitivities"]}
    faster = replace(a100, device=replace(a100.device, peak_flops={k: 1.1 * v
                                                                   for k, v in a100.device.peak_flops.items()}))
    assert _close(rows["+10% peak FLOP/s"]["step_time_s"], predict(gpt, faster, plan).step_time_s)
    assert rows["+10% peak FLOP/s"]["step_time_change"] < 0
    assert f"+10% {a100.network[0].name} bandwidth" in rows
    base = out["prediction"]
    assert out["bottleneck"] == max(base.breakdown_s, key=base.breakdown_s.get)


def test_explain_scales_a_levels_nvls_bandwidth_with_its_links():
    """H100 tensor parallelism all-reduces over NVLS, priced at the level's measured nvls_bandwidth: "+10% nvswitch
    bandwidth" moved nothing (+0.0%) with comm/tp at 30% of the step, as the NVLS figure stayed put."""
    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    assert hw.network[0].nvls_bandwidth is not None
    plan = Plan(devices=8, tp=8, global_batch=8, micro_batch=1)
    rows = {r["change"]: r["step_time_s"] for r in explain(model, hw, plan)["sensitivities"]}
    level = replace(hw.network[0], bandwidth=1.1 * hw.network[0].bandwidth,
                    nvls_bandwidth=1.1 * hw.network[0].nvls_bandwidth)
    faster = replace(hw, network=(level, *hw.network[1:]))
    assert _close(rows["+10% nvswitch bandwidth"], predict(model, faster, plan).step_time_s)
    assert rows["+10% nvswitch bandwidth"] < 0.99 * predict(model, hw, plan).step_time_s


def test_explain_perturbs_the_loader_and_the_layout_the_plan_names():
    """An input-bound NCHW ResNet-50 step: explain re-predicts with twice the loader workers and with NHWC, the two
    knobs that can move it (a step waiting for data moves with no hardware constant but the host's)."""
    model, hw = load_model("resnet50"), load_hardware("dgx-a100")
    plan = Plan(devices=8, global_batch=2048, micro_batch=256, dtype="tf32", memory_format="nchw",
                data_backend="cpu", loader_workers=2, input_ops=("jpeg-decode-pillow", "fast-collate"))
    rows = {r["change"]: r["step_time_s"] for r in explain(model, hw, plan)["sensitivities"]}
    assert _close(rows["loader workers 2 -> 4"], predict(model, hw, plan.with_(loader_workers=4)).step_time_s)
    assert rows["loader workers 2 -> 4"] < predict(model, hw, plan).step_time_s
    assert _close(rows["memory format nchw -> nhwc"], predict(model, hw, plan.with_(memory_format="nhwc")).step_time_s)
    synthetic = explain(model, hw, Plan(devices=8, global_batch=2048, micro_batch=256))["sensitivities"]
    assert not any(r["change"].startswith(("loader", "memory format")) for r in synthetic)


def test_explain_lists_the_knob_changes_the_plan_refuses(run):
    """Megatron's distributed optimizer is ZeRO stage 1 only: explain says why it tried no other stage (and no
    micro-batch larger than the replica's batch) instead of leaving those knobs out silently."""
    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    plan = Plan(devices=16, tp=2, global_batch=64, micro_batch=4, zero=1, zero_impl="megatron")
    out = explain(model, hw, plan)
    refused = {r["change"]: r["reason"] for r in out["refused"]}
    assert set(refused) == {"zero 1 -> 0", "zero 1 -> 2", "zero 1 -> 3"}
    assert all("distributed optimizer" in reason for reason in refused.values())
    assert not any(r["change"].startswith("zero") for r in out["sensitivities"])
    code, text, _ = run("explain", "llama3-8b", "dgx-h100", "--gpus", "16", "--tp", "2", "--global-batch", "64",
                        "--micro-batch", "4", "--zero", "1", "--zero-impl", "megatron")
    assert "knob changes this plan cannot take:" in text and "zero 1 -> 3: zero_impl megatron" in text


def test_progress_quiet_when_piped(capsys):
    assert terminal_progress("x") is None  # pytest captures stderr: not a terminal


def test_cli_search_json(run):
    code, out, _ = run("search", "gpt", "dgx-a100", *SETS, "--gpus", "8", "--global-batch", "32", "--top", "3",
                       "--max-micro-batch", "4", "--max-memory", "3 GiB", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["considered"] == 1242 and data["folded"] == 63 and len(data["plans"]) == 3
    assert [p["rank"] for p in data["plans"]] == [1, 2, 3]
    assert all(p["memory_gib"] <= 3 for p in data["plans"])


def test_cli_search_table_and_sweep_csv(run, tmp_path):
    code, out, _ = run("search", "gpt", "dgx-a100", *SETS, "--gpus", "8", "--global-batch", "32", "--top", "2",
                       "--max-micro-batch", "2")
    assert code == 0 and "plans considered" in out and "step-time breakdown" in out
    plot = tmp_path / "s.png"
    code, out, _ = run("sweep", "resnet50", "dgx1-v100", "--gpus", "1,2", "--format", "csv", "--plot", str(plot))
    assert code == 0 and out.splitlines()[0].startswith("gpus,global_batch")
    assert plot.stat().st_size > 0


def test_cli_explain(run):
    code, out, _ = run("explain", "gpt", "dgx-a100", *SETS, "--gpus", "8", "--tp", "2", "--pp", "2",
                       "--global-batch", "32", "--micro-batch", "2")
    assert code == 0
    assert "bottleneck:" in out and "+10% peak FLOP/s" in out and "step time" in out


@pytest.mark.parametrize("name", ["search", "sweep", "explain"])
def test_every_option_has_help(name):
    from dlperf.cli import LazyGroup

    command = LazyGroup._load(name)
    assert command.help
    for param in command.params:
        if param.param_type_name == "option":
            assert param.help, f"{name} {param.opts} has no help"


def test_to_frame_when_pandas(gpt_search, resnet_sweep):
    pd = pytest.importorskip("pandas")
    frame = gpt_search.to_frame(3)
    assert isinstance(frame, pd.DataFrame) and list(frame["rank"]) == [1, 2, 3]
    assert len(resnet_sweep.to_frame()) == 4


def test_cli_bad_gpu_list_is_one_line_error(run):
    code, _, err = run("sweep", "resnet50", "dgx1-v100", "--gpus", "many")
    assert code == 2 and "--gpus" in err


def test_vectorized_grid_agrees_with_predict_to_1e_9():
    """StepModel.grid (numpy over global batch and virtual stages) against one-at-a-time predict."""
    import numpy as np

    model, hw = load_model("gpt3-175b"), load_hardware("dgx-a100")
    engine = StepModel(model, hw)
    rng = random.Random(7)
    for schedule, zero in (("interleaved", 0), ("1f1b", 1), ("gpipe", 0)):
        base = Plan(devices=1024, tp=8, pp=16, global_batch=1536, micro_batch=1, recompute="full",
                    schedule=schedule, virtual_stages=2 if schedule == "interleaved" else 1, zero=zero)
        batches = np.array([128 * rng.randint(1, 40) for _ in range(20)])
        vs = np.array([rng.choice([2, 3, 6]) if schedule == "interleaved" else 1 for _ in range(20)])
        grid = engine.grid(base, batches, vs)
        for gb, v, step, memory in zip(batches, vs, grid["step_time_s"], grid["memory_bytes_per_device"],
                                       strict=True):
            plan = replace(base, global_batch=int(gb), virtual_stages=int(v))
            ref = predict(model, hw, plan)
            assert step == pytest.approx(ref.step_time_s, rel=1e-9)
            assert memory == pytest.approx(ref.memory_bytes_per_device, rel=1e-9)


def test_grid_prices_megatron_param_gather_at_each_virtual_stage_count(gpt, a100):
    """Megatron's interleaved parameter gather exposes the first model chunk's share, so it depends on the
    virtual stages: grid() must price each count as predict does, not the base plan's (review13: +0.1% off)."""
    import numpy as np

    base = Plan(devices=16, dp=4, tp=2, pp=2, global_batch=64, micro_batch=1, schedule="interleaved",
                virtual_stages=2, zero=1, overlap=True, zero_impl="megatron")
    batches, vs = np.array([64, 64, 128]), np.array([2, 4, 4])
    grid = StepModel(gpt, a100).grid(base, batches, vs)
    for gb, v, step in zip(batches, vs, grid["step_time_s"], strict=True):
        ref = predict(gpt, a100, replace(base, global_batch=int(gb), virtual_stages=int(v)))
        assert step == pytest.approx(ref.step_time_s, rel=1e-9)


def test_grid_marks_invalid_points():
    import numpy as np

    engine = StepModel(load_model("gpt3-175b"), load_hardware("dgx-a100"))
    base = Plan(devices=1024, tp=8, pp=16, global_batch=1536, micro_batch=1, recompute="full")
    grid = engine.grid(base, np.array([1536, 1537, 4]))
    assert not np.isnan(grid["step_time_s"][0])
    assert np.isnan(grid["step_time_s"][1]) and np.isnan(grid["step_time_s"][2])  # not divisible; m < 1


def test_search_over_a_device_range_with_a_time_budget(run):
    code, out, _ = run("search", "gpt", "dgx-a100", *SETS, "--gpus", "4..8", "--global-batch", "32",
                       "--objective", "cost", "--max-step-time", "0.5", "--top", "500", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["plans"] and all(p["step_time_s"] <= 0.5 for p in data["plans"])
    assert {p["devices"] for p in data["plans"]} <= {4, 8}
    costs = [p["cost_per_step"] for p in data["plans"]]
    assert costs == sorted(costs)


@pytest.mark.parametrize(("model", "hardware", "tried"), [
    ("qwen3-30b-a3b", "gb200-nvl72", ("alltoall", "hybridep")),    # HybridEP's README measures GB200
    ("deepseek-v3", "dgx-b200", ("alltoall", "deepep", "hybridep")),
    ("deepseek-v3", "h800", ("alltoall", "deepep")),               # no HybridEP table: never faster than DeepEP
    ("qwen3-30b-a3b", "dgx-gb300", ("alltoall",)),
    ("llama3-8b", "gb200-nvl72", ("alltoall",)),                    # no experts, nothing to dispatch
])
def test_search_tries_hybridep_where_its_published_bandwidths_price_it(model: str, hardware: str,
                                                                        tried: tuple[str, ...]) -> None:
    from dlperf.search import _dispatchers
    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model

    assert _dispatchers(load_model(model), load_hardware(hardware).device.name) == tried


def test_search_picks_hybridep_for_qwen3_on_gb200() -> None:
    """The recipes run HybridEP there (Megatron-Bridge); the search, pricing it at its published bandwidth, agrees."""
    from dlperf.search import search
    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model

    result = search(load_model("qwen3-30b-a3b", {"seq": 4096}), load_hardware("gb200-nvl72"), 8, 512,
                    base=Plan(dtype="mxfp8"))
    best = result.ranked[0].plan
    assert best.ep > 1 and best.ep_dispatcher == "hybridep"


def test_cli_search_table_of_a_dense_flash_model_has_no_twins_nor_expert_columns(run):
    """A GPT with FlashAttention: recompute selective is none there (search._no_ops), so the table lists no plan
    twice under the two names and says how many it folded; a dense model has no expert columns even with
    context parallelism searched, while JSON keeps every field."""
    args = ("search", "gpt", "dgx-a100", *SETS, "--set", "flash=true", "--gpus", "8", "--global-batch", "32",
            "--top", "10", "--max-micro-batch", "2", "--cp", "1,2")
    code, out, _ = run(*args)
    assert code == 0 and "equivalent ones folded)" in out
    table = out.split("\n\nstep-time breakdown")[0].splitlines()
    columns = table[1].split()
    assert "cp" in columns and not {"ep", "ep_overlap", "ep_dispatcher"} & set(columns)
    assert not any(" selective " in line for line in table[3:])
    code, out, _ = run(*args, "--format", "json")
    data = json.loads(out)
    assert data["folded"] > 0 and all(p["ep"] == 1 and "ep_dispatcher" in p for p in data["plans"])
    assert any(p["cp"] == 2 for p in data["plans"]) and not any(p["recompute"] == "selective" for p in data["plans"])


def test_search_json_holds_plain_values(run):
    # the README's promise for JSON and CSV: the device count is a number (it was the --gpus text, "8"), a list for
    # a list of counts, and a plan without partial recomputation lists none (the table shows "-")
    code, out, err = run("search", "llama3-8b", "dgx-h100", "--gpus", "8", "--global-batch", "64", "--top", "3",
                         "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["devices"] == 8
    assert "-" not in {p["recompute_modules"] for p in data["plans"]}
    code, out, err = run("search", "gpt", "dgx-a100", *SETS, "--gpus", "4..8", "--global-batch", "32",
                         "--objective", "cost", "--top", "2", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["devices"] == [4, 8]
