"""Mixture-of-experts families of Hugging Face `config.json`: model documents (the dict a models/*.yaml file
holds) for mixtral, qwen2_moe, qwen3_moe, deepseek_v3 and gpt_oss, read offline without importing `transformers`.

`MOE_FAMILIES[model_type](config) -> document`; `dlperf.spec.model.model_from_dict(document, path, {})` builds
the model. Layouts follow the reference implementations in transformers (models/<family>/modeling_<family>.py):
pre-RMSNorm decoder layers, SwiGLU experts (gate, up, down without biases), untied embeddings unless
`tie_word_embeddings`. Rotary embeddings have no parameters and are not represented. The sequence length
`seq` is the config's max_position_embeddings, as for the dense families (dlperf/spec/hf.py); `--set seq=N`
overrides it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlperf.errors import SpecError
from dlperf.ops import OPS
from dlperf.spec.yamlio import line_of

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
# Attention kernel of a converted model: transformers' default attention (attn_implementation "sdpa") is
# F.scaled_dot_product_attention, which runs the FlashAttention-2 kernel for causal fp16/bf16 attention without
# a padding mask (flash_version 2; Llama-family documents expose it as a param); an encoder with a padding mask
# (BERT) falls back to unfused or memory-efficient kernels. The MoE families run it too: their PreTrainedModel
# classes set `_supports_sdpa = True` (transformers @00d4b3d2, models/qwen3_moe/modeling_qwen3_moe.py
# Qwen3MoePreTrainedModel; Mixtral's and Qwen2-MoE's likewise); DeepSeek-V3's MLA is priced fused in any case.
FLASH_DEFAULT = {"causal": True, "encoder": False}


def _get(config: dict, key: str, default: Any = ..., minimum: int = 1) -> Any:
    """A config field, an integer >= `minimum` (every field these families read is a count or a size), else
    `default` when absent or null; a missing or bad one is reported at its line (the config's when absent)."""
    if key not in config or config[key] is None:
        if default is not ...:
            return default
        raise SpecError(f"config.json needs {key!r} for model_type {config.get('model_type')!r}",
                        expected=f"a value for {key}", field=key, line=line_of(config, key) or line_of(config))
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(field=key, expected=f"an integer >= {minimum}", found=value, line=line_of(config, key))
    return value


def _layer_list(config: dict, key: str) -> list[int]:
    """A list of layer indices (Qwen's mlp_only_layers), [] when absent or null."""
    value = config.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise SpecError(field=key, expected="a list of layer indices", found=value, line=line_of(config, key))
    return value


def causal_flash() -> dict[str, Any]:
    """The attention kernel params of a converted causal model (FLASH_DEFAULT: SDPA's FlashAttention-2)."""
    return {"flash": FLASH_DEFAULT["causal"], "flash_version": 2}


def _common_params(config: dict) -> dict[str, Any]:
    hidden, heads = _get(config, "hidden_size"), _get(config, "num_attention_heads")
    return {
        "layers": _get(config, "num_hidden_layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": _get(config, "num_key_value_heads", heads),
        "head_dim": _get(config, "head_dim", hidden // heads),
        "vocab": _get(config, "vocab_size"),
        "seq": _get(config, "max_position_embeddings"),
    }


def _document(config: dict, family: str, params: dict, blocks: dict, body: list[dict], source: str) -> dict:
    """The whole model: embedding, the decoder blocks, final RMSNorm, LM head (tied or not), loss."""
    tied = bool(config.get("tie_word_embeddings", False))
    name = str(config.get("_name_or_path") or config.get("name") or family)
    return {
        "name": name,
        "description": f"{family} from config.json ({params['layers']} layers, hidden {params['hidden']})",
        "source": source,
        "input": ["seq"],
        "dtype": DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), "bf16"),
        "params": params,
        "blocks": blocks,
        "layers": [
            {"op": "embedding", "vocab": "vocab", "dim": "hidden", "name": "embed_tokens"},
            *body,
            {"op": "rmsnorm", "name": "norm"},
            {"op": "linear", "out": "vocab", "bias": False, "tied": tied, "name": "lm_head"},
            {"op": "cross_entropy"},
        ],
    }


def _attention(bias: bool, qk_norm: bool = False, qkv_bias: bool = False) -> list[dict]:
    """Pre-RMSNorm GQA attention. `qkv_bias`: biases on the q, k and v projections only (Qwen2), through the
    attention op's `qkv_bias` where it has one, else as `bias` on all four (one extra hidden-wide bias)."""
    norm = [{"op": "qk_norm", "heads": "heads", "kv_heads": "kv_heads", "head_dim": "head_dim"}] if qk_norm else []
    attention = {"op": "attention", "heads": "heads", "kv_heads": "kv_heads", "head_dim": "head_dim",
                 "causal": True, "bias": bias, "flash": "flash", "flash_version": "flash_version"}
    if qkv_bias and not bias:
        attention.update({"qkv_bias": True} if "qkv_bias" in OPS["attention"].attrs else {"bias": True})
    return [{"residual": [{"op": "rmsnorm"}, *norm, attention]}]


def _swiglu(width: str) -> list[dict]:
    return [{"residual": [
        {"op": "rmsnorm"},
        {"branches": [[{"op": "linear", "out": width, "bias": False, "name": "gate_proj"}, {"op": "silu"}],
                      [{"op": "linear", "out": width, "bias": False, "name": "up_proj"}]],
         "merge": "multiply"},
        {"op": "linear", "out": "hidden", "bias": False, "name": "down_proj"}]}]


def _moe(**attrs: Any) -> list[dict]:
    return [{"residual": [{"op": "rmsnorm"}, {"op": "moe", "gated": True, **attrs}]}]


def _runs(kinds: list[str]) -> list[dict]:
    """Consecutive layers of one kind as one repeated block call (identical layers are costed once)."""
    body: list[dict] = []
    for kind in kinds:
        if body and body[-1]["block"] == kind:
            body[-1]["repeat"] += 1
        else:
            body.append({"block": kind, "repeat": 1, "name": kind})
    return body


def mixtral(config: dict) -> dict:
    """MixtralForCausalLM: GQA attention without biases, every layer a sparse MoE block of SwiGLU experts."""
    params = _common_params(config) | {
        "ffn": _get(config, "intermediate_size"),
        "experts": _get(config, "num_local_experts"),
        "top_k": _get(config, "num_experts_per_tok"),
    } | causal_flash()
    blocks = {"moe_layer": {"layers": _attention(False) + _moe(experts="experts", top_k="top_k", ffn="ffn")}}
    body = _runs(["moe_layer"] * params["layers"])
    return _document(config, "mixtral", params, blocks, body, "transformers models/mixtral/modeling_mixtral.py "
                     "(MixtralSparseMoeBlock: gate hidden x experts, experts w1/w3/w2)")


def _qwen_sparse(config: dict, layer: int) -> bool:
    """transformers Qwen2MoeDecoderLayer: sparse when not in mlp_only_layers and (layer + 1) % step == 0."""
    step = _get(config, "decoder_sparse_step", 1)
    return layer not in _layer_list(config, "mlp_only_layers") and (layer + 1) % step == 0


def _qwen(config: dict, family: str, qkv_bias: bool, qk_norm: bool, shared: bool) -> dict:
    params = _common_params(config) | {
        "ffn": _get(config, "intermediate_size"),
        "moe_ffn": _get(config, "moe_intermediate_size"),
        "experts": _get(config, "num_experts"),
        "top_k": _get(config, "num_experts_per_tok"),
    } | causal_flash()
    moe_attrs: dict[str, Any] = {"experts": "experts", "top_k": "top_k", "ffn": "moe_ffn"}
    if shared:  # Qwen2-MoE: one shared expert of its own width, scaled by sigmoid(x w_gate)
        params["shared_ffn"] = _get(config, "shared_expert_intermediate_size")
        moe_attrs |= {"shared_experts": 1, "shared_ffn": "shared_ffn", "shared_gate": True}
    attention = _attention(bool(config.get("attention_bias", False)), qk_norm, qkv_bias)
    blocks = {"moe_layer": {"layers": attention + _moe(**moe_attrs)},
              "dense_layer": {"layers": attention + _swiglu("ffn")}}
    kinds = ["moe_layer" if _qwen_sparse(config, i) else "dense_layer" for i in range(params["layers"])]
    return _document(config, family, params, blocks, _runs(kinds),
                     f"transformers models/{family}/modeling_{family}.py")


def qwen2_moe(config: dict) -> dict:
    """Qwen2MoeForCausalLM: q/k/v projections with biases, routed experts plus a gated shared expert."""
    return _qwen(config, "qwen2_moe", qkv_bias=True, qk_norm=False, shared=True)


def qwen3_moe(config: dict) -> dict:
    """Qwen3MoeForCausalLM: no projection biases, RMSNorm on each query and key head, no shared expert."""
    return _qwen(config, "qwen3_moe", qkv_bias=False, qk_norm=True, shared=False)


def deepseek_v3(config: dict) -> dict:
    """DeepseekV3ForCausalLM: MLA attention; the first `first_k_dense_replace` layers dense, then (every
    `moe_layer_freq`) routed experts plus shared experts; the noaux_tc router keeps a per-expert score
    correction bias (a parameter). The multi-token-prediction layers (num_nextn_predict_layers) are not built:
    transformers does not load them either (DeepseekV3ForCausalLM has no MTP module and its forward never runs
    one), so the converted count stays the 671B num_parameters() gives. A training plan that runs MTP uses the
    built-in deepseek-v3 with `--set mtp_layers=N` (Megatron-Core's mtp_num_layers), which prices the module."""
    params = _common_params(config) | {
        "ffn": _get(config, "intermediate_size"),
        "moe_ffn": _get(config, "moe_intermediate_size"),
        "experts": _get(config, "n_routed_experts"),
        "top_k": _get(config, "num_experts_per_tok"),
        "shared_experts": _get(config, "n_shared_experts", 0, minimum=0) or 1,
        "kv_lora_rank": _get(config, "kv_lora_rank"),
        "qk_nope_head_dim": _get(config, "qk_nope_head_dim"),
        "qk_rope_head_dim": _get(config, "qk_rope_head_dim"),
        "v_head_dim": _get(config, "v_head_dim"),
    }
    mla: dict[str, Any] = {"op": "mla", "heads": "heads", "kv_lora_rank": "kv_lora_rank",
                           "qk_nope_head_dim": "qk_nope_head_dim", "qk_rope_head_dim": "qk_rope_head_dim",
                           "v_head_dim": "v_head_dim"}
    if config.get("q_lora_rank"):
        params["q_lora_rank"] = config["q_lora_rank"]
        mla["q_lora_rank"] = "q_lora_rank"
    attention = [{"residual": [{"op": "rmsnorm"}, mla]}]
    moe_attrs = {"experts": "experts", "top_k": "top_k", "ffn": "moe_ffn", "shared_experts": "shared_experts",
                 "router_bias": config.get("topk_method", "noaux_tc") == "noaux_tc"}
    if config.get("n_group") and config.get("topk_group"):  # group-limited (node-limited) routing
        params |= {"groups": config["n_group"], "top_groups": config["topk_group"]}
        moe_attrs |= {"groups": "groups", "top_groups": "top_groups"}
    if not config.get("n_shared_experts"):
        moe_attrs.pop("shared_experts")
        params.pop("shared_experts")
    blocks = {"dense_layer": {"layers": attention + _swiglu("ffn")},
              "moe_layer": {"layers": attention + _moe(**moe_attrs)}}
    first, freq = _get(config, "first_k_dense_replace", 0, minimum=0), _get(config, "moe_layer_freq", 1)
    kinds = ["moe_layer" if i >= first and i % freq == 0 else "dense_layer" for i in range(params["layers"])]
    return _document(config, "deepseek_v3", params, blocks, _runs(kinds),
                     "transformers models/deepseek_v3/modeling_deepseek_v3.py; DeepSeek-AI 2024 "
                     "(arXiv:2412.19437) Sec. 2.1")


LAYER_TYPES = ("sliding_attention", "full_attention")


def _alternating(layers: int) -> list[str]:
    """GptOssConfig's default layer_types: sliding on even layers, full on odd ones."""
    return [LAYER_TYPES[i % 2] for i in range(layers)]


def _gpt_oss_layer_types(config: dict, layers: int) -> list[str]:
    """config.layer_types, or GptOssConfig's default when absent (_alternating)."""
    kinds = config.get("layer_types")
    if kinds is None:
        return _alternating(layers)
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in LAYER_TYPES for k in kinds):
        raise SpecError(field="layer_types", expected=f"{layers} entries, each one of {', '.join(LAYER_TYPES)}",
                        found=kinds, line=line_of(config, "layer_types"))
    return kinds


def _clamped(config: dict) -> bool:
    """Whether the experts' SwiGLU is clamped (GptOssExperts.limit = swiglu_limit; null or absent: not)."""
    limit = config.get("swiglu_limit")
    if limit is None:
        return False
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
        raise SpecError(field="swiglu_limit", expected="a positive number or null", found=limit,
                        line=line_of(config, "swiglu_limit"))
    return True


def gpt_oss(config: dict) -> dict:
    """GptOssForCausalLM: GQA attention with biases and a learned sink logit per head, sliding_attention layers
    limited to a causal window of `sliding_window` keys, every layer a sparse MoE block of SwiGLU experts with
    biases behind a biased router."""
    params = _common_params(config) | {
        "ffn": _get(config, "intermediate_size"),
        "experts": _get(config, "num_local_experts"),
        "top_k": _get(config, "num_experts_per_tok"),
        "window": _get(config, "sliding_window"),
    } | causal_flash()
    # aux_loss False: Megatron-Bridge converts every gpt_oss config with moe_router_load_balancing_type "none"
    # (models/gpt_oss/gpt_oss_bridge.py @17a381f95 line 71; dlperf/ops/moe.py GATING_LAUNCHES)
    moe = _moe(experts="experts", top_k="top_k", ffn="ffn", router_bias=True, expert_bias=True,
               act_clamp=_clamped(config), aux_loss=False)
    blocks = {}
    for kind, window in (("sliding_attention", {"window": "window"}), ("full_attention", {})):
        attention = _attention(bool(config.get("attention_bias", True)))
        attention[0]["residual"][1] |= {"sinks": True, **window}
        blocks[kind] = {"layers": attention + moe}
    kinds = _gpt_oss_layer_types(config, params["layers"])
    if kinds == _alternating(len(kinds)) and len(kinds) % 2 == 0:
        # the default alternation as one repeated pair, as the built-in: recomputation, ZeRO-3 gathers and
        # offloading see one repeated block (a run of repeat-1 calls would read as no repeated block at all)
        blocks["pair"] = {"layers": [{"block": kind} for kind in LAYER_TYPES]}
        body = [{"block": "pair", "repeat": len(kinds) // 2, "name": "decoder"}]
    else:
        body = _runs(kinds)
    return _document(config, "gpt_oss", params, blocks, body,
                     "transformers models/gpt_oss/modeling_gpt_oss.py (GptOssAttention sinks, GptOssExperts "
                     "gate_up_proj_bias / down_proj_bias, GptOssTopKRouter bias)")


MOE_FAMILIES: dict[str, Callable[[dict], dict]] = {
    "mixtral": mixtral,
    "qwen2_moe": qwen2_moe,
    "qwen3_moe": qwen3_moe,
    "deepseek_v3": deepseek_v3,
    "gpt_oss": gpt_oss,
}
