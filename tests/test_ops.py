"""Exact FLOP counts per operator (a multiply-add is 2 FLOPs) against hand-derived and published totals."""

import pytest

from dlperf.engine.layers import layer_table
from dlperf.engine.symbolic import B
from dlperf.engine.work import model_cost
from dlperf.ops import OPS
from dlperf.ops.base import Layer
from dlperf.ops.conv import algorithm_kernel
from dlperf.spec.model import load_model


def _layer(op, in_shape, **attrs):
    rule = OPS[op]
    full = {k: v for k, v in rule.attrs.items()}
    full.update(attrs)
    out = rule.shape(in_shape, full)
    return Layer(op, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in full.items())),
                 in_shape, out, op, rule.params(in_shape, full))


def test_linear_counts():
    layer = _layer("linear", (10, 64), out=32, bias=False)
    (k,) = OPS["linear"].kernels(layer, 4, 4)
    assert k.cost.fwd_flops == 2 * 40 * 64 * 32
    assert k.cost.bwd_data_flops == k.cost.bwd_weight_flops == 2 * 40 * 64 * 32


def test_linear_bias_gradient_is_its_own_memory_bound_reduction():
    m, k, n, e = 40, 64, 32, 4
    gemm, bias = OPS["linear"].kernels(_layer("linear", (10, k), out=n, bias=True), 4, e)
    assert gemm.cost.fwd_flops == 2 * m * k * n + m * n          # the bias add rides in the GEMM's epilogue
    assert gemm.cost.bwd_weight_flops == 2 * m * k * n
    assert (bias.cls, bias.cost.fwd_flops, bias.cost.fwd_bytes) == ("memory", 0, 0)
    assert bias.cost.bwd_weight_flops == m * n and bias.cost.bwd_bytes == e * (m * n + n)
    assert (bias.launches, bias.backward_launches) == (0, 1)
    assert gemm.cost.work + bias.cost.work == 6 * m * k * n + 2 * m * n  # the total is what it was


def test_residual_add_sums_the_forks_gradients_in_backward():
    (add,) = OPS["add"].kernels(_layer("add", (10, 64)), 4, 2)
    n = 4 * 10 * 64
    assert add.cost.fwd_bytes == add.cost.bwd_bytes == 3 * 2 * n and add.backward_launches == 1


def _loss(impl, e, rows=16, classes=100, batch=4):
    kernels = OPS["cross_entropy"].kernels(_layer("cross_entropy", (rows, classes), impl=impl), batch, e)
    fwd = sum(k.cost.fwd_bytes for k in kernels)
    bwd = sum(k.cost.bwd_bytes for k in kernels)
    launches = tuple(sum(k.phase_launches[i] for k in kernels) for i in (0, 1))
    return kernels, fwd, bwd, launches


def test_fused_cross_entropy_is_two_passes_each_way_in_the_model_dtype():
    n, e = 4 * 16 * 100, 2
    _, fwd, bwd, launches = _loss("fused", e)
    assert (fwd, bwd, launches) == (2 * e * n, 2 * e * n, (1, 1))


def test_torch_cross_entropy_upcasts_then_makes_four_backward_passes_in_three_kernels():
    n = 4 * 16 * 100
    # fp32 model: log_softmax (read, write) + nll_loss; backward fill, scatter, log_softmax backward (3 passes)
    assert _loss("torch", 4)[1:] == (2 * 4 * n, 4 * 4 * n, (2, 3))
    # bf16 model: autocast's fp32 copy (read 2, write 4) first, and its cast back (read 4, write 2) last
    assert _loss("torch", 2)[1:] == ((2 + 4) * n + 2 * 4 * n, 4 * 4 * n + (4 + 2) * n, (3, 4))


def test_megatron_cross_entropy_matches_a_hand_count_of_its_kernels():
    """megatron/mpu/cross_entropy.py, per fp32 logit: max reads 4 B; sub_, exp(out=) and div_ read and write 8 B
    each; sum reads 4 B; backward mul_ reads and writes 8 B. Per token (int64 targets, fp32 row values) 12 small
    forward kernels and 6 backward ones, which the vocabulary split does not shrink."""
    rows, n = 4 * 16, 4 * 16 * 100
    logit_fwd = 4 + 8 + 8 + 4 + 8
    kernels, fwd, bwd, launches = _loss("megatron", 2)
    assert fwd == (2 + 4) * n + logit_fwd * n + 139 * rows     # upcast, then the five passes
    assert bwd == (4 + 2) * n + 8 * n + 81 * rows               # cast back, mul_
    assert launches == (1 + 5 + 12, 1 + 1 + 6)
    assert sum(k.cost.fwd_flops for k in kernels) == 5 * n      # max, subtract, exp, sum, divide
    assert sum(k.bwd_flops for k in kernels) == n               # multiply by the incoming gradient
    assert [k.name for k in kernels if not k.split] == ["target_gather"]
    assert _loss("megatron", 4)[3] == (5 + 12, 1 + 6)           # an fp32 model has no cast


def test_te_cross_entropy_matches_a_hand_count_of_its_triton_kernels():
    """transformer_engine/pytorch/triton/cross_entropy.py @70f53666, per bf16 logit: online_softmax_kernel reads
    2 B, cross_entropy_kernel reads 2 B and writes the gradient in place (2 B); backward element_mul_kernel reads
    and writes it (4 B). No fp32 copy, whatever the model dtype. Per token, torch.zeros fills loss_1d (4 B) and
    m_d_X_y (12 B): two small kernels the vocabulary split does not shrink."""
    rows, n = 4 * 16, 4 * 16 * 100
    kernels, fwd, bwd, launches = _loss("te", 2)
    assert fwd == (2 + 2 + 2) * n + (4 + 12) * rows
    assert bwd == (2 + 2) * n
    assert launches == (2 + 2, 1)
    assert sum(k.cost.fwd_flops for k in kernels) == 7 * n      # max, sub, exp, add; sub, exp, divide
    assert sum(k.bwd_flops for k in kernels) == n               # multiply by the incoming gradient
    assert [k.name for k in kernels if not k.split] == ["loss_buffers_zero"]
    assert _loss("te", 4)[1:3] == (3 * 4 * n + 16 * rows, 2 * 4 * n)  # fp32 logits: the same passes, 4 B each
    assert OPS["cross_entropy"].saved(_layer("cross_entropy", (16, 100), impl="te"), 2) == 2 * 16 * 100

def test_unfused_losses_save_the_fp32_softmax():
    layer = _layer("cross_entropy", (16, 100), impl="megatron")
    assert OPS["cross_entropy"].saved(layer, 2) == 4 * 16 * 100
    assert OPS["cross_entropy"].saved(_layer("cross_entropy", (16, 100), impl="fused"), 2) == 2 * 16 * 100


def test_conv_direct_equals_im2col_and_matches_formula():
    layer = _layer("conv2d", (64, 56, 56), out=128, kernel=3, padding=1, bias=False)
    direct = algorithm_kernel(layer, "direct", 8, 2)
    im2col = algorithm_kernel(layer, "im2col", 8, 2)
    assert direct.cost.fwd_flops == im2col.cost.fwd_flops == 2 * 8 * 128 * 56 * 56 * 64 * 9
    assert im2col.cost.fwd_bytes > direct.cost.fwd_bytes  # the im2col buffer is written and read


def test_winograd_f23_multiplies_225x_fewer():
    from dlperf.ops.conv import _geometry, winograd_kernel

    layer = _layer("conv2d", (64, 56, 56), out=64, kernel=3, padding=1, bias=False)
    g = _geometry(layer)
    wino = winograd_kernel(g, 1, 4, m=2)
    alpha = 4
    tiles = 28 * 28
    multiplies = 64 * 64 * tiles * alpha**2
    direct_multiplies = 64 * 56 * 56 * 64 * 9
    assert direct_multiplies / multiplies == pytest.approx(2.25)
    assert wino.cost.fwd_flops > 2 * multiplies  # transforms come on top


def test_grouped_conv_divides_by_groups():
    dense = _layer("conv2d", (32, 8, 8), out=32, kernel=3, padding=1, bias=False)
    depthwise = _layer("conv2d", (32, 8, 8), out=32, kernel=3, padding=1, groups=32, bias=False)
    kd = OPS["conv2d"].kernels(dense, 1, 4)[0]
    kw = OPS["conv2d"].kernels(depthwise, 1, 4)[0]
    assert kd.cost.fwd_flops == 32 * kw.cost.fwd_flops
    assert depthwise.params == 32 * 9


def test_attention_flash_changes_bytes_not_flops():
    plain = _layer("attention", (128, 256), heads=4, head_dim=64, kv_heads=4, kv_seq=128, out=256)
    flash = _layer("attention", (128, 256), heads=4, head_dim=64, kv_heads=4, kv_seq=128, out=256, flash=True)
    def total(layer, field):
        return sum(getattr(k.cost, field) for k in OPS["attention"].kernels(layer, 2, 2))
    assert total(plain, "fwd_flops") == total(flash, "fwd_flops")
    assert total(flash, "fwd_bytes") < total(plain, "fwd_bytes")


def test_grouped_query_attention_has_fewer_kv_params():
    mha = _layer("attention", (16, 512), heads=8, head_dim=64, kv_heads=8, kv_seq=16, out=512, bias=False)
    gqa = _layer("attention", (16, 512), heads=8, head_dim=64, kv_heads=2, kv_seq=16, out=512, bias=False)
    assert mha.params - gqa.params == 2 * 512 * 6 * 64


def test_resnet50_forward_is_about_4_1_gmacs():
    # He et al. 2016 Table 1: 3.8e9 FLOPs (multiply-adds) for v1; torchvision v1.5 is 4.1 GMACs
    _, totals = layer_table(load_model("resnet50"), "fp32")
    assert totals["forward_flops"] / 2 == pytest.approx(4.1e9, rel=0.03)


def test_gpt_flops_per_token_match_palm_formula():
    # PaLM (Chowdhery et al. 2022) Appendix B: training FLOPs per token = 6N + 12*L*h*s (attention counted fully).
    L, h, s, V = 24, 2048, 1024, 50257
    model = load_model("gpt", {"layers": L, "hidden": h, "heads": 16, "seq": s, "vocab": V})
    cost = model_cost(model, 1, "fp16")
    n = 12 * L * h * h + V * h  # non-embedding weights plus the (tied) output projection
    expected = 6 * n + 12 * L * h * s
    assert cost.work / s == pytest.approx(expected, rel=0.02)


def test_depth_at_most_work_and_parallelism_grows_with_batch():
    model = load_model("resnet50")
    small, large = model_cost(model, 1, "fp32"), model_cost(model, 64, "fp32")
    assert small.total_depth <= small.work
    assert large.work / large.total_depth > small.work / small.total_depth
    symbolic = model_cost(model, B, "fp32")
    assert symbolic.work.subs(B, 64) == pytest.approx(large.work)


def test_lenet_depth_and_work_are_reported():
    cost = model_cost(load_model("lenet5"), 1, "fp32")
    assert 0 < cost.total_depth < cost.work


def test_show_survey_columns_match_table_4():
    from dlperf.engine.layers import layer_table

    rows, _ = layer_table(load_model("lenet5"), "fp32", survey=True)
    c1 = rows[0]
    # Table 4/6 direct convolution: W = N*C_out*H'*W'*C_in*Ky*Kx (multiply-adds), D = log C_in + log Ky + log Kx
    assert c1["survey_work"] == 6 * 28 * 28 * 1 * 5 * 5
    assert c1["survey_depth"] == 0 + 3 + 3
    assert c1["forward_flops"] == 2 * c1["survey_work"] + 6 * 28 * 28  # exact count adds the bias


@pytest.mark.parametrize(("name", "params"), [
    ("gpt", {"layers": 2, "hidden": 256, "heads": 4, "seq": 128, "vocab": 1000}),
    ("mpt", {"layers": 2, "hidden": 256, "heads": 4, "seq": 128}),  # host syncs of its unpad kernel
])
def test_elasticities_are_the_derivatives_of_the_closed_form(name, params):
    import sympy

    from dlperf.engine.symbolic import F32, LAM, F, M, elasticities, step_time_expr
    from dlperf.spec.hardware import load_hardware

    model = load_model(name, params)
    hw = load_hardware("dgx-a100")
    numeric = elasticities(model, hw, "fp16", 4)
    expr = step_time_expr(model, hw, "fp16", choose_at=4)  # GEMM quantization is taken at the plan's batch
    values = {B: 4, F: hw.device.peak("fp16"), F32: hw.device.peak("fp32"), M: hw.device.memory_bandwidth,
              LAM: hw.device.launch_latency}
    t = float(expr.subs(values))
    assert numeric["T_value"] == pytest.approx(t, rel=1e-5)  # the closed form prints constants to 4 digits
    for symbol, label in ((F, "peak FLOP/s (F)"), (M, "memory bandwidth (M)"), (LAM, "launch latency (lam)")):
        h = 1e-6  # central difference of the sympy expression in ln X
        up = float(expr.subs({**values, symbol: values[symbol] * (1 + h)}))
        down = float(expr.subs({**values, symbol: values[symbol] * (1 - h)}))
        assert numeric[label] == pytest.approx((up - down) / (2 * h * t), abs=1e-4)
    assert isinstance(expr, sympy.Expr)


def test_closed_form_equals_numeric_single_device_compute():
    """The sympy step-time expression at B = b equals the engine's forward+backward compute at micro-batch b."""
    from dlperf.engine import predict
    from dlperf.engine.symbolic import F32, LAM, F, M, step_time_expr
    from dlperf.plan import Plan
    from dlperf.spec.hardware import load_hardware

    model, hw = load_model("resnet50"), load_hardware("dgx1-v100")
    expr = step_time_expr(model, hw, "fp32", choose_at=16)
    values = {B: 16, F: hw.device.peak("fp32"), F32: hw.device.peak("fp32"), M: hw.device.memory_bandwidth,
              LAM: hw.device.launch_latency}
    breakdown = predict(model, hw, Plan(global_batch=16, dtype="fp32")).breakdown_s
    compute = breakdown["compute/forward"] + breakdown["compute/backward"]
    assert float(expr.subs(values)) == pytest.approx(compute, rel=1e-5)


def test_gather_copies_its_rows_forward_and_scatters_into_a_zeroed_gradient_backward():
    # torch.index_select: forward reads and writes the kept rows (plus int64 indices); backward zero-fills the
    # whole input gradient, then index_add_ reads and writes the kept rows' gradients.
    batch, seq, rows, d, e = 4, 128, 20, 64, 2
    layer = _layer("gather", (seq, d), rows=rows)
    assert layer.out_shape == (rows, d)
    (k,) = OPS["gather"].kernels(layer, batch, e)
    assert k.cost.fwd_bytes == 2 * e * batch * rows * d + 8 * batch * rows
    assert k.cost.bwd_bytes == e * batch * (seq * d + 2 * rows * d)
    assert k.phase_launches == (1, 2) and k.cost.work == 0
    assert OPS["gather"].saved(layer, e) == 8 * rows  # only the indices; the input is not needed backward


@pytest.mark.parametrize("seq,masked", [(128, 20), (512, 77)])
def test_bert_mlm_head_runs_on_the_masked_positions_only(seq, masked):
    # DeepLearningExamples' BERT selects the masked tokens before the MLM head (dense_sequence_output):
    # ceil(15% of seq) rows per sample (Devlin et al. 2019 Sec. 3.1); 20 at seq 128 = its max_predictions_per_seq.
    layers = {layer.name: layer for layer, _ in load_model("bert-large", {"seq": seq}).layers()}
    assert layers["mlm_positions"].in_shape == (seq, 1024) and layers["mlm_decoder"].in_shape == (masked, 1024)
    dense = {layer.name: layer for layer, _ in load_model("bert-large", {"seq": seq, "mlm_positions": seq}).layers()}
    flops = [sum(k.cost.fwd_flops for k in OPS["linear"].kernels(m["mlm_decoder"], 1, 2)) for m in (layers, dense)]
    assert flops[1] == pytest.approx(flops[0] * seq / masked)


def test_gather_of_more_rows_than_the_sequence_is_one_line_exit_2(run):
    code, out, err = run("predict", "bert-large", "dgx-a100", "--set", "mlm_positions=200")
    assert code == 2 and "rows <= 128" in err and "found 200" in err and len(err.strip().splitlines()) == 1


def test_a_fused_swiglu_unit_moves_its_bytes_once() -> None:
    """Megatron-Core's bias_swiglu_impl is one kernel (fused_bias_swiglu.py @2d1fa8d3): forward reads [gate; up]
    and writes the product (3 tensors of the product's size), backward reads both halves and the gradient and
    writes both halves' gradients (5). With fused_glu the silu layer adds FLOPs only; the multiply merge carries
    the traffic and the one launch per pass. Unfused (Hugging Face, torchtitan) silu and multiply are two kernels."""
    from dlperf.ops import OPS
    from dlperf.spec.model import load_model

    for fused in (True, False):
        model = load_model("llama2-7b", {"fused_swiglu": fused, "seq": 128})
        layers = {layer.op: layer for layer, _ in model.counted() if layer.op in ("silu", "multiply")}
        n = 128 * 11008
        kernels = [k for op in ("silu", "multiply") for k in OPS[op].kernels(layers[op], 1, 2)]
        fwd_bytes = sum(k.cost.fwd_bytes for k in kernels)
        bwd_bytes = sum(k.cost.bwd_bytes for k in kernels)
        launches = sum(k.phase_launches[0] for k in kernels)
        flops = sum(k.cost.fwd_flops for k in kernels)
        assert (fwd_bytes, bwd_bytes, launches) == ((3 * 2 * n, 5 * 2 * n, 1) if fused else (5 * 2 * n, 8 * 2 * n, 2))
        assert flops == 5 * n  # silu's 4 per element and the product's 1, fused or not


def test_moe_swiglu_backward_writes_both_halves() -> None:
    """The experts' SwiGLU backward reads gate, up and the output gradient and writes both halves' gradients,
    torch.cat((dy_1, dy_2)) (swiglu_back, fused_bias_swiglu.py @2d1fa8d3): 5 tensors of [rows, f], forward 3."""
    from dlperf.ops.moe import _ffn_kernels

    rows, d, f = 4096, 2048, 768
    (swiglu,) = [k for k in _ffn_kernels("expert", rows, d, f, True, 2, True, 4) if k.name == "expert_swiglu"]
    assert (swiglu.cost.fwd_bytes, swiglu.cost.bwd_bytes) == (3 * 2 * rows * f, 5 * 2 * rows * f)
