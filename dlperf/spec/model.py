"""Model specs: YAML -> a tree of Layers with shapes inferred from the per-sample input (docs/model-format.md).

Identical layers are kept once: a `repeat: 96` block is one subtree with a count, never 96 copies.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from dlperf import builtins
from dlperf.errors import DlperfError, ShapeError, SpecError
from dlperf.ops import MERGE_OPS, OPS
from dlperf.ops.base import REQUIRED, Layer
from dlperf.ops.dense import LOSS_IMPLS, QKV_SPLIT_IMPLS, ROPE_IMPLS, SOFTMAX_IMPLS
from dlperf.spec import expr
from dlperf.spec.hardware import DTYPES
from dlperf.spec.yamlio import check_keys, closest, line_of, load_yaml_file

TOP_KEYS = ("name", "description", "source", "input", "dtype", "params", "base", "blocks", "layers")
FLOAT_ATTRS = ("p", "eps", "dropout")
FACTOR_ATTRS = ("capacity_factor",)  # a number >= 1 (null: off), or a model param naming one (0: off)
CHOICE_ATTRS = {"algorithm": ("auto", "direct", "im2col", "winograd", "fft"), "impl": LOSS_IMPLS,
                "softmax": SOFTMAX_IMPLS, "rope": ROPE_IMPLS,
                "qkv_split": QKV_SPLIT_IMPLS}
MAX_REPEAT = 10**6
# Work budgets checked while building (issue #15). The largest built-in model has 966 layer instances, 198
# pipeline units and builds ~400 layer entries; 16 blocks each calling the previous one 10 times would build
# 10^16 of them, and nested repeats of 10^6 would give the pipeline stager 10^12 units.
MAX_ENTRIES = 20_000       # layer entries built (a block is built once per call site, not per repeat): twice
# MAX_UNITS, since every entry unrolls to at least one layer unless blocks nest single calls; the largest built-in
# builds under 300. At ~12 us an entry a blocks bomb is refused in ~0.25 s of CPU (100,000 took ~1.2 s)
MAX_UNITS = 10_000         # layer instances once repeats are unrolled (what pipeline staging cuts between)
MAX_STACKED = 1_000        # `layers:` of one recurrent op
PAIR_ATTRS = ("kernel", "stride", "padding", "dilation", "output")
# A block call's `precision`: bf16 keeps every layer built inside it out of an FP8 or FP4 recipe (Megatron-Bridge's
# keep_mtp_spec_in_bf16, dlperf.ops.fp8.fp8_layers)
PRECISIONS = ("bf16",)


def _cached_hash(node: Any, key: tuple) -> int:
    """Trees are hashed often (memoised stage costs are keyed by their layers); hash each node once."""
    cached = node.__dict__.get("_hash")
    if cached is None:
        cached = hash(key)
        object.__setattr__(node, "_hash", cached)
    return cached


@dataclass(frozen=True)
class Seq:
    """Layers in sequence, the whole run `repeat` times (shape-preserving when repeat > 1). `layers_per_repeat`:
    how many equal-length model layers one copy holds (gpt-oss-120b's block is a sliding-window and a full-attention
    layer), which Megatron's pipeline split may separate: it divides layers, not blocks, evenly among stages."""

    items: tuple[Node, ...]
    repeat: int = 1
    name: str = field(default="", compare=False)
    layers_per_repeat: int = field(default=1, compare=False)

    @property
    def layer_count(self) -> int:
        return self.repeat * self.layers_per_repeat

    def __hash__(self) -> int:
        return _cached_hash(self, (self.items, self.repeat))


@dataclass(frozen=True)
class Branches:
    """Parallel paths from one input, merged by `merge` (add for residuals, concat for inception)."""

    paths: tuple[Seq, ...]
    merge: Layer
    name: str = field(default="", compare=False)

    def __hash__(self) -> int:
        return _cached_hash(self, (self.paths, self.merge))


Node = Layer | Seq | Branches


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    source: str
    path: str
    input_shape: tuple[Any, ...]
    dtype: str
    params: dict[str, Any]
    root: Seq

    @property
    def output_shape(self) -> tuple[Any, ...]:
        return out_shape(self.root, self.input_shape)

    def layers(self) -> list[tuple[Layer, int]]:
        """Every layer in order with how many times it runs per sample (repeats multiplied through)."""
        return list(walk(self.root, 1))

    def counted(self) -> list[tuple[Layer, int]]:
        """Distinct layers (same op, attributes and input shape) with their total counts, first-seen order."""
        return list(self._counted)

    @cached_property
    def _counted(self) -> tuple[tuple[Layer, int], ...]:
        """`counted`, walked once per model: the tree is frozen, and search asks for it once per plan."""
        totals: dict[Layer, int] = {}
        for layer, count in walk(self.root, 1):
            totals[layer] = totals.get(layer, 0) + count
        return tuple(totals.items())

    @property
    def total_params(self) -> Any:
        return sum(layer.params * count for layer, count in self.counted())


def walk(node: Node, count: int) -> Iterator[tuple[Layer, int]]:
    if isinstance(node, Layer):
        yield node, count
    elif isinstance(node, Seq):
        for item in node.items:
            yield from walk(item, count * node.repeat)
    else:
        for path in node.paths:
            yield from walk(path, count)
        yield node.merge, count


def out_shape(node: Node, default: tuple[Any, ...]) -> tuple[Any, ...]:
    if isinstance(node, Layer):
        return node.out_shape
    if isinstance(node, Branches):
        return node.merge.out_shape
    return out_shape(node.items[-1], default) if node.items else default


# ---- loading --------------------------------------------------------------------------------------------


@dataclass
class _Ctx:
    file: str
    blocks: dict[str, Any]
    depth: int = 0
    built: list[int] = field(default_factory=lambda: [0])  # shared by nested contexts: entries built so far


def load_model(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Model:
    """Load a built-in model by name (`resnet50`), a YAML file by path, or a Hugging Face config.json (converted
    by dlperf.spec.hf), with `--set` style overrides."""
    from dlperf.spec import hf

    if hf.is_config(name_or_path):
        data, file = hf.load_config(name_or_path)
        return model_from_dict(data, file, overrides or {})
    data, file = _read_with_base(str(name_or_path), seen=())
    return model_from_dict(data, file, overrides or {})


def _read(name_or_path: str) -> tuple[Any, str]:
    path = builtins.resolve(name_or_path, "models")
    if path.parent == builtins.data_dir("models") and not path.exists():
        names = builtins.builtin_names("models")
        hint = closest(name_or_path, names)
        raise SpecError(f"unknown model {name_or_path!r}" + (f" (did you mean {hint!r}?)" if hint else ""),
                        expected="a built-in name (" + ", ".join(names) + ") or a .yaml path")
    return load_yaml_file(path), str(path)


def _read_with_base(name_or_path: str, seen: tuple[str, ...]) -> tuple[Any, str]:
    data, file = _read(name_or_path)
    check_keys(data, TOP_KEYS, file, "")
    if "base" not in data:
        return data, file
    base_name = data["base"]
    if not isinstance(base_name, str) or base_name in seen or len(seen) > 8:
        raise SpecError(expected="the name of another model (no cycles)", found=base_name, file=file,
                        line=line_of(data, "base"), field="base")
    base, _ = _read_with_base(base_name, (*seen, name_or_path))
    merged = dict(base)
    merged.update({k: v for k, v in data.items() if k not in ("params", "base")})
    params = dict(_param_map(base, file))
    params.update(_param_map(data, file))
    merged["params"] = params
    return merged, file


def _param_map(data: dict, file: str) -> dict:
    node = data.get("params") or {}
    if not isinstance(node, dict):
        raise SpecError(expected="a mapping of names to integers", found=node, file=file,
                        line=line_of(data, "params"), field="params")
    return node


def unit_count(node: Node) -> int:
    """Layer instances with every repeat unrolled, computed without unrolling (MAX_UNITS bounds it)."""
    if isinstance(node, Seq):
        return node.repeat * sum(unit_count(item) for item in node.items)
    return 1


def model_from_dict(data: Any, file: str, overrides: dict[str, Any]) -> Model:
    check_keys(data, TOP_KEYS, file, "", required=("name", "input", "layers"))
    params = _params(data.get("params") or {}, overrides, file)
    dtype = data.get("dtype", "fp32")
    if dtype not in DTYPES:
        raise SpecError(expected="one of " + ", ".join(DTYPES), found=dtype, file=file, line=line_of(data, "dtype"),
                        field="dtype")
    input_shape = _shape(data["input"], params, file, line_of(data, "input"), "input")
    blocks = data.get("blocks") or {}
    if not isinstance(blocks, dict):
        raise SpecError(expected="a mapping of block names", found=blocks, file=file, line=line_of(data, "blocks"),
                        field="blocks")
    root = _sequence(data["layers"], input_shape, params, _Ctx(file, blocks), "layers", 1)
    if unit_count(root) > MAX_UNITS:
        raise SpecError(f"the model unrolls to {unit_count(root):,} layers (repeats multiplied out)",
                        expected=f"at most {MAX_UNITS:,} (the limit model.MAX_UNITS)", file=file,
                        line=line_of(data, "layers"), field="layers")
    return Model(
        name=str(data["name"]), description=str(data.get("description", "")), source=str(data.get("source", "")),
        path=file, input_shape=input_shape, dtype=dtype, params=params, root=root,
    )


def _params(node: Any, overrides: dict[str, Any], file: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise SpecError(expected="a mapping of names to integers", found=node, file=file, line=line_of(node),
                        field="params")
    for name, value in overrides.items():
        if name not in node:
            hint = closest(name, node)
            raise SpecError(f"--set {name}: the model has no parameter {name!r}"
                            + (f" (did you mean {hint!r}?)" if hint else ""),
                            expected="one of " + (", ".join(node) or "(none)"), file=file)
        if isinstance(node[name], bool):  # a switch (e.g. flash) takes true/false, never a count
            if not isinstance(value, bool):
                raise SpecError(f"--set {name}", expected="true or false", found=value, file=file)
        elif isinstance(value, bool) or not isinstance(value, int) or value < _least(node[name]):
            raise SpecError(f"--set {name}", expected="a positive integer" if _least(node[name]) else
                            "a whole number >= 0", found=value, file=file)
    env: dict[str, Any] = {}
    for name, raw in node.items():
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            # ASCII only: Python folds identifiers by NFKC, so a full-width 'ｈ' would alias 'h' in expressions
            raise SpecError(expected="an ASCII identifier", found=name, file=file, line=line_of(node, name),
                            field="params")
        value = overrides.get(name, raw)
        env[name] = _param_value(name, value, env, file, line_of(node, name), _least(raw))
    return env


def _least(default: Any) -> int:
    """The smallest value a param takes: 0 for one whose file default is 0, an optional part's count that
    `repeat:` expressions of it switch off (deepseek-v3's mtp_layers); 1 for every other count."""
    return 0 if default == 0 and not isinstance(default, bool) else 1


def _param_value(name: str, value: Any, env: dict[str, Any], file: str, line: int | None, least: int = 1) -> Any:
    if value is None:
        import sympy

        return sympy.Symbol(name, positive=True, integer=True)
    try:
        result = _evaluate(value, env)
    except DlperfError as err:
        raise err.located(file=file, line=line, field=f"params.{name}") from None
    if isinstance(result, int) and not isinstance(result, bool) and result < least:
        raise SpecError(expected="a positive integer" if least else "a whole number >= 0", found=value, file=file,
                        line=line, field=f"params.{name}")
    return result


def _evaluate(value: Any, env: dict[str, Any]) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return expr.evaluate(value, env)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if abs(value) > expr.MAX_INT:
            raise SpecError(expected="a whole number of at most 2**53 (expr.MAX_INT)", found=value)
        return value
    raise SpecError(expected="a whole number or an expression", found=value)


def _shape(node: Any, env: dict[str, Any], file: str, line: int | None, where: str) -> tuple[Any, ...]:
    if not isinstance(node, list) or not node:
        raise SpecError(expected="a non-empty list of dimensions", found=node, file=file, line=line, field=where)
    dims = []
    for dim in node:
        try:
            value = _evaluate(dim, env)
        except DlperfError as err:
            raise err.located(file=file, line=line, field=where) from None
        if isinstance(value, bool) or (isinstance(value, int) and value < 1):
            raise SpecError(expected="positive dimensions", found=node, file=file, line=line, field=where)
        dims.append(value)
    return tuple(dims)


def _sequence(node: Any, shape: tuple, env: dict, ctx: _Ctx, where: str, line: int | None) -> Seq:
    if not isinstance(node, list) or not node:
        raise SpecError(expected="a non-empty list of layers", found=node, file=ctx.file, line=line_of(node) or line,
                        field=where)
    items = []
    for index, entry in enumerate(node):
        item_where, item_line = f"{where}[{index}]", line_of(node, index)
        ctx.built[0] += 1
        if ctx.built[0] > MAX_ENTRIES:
            raise SpecError(f"building the model takes more than {MAX_ENTRIES:,} layer entries (blocks calling "
                            "blocks)", expected=f"at most {MAX_ENTRIES:,} (the limit model.MAX_ENTRIES)",
                            file=ctx.file, line=item_line, field=item_where)
        try:
            item = _entry(entry, shape, env, ctx, item_where, item_line)
        except DlperfError as err:
            raise err.located(file=ctx.file, line=item_line, field=item_where) from None
        except (TypeError, ValueError, ArithmeticError) as err:
            # a value of a type no rule checks (a list where a name belongs, a symbol where a number must be):
            # still one located line, never a traceback
            raise SpecError(f"cannot build this layer ({type(err).__name__}: {err})", file=ctx.file,
                            line=item_line, field=item_where) from None
        if isinstance(item, Seq) and not item.items:  # a `repeat:` expression of 0 builds nothing
            continue
        shape = out_shape(item, shape)
        items.append(item)
    return Seq(tuple(items))


def _entry(entry: Any, shape: tuple, env: dict, ctx: _Ctx, where: str, line: int | None) -> Node:
    if not isinstance(entry, dict):
        raise SpecError(expected="a layer mapping like {op: conv2d, ...}", found=entry, file=ctx.file, line=line,
                        field=where)
    if "block" in entry:
        return _block_call(entry, shape, env, ctx, where, line)
    if "residual" in entry:
        check_keys(entry, ("residual", "shortcut", "name", "fused"), ctx.file, where)
        paths = [entry["residual"]] + ([entry["shortcut"]] if "shortcut" in entry else [])
        fused = _attr("add", "fused", entry["fused"], False, env, ctx, where, line_of(entry, "fused") or line) \
            if "fused" in entry else False
        return _branches(paths, "add", shape, env, ctx, where, line, entry.get("name", "residual"),
                         identity=len(paths) == 1, merge_attrs=(("fused", True),) if fused else ())
    if "branches" in entry:
        check_keys(entry, ("branches", "merge", "name", "axis"), ctx.file, where, required=("merge",))
        paths = entry["branches"]
        if not isinstance(paths, list) or not paths:
            raise SpecError(expected="a list of layer lists", found=paths, file=ctx.file, line=line,
                            field=f"{where}.branches")
        axis = entry.get("axis")
        if axis not in (None, 0, -1) or (axis is not None and entry["merge"] != "concat"):
            raise SpecError(expected="axis: 0 or -1, on a concat merge", found=axis, file=ctx.file,
                            line=line_of(entry, "axis") or line, field=f"{where}.axis")
        return _branches(paths, entry["merge"], shape, env, ctx, where, line, entry.get("name", "branches"),
                         axis=axis)
    if "op" not in entry:
        raise SpecError("a layer needs `op`, `block`, `residual` or `branches`", file=ctx.file, line=line,
                        field=where, expected="one of op, block, residual, branches", found=sorted(entry))
    return _op_layer(entry, shape, env, ctx, where, line)


def _repeat(entry: dict, env: dict, ctx: _Ctx, where: str, line: int | None) -> int:
    """The entry's repeat count: 1 to MAX_REPEAT, or 0 from an expression (`repeat: min(mtp_layers, 1)`): the
    entry is then left out, as an optional part a param switches off. A literal 0 stays an error."""
    raw = entry.get("repeat", 1)
    value = _evaluate(raw, env)
    least = 0 if isinstance(raw, str) else 1
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_REPEAT:
        raise SpecError(expected=f"a repeat count from {least} to {MAX_REPEAT}", found=raw, file=ctx.file,
                        line=line_of(entry, "repeat") or line, field=f"{where}.repeat")
    return value


def _block_call(entry: dict, shape: tuple, env: dict, ctx: _Ctx, where: str, line: int | None) -> Seq:
    check_keys(entry, ("block", "repeat", "args", "name", "layers_per_repeat", "precision"), ctx.file, where)
    precision = _precision(entry, ctx, where, line)
    name = entry["block"]
    if not isinstance(name, str) or name not in ctx.blocks:
        hint = closest(str(name), ctx.blocks)
        raise SpecError(f"unknown block {name!r}" + (f" (did you mean {hint!r}?)" if hint else ""), file=ctx.file,
                        line=line, field=f"{where}.block", expected="one of " + ", ".join(ctx.blocks))
    if ctx.depth > 16:
        raise SpecError("blocks nest too deeply (a block calls itself?)", file=ctx.file, line=line, field=where)
    block = ctx.blocks[name]
    check_keys(block, ("args", "layers"), ctx.file, f"blocks.{name}", required=("layers",))
    local = dict(env)
    defaults = block.get("args") or {}
    given = entry.get("args") or {}
    check_keys(defaults, [k for k in defaults if isinstance(k, str) and k.isidentifier() and k.isascii()],
               ctx.file, f"blocks.{name}.args")
    check_keys(given, list(defaults), ctx.file, f"{where}.args")
    for arg, default in defaults.items():
        raw = given.get(arg, default)
        local[arg] = _evaluate(raw, {**env, **{k: v for k, v in local.items() if k in defaults}})
    repeat = _repeat(entry, env, ctx, where, line)
    if repeat == 0:  # left out, never built: a block that calls itself ends here (deepseek-v3's mtp_depths)
        return Seq((), 1, str(entry.get("name", name)))
    inner = _sequence(block["layers"], shape, local, _Ctx(ctx.file, ctx.blocks, ctx.depth + 1, ctx.built),
                      f"blocks.{name}.layers", line_of(block, "layers"))
    _check_repeatable(inner, shape, repeat, where)
    per_repeat = _layers_per_repeat(entry, inner, ctx, where, line)
    items = tuple(_with_precision(item, precision) for item in inner.items) if precision else inner.items
    return Seq(items, repeat, str(entry.get("name", name)), per_repeat)


def _precision(entry: dict, ctx: _Ctx, where: str, line: int | None) -> str:
    """The call's `precision` ("" when absent): bf16, or a SpecError."""
    if "precision" not in entry:
        return ""
    value = entry["precision"]
    if value not in PRECISIONS:
        raise SpecError(expected="precision: " + " | ".join(PRECISIONS), found=value, file=ctx.file,
                        line=line_of(entry, "precision") or line, field=f"{where}.precision")
    return str(value)


def _with_precision(node: Node, precision: str) -> Node:
    """`node` with every layer in it marked `precision` (so distinct from equal layers built elsewhere)."""
    if isinstance(node, Layer):
        return replace(node, precision=precision)
    if isinstance(node, Seq):
        return replace(node, items=tuple(_with_precision(item, precision) for item in node.items))
    return replace(node, paths=tuple(_with_precision(path, precision) for path in node.paths),
                   merge=replace(node.merge, precision=precision))


def _layers_per_repeat(entry: dict, inner: Seq, ctx: _Ctx, where: str, line: int | None) -> int:
    """The call's `layers_per_repeat` (default 1): a count that splits the block's entries into equal layers."""
    value = entry.get("layers_per_repeat", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or len(inner.items) % value:
        raise SpecError(expected=f"a whole number dividing the block's {len(inner.items)} entries into equal layers",
                        found=value, file=ctx.file, line=line_of(entry, "layers_per_repeat") or line,
                        field=f"{where}.layers_per_repeat")
    return value


def _check_repeatable(seq: Seq, shape: tuple, repeat: int, where: str) -> None:
    end = out_shape(seq, shape)
    if repeat > 1 and tuple(end) != tuple(shape):
        raise ShapeError(f"{where}: a repeated block must keep its shape", expected=list(shape), found=list(end))


def _branches(paths: list, merge: Any, shape: tuple, env: dict, ctx: _Ctx, where: str, line: int | None,
              name: str, identity: bool = False, merge_attrs: tuple = (), axis: int | None = None) -> Branches:
    if not isinstance(merge, str) or merge not in MERGE_OPS:
        raise SpecError(expected="merge: " + " | ".join(MERGE_OPS), found=merge, file=ctx.file, line=line,
                        field=f"{where}.merge")
    seqs = [Seq(()) if p == [] else _sequence(p, shape, env, ctx, f"{where}.path{i}", line)
            for i, p in enumerate(paths)]  # `[]`: the input itself (the decoder's output beside the MTP depths)
    ends = [out_shape(s, shape) for s in seqs] + ([shape] if identity else [])
    merged = _concat_shape(ends, axis) if axis is not None else _merge_shape(merge, ends)
    merge_layer = Layer(merge, merge_attrs, ends[0], merged, f"{name}.{merge}")
    return Branches(tuple(seqs), merge_layer, str(name))


def _concat_shape(ends: list[tuple], axis: int) -> tuple:
    """A concat along the dimension `axis` names: 0 the first per-sample one (a sequence stacked after another,
    as Megatron-Core stacks the MTP depths' hidden states), -1 the last (features side by side, as the MTP
    projection's [embedding, hidden] input). The other dimensions must agree."""
    first = ends[0]
    rest = (lambda e: tuple(e[1:])) if axis == 0 else (lambda e: tuple(e[:-1]))
    if any(len(e) != len(first) or rest(e) != rest(first) for e in ends):
        raise ShapeError(f"concat on axis {axis} needs equal shapes in the other dimensions",
                         expected=list(first), found=[list(e) for e in ends])
    total = sum(e[axis] for e in ends)
    return (total, *first[1:]) if axis == 0 else (*first[:-1], total)


def _merge_shape(merge: str, ends: list[tuple]) -> tuple:
    first = ends[0]
    if merge == "concat":
        if any(len(e) != len(first) or tuple(e[1:]) != tuple(first[1:]) for e in ends):
            if not all(len(e) >= 1 and tuple(e[:-1]) == tuple(first[:-1]) for e in ends):
                raise ShapeError("concat needs equal shapes except the channel (or last) dimension",
                                 expected="matching shapes", found=[list(e) for e in ends])
            return (*first[:-1], sum(e[-1] for e in ends))
        return (sum(e[0] for e in ends), *first[1:])
    if any(tuple(e) != tuple(first) for e in ends):
        raise ShapeError(f"{merge} needs equal shapes on every path", expected=list(first),
                         found=[list(e) for e in ends])
    return first


def _op_layer(entry: dict, shape: tuple, env: dict, ctx: _Ctx, where: str, line: int | None) -> Node:
    op = entry["op"]
    if not isinstance(op, str) or op not in OPS or op in MERGE_OPS:
        names = [o for o in OPS if o not in MERGE_OPS]
        hint = closest(str(op), names)
        raise SpecError(f"unknown op {op!r}" + (f" (did you mean {hint!r}?)" if hint else ""), file=ctx.file,
                        line=line, field=f"{where}.op", expected="one of " + ", ".join(names))
    rule = OPS[op]
    check_keys(entry, ("op", "name", "repeat", *rule.attrs), ctx.file, where)
    attrs = {}
    for key, default in rule.attrs.items():
        if key in entry:
            attrs[key] = _attr(op, key, entry[key], default, env, ctx, where, line_of(entry, key) or line)
        elif default is REQUIRED:
            raise SpecError(f"{op} needs {key!r}", file=ctx.file, line=line, field=f"{where}.{key}",
                            expected=f"a value for {key}")
        else:
            attrs[key] = default
    _fill_derived(op, attrs, shape)
    rule.check(shape, attrs)
    out = rule.shape(shape, attrs)
    layer = Layer(op, tuple(sorted((k, _hashable(v)) for k, v in attrs.items())), tuple(shape), tuple(out),
                  str(entry.get("name", op)), rule.params(shape, attrs))
    repeat = _repeat(entry, env, ctx, where, line)
    if repeat == 0:
        return Seq((), 1, layer.name)
    if repeat == 1:
        return layer
    seq = Seq((layer,), repeat, layer.name)
    _check_repeatable(seq, shape, repeat, where)
    return seq


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _attr(op: str, key: str, raw: Any, default: Any, env: dict, ctx: _Ctx, where: str, line: int | None) -> Any:
    field_where = f"{where}.{key}"
    try:
        if key in CHOICE_ATTRS:
            raw = _switched_choice(raw, env)
            if raw is None and default is None:  # an optional choice left off (attention's rope)
                return None
            if raw not in CHOICE_ATTRS[key]:
                raise SpecError(expected="one of " + ", ".join(CHOICE_ATTRS[key]), found=raw)
            return raw
        if key in FACTOR_ATTRS:
            if isinstance(raw, str):  # a model param, 0 for off (qwen3's and deepseek-v3's capacity_factor)
                raw = _evaluate(raw, env)
                if raw == 0 and not isinstance(raw, bool):
                    return None
            if raw is None:
                return None
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 1:
                raise SpecError(expected="a number >= 1 (or null)", found=raw)
            return float(raw)
        if key in FLOAT_ATTRS:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw < 1:
                raise SpecError(expected="a number in [0, 1)", found=raw)
            return float(raw)
        if isinstance(default, bool):
            if isinstance(raw, str) and isinstance(env.get(raw.strip()), bool):  # a switch param, e.g. flash
                return env[raw.strip()]
            if not isinstance(raw, bool):
                raise SpecError(expected="true or false", found=raw)
            return raw
        if key == "padding" and raw == "same":
            return raw
        if isinstance(raw, list):
            if key not in PAIR_ATTRS or len(raw) != 2:
                raise SpecError(expected="an integer or a pair [h, w]" if key in PAIR_ATTRS else "one integer",
                                found=raw)
            return [_count(op, key, v, env) for v in raw]
        value = _count(op, key, raw, env)
        if key == "layers" and isinstance(value, int) and value > MAX_STACKED:
            raise SpecError(expected=f"at most {MAX_STACKED} stacked layers (model.MAX_STACKED)", found=raw)
        return value
    except DlperfError as err:
        raise err.located(file=ctx.file, line=line, field=field_where) from None


def _switched_choice(raw: Any, env: dict) -> Any:
    """A choice written `a if switch else b`, switch a true/false model param, picks a or b (None for null), so
    that a row's `set:` can pick the implementation its stack runs (attention's rope: fused if complex_rope is
    false). Anything else is returned as written."""
    if not isinstance(raw, str) or " if " not in raw:
        return raw
    try:
        node = ast.parse(raw.strip(), mode="eval").body
    except SyntaxError:
        return raw
    if not (isinstance(node, ast.IfExp) and isinstance(node.test, ast.Name)
            and all(isinstance(n, ast.Name) or (isinstance(n, ast.Constant) and n.value is None)
                    for n in (node.body, node.orelse))):
        return raw
    switch = env.get(node.test.id)
    if not isinstance(switch, bool):
        raise SpecError(f"{node.test.id!r} in {raw!r} is not a true/false model param", expected="a switch param",
                        found=node.test.id)
    picked = node.body if switch else node.orelse
    return picked.id if isinstance(picked, ast.Name) else None


def _count(op: str, key: str, raw: Any, env: dict) -> Any:
    value = _evaluate(raw, env)
    minimum = 0 if key in ("padding", "metrics") else 1
    if isinstance(value, bool) or (isinstance(value, int) and value < minimum):
        raise SpecError(expected=f"an integer >= {minimum}", found=raw)
    return value


def _fill_derived(op: str, attrs: dict, shape: tuple) -> None:
    """Attention defaults that depend on the input: head_dim = width/heads, kv_heads = heads, out = width."""
    if op != "attention":
        return
    if len(shape) != 2:
        raise ShapeError("attention needs a [seq, width] input per sample", expected="rank 2", found=list(shape))
    seq, width = shape
    if attrs["head_dim"] is None:
        if isinstance(width, int) and isinstance(attrs["heads"], int) and width % attrs["heads"]:
            raise ShapeError(f"width {width} is not divisible by heads {attrs['heads']}",
                             expected="hidden divisible by heads", found=attrs["heads"])
        attrs["head_dim"] = width // attrs["heads"] if isinstance(width, int) else width / attrs["heads"]
    attrs["kv_heads"] = attrs["kv_heads"] or attrs["heads"]
    attrs["kv_seq"] = attrs["kv_seq"] or seq
    attrs["out"] = attrs["out"] or width


def require_numbers(model: Model) -> Model:
    """A model whose params are all known: `params: {h: null}` keeps shapes symbolic for `dlperf show`; a
    prediction (also `--symbolic`, whose view substitutes the numeric one for communication) needs each such
    param given with --set."""
    for name, value in model.params.items():
        if not isinstance(value, int):
            raise SpecError(f"params.{name} is symbolic; give --set {name}=...",
                            file=model.path)
    return model
