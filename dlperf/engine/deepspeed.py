"""DeepSpeed's fp16 optimizer wrapper without ZeRO (plan.optimizer_impl "deepspeed-fp16"), as Megatron-DeepSpeed runs
fp16 through DeepSpeed's engine (its gradient all-reduce is dlperf.engine.post_backward's). Read from
microsoft/DeepSpeed @38327e07 (deepspeed/runtime/fp16/fused_optimizer.py FP16_Optimizer.step, deepspeed/runtime/
utils.py CheckOverflow); step() runs the same passes at @023f3614.

FP16_Optimizer wraps a fused Adam when fp16 is enabled without ZeRO; the update itself is the wrapped optimizer's,
priced by dlperf.engine.step. Around it, per step:
1. overflow check: CheckOverflow.has_overflow_serial calls `float(x.float().sum())` on every parameter's fp16
   gradient: an fp32 copy (read 2, write 4 bytes per element), its sum (read 4) and a device-to-host read the host
   waits for, tensor after tensor (CHECK_OPS operators each, the device idle while the host issues them);
2. the fp32 flat gradient: `_flatten_dense_tensors([p.grad.to(fp32) ...])`: a cast per tensor (read 2, write 4),
   then one cat (read 4, write 4);
3. the gradient norm over the flat fp32 gradient (read 4); 4. unscale_and_clip_grads: grad.mul_ (read 4, write 4);
5. after the update, the fp16 weights refreshed tensor by tensor: `p.data.copy_(q.data)` (read 4, write 2).
FP16_PASS_BYTES counts 2-5 per parameter, CHECK_BYTES 1. The host's cost per operator is the measured per-operator
cost of an optimizer loop (dlperf.engine.optimizer_loop.OPTIMIZER_OP_HOST) plus the driver's launch call: a lower
bound for `.float()` and `.sum()`, which allocate their outputs.
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx
from dlperf.engine.optimizer_loop import OPTIMIZER_OP_HOST, parameter_tensors
from dlperf.plan import Plan
from dlperf.spec.hardware import LAUNCH_CALL, Hardware
from dlperf.spec.model import Model

CHECK_BYTES = 2 + 4 + 4         # x.float() reads fp16, writes fp32; .sum() reads the fp32 copy
CHECK_OPS = 3                   # .float(), .sum(), float(): two kernels and the device-to-host copy the host waits on
FP16_PASS_BYTES = (2 + 4) + (4 + 4) + 4 + (4 + 4) + (4 + 2)  # cast, cat, norm, unscale, fp16 refresh = 32
PER_TENSOR_OPS = 2              # the gradient's cast to fp32 and the weight's copy back
FLAT_OPS = 3                    # the cat, the norm, the unscale: once over the flat gradient


def fp16_optimizer_time(model: Model, hw: Hardware, plan: Plan, params: Any) -> Any:
    """Seconds FP16_Optimizer adds to the wrapped optimizer's update over this device's `params` parameters (0 for
    another optimizer_impl): the overflow check, a host sync per gradient tensor, then the flat fp32 gradient's
    passes and the fp16 refresh, the longer of the device's traffic and the host's issuing of their per-tensor
    operators. The stage's share of the model's parameter tensors is taken in proportion to its parameters."""
    if plan.optimizer_impl != "deepspeed-fp16":
        return 0.0
    device = hw.device
    bw = device.achieved_memory_bandwidth()
    tensors = parameter_tensors(model) * params / model.total_params
    op = (OPTIMIZER_OP_HOST + LAUNCH_CALL) / device.host_speed
    check = CHECK_BYTES * params / bw + tensors * CHECK_OPS * (op + device.launch_latency)
    passes = FP16_PASS_BYTES * params / bw + (tensors * PER_TENSOR_OPS + FLAT_OPS) * device.launch_latency
    return check + mathx.maximum(passes, tensors * PER_TENSOR_OPS * op)
