"""The built-in model zoo (models/*.yaml): every file loads, shapes flow to a loss, and parameter counts match the
publications or their reference implementations (exactly where the reference gives an exact count)."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dlperf import builtins
from dlperf.spec.model import Model, load_model

MODEL_NAMES = builtins.builtin_names("models")

# The models the rest of dlperf (validation, docs, examples) refers to by name.
REQUIRED = {
    "lenet5", "alexnet", "vgg16", "resnet50", "resnet101", "inception-v3", "lstm-lm", "transformer-base",
    "bert-large", "gpt", "gpt2-xl", "gpt3-175b", "llama2-7b", "llama2-70b", "mpt", "llama3-8b", "llama3-70b",
    "llama3-405b",
}

# Exact counts given by a reference implementation.
EXACT = {
    "alexnet": 61_100_840,        # torchvision.models.alexnet, AlexNet_Weights.IMAGENET1K_V1 num_params
    "vgg16": 138_357_544,         # torchvision.models.vgg16, VGG16_Weights.IMAGENET1K_V1 num_params
    "resnet50": 25_557_032,       # torchvision.models.resnet50, ResNet50_Weights.IMAGENET1K_V1 num_params
    "resnet101": 44_549_160,      # torchvision.models.resnet101, ResNet101_Weights.IMAGENET1K_V1 num_params
    # torchvision inception_v3 has 27,161,264 with AuxLogits; minus the aux head (98,560 + 2,459,136 + 769,000).
    "inception-v3": 27_161_264 - 3_326_696,
    "gpt2-xl": 1_557_611_200,     # Hugging Face gpt2-xl (GPT2LMHeadModel, tied head) num_parameters()
    "llama2-7b": 6_738_415_616,   # Hugging Face meta-llama/Llama-2-7b-hf (LlamaForCausalLM) num_parameters()
    "mpt": 6_658_859_008,         # MPT-7B at seq 2048: llm-foundry scripts/train/benchmarking/README.md NumParams
    # Hugging Face LlamaForCausalLM num_parameters() of meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B and
    # Llama-3.1-405B; each also follows llama_params() below (test_llama3_counts_follow_the_closed_form)
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    # NVIDIA-Nemotron-3-Super-120B-A12B's checkpoint without its MTP layer (Megatron-Bridge examples/
    # model_verification_cards/nemotron-3-super-120b-a12b/card.yaml @067f987d: 123,611,033,088 with it; model card
    # "120B total"); tests/test_mamba.py counts both
    "nemotron-3-super": 120_668_707_840,
    "llama3-405b": 405_853_388_800,
}

# Ranges where the publication gives a rounded figure.
RANGES = {
    "bert-large": (335e6, 340e6),               # Devlin et al. 2019 Sec. 3: "340M"; HF BertModel 335,141,888
    "gpt3-175b": (174.6e9 * 0.995, 174.6e9 * 1.005),   # Brown et al. 2020 Table 2.1 (175.0B, rounded)
    "llama2-7b": (6.74e9 * 0.995, 6.74e9 * 1.005),     # Touvron et al. 2023 Table 1 "7B"; HF card 6.74B
    "llama2-70b": (68.98e9 * 0.995, 68.98e9 * 1.005),  # HF meta-llama/Llama-2-70b-hf: 68.98B
    "transformer-base": (60e6, 66e6),           # Vaswani et al. 2017 Table 3 base: 65M
    "nemotron-3-nano": (31.55e9, 31.65e9),      # NVIDIA-Nemotron-3-Nano-30B-A3B model card: 31.6B total
}


def raw_yaml(name: str) -> dict:
    return yaml.safe_load((builtins.data_dir("models") / f"{name}.yaml").read_text(encoding="utf-8"))


def gpt_params(layers: int, hidden: int, seq: int, vocab: int) -> int:
    """Pre-LN GPT with ffn = 4h and a tied head: per layer QKV+out 4h^2+4h, MLP 8h^2+5h, two LayerNorms 4h;
    token and learned position tables (vocab + seq)*h; final LayerNorm 2h (GPT-2 layout, Radford et al. 2019)."""
    return layers * (12 * hidden**2 + 13 * hidden) + (vocab + seq) * hidden + 2 * hidden


def llama_params(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    """Llama: no biases; Q and O h*h, K and V h*kv_heads*head_dim; SwiGLU 3*h*ffn; two RMSNorms h each;
    untied embedding and head 2*vocab*h; final RMSNorm h (Touvron et al. 2023a Sec. 2.2)."""
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    return layers * (attention + 3 * hidden * ffn + 2 * hidden) + 2 * vocab * hidden + hidden


def test_zoo_has_every_required_model() -> None:
    assert set(MODEL_NAMES) >= REQUIRED, sorted(REQUIRED - set(MODEL_NAMES))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_builtin_loads_and_ends_in_a_loss(name: str) -> None:
    model = load_model(name)
    assert isinstance(model, Model)
    assert model.name == name
    assert model.description.strip()
    assert model.total_params > 0
    layers = model.layers()
    assert layers[-1][0].op == "cross_entropy"
    assert model.output_shape == (1,)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_file_states_its_own_source(name: str) -> None:
    # Presets built on `base:` must still name their own source, not inherit the base's.
    data = raw_yaml(name)
    assert isinstance(data.get("source"), str) and data["source"].strip()
    assert isinstance(data.get("description"), str) and data["description"].strip()


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_parameter_counts(name: str) -> None:
    assert load_model(name).total_params == EXACT[name]


@pytest.mark.parametrize("name", sorted(RANGES))
def test_published_parameter_ranges(name: str) -> None:
    low, high = RANGES[name]
    assert low <= load_model(name).total_params <= high


def test_hand_counted_small_and_classic_models() -> None:
    # LeNet-5 dense-C3 variant (LeCun et al. 1998 Sec. II-B sizes): C1 156, C3 2,416, C5 48,120, F6 10,164, out 850.
    assert load_model("lenet5").total_params == 156 + 2_416 + 48_120 + 10_164 + 850
    # Zaremba et al. 2014 large: embedding 10k x 1500, two LSTM layers 4h(2h) + 8h (PyTorch b_ih, b_hh), softmax.
    h, v = 1500, 10_000
    assert load_model("lstm-lm").total_params == v * h + 2 * (4 * h * 2 * h + 8 * h) + (h * v + v)
    # Transformer base (Vaswani et al. 2017): shared 37000 x 512 table; encoder layer = attention + FFN + 2 LN,
    # decoder layer = 2 attentions + FFN + 3 LN; tied pre-softmax projection without bias.
    d, f = 512, 2048
    attention, ffn, norm = 4 * (d * d + d), d * f + f + f * d + d, 2 * d
    assert load_model("transformer-base").total_params == (
        37_000 * d + 6 * (attention + ffn + 2 * norm) + 6 * (2 * attention + ffn + 3 * norm))


def test_bert_large_matches_hugging_face_modules() -> None:
    # HF BertModel (bert-large-uncased) has 335,141,888 params; BertForPreTraining adds the MLM transform
    # (dense 1024x1024 + bias, LayerNorm) and the decoder bias (vocab 30522); the NSP head (2,050) is left out.
    model = load_model("bert-large")
    assert model.total_params == 335_141_888 + (1024 * 1024 + 1024) + 2 * 1024 + 30_522


def test_gpt_defaults_are_gpt3_175b() -> None:
    # Brown et al. 2020 Table 2.1: 96 layers, d_model 12288, n_ctx 2048; GPT-2 vocabulary 50,257.
    assert load_model("gpt").total_params == load_model("gpt3-175b").total_params == gpt_params(96, 12288, 2048, 50257)


def test_gpt_set_matches_12_l_h2_plus_v_h() -> None:
    # `--set layers=24 hidden=2048 heads=16`: within 1% of the usual 12*L*h^2 + V*h estimate (Kaplan et al. 2020
    # Sec. 2.1 count non-embedding params as 12*L*d^2); the rest is biases, LayerNorms and the position table.
    model = load_model("gpt", {"layers": 24, "hidden": 2048, "heads": 16})
    estimate = 12 * 24 * 2048**2 + 50257 * 2048
    assert model.total_params == gpt_params(24, 2048, 2048, 50257)
    assert abs(model.total_params - estimate) / estimate < 0.01


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(1, 128),
    heads=st.integers(1, 64),
    head_dim=st.sampled_from([32, 64, 80, 128]),
    seq=st.integers(1, 8192),
    vocab=st.integers(2, 256_000),
)
def test_gpt_params_follow_the_closed_form(layers: int, heads: int, head_dim: int, seq: int, vocab: int) -> None:
    hidden = heads * head_dim
    overrides = {"layers": layers, "hidden": hidden, "heads": heads, "seq": seq, "vocab": vocab}
    assert load_model("gpt", overrides).total_params == gpt_params(layers, hidden, seq, vocab)


def test_gpt_ffn_defaults_to_four_hidden_and_can_be_set() -> None:
    base = load_model("gpt", {"layers": 2, "hidden": 256, "heads": 4})
    wider = load_model("gpt", {"layers": 2, "hidden": 256, "heads": 4, "ffn": 2048})
    # Each layer's MLP gains 2 * h * (2048 - 1024) weights and (2048 - 1024) bias entries.
    assert wider.total_params - base.total_params == 2 * (2 * 256 * 1024 + 1024)


def test_llama_counts_follow_the_closed_form() -> None:
    # Sizes from the meta-llama Llama-2-{7b,70b}-hf config.json files.
    assert load_model("llama2-7b").total_params == llama_params(32, 4096, 32, 32, 11008, 32000)
    assert load_model("llama2-70b").total_params == llama_params(80, 8192, 64, 8, 28672, 32000)
    small = load_model("llama2-7b", {"layers": 2, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn": 1376})
    assert small.total_params == llama_params(2, 512, 8, 2, 1376, 32000)


@pytest.mark.parametrize(("name", "expected"), [
    ("resnet50", (2048, 7, 7)),        # He et al. 2016 Table 1: conv5_x output 7x7, 2048 channels
    ("resnet101", (2048, 7, 7)),
    ("vgg16", (512, 7, 7)),            # Simonyan & Zisserman 2015 Table 1: five 2x2 pools, 224 -> 7
    ("inception-v3", (2048, 8, 8)),    # Szegedy et al. 2016 Table 1: last inception module 8x8x2048
    ("alexnet", (256, 6, 6)),          # torchvision AlexNet: 256 x 6 x 6 = 9216 features into fc6
])
def test_convnet_feature_map_before_the_classifier(name: str, expected: tuple[int, ...]) -> None:
    layers = [layer for layer, _ in load_model(name).layers()]
    pool = next(i for i, layer in enumerate(layers) if layer.op in ("global_avgpool", "adaptive_avgpool"))
    assert layers[pool].in_shape == expected


def test_resnet_stage_depths_are_parameters() -> None:
    # resnet101 is resnet50 with 23 blocks in conv4_x (He et al. 2016 Table 1): 17 more bottlenecks of
    # 1024 -> 256 -> 256 -> 1024 with BN, 1,117,184 params each.
    per_block = 1024 * 256 + 256 * 256 * 9 + 256 * 1024 + 2 * (256 + 256 + 1024)
    assert load_model("resnet50", {"blocks3": 23}).total_params == load_model("resnet101").total_params
    assert load_model("resnet101").total_params - load_model("resnet50").total_params == 17 * per_block


@pytest.mark.parametrize(("name", "sizes"), [
    ("llama3-8b", (32, 4096, 32, 8, 14336, 128256)),      # Llama 3 Table 3 / config.json
    ("llama3-70b", (80, 8192, 64, 8, 28672, 128256)),
    ("llama3-405b", (126, 16384, 128, 8, 53248, 128256)),
])
def test_llama3_counts_follow_the_closed_form(name: str, sizes: tuple[int, ...]) -> None:
    assert load_model(name).total_params == llama_params(*sizes) == EXACT[name]
