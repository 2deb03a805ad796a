"""Model states per device by who holds them, pinned by hand count, and the memory's monotonicity in what a plan keeps.

Per parameter of a Llama with Adam (dlperf.engine.memory):
- PyTorch FSDP's ZeRO-3 (zero_impl fsdp): the fp32 flat-parameter shard is the master copy and its gradient is
  fp32: 0 + 4 + 12 bytes over dp, whatever dtype the gradient is reduced in;
- Megatron-Core's FSDP (zero_impl megatron-fsdp): a bf16 model-weight shard beside the fp32 main weights, the
  gradient in the plan's grad dtype: 2 + grad + 12 over dp; with fp8_param_gather the weight shard of an FP8
  layer is its FP8 data (1 byte; MXFP8 adds a transpose buffer: 2 x (1 + 1/32));
- an FP8 recipe caches FP8 copies of the FP8 layers' weights only: the embedding, final norm and output head
  stay bf16 (dlperf.ops.fp8.fp8_layers).
"""

from __future__ import annotations

import pytest

from dlperf.engine.step import StepModel
from dlperf.ops.fp8 import OPERAND_BYTES
from dlperf.plan import Plan
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

VOCAB, HIDDEN = 128256, 4096
OUTSIDE = 2 * VOCAB * HIDDEN + HIDDEN  # llama3-8b's embedding, output head and final RMSNorm: not FP8 layers
STATES = ("weights", "gradients", "optimizer", "fp8_weights")


@pytest.fixture(scope="module")
def llama():
    return load_model("llama3-8b", {"layers": 2, "seq": 1024})


def _memory(model, hw_name: str, plan: Plan) -> dict:
    return StepModel(model, load_hardware(hw_name)).predict(plan).memory


def test_torch_fsdp_holds_16_bytes_per_parameter_over_dp(llama):
    params, dp = llama.total_params, 8
    for grad_dtype in (None, "fp32"):
        plan = Plan(devices=dp, global_batch=dp, zero=3, dtype="bf16", grad_dtype=grad_dtype)
        memory = _memory(llama, "dgx-h100", plan)
        assert memory["weights"] == 0
        assert memory["gradients"] == pytest.approx(4 * params / dp)
        assert memory["optimizer"] == pytest.approx(12 * params / dp)


def test_megatron_fsdp_keeps_a_16_bit_weight_shard_beside_the_main_weights(llama):
    params, dp = llama.total_params, 8
    plan = Plan(devices=dp, global_batch=dp, zero=3, zero_impl="megatron-fsdp", dtype="bf16")
    memory = _memory(llama, "dgx-h100", plan)
    assert memory["weights"] == pytest.approx(2 * params / dp)
    assert memory["gradients"] == pytest.approx(2 * params / dp)
    assert memory["optimizer"] == pytest.approx(12 * params / dp)
    fp32_grads = _memory(llama, "dgx-h100", plan.with_(grad_dtype="fp32"))
    assert fp32_grads["gradients"] == pytest.approx(4 * params / dp)


@pytest.mark.parametrize(("recipe", "shard_bytes"), [("fp8", 1.0), ("mxfp8", 2 * (1 + 1 / 32))])
def test_megatron_fsdp_fp8_param_gather_shards_the_fp8_data(llama, recipe, shard_bytes):
    """Per-tensor FP8 keeps no transpose buffer in Megatron-FSDP (only MXFP8 does): 1 byte per FP8-layer
    parameter over dp; the embedding, final norm and head keep a bf16 shard."""
    params, dp = llama.total_params, 8
    plan = Plan(devices=dp, global_batch=dp, zero=3, zero_impl="megatron-fsdp", dtype=recipe,
                fp8_param_gather=True)
    memory = _memory(llama, "dgx-b200", plan)
    assert memory["weights"] == pytest.approx(2 * OUTSIDE / dp)
    assert memory["fp8_weights"] == pytest.approx(shard_bytes * (params - OUTSIDE) / dp)
    assert OPERAND_BYTES[recipe] * (2 if recipe == "mxfp8" else 1) == pytest.approx(shard_bytes)


@pytest.mark.parametrize("recipe", ["fp8", "mxfp8", "nvfp4"])
def test_fp8_copies_are_held_for_the_fp8_layers_of_each_stage(recipe):
    """Four stages of a 4-layer Llama: the first holds the embedding, the last the final norm and head, neither
    of which has an FP8 copy; the fullest stage (by parameters) holds one layer's FP8 copies only."""
    model = load_model("llama3-8b", {"layers": 4, "seq": 1024})
    layer = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * 1024 + 3 * HIDDEN * 14336 + 2 * HIDDEN  # attention, SwiGLU, 2 norms
    plan = Plan(devices=4, pp=4, global_batch=4, dtype=recipe)
    memory = _memory(model, "dgx-b200", plan)
    assert memory["fp8_weights"] == pytest.approx(2 * OPERAND_BYTES[recipe] * layer)
    assert memory["weights"] == pytest.approx(2 * (layer + VOCAB * HIDDEN + HIDDEN))


# Plans that keep more: more micro-batches in flight, less recomputation, a bigger micro-batch. Each pair is
# (keeps less, keeps more) on the same model and hardware.
BASE = Plan(devices=8, pp=4, dp=2, global_batch=16, micro_batch=1)
MORE = [
    (BASE.with_(global_batch=4), BASE),                                        # 2 micro-batches < pp: 2 in flight
    (BASE, BASE.with_(schedule="interleaved", virtual_stages=2)),             # pp + (pp-1)/v in flight
    (BASE.with_(recompute="full"), BASE.with_(recompute="selective")),
    (BASE.with_(recompute="selective"), BASE),
    (BASE.with_(recompute_modules=("layernorm",)), BASE),
    (BASE, BASE.with_(micro_batch=2, global_batch=32)),
]


@pytest.mark.parametrize(("dtype", "hw_name", "zero", "zero_impl"), [
    ("bf16", "dgx-h100", 1, "fsdp"),
    ("fp8", "dgx-h100", 1, "fsdp"),
    ("mxfp8", "dgx-b200", 1, "fsdp"),
    ("nvfp4", "dgx-gb300", 1, "fsdp"),
    ("bf16", "dgx-h100", 3, "fsdp"),
    ("fp8", "gb200-nvl72", 3, "megatron-fsdp"),
])
@pytest.mark.parametrize(("less", "more"), MORE)
def test_memory_never_decreases_when_a_plan_keeps_more(dtype, hw_name, zero, zero_impl, less, more):
    model = load_model("llama3-8b", {"layers": 4, "seq": 1024})
    step = StepModel(model, load_hardware(hw_name))

    def total(plan: Plan) -> float:
        return float(step.predict(plan.with_(dtype=dtype, zero=zero, zero_impl=zero_impl)).memory["total"])

    assert total(less) <= total(more)


@pytest.mark.parametrize("zero", [1, 3])
def test_offloading_fewer_layers_keeps_more(zero):
    """Activation offloading to the host (Megatron-Bridge's Llama 3 70B GB200 plans, Megatron FSDP): fewer layers
    offloaded, more memory on the device."""
    model = load_model("llama3-8b", {"layers": 4, "seq": 1024})
    step = StepModel(model, load_hardware("gb200-nvl72"))
    plan = Plan(devices=8, dp=8, global_batch=16, micro_batch=2, zero=zero, dtype="fp8", fp8_param_gather=True,
                zero_impl="megatron-fsdp" if zero == 3 else "fsdp")
    totals = [float(step.predict(plan.with_(offload_layers=n)).memory["total"]) for n in (3, 2, 1, 0)]
    assert totals == sorted(totals)


def test_the_fullest_device_is_the_stage_with_the_most_state_bytes(llama):
    """Per parameter an FP8 layer holds 16 + 2 bytes (its FP8 copy and transpose) and the embedding 16: a stage
    of 95 FP8-layer parameters outweighs one of 100 embedding parameters, though it has fewer parameters."""
    from dlperf.engine.memory import per_device
    from dlperf.engine.stage import StageCost

    plan = Plan(devices=1, global_batch=1, dtype="fp8")
    embedding, blocks = StageCost(params=100), StageCost(params=95, fp8_params=95)
    for stages in ([embedding, blocks], [blocks, embedding]):
        memory = per_device(llama, load_hardware("dgx-h100"), plan, stages, "fp8", 1)
        assert sum(memory[k] for k in STATES) == pytest.approx(18 * 95)
