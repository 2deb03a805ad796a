"""Models from Hugging Face config.json files (dlperf.spec.hf): parameter counts equal the reference
implementations' num_parameters(), the converted model prices like the equivalent built-in, and bad configs get
one located line.

The fixtures in tests/data/hf are the published config.json files of those checkpoints (values copied from the
Hugging Face model pages: meta-llama/Meta-Llama-3-8B, mistralai/Mistral-7B-v0.1, Qwen/Qwen2-7B, gpt2,
EleutherAI/pythia-160m, google-bert/bert-base-uncased and bert-large-uncased).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlperf.engine import predict
from dlperf.errors import SpecError
from dlperf.plan import Plan
from dlperf.spec import hf
from dlperf.spec.hardware import load_hardware
from dlperf.spec.hf import FAMILIES
from dlperf.spec.model import load_model, model_from_dict

DATA = Path(__file__).parent / "data" / "hf"

# model.num_parameters() of the transformers classes the configs name.
EXACT = {
    "meta-llama-3-8b": 8_030_261_248,   # LlamaForCausalLM (untied head)
    "mistral-7b-v0.1": 7_241_732_096,   # MistralForCausalLM
    "qwen2-7b": 7_615_616_512,          # Qwen2ForCausalLM (q/k/v biases, untied)
    "gpt2": 124_439_808,                # GPT2LMHeadModel (tied head)
    "pythia-160m": 162_322_944,         # GPTNeoXForCausalLM; Pythia paper (Biderman et al. 2023) Table 1 row
    # BertModel with pooler 109,482,240 + MLM head (transform 590,592 + LayerNorm 1,536 + decoder bias 30,522)
    "bert-base-uncased": 109_482_240 + 622_650,
    "bert-large-uncased": 336_224_058,  # = models/bert-large.yaml, the same layout
}


def config(name: str) -> str:
    return str(DATA / name / "config.json")


@pytest.mark.parametrize("name", sorted(EXACT))
def test_parameter_counts_equal_the_reference(name: str) -> None:
    model = load_model(config(name))
    assert model.total_params == EXACT[name]
    assert model.layers()[-1][0].op == "cross_entropy"


def test_bert_base_model_with_pooler_is_109_482_240() -> None:
    """BertModel alone (embeddings, encoder, pooler) is the figure transformers reports for bert-base."""
    model = load_model(config("bert-base-uncased"))
    body = sum(layer.params * count for layer, count in model.layers() if not layer.name.startswith("mlm_"))
    assert body == 109_482_240


def test_llama3_config_prices_like_the_builtin() -> None:
    # the built-in runs Hopper-generation fused attention (flash_version 3); a converted config defaults to SDPA's
    # FlashAttention-2. The built-in also prices the RoPE its training stacks run (Transformer Engine's fused kernel
    # under Megatron-Core, dlperf.ops.dense `rope: fused`) and Megatron-Core's QKV split copies (`qkv_split:
    # mcore`) and its fused SwiGLU kernel (`fused_swiglu`: one kernel for the gate's SiLU and the product); a config
    # names no stack, so the converted model leaves them out and is given them here to compare the rest.
    data, file = hf.load_config(config("meta-llama-3-8b"))
    attention = next(entry for entry in data["blocks"]["layer"]["layers"][0]["residual"] if entry["op"] == "attention")
    attention["rope"], attention["qkv_split"] = "fused", "mcore"
    (gate, up) = next(entry for entry in data["blocks"]["layer"]["layers"][1]["residual"] if "branches" in entry)[
        "branches"]
    gate[1]["fused_glu"], up[0]["fused_input"] = True, True
    converted, builtin = model_from_dict(data, file, {"flash_version": 3}), load_model("llama3-8b")
    assert converted.total_params == builtin.total_params
    hw, plan = load_hardware("dgx-h100"), Plan(devices=8, tp=8, global_batch=8, micro_batch=1)
    assert predict(converted, hw, plan).step_time_s == pytest.approx(predict(builtin, hw, plan).step_time_s,
                                                                    rel=1e-9)


def test_sizes_are_params_that_set_overrides() -> None:
    model = load_model(config("meta-llama-3-8b"), {"layers": 2, "seq": 1024, "flash": False})
    assert model.params["layers"] == 2 and model.input_shape == (1024,)
    assert [layer["flash"] for layer, _ in model.counted() if layer.op == "attention"] == [False]
    # 2 layers of 218,112,000 + embeddings and head 2*128256*4096 + final norm 4096
    assert model.total_params == 2 * 218_112_000 + 2 * 128_256 * 4096 + 4096


def test_gpt_neox_parallel_residual_runs_attention_beside_the_mlp(tmp_path: Path) -> None:
    """x + attn(ln1(x)) + mlp(ln2(x)): same parameters as the sequential layout, shorter critical path."""
    from dlperf.engine.work import model_cost

    body = json.loads(Path(config("pythia-160m")).read_text())
    parallel = load_model(config("pythia-160m"))
    sequential = load_model(_write(tmp_path, {**body, "use_parallel_residual": False}))
    assert parallel.total_params == sequential.total_params == EXACT["pythia-160m"]
    assert model_cost(parallel, 1, "fp16").depth < model_cost(sequential, 1, "fp16").depth


def test_every_family_has_a_fixture_or_shares_a_builder() -> None:
    covered = {json.loads(p.read_text())["model_type"] for p in DATA.glob("*/config.json")}
    assert set(FAMILIES) == covered


def _write(tmp_path: Path, body: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(body, indent=2), encoding="utf-8")
    return str(path)


def _line(path: str, key: str) -> int:
    """1-based line of a key in the JSON text, found independently of the loader."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.strip().startswith(f'"{key}"'))


def test_unknown_model_type_is_one_located_line(tmp_path: Path) -> None:
    body = json.loads(Path(config("gpt2")).read_text())
    body["model_type"] = "gpt3"
    path = _write(tmp_path, body)
    with pytest.raises(SpecError) as err:
        load_model(path)
    text = str(err.value)
    assert path in text and "model_type" in text and "'gpt3'" in text and "gpt2" in text
    assert f"config.json:{_line(path, 'model_type')}:" in text


def test_missing_field_names_it(tmp_path: Path) -> None:
    body = json.loads(Path(config("meta-llama-3-8b")).read_text())
    del body["intermediate_size"]
    with pytest.raises(SpecError, match="missing field 'intermediate_size'") as err:
        load_model(_write(tmp_path, body))
    assert "config.json" in str(err.value)


def test_bad_value_names_field_and_line(tmp_path: Path) -> None:
    body = json.loads(Path(config("meta-llama-3-8b")).read_text())
    body["num_hidden_layers"] = "thirty-two"
    path = _write(tmp_path, body)
    with pytest.raises(SpecError, match="num_hidden_layers") as err:
        load_model(path)
    assert f"config.json:{_line(path, 'num_hidden_layers')}:" in str(err.value)
    assert "'thirty-two'" in str(err.value)


def test_cli_show_and_predict_read_a_config(run) -> None:  # noqa: ANN001 - the conftest fixture
    code, out, _ = run("show", config("gpt2"), "--format", "json")
    assert code == 0 and json.loads(out)[-1]["params"] == EXACT["gpt2"]
    code, out, _ = run("predict", config("meta-llama-3-8b"), "dgx-h100", "--gpus", "8", "--tp", "8",
                       "--global-batch", "8", "--micro-batch", "1", "--set", "seq=2048", "--format", "json")
    assert code == 0 and json.loads(out)["step_time_s"] > 0


def test_cli_bad_config_exits_2_with_one_line(run, tmp_path: Path) -> None:  # noqa: ANN001
    path = _write(tmp_path, {"model_type": "llama"})
    code, out, err = run("show", path)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "missing field" in err


@pytest.mark.parametrize(("folder", "key", "value"), [
    ("qwen3-30b-a3b", "num_experts", "x"), ("qwen3-30b-a3b", "num_hidden_layers", True),
    ("qwen3-30b-a3b", "decoder_sparse_step", 0), ("qwen3-30b-a3b", "mlp_only_layers", 3),
    ("qwen3-30b-a3b", "hidden_size", 2.5), ("qwen3-30b-a3b", "num_experts", None),
    ("mixtral-8x7b-v0.1", "num_local_experts", "8"), ("deepseek-v3", "first_k_dense_replace", -1),
    ("deepseek-v3", "moe_layer_freq", 0), ("gpt-oss-120b", "sliding_window", 0),
    ("gpt-oss-120b", "layer_types", ["sliding_attention"]), ("gpt-oss-120b", "layer_types", "full_attention"),
    ("gpt-oss-120b", "swiglu_limit", "x"), ("gpt-oss-120b", "swiglu_limit", [1]), ("gpt-oss-120b", "swiglu_limit", 0),
])
def test_moe_config_bad_field_is_one_located_line(run, tmp_path: Path, folder: str, key: str, value: object) -> None:  # noqa: ANN001
    """The MoE converters check what they compute with (a string compared, a modulo by zero, a bool taken as one
    layer): one line at the field's own line, exit 2, never the internal-error net."""
    from dlperf.cli import INTERNAL

    body = json.loads(Path(config(folder)).read_text())
    body[key] = value
    path = _write(tmp_path, body)
    code, out, err = run("predict", path, "dgx-h100", "--gpus", "8", "--global-batch", "8", "--set", "seq=1024")
    assert code == 2 and INTERNAL not in err and len(err.strip().splitlines()) == 1, err
    assert f"config.json:{_line(path, key)}: {key}" in err


def test_moe_config_missing_field_points_at_the_config(tmp_path: Path) -> None:
    body = json.loads(Path(config("qwen3-30b-a3b")).read_text())
    del body["num_experts"]
    with pytest.raises(SpecError, match="num_experts") as err:
        load_model(_write(tmp_path, body))
    assert "config.json:1:" in str(err.value)
