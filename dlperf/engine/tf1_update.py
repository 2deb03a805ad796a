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
