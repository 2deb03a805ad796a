"""When the ZeRO-1/2 parameter all-gather hides: Megatron-Core's overlap_param_gather (zero_impl megatron) and
PyTorch FSDP's SHARD_GRAD_OP (zero 2, zero_impl fsdp); DeepSpeed's gather after the step (anything else, or no
overlap) stays exposed."""

import pytest

from dlperf.engine import predict
from dlperf.engine.step import MEGATRON_BUCKET_PARAMS, _megatron_param_gather, _zero3_per_micro
from dlperf.errors import PlanError
from dlperf.plan import Plan, validate
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model

LATENCY, BANDWIDTH = 1e-4, 1e10


class LinearComm:
    """A collective that costs a latency plus bytes over a bandwidth: enough to check the bookkeeping."""

    def collective_time(self, kind, nbytes, group, hw):
        return LATENCY + nbytes / BANDWIDTH


def gather(nbytes):
    return LinearComm().collective_time("allgather", nbytes, None, None)


def megatron(params, forward, stolen=0.1, **plan):
    plan = Plan(devices=64, dp=8, zero=1, zero_impl="megatron", **plan)
    return _megatron_param_gather(LinearComm(), None, plan, None, params, 2 * params, forward, stolen)


def test_one_bucket_is_exposed_whole():
    assert megatron(MEGATRON_BUCKET_PARAMS, forward=10.0) == pytest.approx(gather(2 * MEGATRON_BUCKET_PARAMS))


def test_later_buckets_hide_behind_the_first_forward_but_slow_it():
    params, stolen = 4 * MEGATRON_BUCKET_PARAMS, 0.1
    g = gather(2 * MEGATRON_BUCKET_PARAMS)
    assert megatron(params, forward=100.0, stolen=stolen) == pytest.approx(g + 3 * stolen * g)
    # a forward too short to hide them: the link is busy back to back, no more than the whole gather exposed
    assert megatron(params, forward=0.0, stolen=stolen) == pytest.approx(4 * g)


def test_without_interleaving_every_stage_waits_on_its_first_micro_batch_in_turn():
    params = 4 * MEGATRON_BUCKET_PARAMS
    one = megatron(params, forward=1.0)
    assert megatron(params, forward=1.0, pp=4, micro_batch=1, schedule="1f1b") == pytest.approx(4 * one)


def test_interleaved_exposes_the_first_chunk_only():
    params, stolen = 4 * MEGATRON_BUCKET_PARAMS, 0.1
    whole, chunk = gather(2 * params), gather(2 * params / 4)
    exposed = megatron(params, forward=1.0, stolen=stolen, pp=4, micro_batch=1, schedule="interleaved",
                       virtual_stages=4)
    assert exposed == pytest.approx(chunk + stolen * (whole - chunk))
    assert exposed < whole


def test_fsdp_shard_grad_op_gathers_per_block_in_the_forward_only():
    comm, weight, grad, blocks = LinearComm(), 1e9, 2e9, 8
    zero3, _ = _zero3_per_micro(comm, None, None, weight, grad, blocks, 1.0, 2.0, True)
    zero2, exposed = _zero3_per_micro(comm, None, None, weight, grad, blocks, 1.0, 2.0, True, 0.1,
                                      backward_gathers=False)
    assert zero3 - zero2 == pytest.approx(blocks * gather(weight / blocks))  # one gather per block less
    assert exposed < zero2


@pytest.fixture(scope="module")
def gpt():
    return load_model("gpt", {"layers": 24, "hidden": 4096, "heads": 32, "seq": 2048, "vocab": 50304})


@pytest.fixture(scope="module")
def h100():
    return load_hardware("dgx-h100")


def exposed_gather(model, hw, **plan):
    return predict(model, hw, Plan(**plan)).breakdown_s["comm/dp_allreduce"]


@pytest.mark.parametrize("layout", [{}, {"pp": 4, "micro_batch": 1, "schedule": "interleaved", "virtual_stages": 2}])
def test_megatrons_overlapped_gather_never_costs_more_than_the_exposed_one(gpt, h100, layout):
    plan = {"devices": 32, "dp": 32 // layout.get("pp", 1), "global_batch": 64, "zero": 1, "overlap": True} | layout
    deepspeed = exposed_gather(gpt, h100, **plan)
    assert exposed_gather(gpt, h100, **plan, zero_impl="megatron") < deepspeed


@pytest.mark.parametrize("layout", [{}, {"pp": 4, "micro_batch": 1, "schedule": "interleaved", "virtual_stages": 2}])
def test_without_overlap_megatron_gathers_after_the_step_as_today(gpt, h100, layout):
    plan = Plan(devices=32, dp=32 // layout.get("pp", 1), global_batch=64, zero=1, overlap=False, **layout)
    today = predict(gpt, h100, plan).step_time_s
    assert predict(gpt, h100, plan.with_(zero_impl="megatron")).step_time_s == today


def test_fsdp_zero2_overlapped_is_cheaper_than_gathering_after_the_step(gpt, h100):
    plan = {"devices": 32, "dp": 32, "global_batch": 64, "zero": 2}
    assert exposed_gather(gpt, h100, **plan, overlap=True) < exposed_gather(gpt, h100, **plan, overlap=False)


def test_zero_impl_megatron_is_zero_1():
    with pytest.raises(PlanError, match="zero_impl megatron"):
        validate(Plan(devices=8, dp=8, global_batch=8, zero=2, zero_impl="megatron"))
