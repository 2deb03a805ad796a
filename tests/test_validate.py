"""`dlperf validate`: the sourced dataset, its loader, the error arithmetic, the command, and the accuracy
the model holds against published measurements (tolerances are fixed; misses are strict xfails)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dlperf.cli import main
from dlperf.errors import DlperfError
from dlperf.plan import Plan
from dlperf.validate import (
    DATA_DIR,
    EVIDENCE,
    UNITS,
    Result,
    Row,
    average_ranks,
    default_files,
    evaluate,
    is_layout_group,
    load_dataset,
    load_pending,
    mean_abs_error,
    median_spearman,
    plan_groups,
    predicted_unfit,
    select,
    simulated_line,
    spearman,
    summary,
)

TINY_SET = "{layers: 2, hidden: 64, heads: 4, seq: 128, vocab: 1000}"
TINY = f"""\
sources:
  fixture:
    citation: "test fixture (not a measurement)"
rows:
  - id: one
    source: fixture
    where: "n/a"
    evidence: unverified
    tags: [single-gpu]
    model: gpt
    set: {TINY_SET}
    hardware: dgx-a100
    plan: {{devices: 1, global_batch: 8, micro_batch: 8, dtype: fp16}}
    measured: {{value: 100, unit: samples_per_s}}
  - id: eight
    source: fixture
    where: "n/a"
    evidence: unverified
    tags: [dp]
    model: gpt
    set: {TINY_SET}
    hardware: dgx-a100
    plan: {{devices: 8, dp: 8, global_batch: 64, micro_batch: 8, dtype: fp16}}
    measured: {{value: 6.0, unit: speedup}}
    baseline: one
"""


def write(tmp_path: Path, text: str, name: str = "data.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------------- the dataset


def test_builtin_files_ship_inside_the_package():
    assert DATA_DIR.parent.parent.name == "dlperf"
    assert {p.name for p in default_files()} >= {"narayanan2021.yaml", "megatron2020.yaml",
                                                  "deeplearningexamples.yaml"}


def test_every_builtin_row_names_a_cited_source_and_a_place_in_it():
    # Read the raw YAML, not the loader, so that this test fails on its own if a row loses its source.
    for path in default_files():
        data = yaml.safe_load(path.read_text())
        sources = data["sources"]
        templates = [table["template"] for table in data.get("tables", [])]  # one per table: every row's keys
        for row in [*data.get("rows", []), *templates]:
            assert row.get("source") in sources, (path.name, row.get("id"))
            assert str(sources[row["source"]].get("citation", "")).strip(), row["source"]
            assert str(row.get("where", "")).strip(), row["id"]
            assert row.get("evidence") in EVIDENCE, row["id"]


def test_builtin_dataset_loads_with_unique_ids_and_known_units():
    rows, pending = load_dataset(), load_pending()
    # 2152 scored, 101 pending: the Megatron-Bridge Qwen3-235B GB200 MXFP8 token-drop row (EP 64 over TP 2 x DP 32)
    # scores since `etp: 1` expresses its expert grid (dlperf.plan.folded); the 20 other rows that waited for it wait
    # for their recipe settings, a model or NVFP4, and the DeepSeek-V3 GB200 MXFP8 one for a layout no grid folds.
    # The 16 Nemotron 3 Nano MXFP8 rows score since the built-in model and their recipes' settings (2136 before); its
    # 4 H100 FP8 rows wait for the recipe's recomputation of the moe and core_attn modules (`recompute_modules`).
    # 2158, 95: six Nemotron 3 Super MXFP8 rows (26.04, 26.04.01 on GB300, B300, B200) score since the MTP call's
    # `precision: bf16` keeps the recipe's 2 MTP passes in BF16 (keep_mtp_spec_in_bf16)
    assert (len(rows), len(pending)) == (2158, 95)
    assert len({r.id for r in [*rows, *pending]}) == len(rows) + len(pending)
    assert {r.unit for r in [*rows, *pending]} <= set(UNITS)
    assert all(r.citation for r in [*rows, *pending])
    assert all(p.waits_for and all(p.waits_for.values()) for p in pending)


@pytest.mark.parametrize(("sets", "num_params"), [
    # llm-foundry benchmarking README, NumParams column (rows: size | SeqLen)
    ({"hidden": 768, "heads": 12, "layers": 12, "seq": 512}, 124131840),          # 125m | 512
    ({"hidden": 1536, "heads": 12, "layers": 24, "seq": 32768}, 807656448),       # 760m | 32768
    ({"hidden": 2048, "heads": 16, "layers": 24, "seq": 2048}, 1315950592),       # 1b | 2048
    ({"hidden": 4096, "heads": 32, "layers": 32, "seq": 2048}, 6658859008),       # 7b | 2048
    ({"hidden": 7168, "heads": 56, "layers": 48, "seq": 8192}, 30019254272),      # 30b | 8192
    ({"hidden": 8192, "heads": 64, "layers": 80, "seq": 2048}, 64862437376),      # 70b | 2048
])
def test_mpt_model_has_the_benchmarked_parameter_counts(sets, num_params):
    from dlperf.spec.model import load_model

    assert load_model("mpt", sets).total_params == num_params


def test_new_sources_carry_the_published_figures():
    rows = {r.id: r for r in load_dataset()}
    # llm-foundry README, "A100 80GB ... (RoCE)" table, row 1b | 2048 | 8 GPUs | MicroBatchSize 14 | GradAccum 4.
    mpt = rows["llmfoundry-a100-1b-s2048-g8-mb14"]
    assert (mpt.value, mpt.unit) == (164109, "tokens_per_s")
    # MP Mode DEFAULT: composer reduces gradients in fp32; attn_impl: submit_benchmarks.py's default, triton
    assert mpt.plan == Plan(devices=8, dp=8, global_batch=448, micro_batch=14, zero=3, dtype="bf16",
                            grad_dtype="fp32")
    assert (mpt.model, mpt.sets) == ("mpt", {"hidden": 2048, "heads": 16, "layers": 24, "seq": 2048,
                                             "triton_attention": True})
    # the Large Scale table set attn_impl per model (sweep.py @5e85bd62): flash for 70b, triton for 30b
    assert "triton_attention" not in rows["llmfoundry-h100-70b-s2048-g512-mb8"].sets
    assert rows["llmfoundry-h100-30b-s2048-g512-mb8"].sets["triton_attention"] is True
    # MP Mode PURE (the A100 70b rows): bf16 reduction
    assert rows["llmfoundry-a100-70b-s2048-g64-mb8"].plan.grad_dtype is None
    # "A100 40GB ... (RoCE)" table, row 13b | 2048 | 8 GPUs | MicroBatchSize 4 | GradAccum 16, MP Mode PURE
    forty = rows["llmfoundry-a100-40g-13b-s2048-g8-mb4"]
    assert (forty.value, forty.hardware) == (13347, "a100-40gb")
    assert forty.plan == Plan(devices=8, dp=8, global_batch=512, micro_batch=4, zero=3, dtype="bf16",
                              recompute="full")
    # Narayanan 2021 Table 2: ZeRO-3 on 1536 GPUs reaches 44 TF/s per GPU at batch 1536, microbatch 1.
    zero3 = rows["narayanan2021-t2-175b-zero3-1536"]
    assert (zero3.value, zero3.plan.zero, zero3.plan.data_parallel, zero3.plan.micro) == (44, 3, 1536, 1)
    # Korthikanti 2022 Table 5 (22B, t 8 on 8 GPUs, batch 4): 1.42 s with full recompute, 1.10 s selective + SP.
    full, present = rows["korthikanti2022-t5-22b-full"], rows["korthikanti2022-t5-22b-selective-sp"]
    assert (full.value, present.value) == (1.42, 1.10)
    assert (present.plan.recompute, present.plan.sequence_parallel, present.plan.tp) == ("selective", True, 8)
    # BigScience tr11 prequel, 'Tweaking TP' (02-25): DP 16, TP 2, PP 12, MBS 2 on 48 nodes at GBS 2048: 112.50 s/it.
    bloom = rows["bloom-prequel-02-25-h14336-l72-a64-dp16-tp2-pp12-mb2-gbs2048"]
    assert (bloom.value, bloom.plan.devices, bloom.sets["layers"]) == (112.50, 384, 72)
    # the MXFP8 MoE presets of 25.11 on GB200/GB300 run the HybridEP dispatcher, scored as such
    assert rows["mbridge-2511-qwen3-30b-a3b-gb200-mxfp8"].plan.ep_dispatcher == "hybridep"
    pending = {p.id: p for p in load_pending()}
    # torchtitan docs/performance.md Table 2: FSDP 2 x CP 4 at seq 131072 on 8 H100s, 1,071 TPS/GPU.
    cp = pending["torchtitan-t2-8b-fsdp2-cp4"]
    assert (cp.value, cp.plan["cp"], cp.sets["seq"]) == (1071, 4, 131072)
    # the model, FP8 and cp exist; the row still waits for the Grand Teton hardware and torch.compile
    assert set(cp.waits_for) == {"grand-teton-h100", "compile"}


def test_builtin_rows_carry_the_published_figures():
    rows = {r.id: r for r in load_dataset()}
    # Narayanan 2021 Table 1, 76.1B: t8 p4 d32 on 1024 GPUs, GBS 1792, MBS 2, VP 5 layers -> 60/(4*5) = 3 chunks.
    big = rows["narayanan2021-t1-76.1B"]
    assert (big.value, big.unit) == (140.0, "tflops_per_gpu")
    assert big.plan == Plan(devices=1024, dp=32, tp=8, pp=4, global_batch=1792, micro_batch=2,
                            schedule="interleaved", virtual_stages=3, recompute="full", dtype="fp16",
                            dp_impl="post-backward")  # Megatron-LM's local DDP of 2021 (engine.post_backward)
    assert big.sets == {"hidden": 10240, "heads": 80, "layers": 60, "seq": 2048, "vocab": 51200}
    # BERT seq128 AMP, 4 nodes: GBS 65536 from 32 GPUs x 256 -> 8 accumulation steps.
    bert = rows["dle-bert-large-seq128-fp16-4node"]
    assert bert.value == 18119 and bert.plan.micro_batches == 8
    scaling = rows["megatron2020-dp-a100-8B-scaling"]
    assert (scaling.value, scaling.baseline) == (0.727, "megatron2020-mp-a100-1B")


# ----------------------------------------------------------------------------------------- the loader

BAD = [
    ("    source: fixture\n", "", "missing required key 'source'"),
    ("    source: fixture\n", "    source: elsewhere\n", "a name listed under sources"),
    ("    where: \"n/a\"\n", "    wher: \"n/a\"\n", "did you mean 'where'"),
    ("micro_batch: 8, dtype", "micro_bach: 8, dtype", "did you mean 'micro_batch'"),
    ("unit: samples_per_s", "unit: images_per_s", "expected one of iteration_time_s"),
    ("value: 100,", "value: -3,", "expected a positive number"),
    ("evidence: unverified\n    tags: [single", "evidence: likely\n    tags: [single", "expected one of verified"),
    ("    baseline: one\n", "", "a baseline: row id"),
    ("    baseline: one\n", "    baseline: none-such\n", "the id of a row with an absolute unit"),
    ("  - id: eight", "  - id: one", "duplicate row id"),
    ("devices: 8, dp: 8", "devices: 8, dp: 4", "dp*tp*pp must equal the device count"),
    ('    citation: "test fixture (not a measurement)"\n', '    citation: ""\n', "expected a citation"),
    ("dp: 8, global_batch", "dp: 8, tp_overlap: 1, global_batch", "expected true or false"),
    ("dp: 8, global_batch", "dp: 8, cp_algorithm: 2, global_batch", "expected a name"),
    ("dp: 8, global_batch", "dp: 8, moe_imbalance: high, global_batch", "expected a number"),
    # the plan keys added with Horovod, FP8 current scaling and torch.optim's per-tensor loop
    ("dp: 8, global_batch", "dp: 8, dp_impl: horovod, global_batch", "expected one of nccl, horovod-0.19"),
    ("dp: 8, global_batch", "dp: 8, dp_impl: 3, global_batch", "expected a name"),
    ("dp: 8, global_batch", "dp: 8, dp_impl: horovod-0.19, zero: 1, global_batch", "allreduces whole gradients"),
    ("dp: 8, global_batch", "dp: 8, fp8_scaling: just-in-time, global_batch", "expected one of delayed, current"),
    ("dp: 8, global_batch", "dp: 8, fp8_scaling: current, global_batch", "expected --dtype fp8"),
    ("dp: 8, global_batch", "dp: 8, optimizer_impl: foreach, global_batch", "expected one of fused, per-tensor"),
    ("dp: 8, global_batch", "dp: 8, optimizer_impl: per-tensor, zero: 1, global_batch", "ZeRO updates flat shards"),
]


def test_megatron_bridge_rows_carry_the_recipe_settings():
    # The settings the published table omits, read from the Megatron-Bridge performance recipes (see each note),
    # reach the Plan through the loader's FP8 / overlap / context- and expert-parallel keys.
    rows = {r.id: r for r in load_dataset()}
    big = rows["mbridge-2602-llama31-405b-h100"].plan
    assert (big.tp, big.pp, big.cp, big.virtual_stages, big.global_batch) == (8, 8, 2, 8, 1536)
    assert (big.zero, big.sequence_parallel, big.tp_overlap, big.fp8_param_gather, big.dtype) == (1, True, True,
                                                                                                  True, "fp8")
    dsv3 = rows["mbridge-2509-deepseek-v3-h100"].plan
    assert (dsv3.ep, dsv3.ep_overlap, dsv3.moe_imbalance, dsv3.overlap, dsv3.tp_overlap) == (64, True, 1.0, False,
                                                                                             False)
    assert rows["mbridge-2511-llama3-8b-h100"].plan.zero == 3


def test_megatron_bridge_blackwell_and_moe_rows_carry_the_published_figures():
    rows = {r.id: r for r in load_dataset()}
    # archive 26.02, Model: LLAMA3.1_405B, DGX-GB200 | 256 | FP8 | 1536 | 1 | 8192 | 0 | 4 | 16 | 1 | 4 | n/a | 793
    gb200 = rows["mbridge-2602-llama31-405b-gb200-fp8"]
    assert (gb200.value, gb200.hardware, gb200.model, gb200.sets) == (793, "gb200-nvl72", "llama3-405b", {"seq": 8192})
    assert gb200.plan == Plan(devices=256, dp=4, tp=4, pp=16, global_batch=1536, micro_batch=1,
                              schedule="interleaved", virtual_stages=4, zero=1, overlap=True, zero_impl="megatron",
                              sequence_parallel=True, tp_overlap=True, fp8_param_gather=True, dtype="fp8",
                              fp8_scaling="current", p2p_overlap=True,  # comm_overlap.py:453-457 @0a25f911 (vp > 1)
                              cudnn="9.18.0")  # NeMo Framework 26.02's cuDNN 9.18.0.50 (software-versions.md)
    # 25.11, System: DGX-B200, LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 |
    # 30624 (29521): the FP8-CS figure and the parenthesised MXFP8 one, each scored with its own recipe
    b200 = rows["mbridge-2511-llama3-8b-b200-fp8cs"]
    assert (b200.value, b200.plan.micro, b200.plan.dp, b200.plan.dtype) == (30624, 2, 8, "fp8")
    assert b200.plan.fp8_scaling == "current"  # FP8-CS: Transformer Engine's Float8CurrentScaling
    mx = rows["mbridge-2511-llama3-8b-b200-mxfp8"]
    assert (mx.value, mx.plan.micro, mx.plan.dtype, mx.plan.fp8_param_gather) == (29521, 2, "mxfp8", True)
    # 25.09, System: DGX-B200, Qwen3_235B_a22B (tokendrop) | 64 | 1024 | 1 | 4096 | 0 | 1 | 8 | 1 | 2 | 8 | 128 |
    # 4104 (4275): capacity factor 1.0, padded, so every expert computes the mean load
    qwen = rows["mbridge-2509-qwen3-235b-a22b-b200-fp8-tokendrop"]
    assert (qwen.value, qwen.model, qwen.sets["seq"]) == (4104, "qwen3-235b-a22b", 4096)
    assert (qwen.plan.pp, qwen.plan.virtual_stages, qwen.plan.ep, qwen.plan.data_parallel) == (8, 2, 8, 8)
    assert (qwen.plan.moe_imbalance, qwen.plan.ep_dispatcher, qwen.plan.global_batch) == (1.0, "alltoall", 1024)
    # 25.09 GB200 DeepSeekV3 (tokendrop): PP 4 (8), VP 4 (2), EP 64, 3454; GB200 recomputes mla_up_proj and moe_act
    dsv3 = rows["mbridge-2509-deepseek-v3-gb200-fp8-tokendrop"]
    assert (dsv3.value, dsv3.plan.pp, dsv3.plan.virtual_stages, dsv3.plan.ep) == (3454, 4, 4, 64)
    assert dsv3.plan.recompute_modules == ("mla_up_proj", "moe_act")
    pending = {p.id: p for p in load_pending()}
    # the parenthesised 25.09 layout is the MX run's own: PP 8, VP 2, GA 64 -> 2835
    assert pending["mbridge-2509-deepseek-v3-gb200-mxfp8-tokendrop"].plan["pp"] == 8
    assert pending["mbridge-2509-deepseek-v3-gb200-mxfp8-tokendrop"].value == 2835
    nvfp4 = rows["mbridge-2602-llama3-70b-gb300-nvfp4"]  # scored since --dtype nvfp4 (dlperf.ops.fp8)
    assert (nvfp4.value, nvfp4.plan.dtype, nvfp4.plan.pp, nvfp4.plan.virtual_stages) == (6798, "nvfp4", 4, 5)
    assert set(pending["mbridge-2606-nemotron-3-super-gb300-nvfp4"].waits_for) == {"nvfp4"}
    assert set(pending["mbridge-2511-llama3-70b-gb200-fp8cs"].waits_for) == {"cpu_offload"}
    # EP 32 over TP 2 x DP 16 is `etp: 1` now; the row's recipe settings are not in its note
    assert set(pending["mbridge-2511-qwen3-235b-a22b-h100-fp8cs"].waits_for) == {"recipe"}
    assert pending["mbridge-2511-qwen3-235b-a22b-h100-fp8cs"].plan["etp"] == 1
    assert set(pending["mbridge-2509-deepseek-v3-gb200-mxfp8-tokendrop"].waits_for) == {"layout"}
    folded = rows["mbridge-2509-qwen3-235b-a22b-gb200-mxfp8-tokendrop"].plan
    assert (folded.tp, folded.ep, folded.etp, folded.data_parallel, folded.expert_data_parallel) == (2, 64, 1, 32, 1)
    assert not any("ep_over_tp" in p.waits_for for p in pending.values())
    # gpt-oss-120b is a built-in now: its H100 row is scored with the 26.02 V2 preset's layout (PP 4, EP 8, MBS 1)
    oss = rows["mbridge-2602-gpt-oss-120b-h100-bf16"]
    assert (oss.value, oss.model, oss.plan.pp, oss.plan.ep, oss.plan.micro) == (5993, "gpt-oss-120b", 4, 8, 1)
    assert set(pending["mbridge-260601-gpt-oss-120b-gb200-mxfp8"].waits_for) == {"regression"}
    # every table row of the releases 25.09 to 26.08 is in the file once: 278 rows, 14 parenthesised figures
    mbridge = [i for i in [*rows, *pending] if i.startswith("mbridge-")]
    assert len(mbridge) == len(set(mbridge)) == 278 + 14
    # 26.06 (archive @4ab94dfad), Model: LLAMA3.1_405B, DGX-H100 | 1024 | FP8 | 1536 | 1 | 8192 | 8 | 8 | 2 | 8 | 326
    late = rows["mbridge-2606-llama31-405b-h100-fp8"]
    assert (late.value, late.plan.tp, late.plan.pp, late.plan.cp, late.plan.virtual_stages) == (326, 8, 8, 2, 8)
    assert set(pending["mbridge-2606-llama3-70b-h100-fp8-lora"].waits_for) == {"lora"}
    assert rows["mbridge-2604-qwen3-30b-a3b-h100-fp8"].plan.ep_dispatcher == "hybridep"
    assert "hybridep" not in {w for p in pending.values() for w in p.waits_for}


@pytest.mark.parametrize(("old", "new", "message"), BAD)
def test_loader_rejects_bad_files_with_one_located_line(tmp_path, old, new, message):
    assert old in TINY
    path = write(tmp_path, TINY.replace(old, new, 1))
    with pytest.raises(DlperfError) as err:
        load_dataset([path])
    text = str(err.value)
    assert message in text
    assert "\n" not in text
    assert text.startswith(f"{path}:")


def test_loader_rejects_a_file_without_sources(tmp_path):
    path = write(tmp_path, "rows: []\n")
    with pytest.raises(DlperfError, match="missing required key 'sources'"):
        load_dataset([path])


# ----------------------------------------------------------------------------------------- tables

TABLE = f"""\
sources:
  fixture:
    citation: "test fixture (not a measurement)"
tables:
  - columns: [name, devices, batch, value]
    template:
      id: "t-{{name}}"
      source: fixture
      where: "row {{name}}: {{devices}} GPUs, {{value}} samples/s"
      evidence: unverified
      tags: [table, "gpus{{devices}}"]
      model: gpt
      set: {TINY_SET}
      hardware: dgx-a100
      plan: {{devices: "{{devices}}", dp: "{{devices}}", global_batch: "{{batch}}", micro_batch: 8, dtype: fp16}}
      measured: {{value: "{{value}}", unit: samples_per_s}}
    rows:
      - [one, 1, 8, 100]
      - [eight, 8, 64, 700.5]
"""
WRITTEN_OUT = f"""\
sources:
  fixture:
    citation: "test fixture (not a measurement)"
rows:
  - id: t-one
    source: fixture
    where: "row one: 1 GPUs, 100 samples/s"
    evidence: unverified
    tags: [table, gpus1]
    model: gpt
    set: {TINY_SET}
    hardware: dgx-a100
    plan: {{devices: 1, dp: 1, global_batch: 8, micro_batch: 8, dtype: fp16}}
    measured: {{value: 100, unit: samples_per_s}}
  - id: t-eight
    source: fixture
    where: "row eight: 8 GPUs, 700.5 samples/s"
    evidence: unverified
    tags: [table, gpus8]
    model: gpt
    set: {TINY_SET}
    hardware: dgx-a100
    plan: {{devices: 8, dp: 8, global_batch: 64, micro_batch: 8, dtype: fp16}}
    measured: {{value: 700.5, unit: samples_per_s}}
"""


def test_a_table_loads_as_its_rows_written_out(tmp_path):
    from dataclasses import replace

    table = load_dataset([write(tmp_path, TABLE)])
    plain = load_dataset([write(tmp_path, WRITTEN_OUT, "plain.yaml")])
    assert [replace(r, file="", line=0) for r in table] == [replace(r, file="", line=0) for r in plain]
    # a whole-cell placeholder keeps the cell's type; errors and duplicates point at the table row's line
    assert [(r.plan.devices, r.value, r.line) for r in table] == [(1, 100.0, 18), (8, 700.5, 19)]
    both = write(tmp_path, TABLE + "rows:\n" + WRITTEN_OUT.split("rows:\n", 1)[1], "both.yaml")
    with pytest.raises(DlperfError, match=r"both.yaml:\d+: rows\[t-one\].id: duplicate row id \(first at "):
        load_dataset([both])


BAD_TABLE = [
    ("      - [one, 1, 8, 100]", "      - [one, 1, 8]", 18, "expected a list of 4 cells (name, devices, batch, value)"),
    ("      - [one, 1, 8, 100]", "      - [one, 1, 8, [100]]", 18, "expected a number (at most 1e30)"),
    ("      - [one, 1, 8, 100]", "      - [one, 1, 8, 1" + "0" * 40 + "]", 18, "expected a number (at most 1e30)"),
    ("      - [one, 1, 8, 100]", "      - [" + "o" * 201 + ", 1, 8, 100]", 18, "a text of at most 200 characters"),
    ("      - [eight, 8, 64, 700.5]", "      - [eight, 8, 64, -700.5]", 19, "expected a positive number"),
    ("      - [eight, 8, 64, 700.5]", "      - [eight, 6, 64, 700.5]", 19, "global batch 64 is not divisible by dp=6"),
    ("      - [eight, 8, 64, 700.5]", "      - [one, 8, 64, 700.5]", 19, "duplicate row id"),
    ('      id: "t-{name}"', '      id: "t-{nme}"', 7, "unknown column {nme}; expected one of name, devices"),
    ("      evidence: unverified", "      evidence: unverified\n      note: [[[x]]]", 11, "nested at most 4 deep"),
    ("      evidence: unverified", "      note: " + "n" * 2001 + "\n      evidence: unverified", 10,
     "a template text of at most 2000 characters"),
    ("      evidence: unverified", "      evidnce: unverified", 18, "did you mean 'evidence'"),  # first row
    ("  - columns: [name, devices, batch, value]", "  - columns: [name, name, batch, value]", 5,
     "a non-empty list of distinct names"),
    ("  - columns: [name, devices, batch, value]", "  - columns: [name, devices, batch, value]\n    rws: []", 6,
     "did you mean 'rows'"),
]


@pytest.mark.parametrize(("old", "new", "line", "message"), BAD_TABLE)
def test_bad_tables_give_one_line_at_the_table_row(tmp_path, old, new, line, message):
    assert old in TABLE
    path = write(tmp_path, TABLE.replace(old, new, 1))
    with pytest.raises(DlperfError) as err:
        load_dataset([path])
    text = str(err.value)
    assert message in text and "\n" not in text
    # the line of the template for a bad template, else of the first table row whose expansion is wrong
    assert text.startswith(f"{path}:{line}:"), text


def test_table_expansion_is_budgeted_before_it_is_built(tmp_path):
    from dlperf.spec.yamlio import MAX_NODES
    from dlperf.validate import MAX_TABLE_CHARS

    head, _ = TABLE.split("    rows:\n")
    many = max(MAX_NODES // 30, 100)  # the template has 30+ nodes: more nodes than a file may expand to
    path = write(tmp_path, head + "    rows:\n" + "".join(f"      - [r{i}, 1, 8, 100]\n" for i in range(many)))
    with pytest.raises(DlperfError, match=f"at most {MAX_NODES:,} YAML nodes per file"):
        load_dataset([path])
    # long texts: 2,000 characters per row, more rows than MAX_TABLE_CHARS allows, well inside the node budget
    note = '      note: "' + "n" * 1990 + '{name}"\n'
    long = head.replace("      evidence: unverified", note + "      evidence: unverified")
    count = MAX_TABLE_CHARS // 1990 + 10
    path = write(tmp_path, long + "    rows:\n" + "".join(f"      - [r{i}, 1, 8, 100]\n" for i in range(count)))
    with pytest.raises(DlperfError, match="characters of text per file"):
        load_dataset([path])


def test_a_file_needs_rows_or_tables(tmp_path):
    path = write(tmp_path, 'sources:\n  fixture:\n    citation: "c"\n')
    with pytest.raises(DlperfError, match="missing required key 'rows'"):
        load_dataset([path])
    path = write(tmp_path, 'sources:\n  fixture:\n    citation: "c"\ntables: []\n')
    with pytest.raises(DlperfError, match="expected a non-empty list of tables"):
        load_dataset([path])


# ----------------------------------------------------------------------------------------- vTrain

VTRAIN = DATA_DIR / "vtrain2024.yaml"


def test_vtrain_rows_carry_the_csv_figures():
    # VIA-Research/vTrain data/ground_truth_single.csv @f8dda847, line 2: 2 GPUs, global batch 16, micro batch 8,
    # hidden 1024, 16 heads, 24 layers, seq 1024, TP 1 DP 1 PP 2: 372.160408 ms; line 1441: 4 GPUs, 64, 8, 1024,
    # 16, 24, 1024, TP 1 DP 4 PP 1: 474.725583 ms.
    rows = {r.id: r for r in load_dataset([VTRAIN])}
    first = rows["vtrain-1n-L2-h1024-l24-g2-tp1-dp1-pp2-mb8-gb16"]
    assert (first.value, first.unit, first.hardware) == (0.372160408, "iteration_time_s", "dgx-a100")
    assert first.plan == Plan(devices=2, dp=1, tp=1, pp=2, global_batch=16, micro_batch=8, schedule="1f1b",
                              recompute="full", dtype="fp16", optimizer="adam", dp_impl="post-backward",
                              optimizer_impl="deepspeed-fp16")
    assert first.sets == {"hidden": 1024, "heads": 16, "layers": 24, "seq": 1024, "vocab": 50257}
    last = rows["vtrain-1n-L1441-h1024-l24-g4-tp1-dp4-pp1-mb8-gb64"]
    assert last.value == 0.474725583 and "iteration time (ms) 474.725583" in last.where
    single = [r for r in rows.values() if r.source == "vtrain-single-node"]
    multi = [r for r in rows.values() if r.source == "vtrain-multi-node"]
    assert (len(single), len(multi)) == (1440, 109) and not load_pending([VTRAIN])
    assert {r.hardware for r in multi} == {"a100-800g"}  # the 800 Gb/s per node the multi-node configs state
    # 175B, 512 GPUs, TP 4 DP 4 PP 32, micro-batch 2 was measured twice (CSV lines 92 and 93); both are kept
    twice = [r.value for r in multi if r.plan.tp == 4 and r.plan.pp == 32 and r.plan.micro_batch == 2]
    assert twice == [53.9096, 53.9379]


def test_vtrain_seconds_are_the_published_milliseconds():
    data = yaml.safe_load(VTRAIN.read_text())
    for table in data["tables"]:
        ms, s = table["columns"].index("ms"), table["columns"].index("s")
        for cells in table["rows"]:
            assert isinstance(cells[ms], str) and float(cells[ms]) / 1000 == pytest.approx(cells[s], rel=1e-12)


# ----------------------------------------------------------------------------------------- arithmetic


def fake(value: float, predicted: float, source: str = "s", evidence: str = "verified") -> Result:
    row = Row(id="r", source=source, citation="c", where="w", evidence=evidence, tags=(), model="gpt", sets={},
              hardware="dgx-a100", plan=Plan(), value=value, unit="samples_per_s")
    return Result(row, predicted)


def test_signed_error_and_summary_are_hand_computed():
    results = [fake(100, 110, "a"), fake(200, 150, "a"), fake(10, 10.5, "b")]
    assert [r.error_pct for r in results] == pytest.approx([10.0, -25.0, 5.0])
    a, b, overall = summary(results)
    # source a: the two rows share model, hardware, devices, batch and unit -> one plan group, ranked right
    assert a == pytest.approx({"source": "a", "measured": True, "count": 2, "mean_abs_error_pct": 17.5,
                               "median_abs_error_pct": 17.5,
                               "max_abs_error_pct": 25.0, "mean_signed_error_pct": -7.5, "groups": 1,
                               "spearman_median": 1.0})
    assert (b["source"], b["count"], b["max_abs_error_pct"]) == ("b", 1, pytest.approx(5.0))
    assert (b["groups"], b["spearman_median"]) == (0, None)
    assert overall["source"] == "overall" and overall["count"] == 3
    assert overall["mean_abs_error_pct"] == pytest.approx(40 / 3)
    assert overall["median_abs_error_pct"] == pytest.approx(10.0)
    assert mean_abs_error(results) == pytest.approx(40 / 3)


def test_simulated_rows_are_summarised_but_left_out_of_the_overall():
    """A figure another model computed is compared per source, never counted as accuracy: the overall error,
    its plan groups and --max-error's mean cover the measured rows only."""
    results = [fake(100, 110, "a"), fake(100, 300, "sim", "simulated"), fake(200, 900, "sim", "simulated")]
    a, sim, overall = summary(results)
    assert (sim["source"], sim["measured"], sim["count"], sim["groups"]) == ("sim", False, 2, 1)
    assert (overall["count"], overall["groups"]) == (1, 0)
    assert overall["mean_abs_error_pct"] == pytest.approx(10.0) == mean_abs_error(results)
    assert median_spearman(results) is None
    assert "2 rows" in simulated_line(results) and "sim 2" in simulated_line(results)
    assert simulated_line(results[:1]) == ""
    # a simulated source chosen alone is still gated on itself: (200% + 350%) / 2
    assert mean_abs_error(results[1:]) == pytest.approx(275.0)


def test_vtrain_single_node_is_marked_simulated():
    """VIA-Research/vTrain's single-node 'ground truth' is exactly bilinear in layers and micro-batches within a
    plan (benchmarks/vtrain_ground_truth_check.py): per-layer steps repeat to the nanosecond, which no measured
    iteration does. Checked here on the rows themselves, and that the file says so."""
    data = yaml.safe_load(VTRAIN.read_text())
    single = next(t for t in data["tables"] if t["template"]["source"] == "vtrain-single-node")
    assert single["template"]["evidence"] == "simulated"
    cols = single["columns"]
    times: dict[tuple, dict[int, float]] = {}
    for cells in single["rows"]:
        r = dict(zip(cols, cells, strict=True))
        if r["dp"] == 1 and r["pp"] == 1:
            times.setdefault((r["hidden"], r["tp"], r["micro_batch"], r["global_batch"]), {})[r["layers"]] = r["s"]
    steps = [[(t[b] - t[a]) / (b - a) for a, b in zip(sorted(t), sorted(t)[1:], strict=False)]
             for t in times.values() if len(t) > 2]
    assert len(steps) >= 10
    assert all(max(s) - min(s) < 2e-9 for s in steps)


@given(st.lists(st.tuples(st.floats(0.1, 1e6), st.floats(0.1, 1e6)), min_size=1, max_size=20))
def test_summary_statistics_are_ordered(pairs):
    stats = summary([fake(m, p) for m, p in pairs])[-1]
    assert stats["count"] == len(pairs)
    # fmean of equal values may exceed them by an ulp: compare with a relative floating-point slack
    slack = stats["max_abs_error_pct"] * 1e-12 + 1e-9
    assert stats["median_abs_error_pct"] <= stats["max_abs_error_pct"] + slack
    assert stats["mean_abs_error_pct"] <= stats["max_abs_error_pct"] + slack
    assert abs(stats["mean_signed_error_pct"]) <= stats["mean_abs_error_pct"] + 1e-9


def test_ratio_rows_compare_the_ratio_of_two_predictions(tmp_path):
    from dlperf.engine import predict
    from dlperf.spec.hardware import load_hardware
    from dlperf.spec.model import load_model

    rows = load_dataset([write(tmp_path, TINY)])
    one, eight = evaluate(rows)
    model = load_model("gpt", {"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000})
    hw = load_hardware("dgx-a100")
    base = predict(model, hw, Plan(devices=1, global_batch=8, micro_batch=8, dtype="fp16"))
    dp8 = predict(model, hw, Plan(devices=8, dp=8, global_batch=64, micro_batch=8, dtype="fp16"))
    assert one.predicted == pytest.approx(base.throughput_samples_per_s)
    assert eight.predicted == pytest.approx(dp8.throughput_samples_per_s / base.throughput_samples_per_s)
    assert eight.error_pct == pytest.approx((eight.predicted - 6.0) / 6.0 * 100)


def test_select_filters_by_source_and_every_tag():
    rows = load_dataset()
    assert {r.source for r in select(rows, ["dle-resnet50"])} == {"dle-resnet50"}
    single = select(rows, tags=["cnn-dp", "single-gpu"])
    assert len(single) == 4 and all(r.plan.devices == 1 for r in single)


# ----------------------------------------------------------------------------------------- plan ranking


def test_average_ranks_share_ties():
    assert average_ranks([3, 1, 3, 2]) == [3.5, 1.0, 3.5, 2.0]
    assert average_ranks([5, 5, 5]) == [2.0, 2.0, 2.0]


def test_spearman_is_hand_computed():
    # No ties: 1 - 6*sum(d^2)/(n(n^2-1)) = 1 - 6*2/60 = 0.8.
    assert spearman([10, 20, 30, 40], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    # Ties: ranks [1,2,3,4,5] vs [1,2,3.5,5,3.5]; Pearson of ranks = 8 / sqrt(10 * 9.5).
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / (10 * 9.5) ** 0.5)
    assert spearman([1, 1, 1], [1, 2, 3]) is None       # nothing to rank
    assert spearman([1], [2]) is None
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)), min_size=2, max_size=12))
def test_spearman_is_bounded_and_symmetric(pairs):
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    rho = spearman(xs, ys)
    if rho is not None:
        assert -1 - 1e-9 <= rho <= 1 + 1e-9
        assert spearman(ys, xs) == pytest.approx(rho)
        assert spearman(xs, [-y for y in ys]) == pytest.approx(-rho)


def plan_result(value: float, predicted: float, devices: int, group: str | None = None, tp: int = 1) -> Result:
    row = Row(id=f"r{value}", source="s", citation="c", where="w", evidence="verified", tags=(), model="gpt",
              sets={}, hardware="dgx-a100", plan=Plan(devices=devices, tp=tp, global_batch=64), value=value,
              unit="samples_per_s", group=group)
    return Result(row, predicted)


def test_plan_groups_by_job_and_explicit_group():
    results = [plan_result(10, 1, 8), plan_result(20, 3, 8, tp=2), plan_result(30, 2, 8, tp=4),
               plan_result(40, 5, 16)]
    (group,) = plan_groups(results)                     # the 16-device row is another cluster: no group of 2
    assert group["count"] == 3 and group["spearman"] == pytest.approx(0.5)
    joined = [plan_result(10, 1, 8, "g"), plan_result(40, 5, 16, "g")]
    assert [g["spearman"] for g in plan_groups(joined)] == [pytest.approx(1.0)]
    # predictions that cannot tell plans apart rank nothing: rho 0, a miss
    assert plan_groups([plan_result(10, 2, 8), plan_result(20, 2, 8, tp=2)])[0]["spearman"] == 0.0
    assert median_spearman(results) == pytest.approx(0.5)
    assert group["varies"] == ["dp", "tp", "micro_batch"] and is_layout_group(group)


def test_layout_summary_leaves_out_groups_that_compare_dtypes():
    amp = plan_result(20, 2, 8)
    tf32 = Result(Row(**{**amp.row.__dict__, "id": "tf32", "value": 10.0,
                         "plan": amp.row.plan.with_(dtype="tf32")}), 1.0)
    tp2, tp4 = plan_result(30, 1, 16), plan_result(40, 2, 16, tp=2)     # ranked backwards: rho -1
    tp4 = Result(tp4.row, 0.5)
    groups = plan_groups([amp, tf32, tp2, tp4])
    assert [g["varies"] for g in groups] == [["dtype"], ["dp", "tp", "micro_batch"]]
    assert median_spearman([amp, tf32, tp2, tp4]) == pytest.approx(0.0)          # median of 1 and -1
    assert median_spearman([amp, tf32, tp2, tp4], layout_only=True) == pytest.approx(-1.0)


def test_pending_rows_are_listed_not_scored(tmp_path, capsys):
    text = TINY + """  - id: later
    source: fixture
    where: "n/a"
    evidence: unverified
    model: llama3-8b
    hardware: dgx-h100
    plan: {devices: 8, dp: 4, cp: 2, global_batch: 4, dtype: fp8}
    measured: {value: 1000, unit: tokens_per_s_per_device}
    pending: {fp8: "no FP8 GEMMs yet", cp: "no context parallelism yet"}
"""
    path = write(tmp_path, text)
    assert [r.id for r in load_dataset([path])] == ["one", "eight"]
    (later,) = load_pending([path])
    assert later.waits_for == {"fp8": "no FP8 GEMMs yet", "cp": "no context parallelism yet"}
    main(["validate", str(path), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["rows"]] == ["one", "eight"]
    assert [(p["id"], p["waits_for"]) for p in out["pending"]] == [("later", "fp8,cp")]
    main(["validate", str(path)])
    assert "Pending: 1 published rows dlperf does not model yet" in capsys.readouterr().out
    for bad in ('{}', '{fp8: ""}', '[fp8]'):
        broken = write(tmp_path, text.replace('{fp8: "no FP8 GEMMs yet", cp: "no context parallelism yet"}', bad),
                       "broken.yaml")
        with pytest.raises(DlperfError, match="expected a mapping of missing feature to the reason"):
            load_dataset([broken])


# ----------------------------------------------------------------------------------------- the command


def test_command_json_report_for_a_user_file(tmp_path, capsys):
    path = write(tmp_path, TINY)
    main(["validate", str(path), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["rows"]] == ["one", "eight"]
    assert [s["source"] for s in out["summary"]] == ["fixture", "overall"]
    errors = [abs(r["error_pct"]) for r in out["rows"]]
    assert out["summary"][-1]["mean_abs_error_pct"] == pytest.approx(statistics.fmean(errors))
    assert (out["groups"], out["median_spearman"], out["median_spearman_layout"], out["pending"]) == (
        [], None, None, [])


def test_a_published_plan_predicted_not_to_fit_is_reported(tmp_path, capsys):
    # a run that was measured fits by definition: when dlperf's memory says it does not, the report says so
    # (by source, and the row ids in JSON) instead of scoring the time alone
    heavy = TINY.replace(f"set: {TINY_SET}\n    hardware: dgx-a100\n    plan: {{devices: 1,",
                         "set: {layers: 96, hidden: 12288, heads: 96, seq: 2048, vocab: 51200}\n"
                         "    hardware: dgx-a100\n    plan: {devices: 1,", 1)
    assert heavy != TINY
    path = write(tmp_path, heavy)
    main(["validate", str(path)])
    assert "memory: 1 published plans (they ran) are predicted NOT to fit in device memory (fixture 1)" in \
        capsys.readouterr().out
    main(["validate", str(path), "--format", "json"])
    assert json.loads(capsys.readouterr().out)["predicted_unfit"] == ["one"]
    main(["validate", str(write(tmp_path, TINY, "fits.yaml"))])
    assert "predicted NOT to fit" not in capsys.readouterr().out


def test_command_max_error_sets_the_exit_status(tmp_path, capsys):
    path = write(tmp_path, TINY)
    main(["validate", str(path), "--max-error", "1e9"])  # returns normally: exit status 0
    assert "Absolute % error per source" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(path), "--max-error", "0"])
    assert exit_info.value.code == 1


def test_command_filters_csv_and_plot(tmp_path, capsys):
    plot = tmp_path / "parity.png"
    main(["validate", "--source", "megatron-readme-gpt3", "--format", "csv", "--plot", str(plot)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "id,source,unit,measured,predicted,error_pct,evidence,tags"
    assert [line.split(",")[0] for line in lines[1:]] == ["megatron-readme-gpt3-175b-iter",
                                                         "megatron-readme-gpt3-175b-tflops"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratio_rows_keep_their_baseline_when_a_filter_drops_it(capsys):
    main(["validate", "--tag", "scaling", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 10 and {r["unit"] for r in out["rows"]} == {"scaling_efficiency"}
    assert all(0 < r["predicted"] <= 1.0 for r in out["rows"])


def test_command_bad_file_and_empty_filter_exit_2_with_one_line(tmp_path, capsys):
    path = write(tmp_path, TINY.replace("    source: fixture\n", "", 1))
    for argv in (["validate", str(path)], ["validate", "--tag", "no-such-tag"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("Error: ") and err.count("\n") == 1


# ----------------------------------------------------------------------------------------- accuracy
# Fixed tolerances (issue 8). A miss is a strict xfail whose reason states the measured error and the term
# of the model that is wrong, so that CI stays green and the miss stays visible.


@pytest.fixture(scope="module")
def results() -> list[Result]:
    return evaluate(load_dataset())


def mae(results: list[Result], *tags: str) -> float:
    chosen = [r for r in results if any(t in r.row.tags for t in tags)]
    assert chosen, tags
    return mean_abs_error(chosen)


def test_every_scored_row_counted_and_plans_ranked(results):
    # Issue 12's ranking acceptance: median within-group Spearman >= 0.9 over the groups of measured rows (0.96 over
    # 79; 0.97 over 223 while vTrain's simulated one-node groups counted)
    # 2136 since the Qwen3-235B GB200 MXFP8 token-drop row scores at etp 1 (2135 before); 2152 with the 16 Nemotron
    # 3 Nano MXFP8 rows; 2158 with 6 Nemotron 3 Super MXFP8 rows
    assert len(results) == 2158
    assert median_spearman(results) >= 0.9


def test_etp_equal_to_tp_leaves_every_row_bit_identical(results):
    """A plan without `etp` splits the experts as tp splits the dense layers (Megatron-Core's default expert tp,
    megatron/training/arguments.py @92c8482e:465-466): every row with etp = tp written out predicts the same figure,
    to the last bit, and fits or not as before (tests/test_etp.py compares breakdowns and memory)."""
    from dataclasses import replace

    unset = [r for r in results if r.row.plan.etp is None]  # all but the one row at etp 1
    assert len(unset) == len(results) - 1
    explicit = evaluate([replace(r.row, plan=r.row.plan.with_(etp=r.row.plan.tp)) for r in unset])
    assert [(r.predicted, r.notes) for r in explicit] == [(r.predicted, r.notes) for r in unset]


# Issue 12's overall acceptance, mean abs error over the scored measurements <= 10%: 9.95% over 718 rows (13.1% at
# ed6d1eb; 9.42% over 696 before the 16 Nemotron 3 Nano rows, +19..+34%, and 6 Nemotron 3 Super rows, +8..+30%), by a
# very small margin. Megatron-Bridge (15.4% over 229: its MoE all-to-all rows, GPT-OSS and Nemotron 3 too fast) is over
# its own
# bound (the strict xfails below); vTrain's 1,440 one-node rows, its simulator's output, are not counted.
def test_every_scored_row_overall_within_10_percent(results):
    assert mean_abs_error(results) <= 10.0


@pytest.mark.xfail(strict=True, reason=(
    "4 published plans (they ran) are predicted not to fit in device memory: Megatron-Bridge 2 of 223, both "
    "Llama 3 70B on GB300 26.02.01 at the table's layouts, which the preset (PP 4 VP 5 MBS 1, 259.0 GiB of "
    "277.5) contradicts: NVFP4 at TP 1 PP 1 MBS 2 without FSDP (639 GiB: 131 GiB of bf16 weights alone) and "
    "MXFP8 at PP 4 MBS 2 without VP (383 GiB); GPT-OSS 120B 25.11 on H100 at the table's unconfirmed MBS 4 "
    "(120 GiB of 79.6; the preset's MBS 1 fits); DeepSeek-V3 on H800 (79.4 GiB of 79.1: 43 GiB of activations for "
    "PP+1 micro-batches on DualPipe's first rank, 0.3 GiB over); nothing fitted"))
def test_every_published_plan_is_predicted_to_fit(results):
    assert not predicted_unfit(results), [r.row.id for r in predicted_unfit(results)][:10]


def test_llm_hybrid_rows_within_10_percent(results):
    # Narayanan 2021 Table 1, Megatron-LM 2020 tables and the GPT-3 175B example, with GEMM curves fitted to
    # kernel microbenchmarks (hardware/*.yaml) and tile/wave quantization; nothing fitted to these rows.
    assert mae(results, "llm-hybrid") <= 10.0


# CNN/BERT data-parallel MAE 8.7% over 43 rows (ResNet-50 8.0%, -1..+20%: A100 AMP +5/+20%, TF32 -1/+1%, with cuDNN's
# NCHW transposes, A100 convolutions at V100's cuDNN-over-GEMM rate, torch.optim's per-tensor loop, in-place ReLUs and
# DLE's 8-iteration accumulation on one GPU priced; PyTorch BERT seq 128 6.8%; TensorFlow 1 BERT on A100 40GB 10.3%,
# every row too fast, AMP +7..+22%, TF32 +5..+15%, with its per-micro-batch gradient passes, tf.nn.dropout's float32
# random tensors, XLA's fused float32 LayerNorm, GELU and attention-softmax sections, the AMP accumulation run's host
# tail after its sync on all_are_finite and Horovod v0.19's cycle, fusion buffers and copies priced). Still open: A100
# convolutions carry V100's cuDNN-over-GEMM ratio for want of an A100 per-shape cuDNN microbenchmark; the 8-GPU AMP
# row +20%; DLE's CPU loader does not bind at its sourced per-sample costs; the 2020 TensorFlow stack is slower than
# dlperf prices per micro-batch (12-20 ms on one GPU) and per multi-node update (~95-125 ms) for reasons not found.
# The PyTorch seq-512 rows wait as pending (LDDL sequence binning).
def test_cnn_and_bert_data_parallel_rows_within_15_percent(results):
    assert mae(results, "cnn-dp", "bert-dp") <= 15.0


# Issue 12's single-device acceptance: ResNet-50 on one A100 (TF32 and AMP) and BERT on one A100 within 15%,
# each row on its own (a source mean could hide one precision behind the other).
SINGLE_DEVICE_TOLERANCE_PCT = 15.0


def assert_single_gpu_rows_within(results: list[Result], source: str, hardware: str) -> None:
    """Every one-GPU row of `source` on `hardware`, TF32 and FP16 both present, within the tolerance."""
    chosen = [r for r in results if r.row.source == source and "single-gpu" in r.row.tags
              and r.row.hardware == hardware]
    assert {r.row.plan.dtype for r in chosen} == {"tf32", "fp16"}, (source, hardware)
    assert max(abs(r.error_pct) for r in chosen) <= SINGLE_DEVICE_TOLERANCE_PCT, [
        (r.row.id, round(r.error_pct, 1)) for r in chosen]


# One A100, DLE PyTorch ResNet-50: AMP +4.9%, TF32 -0.8% (NCHW, with cuDNN's layout transposes), with A100
# convolutions at V100's measured cuDNN-over-GEMM rate (spec/hardware.py CONV_OVER_GEMM; before it, on the GEMM
# curve itself, +19.6% / +8.7%).
def test_single_a100_resnet50_rows_within_15_percent(results):
    assert_single_gpu_rows_within(results, "dle-resnet50", "dgx-a100")


def test_single_a100_pytorch_bert_rows_within_15_percent(results):
    # DLE PyTorch BERT-large at sequence 128 on one A100 80GB, AMP and TF32 (the seq-512 rows are pending).
    assert_single_gpu_rows_within(results, "dle-bert-pytorch", "dgx-a100")


# One A100 40GB, DLE TensorFlow 1 BERT-large: AMP +9.0% (seq 128) / +7.5% (seq 512), TF32 +4.9% / +11.3%, all
# too fast, 12-20 ms short per micro-batch. Priced: optimization.py's per-micro-batch gradient passes (grad_passes),
# tf.nn.dropout's float32 random tensors (tf_dropout), XLA's kernels for the LayerNorm sections, the GELU and the
# attention's scale-mask-softmax-dropout (tf_xla: three forward kernels that write the scores and exp back, two
# backward ones that re-read exp and the random tensor), and under AMP the host's tail after the accumulation run's
# sync on all_are_finite (the global norm's tf.cond; dlperf.engine.tf1_update.accumulation_sync_host). Not priced:
# the Estimator session.run's own start and end (scalar fetches, a host sync), which no measurement here sizes.
def test_single_a100_tf1_bert_rows_within_15_percent(results):
    assert_single_gpu_rows_within(results, "dle-bert-tf1", "a100-40gb")


# The pipeline-speedup tolerance (15%) is tested in tests/test_validate_pipeline.py on the torchgpipe rows.


# MPT/FSDP, 216 rows: 9.8% (llm-foundry H100 BF16 15.7%, H100 FP8 7.7%, A100 80GB 5.8%, A100 40GB 7.9%) since the
# A100 FlashAttention-2 curve is FlashAttention-2's own A100 figure (it was a flat 0.73 of peak, faster than every bar)
# and composer's per-batch metric sync is priced (dlperf.engine.metric_sync). Still too fast where the GEMMs dominate:
# H100 at 2k +14..+27% on 8-64 GPUs, no sourced cause found.
def test_fsdp_llm_rows_within_10_percent(results):
    assert mae(results, "llm-fsdp") <= 10.0


# Issue 14's acceptance: new public rows within 15%, FP8 and MoE rows within 20%, each row. Every new scored row
# is an FP8 run (Megatron-Bridge H100 Llama 3 and DeepSeek-V3, llm-foundry's H100 FP8 table), so 20% applies to
# all of them; no new row runs in BF16.
ISSUE14_FP8_MOE_TOLERANCE_PCT = 20.0


def test_megatron_bridge_llama3_fp8_rows_within_20_percent(results):
    # Llama 3 8B (FSDP), 70B (TP+PP+VP, TP overlap) and 405B (+ CP 2) on DGX-H100 in FP8, 13 rows (25.09-26.06).
    chosen = [r for r in results if r.row.source == "megatron-bridge-perf" and r.row.model.startswith("llama3")
              and "llm-hybrid-h100" in r.row.tags]
    assert len(chosen) == 13
    worst = max(chosen, key=lambda r: abs(r.error_pct))
    assert abs(worst.error_pct) <= ISSUE14_FP8_MOE_TOLERANCE_PCT, (worst.row.id, worst.error_pct)


# DeepSeek-V3 on 1024 H100s (TP 2, PP 8, VP 4, EP 64, FP8): +21.0% until the per-micro-batch gradient
# accumulation was priced (now +16.9%); still not counted: the MTP layer, the recipe's recomputation of
# mla_up_proj and mlp, and its uneven pipeline layout.
def test_megatron_bridge_deepseek_v3_moe_row_within_20_percent(results):
    (row,) = [r for r in results if r.row.id == "mbridge-2509-deepseek-v3-h100"]
    assert abs(row.error_pct) <= ISSUE14_FP8_MOE_TOLERANCE_PCT


def test_llmfoundry_fp8_rows_are_the_seven_published(results):
    # outside the strict xfail below, so that a miscount cannot pass as the expected failure
    assert len([r for r in results if r.row.source == "llmfoundry-h100-fp8"]) == 7


# llm-foundry H100 FP8 (MPT-1B/3B, 8 GPUs, FSDP): MAE 7.7%, -6.9..+16.7% since the Triton attention kernel's
# causal fraction is priced per key length (dense.causal_fraction; it was 10.3%, -1..+21%, at a global 1/1.75).
# The short-sequence rows are still +12..+17%; the same configurations in BF16 miss alike (+17..+21% at 512),
# and the FP8/BF16 throughput ratio is predicted within -8..+6% of the measured one (test below).
def test_llmfoundry_fp8_rows_within_20_percent(results):
    chosen = [r for r in results if r.row.source == "llmfoundry-h100-fp8"]
    assert max(abs(r.error_pct) for r in chosen) <= ISSUE14_FP8_MOE_TOLERANCE_PCT


def test_llmfoundry_fp8_over_bf16_speedup_within_20_percent(results):
    # The five llm-foundry H100 configurations published in both BF16 and FP8 with the same model, sequence,
    # GPUs, micro-batch and checkpointing: the measured FP8 speedup (1.00-1.35x) against the predicted one.
    by_id = {r.row.id: r for r in results}
    pairs = ["3b-s32768-g8-mb3", "3b-s8192-g8-mb3", "3b-s512-g8-mb40", "1b-s32768-g8-mb1", "1b-s512-g8-mb56"]
    for tail in pairs:
        fp8, bf16 = by_id[f"llmfoundry-h100-fp8-{tail}"], by_id[f"llmfoundry-h100-{tail}"]
        assert fp8.row.plan == Plan(**{**bf16.row.plan.__dict__, "dtype": "fp8"})
        measured, predicted = fp8.row.value / bf16.row.value, fp8.predicted / bf16.predicted
        assert abs(predicted / measured - 1.0) * 100.0 <= ISSUE14_FP8_MOE_TOLERANCE_PCT, (tail, measured, predicted)


def test_korthikanti_rows_within_10_percent(results):
    assert mae(results, "llm-hybrid-2022") <= 10.0


# Narayanan 2021 Table 2, MAE 9.95%: the ZeRO-3 rows are +16/+14/-8% (175B, 384/768/1536 GPUs) and +27/+22/+20%
# (530B, 640/1120/2240) under zero_impl deepspeed-0.3; the predicted step rises 59 -> 73 s from 768 to 1536 GPUs
# where the measured one stays at 67 s, and the 530B rows (one transcription, unverified) keep 30-55 s per step that
# nothing found in the code explains; PTD-P rows -2..+4%
def test_zero3_vs_ptdp_rows_within_10_percent(results):
    assert mae(results, "llm-zero3-vs-ptdp") <= 10.0


# Narayanan 2021 Table 2: with DeepSpeed v0.3's stage 3 priced as its code runs (zero_impl deepspeed-0.3),
# PTD-P ranks above ZeRO-3 at every GPU count, as measured (Spearman was -1 in all 5 groups with the FSDP model).
def test_zero3_vs_ptdp_plans_rank_right(results):
    chosen = [r for r in results if r.row.source == "narayanan2021-table2"]
    assert median_spearman(chosen) >= 0.9


def test_bloom_topology_rows_within_10_percent(results):
    # On jean-zay-a100 (4x 100 Gb/s Omni-Path per node at the all-reduce bus bandwidth measured on 4 of these nodes,
    # not fitted to the rows); on dgx-a100's 8x 200 Gb/s HDR the same rows were 20.9% too fast on average
    chosen = [r for r in results if r.row.source == "bigscience-tr11-prequel"]
    assert len(chosen) == 56 and mean_abs_error(chosen) <= 10.0


def test_bloom_topology_plans_rank_right(results):
    # Median within-group Spearman 0.91 over 14 groups (0.60 on dgx-a100's fabric, 0.62 on jean-zay-a100 before the
    # stage-boundary sends shared the node's 4 links). Still wrong, and unpriced: hidden 13824 with 128 heads (head
    # dim 108, not a multiple of 8; measured +40% over 64 heads where dlperf sees +3%) and DP 8 TP 4 PP 12 MBS 1 at
    # hidden 13824 (148 s against 104 s at MBS 2)
    chosen = [r for r in results if r.row.source == "bigscience-tr11-prequel"]
    assert median_spearman(chosen) >= 0.9


# vTrain single-node rows (1,440 plans of 0.3-1.3B GPT on 2-8 A100s of one node): vTrain's simulator output, not
# measurements (evidence: simulated; test_vtrain_single_node_is_marked_simulated). Not an accuracy test: it holds
# dlperf within 15% of another model of the same host-bound regime (8.0%; TP 8 -17%), so that a change there shows.
def test_vtrain_single_node_rows_within_15_percent(results):
    chosen = [r for r in results if r.row.source == "vtrain-single-node"]
    assert len(chosen) == 1440 and mean_abs_error(chosen) <= 15.0


def test_mixed_precision_pairs_rank_right(results):
    # DLE: AMP and TF32 at the same batch and GPU count (18 groups: 2 ResNet-50, 7 PyTorch BERT seq 128 and 9 of
    # the TensorFlow 1 BERT rows on A100 40GB; the 7 PyTorch seq-512 groups wait as pending rows for sequence
    # binning); every one ranked right today. These are the easy groups (a 2-8x peak difference); they carry the
    # overall median of 1.0, the parallelism groups do not.
    groups = [g for g in plan_groups(results) if g["source"].startswith("dle-")]
    assert len(groups) == 18 and all(g["spearman"] == 1.0 for g in groups)


def _blackwell_llama3(results: list[Result]) -> list[Result]:
    return [r for r in results if r.row.source == "megatron-bridge-perf" and r.row.model.startswith("llama3")
            and {"llm-hybrid-b200", "llm-hybrid-gb200", "llm-hybrid-gb300"} & set(r.row.tags)]


def _new_moe(results: list[Result]) -> list[Result]:
    return [r for r in results if r.row.source == "megatron-bridge-perf" and "moe" in r.row.tags
            and r.row.model != "gpt-oss-120b"]


def _gpt_oss(results: list[Result]) -> list[Result]:
    return [r for r in results if r.row.model == "gpt-oss-120b"]


def test_megatron_bridge_tolerance_tests_score_the_rows_they_name(results):
    # outside the tolerance tests below, so that a miscount cannot pass as the strict xfail's expected failure
    # FP8 27: 8B x 5 (B200 2, GB200 2, GB300 1), 70B x 8 with activation offloading (GB200 4, GB300 4), 405B x 14
    # (2, 6, 6); MXFP8 27: 8B x 5 (2, 2, 1), 70B x 9 (GB200 5, GB300 4), 405B x 13 (2, 6, 5); NVFP4 18: 70B x 8
    # (GB200 4, GB300 4), 405B x 10 (GB200 5, GB300 5)
    assert len(_blackwell_llama3(results)) == 72
    # FP8 9: Qwen3-30B x 6 (26.02's H100 on DeepEP), Qwen3-235B x 1, DeepSeek-V3 token-drop x 2; all-to-all MXFP8
    # 14 (11 on B200/GB200, the 25.11 DeepSeek-V3 w/ MTP one of them and the 25.09 Qwen3-235B GB200 token-drop one
    # at etp 1; 3 Qwen3-235B on B300); HybridEP 85 (DeepSeek-V3 26, Qwen3-235B 17, Qwen3-30B 26, Nemotron 3 Nano 16
    # MXFP8: GB300 6, GB200 5, B300 4, B200 1; 13 of them on B300). 92 since that etp-1 row scores (91 before); 108
    # with Nemotron 3 Nano, a MoE model (23 of its 52 layers, HybridEP) scored from the same tables; 114 (HybridEP
    # 91) with Nemotron 3 Super MXFP8 (40 LatentMoE layers of 88, HybridEP): GB300 2, B300 2, B200 2.
    assert len(_new_moe(results)) == 114
    # GPT-OSS 120B, 29 of 31 table rows: BF16 on H100, B200, GB200, GB300, B300 (releases 25.11, 26.02, 26.02.01,
    # 26.04, 26.04.01: 5 each, less B300 at 25.11) and MXFP8 on GB200, GB300 (26.06, 26.08) and B300 (26.06)
    assert len(_gpt_oss(results)) == 29


@pytest.mark.xfail(strict=True, reason=(
    "Megatron-Bridge GPT-OSS 120B (29 rows, MAE 27.3%, all but two too fast): BF16 H100 +9..+14% (PP 4 split "
    "as Megatron does, 9 layers a stage: +19..+24% on the balanced split's 8-layer last stage), B200 +25..+87%, "
    "GB200 +10..+49%, GB300 +23..+26%, B300 +32..+74% (26.02's EP 64 rows across 8 nodes +26/+74%); MXFP8 "
    "(26.06+, full-iteration CUDA graphs and fused grouped MLP) GB200 +5/+6%, GB300 -3/-4%, B300 +28%. No aux "
    "loss (GPT-OSS's routing type none). The errors follow the run settings more than the hardware: the "
    "whole-iteration-graph rows are within 6%. "
    "Priced: the sliding-window layers as cuDNN runs them, "
    "head dim 64 at cuDNN's H100 rate, Megatron-Core's eager GLU clamp, fp32 down-projection bias and eager YaRN "
    "RoPE, the QKV split copies, the expert GEMMs per expert (TE's own grouped-GEMM benchmark, "
    "NVIDIA/TransformerEngine#2045), GEMMs at their power-limited rates. NVIDIA credits the fused MoE kernels that "
    "enable full-iteration CUDA graphs with +93% end to end on GPT-OSS (developer blog, 2026-06-15): the BF16 runs "
    "before them pay host and synchronisation costs dlperf does not see (no published per-layer host time for "
    "TE's GroupedLinear was found); nothing fitted"))
def test_megatron_bridge_gpt_oss_rows_within_20_percent(results):
    assert max(abs(r.error_pct) for r in _gpt_oss(results)) <= ISSUE14_FP8_MOE_TOLERANCE_PCT


@pytest.mark.xfail(strict=True, reason=(
    "Megatron-Bridge Llama 3 on DGX-B200 / GB200 / GB300 NVL72 in FP8, MXFP8 and NVFP4 (72 rows, MAE 7.6%, signed "
    "+3.2%); over 20%: 405B MXFP8 on GB200 (+8..+24%, the 25.09 row +24%), 70B FP8 with 40 layers offloaded on "
    "GB200 (+12..+21%) and 70B NVFP4 on GB300 (-3..+20%). FP8: 8B B200 +1/+3%, GB200 +7%, GB300 +2%; 70B with "
    "activation offloading GB300 +7..+12%; 405B -8..+7%. MXFP8: 8B B200 +5%, GB200 +12%, GB300 +6%; 70B GB200 "
    "+7..+13%, GB300 -17..+8%; 405B B200 +1/+2%, GB300 -0..+3%. NVFP4: 70B GB200 +5..+14%; 405B -13..-5%. "
    "Since the fused SwiGLU unit is priced as one kernel (Megatron-Core's bias_swiglu_impl) every row moved 1-2.5% "
    "faster; since B200 and GB200 share their cuDNN measurements (one die), GB200 rows on cuDNN 9.11/9.13 moved "
    "3-6% slower. GEMMs: B200's power-limited BF16 fit and XLA FP8 "
    "fit, GB200/GB300 as B200's times aiconfigurator's same-software ratios; fused attention at each release's "
    "cuDNN; MXFP8 GEMMs on the FP8 curve (no same-run MXFP8/FP8 cuBLAS table is public); the 8B recipes' CUDA "
    "graphs (plan cuda_graphs) leave these device-bound rows unchanged; nothing is fitted to these rows"))
def test_megatron_bridge_blackwell_llama3_fp8_rows_within_20_percent(results):
    chosen = _blackwell_llama3(results)
    assert max(abs(r.error_pct) for r in chosen) <= ISSUE14_FP8_MOE_TOLERANCE_PCT


@pytest.mark.xfail(strict=True, reason=(
    "Megatron-Bridge MoE rows other than DeepSeek-V3 on H100 (114 rows, MAE 18.8%). The 91 HybridEP rows: MAE 12.4% "
    "(DeepSeek-V3 -9..+12% with the recipes' MTP layer, Qwen3-235B -17..+16%, Qwen3-30B +1..+21%, H100 +20..+22%; "
    "Nemotron 3 Nano MXFP8, 16 rows, MAE 27.3%, every one too fast: GB300 +24..+34%, GB200 +24..+32%, B300 "
    "+19..+26%, B200 +20%, with its Mamba-2 SSD priced as FlashAttention-2 over 2048 keys; its recipes' CUDA "
    "graphs (attn, mamba, moe_router, moe_preprocess) remove host time that dlperf already finds hidden; "
    "Nemotron 3 Super MXFP8 with its 2 MTP passes in BF16, 6 rows, MAE 20.1%: GB300 +23/+25%, B300 +25/+30%, "
    "B200 +8/+10% (EP 64 over 8 nodes: HybridEP's RDMA leg once per node reached)). "
    "The 23 all-to-all / DeepEP rows: MAE 44.4%, -22..+168% (the 25.09 token-drop ones as drop-and-pad at capacity "
    "factor 1, -22..+21%): Qwen3-30B H100 dropless with EP overlap +168% (25.11, all-to-all), +139% (26.02, DeepEP "
    "as Megatron-Bridge v0.3.0 sets it), +27% (26.02.01: the same table layout measured 1.8x faster; v0.3.1's "
    "preset is EP 16 with HybridEP), B200 MXFP8 MBS 1 all-to-all +87% (25.11), +86% (26.02); Qwen3-235B B300 +137% "
    "(26.02: VP 4 with EP overlap, v0.3.0), +98% (26.02.01: the table's VP 4 at MBS 1) and +18% (26.04), B200 "
    "+0..+72%. Megatron-Bridge#1998 (2026-01-20): 25.11's dropless Qwen3-30B runs on H100 and B200 are 2x slower "
    "than 25.09's token-drop ones; #1760 turned EP overlap off on Qwen3-235B B200 'due to CPU overhead' (MXFP8 step "
    "20.1 -> 16.9 s with VP off too); dlperf prices EP overlap and DeepEP as gains. Priced: TE's per-expert GEMMs "
    "on four streams, per-expert FP8 quantization, MXFP8 scale swizzles, the dispatcher's count gather, "
    "all-to-alls and host sync, DeepEP's layout kernel, Megatron-Core's router, aux-loss and permutation operators, "
    "fused RoPE and the QKV split copies. Qwen3-30B on 8 B200, 26.02 (all-to-all, MBS 1, CUDA graphs on router and "
    "preprocess) against 26.02.01 (HybridEP, MBS 4, attention graphed too): ~7.5 ms more per layer and micro-batch "
    "that no published host or per-component figure explains. CUDA graphs as each recipe sets them (plan "
    "cuda_graphs) remove host cost only: the full-iteration Qwen3-235B GB200 rows (26.06+) moved +4..+6% -> "
    "+13..+15%, the others are device-bound in dlperf and did not move; nothing is fitted"))
def test_megatron_bridge_new_moe_rows_within_20_percent(results):
    chosen = _new_moe(results)
    assert max(abs(r.error_pct) for r in chosen) <= ISSUE14_FP8_MOE_TOLERANCE_PCT


def test_layout_summary_leaves_out_one_plan_measured_on_two_releases():
    """Two rows of one plan that differ only in the cuDNN their release shipped are the same plan measured twice,
    not alternatives to rank: the layout summary leaves them out, the all-groups median keeps them."""
    old = plan_result(20, 2, 8)
    new = Result(Row(**{**old.row.__dict__, "id": "new", "value": 10.0,
                        "plan": old.row.plan.with_(cudnn="9.18.0")}), 1.0)
    old = Result(Row(**{**old.row.__dict__, "plan": old.row.plan.with_(cudnn="9.13.1")}), 2.0)
    (group,) = plan_groups([old, new])
    assert group["varies"] == ["cudnn"] and not is_layout_group(group)
    assert median_spearman([old, new]) == pytest.approx(1.0)
    assert median_spearman([old, new], layout_only=True) is None
