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

HOST_PER_VARIABLE: benchmarks/tf1_lamb_host.py builds that branch for BERT-large's 398 variables on one-element
CPU tensors (TensorFlow 2.21 CPU build in TF1 graph mode with v1 control flow, standing in for the 20.06
container's TF 1.15 on a GPU: same executor and auto-clustering pass design, not the same build; the CPU device
runs the clusters' arithmetic on the host where the GPU would launch kernels) with XLA auto-clustering on, and
printed, on the 2-vCPU Intel Xeon VM of spec/hardware.py's Xeon measurement (one run each, shared machine):
  fp16 (resource variables, finite check): update branch 2000 executor ops, 29.22 ms
  tf32 (reference variables):              update branch 2390 executor ops, 36.06 ms
(without XLA: tf32 11856 ops, 53.35 ms, 4.50 us per op). Per variable, at the reference host (x 0.966, that VM's
quiet single-thread speed over HOST_REFERENCE, spec/hardware.py); a shared VM only adds time, so these may be high.
"""

from __future__ import annotations

from dlperf.engine.optimizer_loop import parameter_tensors
from dlperf.plan import Plan
from dlperf.spec.hardware import Hardware
from dlperf.spec.model import Model

VARIABLES_MEASURED = 398  # BERT-large's trainable variables, benchmarks/tf1_lamb_host.py variable_names()
XEON_VM_SPEED = 0.966     # spec/hardware.py: the Xeon VM's single-thread speed over HOST_REFERENCE
HOST_PER_VARIABLE = {     # host seconds per variable at the reference host, benchmarks/tf1_lamb_host.py with XLA
    "fp16": 29.22e-3 / VARIABLES_MEASURED * XEON_VM_SPEED,
    "tf32": 36.06e-3 / VARIABLES_MEASURED * XEON_VM_SPEED,
}


def branch_host_time(model: Model, hw: Hardware, plan: Plan, dtype: str) -> float:
    """Host seconds to issue the TF1 update branch after Horovod's allreduce (0 where nothing makes it show:
    another optimizer_impl, or no Horovod, whose completion is the host-side sync)."""
    if plan.optimizer_impl != "tf1-graph" or not plan.dp_impl.startswith("horovod"):
        return 0.0
    per_variable = HOST_PER_VARIABLE["fp16" if dtype == "fp16" else "tf32"]
    return parameter_tensors(model) * per_variable / hw.device.host_speed
