"""Models from a Hugging Face transformers `config.json`, offline and without importing `transformers`.

`FAMILIES` maps a config's `model_type` to a function that returns a model document: the same dict a model YAML
parses to (docs/model-format.md), with the sizes as `params` so that `--set` works as on a built-in. A new family
is one entry. Each builder follows the reference implementation's module layout (transformers `modeling_*.py`),
so parameter counts equal `model.num_parameters()` (tests/test_hf.py).

JSON is YAML, so the config is read with dlperf's line-keeping YAML loader: a missing or bad field is reported
with the file, the line and the field, like any other spec error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlperf.errors import SpecError
from dlperf.spec.hf_moe import FLASH_DEFAULT, MOE_FAMILIES, causal_flash
from dlperf.spec.yamlio import closest, line_of, load_yaml_file

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def need(config: dict, key: str, kind: type = int) -> Any:
    """A required config field of the given type, or a located one-line error."""
    if key not in config:
        raise SpecError(f"missing field {key!r}", field=key, expected=f"{kind.__name__} {key}", line=line_of(config))
    value = config[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise SpecError(field=key, expected="a positive integer", found=value, line=line_of(config, key))
    return value


def optional(config: dict, key: str, default: Any) -> Any:
    """An optional field with the reference implementation's default; null means the default too."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(default, bool) and not isinstance(value, bool):
        raise SpecError(field=key, expected="true or false", found=value, line=line_of(config, key))
    if isinstance(default, int) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise SpecError(field=key, expected="a positive integer", found=value, line=line_of(config, key))
    return value


def _dtype(config: dict) -> str:
    """torch_dtype (newer configs: dtype) of the checkpoint; bf16 when absent, today's training default."""
    key = "torch_dtype" if "torch_dtype" in config else "dtype"
    raw = config.get(key) or "bfloat16"
    if raw not in DTYPES:
        raise SpecError(field=key, expected="one of " + ", ".join(DTYPES), found=raw, line=line_of(config, key))
    return DTYPES[raw]


def _dropout(config: dict, key: str) -> float:
    value = config.get(key) or 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise SpecError(field=key, expected="a probability in [0, 1)", found=value, line=line_of(config, key))
    return float(value)


def _document(config: dict, family: str, params: dict, block: list, layers: list, note: str) -> dict:
    return {
        "name": "", "description": f"{family} from a Hugging Face config.json: {note}",
        "source": "", "input": ["seq"], "dtype": _dtype(config), "params": params,
        "blocks": {"layer": {"layers": block}}, "layers": layers,
    }


def _head(config: dict, tied_default: bool) -> dict:
    """The output projection over the vocabulary, tied to the input embedding or its own weights."""
    tied = optional(config, "tie_word_embeddings", tied_default)
    return {"op": "linear", "out": "vocab", "bias": False, "tied": tied, "name": "lm_head"}


# ---- decoder families -----------------------------------------------------------------------------------


def llama(config: dict) -> dict:
    """LlamaForCausalLM (also Mistral): pre-RMSNorm, GQA attention with RoPE (no parameters), SwiGLU MLP,
    optional attention/MLP biases, untied head by default (transformers modeling_llama.py)."""
    heads = need(config, "num_attention_heads")
    hidden = need(config, "hidden_size")
    mlp_bias = optional(config, "mlp_bias", False)
    params = {
        "layers": need(config, "num_hidden_layers"), "hidden": hidden, "heads": heads,
        "kv_heads": optional(config, "num_key_value_heads", heads),
        "head_dim": optional(config, "head_dim", max(hidden // heads, 1)),
        "ffn": need(config, "intermediate_size"), "vocab": need(config, "vocab_size"),
        "seq": need(config, "max_position_embeddings"), **causal_flash(),
    }
    attention = {"op": "attention", "heads": "heads", "kv_heads": "kv_heads", "head_dim": "head_dim",
                 "causal": True, "bias": optional(config, "attention_bias", False),
                 "qkv_bias": config.get("model_type") == "qwen2", "flash": "flash", "flash_version": "flash_version",
                 "dropout": _dropout(config, "attention_dropout")}
    block = [
        {"residual": [{"op": "rmsnorm"}, attention]},
        {"residual": [
            {"op": "rmsnorm"},
            {"branches": [[{"op": "linear", "out": "ffn", "bias": mlp_bias, "name": "gate_proj"}, {"op": "silu"}],
                          [{"op": "linear", "out": "ffn", "bias": mlp_bias, "name": "up_proj"}]],
             "merge": "multiply"},
            {"op": "linear", "out": "hidden", "bias": mlp_bias, "name": "down_proj"},
        ]},
    ]
    layers = [
        {"op": "embedding", "vocab": "vocab", "dim": "hidden", "name": "embed_tokens"},
        {"block": "layer", "repeat": "layers", "name": "decoder"},
        {"op": "rmsnorm", "name": "norm"},
        _head(config, False),
        {"op": "cross_entropy"},
    ]
    return _document(config, config.get("model_type", "llama"), params, block, layers,
                     "pre-RMSNorm, grouped-query attention, SwiGLU")


def qwen2(config: dict) -> dict:
    """Qwen2ForCausalLM: the Llama layout with biases on the Q, K and V projections only
    (transformers modeling_qwen2.py: q/k/v_proj bias=True, o_proj bias=False)."""
    return llama({**config, "model_type": "qwen2"})


def gpt2(config: dict) -> dict:
    """GPT2LMHeadModel: learned positions, pre-LN, fused QKV (Conv1D) and MLP with biases, GELU, tied head
    (transformers modeling_gpt2.py)."""
    hidden = need(config, "n_embd")
    params = {
        "layers": need(config, "n_layer"), "hidden": hidden, "heads": need(config, "n_head"),
        "ffn": optional(config, "n_inner", 4 * hidden), "vocab": need(config, "vocab_size"),
        "seq": need(config, "n_positions"), "flash": FLASH_DEFAULT["causal"],
    }
    resid, attn = _dropout(config, "resid_pdrop"), _dropout(config, "attn_pdrop")
    drop = [{"op": "dropout", "p": resid}] if resid else []
    block = [
        {"residual": [{"op": "layernorm"},
                      {"op": "attention", "heads": "heads", "causal": True, "dropout": attn, "flash": "flash"},
                      *drop]},
        {"residual": [{"op": "layernorm"}, {"op": "linear", "out": "ffn"}, {"op": "gelu"},
                      {"op": "linear", "out": "hidden"}, *drop]},
    ]
    embd = _dropout(config, "embd_pdrop")
    layers = [
        {"op": "embedding", "vocab": "vocab", "dim": "hidden", "name": "wte"},
        {"op": "positional_embedding", "length": "seq", "name": "wpe"},
        *([{"op": "dropout", "p": embd}] if embd else []),
        {"block": "layer", "repeat": "layers", "name": "h"},
        {"op": "layernorm", "name": "ln_f"},
        _head(config, True),
        {"op": "cross_entropy"},
    ]
    return _document(config, "gpt2", params, block, layers, "pre-LN, learned positions, tied head")


def gpt_neox(config: dict) -> dict:
    """GPTNeoXForCausalLM (Pythia): rotary positions, attention and MLP with biases, GELU, and with
    use_parallel_residual (the default) x + attn(ln1(x)) + mlp(ln2(x)); untied embed_out
    (transformers modeling_gpt_neox.py)."""
    params = {
        "layers": need(config, "num_hidden_layers"), "hidden": need(config, "hidden_size"),
        "heads": need(config, "num_attention_heads"), "ffn": need(config, "intermediate_size"),
        "vocab": need(config, "vocab_size"), "seq": need(config, "max_position_embeddings"),
        "flash": FLASH_DEFAULT["causal"],
    }
    bias = optional(config, "attention_bias", True)
    attention = [{"op": "layernorm"},
                 {"op": "attention", "heads": "heads", "causal": True, "bias": bias, "flash": "flash",
                  "dropout": _dropout(config, "attention_dropout")}]
    mlp = [{"op": "layernorm"}, {"op": "linear", "out": "ffn"}, {"op": "gelu"}, {"op": "linear", "out": "hidden"}]
    if optional(config, "use_parallel_residual", True):
        block = [{"residual": [{"branches": [attention, mlp], "merge": "add"}]}]
    else:
        block = [{"residual": attention}, {"residual": mlp}]
    layers = [
        {"op": "embedding", "vocab": "vocab", "dim": "hidden", "name": "embed_in"},
        {"block": "layer", "repeat": "layers", "name": "layers"},
        {"op": "layernorm", "name": "final_layer_norm"},
        {**_head(config, False), "name": "embed_out"},
        {"op": "cross_entropy"},
    ]
    return _document(config, "gpt_neox", params, block, layers, "rotary, parallel attention and MLP residual")


# ---- encoder family -------------------------------------------------------------------------------------


def bert(config: dict) -> dict:
    """BertForPreTraining without its 2-way next-sentence classifier, laid out as models/bert-large.yaml:
    BertModel (word, position and token-type embeddings, post-LN encoder, pooler) and the MLM head (dense +
    GELU + LayerNorm, decoder tied to the word embeddings with its own bias) (transformers modeling_bert.py)."""
    params = {
        "layers": need(config, "num_hidden_layers"), "hidden": need(config, "hidden_size"),
        "heads": need(config, "num_attention_heads"), "ffn": need(config, "intermediate_size"),
        "vocab": need(config, "vocab_size"), "positions": need(config, "max_position_embeddings"),
        "types": optional(config, "type_vocab_size", 2), "seq": 128, "flash": FLASH_DEFAULT["encoder"],
    }
    hidden_drop = _dropout(config, "hidden_dropout_prob")
    drop = [{"op": "dropout", "p": hidden_drop}] if hidden_drop else []
    attention = {"op": "attention", "heads": "heads", "flash": "flash",
                 "dropout": _dropout(config, "attention_probs_dropout_prob")}
    block = [
        {"residual": [attention, *drop]},
        {"op": "layernorm"},
        {"residual": [{"op": "linear", "out": "ffn"}, {"op": "gelu"}, {"op": "linear", "out": "hidden"}, *drop]},
        {"op": "layernorm"},
    ]
    layers = [
        {"op": "embedding", "vocab": "vocab", "dim": "hidden", "name": "word_embeddings"},
        {"op": "positional_embedding", "length": "positions", "name": "position_embeddings"},
        {"op": "positional_embedding", "length": "types", "name": "token_type_embeddings"},
        {"op": "layernorm"},
        *drop,
        {"block": "layer", "repeat": "layers", "name": "encoder"},
        {"residual": [{"op": "linear", "out": "hidden", "name": "pooler"}, {"op": "tanh"}]},
        {"op": "linear", "out": "hidden", "name": "mlm_transform"},
        {"op": "gelu", "name": "mlm_gelu"},
        {"op": "layernorm", "name": "mlm_layernorm"},
        {"op": "linear", "out": "vocab", "tied": True, "bias": True, "name": "mlm_decoder"},
        {"op": "cross_entropy"},
    ]
    return _document(config, "bert", params, block, layers,
                     "post-LN encoder, pooler and MLM head (sequence length 128, BERT phase 1; --set seq=512)")


FAMILIES: dict[str, Callable[[dict], dict]] = {
    "llama": llama,
    "mistral": llama,
    "qwen2": qwen2,
    "gpt2": gpt2,
    "gpt_neox": gpt_neox,
    "bert": bert,
}
FAMILIES.update(MOE_FAMILIES)  # mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss (dlperf/spec/hf_moe.py)


def is_config(name_or_path: str | Path) -> bool:
    return str(name_or_path).endswith(".json")


def model_document(config: Any, file: str) -> dict:
    """The model document of a parsed config.json; errors name the file, the line and the field."""
    try:
        if not isinstance(config, dict):
            raise SpecError(expected="a JSON object (a transformers config)", found=type(config).__name__)
        kind = config.get("model_type")
        if kind not in FAMILIES:
            hint = closest(str(kind), FAMILIES) if kind is not None else None
            raise SpecError(f"unsupported model_type {kind!r}" + (f" (did you mean {hint!r}?)" if hint else ""),
                            field="model_type", line=line_of(config, "model_type"),
                            expected="one of " + ", ".join(FAMILIES))
        document = FAMILIES[kind](config)
    except SpecError as err:
        raise err.located(file=file) from None
    path = Path(file)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    document["name"] = str(config.get("_name_or_path") or name)
    document["source"] = f"Hugging Face transformers config.json ({file}), model_type {kind}"
    return document


def load_config(path: str | Path) -> tuple[dict, str]:
    """Read a config.json and convert it: (model document, file name)."""
    file = str(path)
    return model_document(load_yaml_file(Path(file)), file), file
