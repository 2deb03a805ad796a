"""The gradient allreduce as Horovod v0.18-v0.20 runs it (plan key dp_impl: horovod-0.19; dlperf/engine/horovod.py):
half a 5 ms negotiation cycle, one NCCL allreduce per 64 MiB fusion buffer, two copies through the buffer, the
compression casts and the averaging division."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dlperf import comm
from dlperf.engine import horovod
from dlperf.engine.step import StepModel
from dlperf.errors import DlperfError
from dlperf.plan import Plan, validate
from dlperf.validate import load_dataset
from tests.test_grad_passes import _hw, _model

MIB = 1024 * 1024


def _plan(**kw) -> Plan:
    """DeepLearningExamples' TF1 BERT on 4 nodes: AMP, fp32 accumulators sent as fp16, allreduce after accumulation."""
    base = dict(devices=32, dp=32, global_batch=65536, micro_batch=64, dtype="fp16", optimizer="adam",
                grad_dtype="fp32", compression="fp16", overlap=False)
    return Plan(**{**base, **kw})


def _allreduce(plan: Plan) -> float:
    return StepModel(_model(), _hw()).predict(plan).breakdown_s["comm/dp_allreduce"]


def test_default_is_nccl_and_one_gpu_pays_nothing():
    assert Plan().dp_impl == "nccl"
    one = _plan(devices=1, dp=1, global_batch=256)
    engine = StepModel(_model(), _hw())
    a, b = engine.predict(one), StepModel(_model(), _hw()).predict(one.with_(dp_impl="horovod-0.19"))
    assert a.step_time_s == b.step_time_s and b.breakdown_s.get("comm/dp_allreduce", 0.0) == 0.0


@pytest.mark.parametrize(("wire", "calls"), [(1, 1), (64 * MIB, 1), (64 * MIB + 1, 2), (672_448_116, 11)])
def test_one_nccl_allreduce_per_64_mib_fusion_buffer(wire, calls):
    # 672,448,116 B: BERT-Large's 336,224,058 gradients as fp16 fill ten buffers and part of an eleventh
    assert horovod.fused_calls(wire) == calls


def test_horovod_adds_the_cycle_the_buffers_the_copies_and_the_division_to_nccl_allreduce():
    hw, params = _hw(), float(_model().total_params)
    nccl, hvd = _allreduce(_plan()), _allreduce(_plan(dp_impl="horovod-0.19"))
    bw = hw.device.memory_bandwidth * hw.device.eff("memory").peak
    group = comm.Group(32, 1)
    wire = 2 * params  # Compression.fp16
    one_call = comm.collective_time("allreduce", wire, group, hw)
    eleven = 11 * comm.collective_time("allreduce", wire / 11, group, hw)
    copies = 4 * wire / bw                                 # into and out of the buffer, read and written
    average = 8 * params / bw + hw.device.launch_latency   # fp32 sum / size after the fp16 -> fp32 cast
    assert hvd - nccl == pytest.approx(2.5e-3 + (eleven - one_call) + copies + average, rel=1e-6)


def test_uncompressed_tf32_gradients_take_twice_the_buffers():
    plan = _plan(dtype="tf32", grad_dtype=None, compression="none", dp_impl="horovod-0.19")
    assert horovod.fused_calls(4 * _model().total_params) == 21
    assert _allreduce(plan) > _allreduce(_plan(dp_impl="horovod-0.19"))


def test_overlapped_horovod_exposes_at_least_its_last_buffer_and_cycle():
    # DistributedOptimizer without accumulation allreduces while backward runs (overlap true)
    plan = _plan(global_batch=2048, overlap=True, dp_impl="horovod-0.19")
    exposed = _allreduce(plan)
    hw = _hw()
    last = horovod.allreduce_time(comm, hw, comm.Group(32, 1), horovod.buffer_params(4, "fp16"), 4, "fp16")
    assert horovod.CYCLE_TIME / 2 < last <= exposed < _allreduce(plan.with_(overlap=False))


def test_multi_gpu_tf1_bert_rows_run_horovod_and_one_gpu_rows_do_not():
    rows = [r for r in load_dataset() if r.source == "dle-bert-tf1"]
    assert len(rows) == 21
    for row in rows:
        assert row.plan.dp_impl == ("horovod-0.19" if row.plan.devices > 1 else "nccl"), row.id


@pytest.mark.parametrize(("plan", "message"), [
    (Plan(devices=8, global_batch=8, dp_impl="horovod"), "expected one of nccl, horovod-0.19"),
    (Plan(devices=8, global_batch=8, zero=1, dp_impl="horovod-0.19"), "allreduces whole gradients"),
    (Plan(devices=8, global_batch=8, parameter_server=2, dp_impl="horovod-0.19"), "allreduces whole gradients"),
    (Plan(devices=8, global_batch=8, compression="int8", dp_impl="horovod-0.19"), "Compression.fp16"),
    (Plan(devices=8, global_batch=8, compression="fp16:256", dp_impl="horovod-0.19"), "Compression.fp16"),
    (Plan(devices=8, cp=2, global_batch=8, dp_impl="horovod-0.19"), "flat data-parallel group"),
])
def test_bad_plans_are_refused(plan, message):
    with pytest.raises(DlperfError, match=message) as err:
        validate(plan)
    assert "\n" not in str(err.value)


def test_a_bad_cli_choice_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "dlperf", "predict", "gpt2-xl", "dgx-a100", "--gpus", "8",
                           "--dp-impl", "horovod-0.21"], capture_output=True, text=True)
    assert proc.returncode == 2 and "'--dp-impl'" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
