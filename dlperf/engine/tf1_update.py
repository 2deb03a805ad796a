"""The host time of a TensorFlow 1 graph-mode optimizer branch run after Horovod (plan.optimizer_impl "tf1-graph").

NVIDIA DeepLearningExamples' TF1 BERT (TensorFlow/LanguageModeling/BERT @729963dd, optimization.py
create_optimizer, lines 149-157) applies the accumulated gradients inside the `update` branch of a tf.cond: per
trainable variable an hvd.allreduce, then LAMBOptimizer.apply_gradients' m and v updates, bias corrections, weight
decay, two l2 norms, the tf.where trust ratio and three assigns (lines 319-390); under AMP the loss-scale
optimizer adds a finite check per gradient and another cond. Every one of these is an op of TF's graph executor,
which the host dispatches one by one; XLA auto-clustering (use_xla, run_pretraining.py line 588) folds the
arithmetic into clusters but leaves the Switch nodes that carry each variable into the branch, the assigns of
reference variables (TF32 runs; AMP runs enable resource variables, line 591) and the cluster launches.

Why the host's time shows: HorovodAllreduceOp is an asynchronous kernel whose completion callback runs once the
NCCL allreduce has finished on the GPU (horovod/tensorflow/mpi_ops.cc and common/ops/gpu_operations.cc
FinalizeGPUQueue @v0.19.5: the finalizer waits on the GPU event, then calls each tensor's callback), so the ops
that consume the reduced gradients are dispatched only after the device has drained: the step lasts as long as
the host takes to issue the branch (or the device to run it, if longer). On one GPU there is no Horovod and the
host issues the branch while the device still runs the backward pass.

HOST_PER_VARIABLE: benchmarks/tf1_lamb_step.py imports that optimization.py itself and builds it for BERT-large's
398 variables on tiny tensors under TensorFlow 1.15.5 (the pip build of the 20.06 container's 1.15.2, whose
NVIDIA patches to the clustering pass are opt-in), with a Horovod stand-in of v0.19.5's ops and XLA auto-clustering
as run_pretraining.py sets it. XLA compiles all of LAMB's math for all variables into one cluster; what is left to
the executor is that cluster's launch, the allreduce ops, the fp16 casts (AMP) or the ref-variable Assigns (TF32).
It printed, per update run over an accumulation run, on the 2-vCPU Intel Xeon VM of spec/hardware.py's Xeon
measurement: fp16 +12.25 ms, tf32 +11.90 ms in its quiet runs (+23.43 / +28.81 ms when the VM was loaded; load
only adds time, so the quiet figures are used). Per variable, at the reference host (x 0.966, that VM's quiet
single-thread speed over HOST_REFERENCE, spec/hardware.py). A GPU host also launches the compiled cluster's
kernels, which a CPU run cannot show: a lower bound. (A TensorFlow 2.21 stand-in in v1 graph mode printed 29.22 /
36.06 ms for the same branch; TF 2's executor is not the one that ran, so that figure is not used.)

ASSIGN_COPY_BYTES: in TF32 runs the variables are reference variables (run_pretraining.py enables resource
variables under AMP only), whose Assigns XLA does not cluster: benchmarks/tf1_lamb_step.py --xla counts 1194 Assign
ops outside the cluster (3 per variable: the parameter, adam_m, adam_v), and TensorFlow's AssignOp copies the new
value into the variable's existing buffer (tensorflow/core/kernels/assign_op.h @v1.15.2+nv20.06, lines 84-99 and
132-133): per parameter 3 fp32 copies, each a read and a write, 24 bytes of device traffic per step beyond the
cluster's own (under AMP the resource variables' assigns are inside the cluster, nothing extra).

ACCUMULATE_SYNC_HOST: with AMP the accumulation runs sync in the middle as well. optimization.py (lines 130 and
138-143) makes all_are_finite, a reduce_all over every gradient computed on the GPU, the predicate of the tf.cond
that picks clip_by_global_norm's norm, and a GPU Switch takes its predicate in host memory (NVIDIA/tensorflow
@91fc0fc3 tensorflow/core/kernels/control_flow_ops.cc:77-82, REGISTER_GPU_SWITCH ... HostMemory("pred")): the
executor dispatches the global norm, the clip of every gradient and the accumulators' assign cond (lines 145-147)
only once the whole backward pass has run and the flag has reached the host. From there the micro-batch lasts as
long as the host takes to issue that tail or the device to run it, whichever is longer (the global-norm and clip
passes and the accumulate of dlperf.engine.grad_passes and the step's gradient accumulation). Without AMP
all_are_finite is tf.constant(True), so no sync. benchmarks/tf1_accumulate_sync.py measures the tail on the same
tiny-tensor build of that optimization.py, as an accumulation run's host time minus that of a run of everything
that does not wait for all_are_finite: 1,198 Switch, 402 Merge, 401 assign ops and the XLA clusters' launches after
the sync. Its longest measurement (240 runs of each) printed 10.17 ms between the quickest runs (12.88 - 2.71 ms;
medians 19.39 - 4.59 with the VM loaded, load only adding time), 5.0 us per op, as the update branch's quiet 12.25
ms for 2,410 ops (5.1 us); shorter ones gave 11.34 and 12.51 ms, so the lowest is used. A lower bound, for the
reason HOST_PER_VARIABLE is one.
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx
from dlperf.engine.optimizer_loop import parameter_tensors
from dlperf.plan import Plan
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

VARIABLES_MEASURED = 398  # BERT-large's trainable variables, benchmarks/tf1_lamb_step.py bert_large_variables()
ASSIGN_COPY_BYTES = {"fp16": 0, "tf32": 3 * 2 * 4}  # per parameter per step (docstring)
XEON_VM_SPEED = 0.966     # spec/hardware.py: the Xeon VM's single-thread speed over HOST_REFERENCE
HOST_PER_VARIABLE = {     # host seconds per variable at the reference host, benchmarks/tf1_lamb_step.py --xla
    "fp16": 12.25e-3 / VARIABLES_MEASURED * XEON_VM_SPEED,
    "tf32": 11.90e-3 / VARIABLES_MEASURED * XEON_VM_SPEED,
}


ACCUMULATE_SYNC_HOST = 10.17e-3  # s per accumulation run after all_are_finite, 398 variables, Xeon VM (docstring)
POST_SYNC_PASSES = ("global-norm", "clip")  # dlperf.engine.grad_passes run in that tail (optimization.py:138-147)


def accumulation_sync_host(model: Model, hw: Hardware, plan: Plan) -> float:
    """Host seconds per micro-batch to issue what an AMP accumulation run dispatches after its sync on
    all_are_finite (ACCUMULATE_SYNC_HOST per variable, at this host's speed): 0 for another optimizer_impl or
    without the finite check (plan grad_passes), whose flag is then a constant."""
    if plan.optimizer_impl != "tf1-graph" or "finite-check" not in plan.grad_passes:
        return 0.0
    per_variable = ACCUMULATE_SYNC_HOST / VARIABLES_MEASURED * XEON_VM_SPEED
    return parameter_tensors(model) * per_variable / hw.device.host_speed


def _kind(dtype: str) -> str:
    """Which measurement a dtype takes: AMP's (fp16, resource variables) or TF32's (reference variables)."""
    return "fp16" if dtype == "fp16" else "tf32"


def branch_host_time(model: Model, hw: Hardware, plan: Plan, dtype: str) -> float:
    """Host seconds to issue the TF1 update branch after Horovod's allreduce (0 where nothing makes it show:
    another optimizer_impl, or no Horovod, whose completion is the host-side sync)."""
    if plan.optimizer_impl != "tf1-graph" or not plan.dp_impl.startswith("horovod"):
        return 0.0
    per_variable = HOST_PER_VARIABLE[_kind(dtype)]
    return parameter_tensors(model) * per_variable / hw.device.host_speed


def update_step_time(model: Model, hw: Hardware, plan: Plan, dtype: str, params: Any, update: Any) -> Any:
    """The optimizer step of a tf1-graph plan: the device's `update` plus the reference variables' Assign copies
    (ASSIGN_COPY_BYTES over this device's `params`), or the host's issuing time after Horovod (branch_host_time),
    whichever is longer; any other optimizer_impl: `update` as it is."""
    if plan.optimizer_impl != "tf1-graph":
        return update
    copies = ASSIGN_COPY_BYTES[_kind(dtype)] * params / hw.device.achieved_memory_bandwidth()
    return mathx.maximum(update + copies, branch_host_time(model, hw, plan, dtype))
