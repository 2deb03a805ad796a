"""Megatron's uniform pipeline split counts layers, not blocks: gpt-oss-120b's repeated block is a sliding-window
and a full-attention layer (`layers_per_repeat: 2`), and Megatron-Core gives each of PP 4's stages 36 / 4 = 9
consecutive layers (transformer_block.py get_num_layers_to_build), so a stage boundary may fall inside a pair."""

from __future__ import annotations

import textwrap

import pytest

from dlperf.engine.memory import blocks_in_stage
from dlperf.engine.pipeline import uniform_partition
from dlperf.errors import SpecError
from dlperf.plan import Plan
from dlperf.search import SearchSpace, _pp_filter
from dlperf.spec.model import Seq, load_model


@pytest.fixture(scope="module")
def gpt_oss():
    return load_model("gpt-oss-120b", {"layers": 36})


def _attention_names(stage: list) -> list[str]:
    names = []
    for node in stage:
        for item in node.items if isinstance(node, Seq) else ():
            names += [layer.name for path in getattr(item, "paths", ()) for layer in path.items
                      if getattr(layer, "op", "") == "attention"]
    return names


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 9, 12])
def test_each_stage_gets_layers_over_pp_consecutive_layers(gpt_oss, pp: int) -> None:
    stages = uniform_partition(gpt_oss, pp)
    assert stages is not None
    kinds = [_attention_names(stage) for stage in stages]
    assert all(len(k) == 36 // pp for k in kinds)
    flat = [name for k in kinds for name in k]  # the model's order survives the cut
    assert flat == ["sliding_attention", "full_attention"] * 18


def test_pp_4_splits_inside_a_pair_and_pp_8_is_refused(gpt_oss) -> None:
    stages = uniform_partition(gpt_oss, 4)
    assert _attention_names(stages[1])[0] == "full_attention"  # layer 9 is a full-attention layer
    assert uniform_partition(gpt_oss, 8) is None  # 36 layers: Megatron refuses pp 8 as well


def test_search_tries_the_pp_megatron_accepts(gpt_oss) -> None:
    accepts = _pp_filter(gpt_oss, SearchSpace())
    assert accepts(4) and accepts(12) and not accepts(8)


def test_full_recomputation_counts_layers_per_stage(gpt_oss) -> None:
    assert blocks_in_stage(gpt_oss, Plan(devices=4, pp=4)) == 9


def test_a_block_of_one_layer_splits_as_before() -> None:
    model = load_model("llama3-8b")
    stages = uniform_partition(model, 4)
    assert [sum(isinstance(n, Seq) and n.name == "decoder" for n in s) for s in stages] == [8, 8, 8, 8]


@pytest.mark.parametrize("value", [0, 3, "two", True])
def test_layers_per_repeat_must_split_the_block_evenly(tmp_path, value) -> None:
    spec = tmp_path / "m.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: m
        input: [16]
        params: {{hidden: 8}}
        blocks:
          pair:
            layers:
              - {{op: linear, out: hidden}}
              - {{op: linear, out: hidden}}
        layers:
          - {{op: embedding, vocab: 10, dim: hidden}}
          - {{block: pair, repeat: 4, layers_per_repeat: {value}}}
        """))
    with pytest.raises(SpecError, match="layers_per_repeat"):
        load_model(str(spec))
