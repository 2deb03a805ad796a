"""Model spec loading: params, blocks, repeats, shapes, and one clean located error per kind of bad input."""

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlperf.errors import DlperfError, ShapeError, SpecError
from dlperf.spec import expr
from dlperf.spec.model import load_model, model_from_dict
from dlperf.spec.yamlio import load_yaml_text

GOOD = """\
name: tiny
source: test
input: [3, 32, 32]
params: {width: 16, wide: 2*width}
blocks:
  basic:
    args: {c: 16}
    layers:
      - residual:
          - {op: conv2d, out: c, kernel: 3, padding: 1, bias: false}
          - {op: batchnorm}
      - {op: relu}
layers:
  - {op: conv2d, out: width, kernel: 3, padding: 1}
  - {block: basic, repeat: 3, args: {c: width}}
  - {op: global_avgpool}
  - {op: linear, out: wide}
  - {op: cross_entropy}
"""


def load_text(text: str, overrides=None):
    return model_from_dict(load_yaml_text(text, "m.yaml"), "m.yaml", overrides or {})


def test_shapes_params_and_repeat_counts():
    model = load_text(GOOD)
    # conv 3->16 3x3 + bias: 448; 3 x (conv 16->16 3x3: 2304 + bn 32); linear 16->32 + bias: 544
    assert model.total_params == 448 + 3 * (2304 + 32) + 544
    counts = {layer.op: count for layer, count in model.counted()}
    assert counts["batchnorm"] == 3 and counts["linear"] == 1
    assert model.output_shape == (1,)


def test_param_override_flows_into_expressions():
    model = load_text(GOOD, {"width": 8})
    linear = next(layer for layer, _ in model.layers() if layer.op == "linear")
    assert linear.in_shape == (8,) and linear.out_shape == (16,)


def test_repeat_is_costed_once():
    model = load_model("gpt3-175b")
    attention = [layer for layer, _ in model.counted() if layer.op == "attention"]
    assert len(attention) == 1  # 96 layers, one distinct attention layer
    assert dict(model.counted())[attention[0]] == 96


def test_symbolic_param_stays_symbolic():
    text = GOOD.replace("width: 16,", "width: null,").replace("out: wide", "out: 10")
    model = load_text(text)
    assert "width" in str(model.total_params)


@pytest.mark.parametrize("text", ["2*h", "h // 3", "min(h, 7) + 1", "(h + 1) ** 2", "ceil(h)"])
def test_expressions(text):
    assert expr.evaluate(text, {"h": 6}) == eval(text.replace("ceil", ""), {"h": 6, "min": min})  # noqa: S307


@pytest.mark.parametrize("text", ["__import__('os')", "h.real", "[1]", "h if h else 2", "lambda: 1", "2**999"])
def test_expressions_reject_anything_else(text):
    with pytest.raises(SpecError):
        expr.evaluate(text, {"h": 6})


BAD = [
    (GOOD.replace("op: relu", "op: rleu"), "unknown op 'rleu' (did you mean 'relu'?)", 12),
    (GOOD.replace("op: relu", "op: gelu, inplace: true"), "unknown key 'inplace'", 12),  # only ReLU runs in place
    (GOOD.replace("op: relu", "op: relu, inplace: 1"), "expected true or false", 12),
    (GOOD.replace("kernel: 3, padding: 1}", "kernel: 3, paddin: 1}", 1), "unknown key 'paddin'", 14),
    (GOOD.replace("repeat: 3", "repeat: 0"), "expected a repeat count", 15),
    (GOOD.replace("out: wide", "out: nope"), "undefined name 'nope'", 17),
    (GOOD.replace("out: width, kernel: 3", "out: width, kernel: 40"), "larger than its padded input", 14),
    (GOOD.replace("input: [3, 32, 32]", "input: [3, -2, 2]"), "positive dimensions", 3),
    (GOOD.replace("- {op: global_avgpool}", "- {op: linear, out: 4, in: 99}"), "input width does not match", 16),
    (GOOD + "  - {op: conv2d, out: 4, kernel: 3}\n", "rank-3 input", 19),
    (GOOD.replace("name: tiny", "name: tiny\nbogus: 1"), "unknown key 'bogus'", 2),
    ("name: [unclosed\n", "YAML syntax error", 2),
    (GOOD.replace("{op: conv2d, out: width, kernel: 3, padding: 1}", "{op: conv2d, kernel: 3, padding: 1}"),
     "conv2d needs 'out'", 14),
    (GOOD.replace("kernel: 3, padding: 1, bias: false}", "kernel: 3, padding: 1, bias: 3}"), "expected true or false",
     10),
    (GOOD.replace("input: [3, 32, 32]\n", ""), "missing required key 'input'", 1),
]


@pytest.mark.parametrize("text,message,line", BAD)
def test_bad_models_give_one_located_line(text, message, line):
    with pytest.raises(DlperfError) as info:
        load_text(text)
    text_out = str(info.value)
    assert message in text_out and "\n" not in text_out
    assert text_out.startswith("m.yaml")
    if line:
        assert f"m.yaml:{line}:" in text_out


def test_hidden_not_divisible_by_heads():
    with pytest.raises(ShapeError, match="not divisible by heads"):
        load_model("gpt", {"hidden": 1000, "heads": 96})


@pytest.mark.parametrize("overrides,message", [
    ({"layerz": 2}, "no parameter 'layerz' (did you mean 'layers'?)"),
    ({"layers": 0}, "expected a positive integer"),
])
def test_bad_overrides(overrides, message):
    with pytest.raises(SpecError) as info:
        load_model("gpt", overrides)
    assert message in str(info.value)


def test_missing_file():
    with pytest.raises(SpecError, match="file not found"):
        load_model("nowhere/x.yaml")


def test_unknown_builtin_suggests():
    with pytest.raises(SpecError, match="did you mean 'resnet50'"):
        load_model("resnet5")


def _mutations():
    import pathlib

    texts = [p.read_text() for p in sorted(pathlib.Path("models").glob("*.yaml"))]
    return st.tuples(st.sampled_from(texts), st.integers(0, 10**6), st.sampled_from(
        ["", "0", "-1", "x", "[", "}", ": ", "null", "2.5", "conv2d", "'a'", "1e9", "\n  - "]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_fuzz_mutated_builtins_give_valid_spec_or_clean_error(case):
    text, position, insert = case
    cut = position % (len(text) + 1)
    mutated = text[:cut] + insert + text[cut + len(insert):]
    try:
        load_text(mutated)
    except DlperfError as err:
        assert "\n" not in str(err) and str(err)


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20))
def test_fuzz_random_documents(document):
    import yaml

    try:
        load_text(yaml.safe_dump(document))
    except DlperfError as err:
        assert "\n" not in str(err)


def test_cli_error_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("op: relu", "op: rleu"))
    proc = subprocess.run([sys.executable, "-m", "dlperf", "show", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "bad.yaml:12: blocks.basic.layers[1].op: unknown op" in proc.stderr


def test_a_parsed_document_is_reused_but_each_caller_gets_its_own_copy(tmp_path, monkeypatch):
    from dlperf.spec import yamlio

    parsed = []
    parse = yamlio._parse
    monkeypatch.setattr(yamlio, "_parse", lambda text, file: parsed.append(file) or parse(text, file))
    path = tmp_path / "doc.yaml"
    path.write_text("a:\n  b: [1, 2]\n")
    first = yamlio.load_yaml_file(path)
    first["a"]["b"].append(3)  # a caller that changes what it got does not change what the next caller gets
    second = yamlio.load_yaml_file(path)
    assert second == {"a": {"b": [1, 2]}} and yamlio.line_of(second["a"], "b") == 2
    assert len(parsed) == 1  # read twice, parsed once
    path.write_text("a:\n  b: [4]\n")  # an edited file is parsed again
    assert yamlio.load_yaml_file(path) == {"a": {"b": [4]}} and len(parsed) == 2


def test_optional_parts_empty_path_axis_and_zero_repeat():
    """The features DeepSeek-V3's MTP module uses: `[]` is the identity path, `axis` picks concat's dimension,
    a `repeat:` expression of 0 leaves its entry out, and a param whose default is 0 may be 0."""
    doc = {"name": "t", "input": ["seq"], "params": {"seq": 8, "h": 4, "extra": 0},
           "blocks": {"side": {"layers": [
               {"branches": [[], [{"op": "linear", "out": "h"}]], "merge": "concat", "axis": 0}]}},
           "layers": [{"op": "embedding", "vocab": 10, "dim": "h"},
                      {"branches": [[{"op": "embedding", "vocab": 10, "dim": "h", "tied": True}], []],
                       "merge": "concat", "axis": -1},
                      {"op": "linear", "in": "2 * h", "out": "h"},
                      {"block": "side", "repeat": "min(extra, 1)", "name": "side"}]}
    off = model_from_dict(doc, "t.yaml", {})
    assert off.output_shape == (8, 4) and not any(layer.name == "side" for layer, _ in off.layers())
    assert off.total_params == 10 * 4 + 8 * 4 + 4  # the tied lookup owns nothing
    on = model_from_dict(doc, "t.yaml", {"extra": 1})
    assert on.output_shape == (16, 4)  # the identity and the linear stacked along the sequence
    with pytest.raises(DlperfError, match="repeat count from 1"):
        model_from_dict({**doc, "layers": [*doc["layers"][:3], {"block": "side", "repeat": 0}]}, "t.yaml", {})
    with pytest.raises(DlperfError, match="axis"):
        model_from_dict({**doc, "layers": [doc["layers"][0], {**doc["layers"][1], "merge": "add"}]}, "t.yaml", {})
