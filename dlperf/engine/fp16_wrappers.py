"""fp16 optimizer wrappers around a fused update that check, unscale and copy gradients tensor by tensor (plan
optimizer_impl "deepspeed-fp16" and "megatron-fp16-2020"); the update itself is the wrapped optimizer's, priced by
dlperf.engine.step. Each wrapper's operators per step are read from its code:

DeepSpeed's FP16_Optimizer without ZeRO, as Megatron-DeepSpeed runs fp16 (microsoft/DeepSpeed @38327e07
deepspeed/runtime/fp16/fused_optimizer.py FP16_Optimizer.step, deepspeed/runtime/utils.py CheckOverflow; step() runs
the same passes at @023f3614):
1. overflow check: CheckOverflow.has_overflow_serial calls `float(x.float().sum())` on every parameter's fp16
   gradient: an fp32 copy (read 2, write 4 bytes per element), its sum (read 4) and a device-to-host read the host
   waits for, tensor after tensor (3 operators each, the device idle while the host issues them);
2. the fp32 flat gradient: `_flatten_dense_tensors([p.grad.to(fp32) ...])`: a cast per tensor (read 2, write 4),
   then one cat (read 4, write 4);
3. the gradient norm over the flat fp32 gradient (read 4); 4. unscale_and_clip_grads: grad.mul_ (read 4, write 4);
5. after the update, the fp16 weights refreshed tensor by tensor: `p.data.copy_(q.data)` (read 4, write 2).

Megatron-LM's FP16_Optimizer of 2019-2020 (NVIDIA/Megatron-LM @5281919, megatron/fp16/fp16.py, adapted from apex):
1. _check_overflow: the same `float(x.float().sum())` per fp16 gradient (megatron/fp16/loss_scaler.py
   DynamicLossScaler._has_inf_or_nan), a host wait per tensor;
2. _model_grads_to_master_grads: fp16 gradients into the fp32 masters' by amp_C.multi_tensor_scale (read 2, write
   4; megatron/fp16/fp16util.py); 3. _downscale_master: multi_tensor_scale in place (read 4, write 4);
4. clip_master_grads: megatron/mpu/grads.py clip_grad_norm takes `p.grad.data.norm(2)` and `.item()` per tensor
   (read 4, a second host wait per tensor); the clip's mul_ runs only when the norm exceeds the limit (not priced);
5. _master_params_to_model_params: `model.data.copy_(master.data)` per tensor (read 4, write 2).

The host's cost per operator is the measured per-operator cost of an optimizer loop (dlperf.engine.optimizer_loop.
OPTIMIZER_OP_HOST) plus the driver's launch call: a lower bound for `.float()` and `.sum()`, which allocate their
outputs. Operators before a host wait run one after another with the device (each tensor's operator and launch);
the rest overlap: the longer of the device's traffic and launches and the host's issuing of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlperf import mathx
from dlperf.engine.optimizer_loop import OPTIMIZER_OP_HOST, parameter_tensors
from dlperf.plan import Plan
from dlperf.spec.hardware import LAUNCH_CALL, Hardware
from dlperf.spec.model import Model


@dataclass(frozen=True)
class Wrapper:
    waited_ops: int      # operators per gradient tensor that end in (or precede) a host wait
    waited_bytes: int    # bytes per parameter those operators move
    tensor_ops: int      # further operators per tensor, issued without a wait
    group_ops: int       # operators over whole groups (cat, norm, multi-tensor kernels)
    pass_bytes: int      # bytes per parameter of the operators issued without a wait


WRAPPERS = {
    # check (.float, .sum, float) | cast, cat, norm, unscale, refresh; per tensor: cast, copy back
    "deepspeed-fp16": Wrapper(waited_ops=3, waited_bytes=2 + 4 + 4, tensor_ops=2, group_ops=3,
                              pass_bytes=(2 + 4) + (4 + 4) + 4 + (4 + 4) + (4 + 2)),
    # check (.float, .sum, float) + norm (.norm, .item) | to masters, unscale, refresh; per tensor: copy back
    "megatron-fp16-2020": Wrapper(waited_ops=3 + 2, waited_bytes=(2 + 4 + 4) + 4, tensor_ops=1, group_ops=2,
                                  pass_bytes=(2 + 4) + (4 + 4) + (4 + 2)),
}


def fp16_optimizer_time(model: Model, hw: Hardware, plan: Plan, params: Any) -> Any:
    """Seconds the plan's fp16 wrapper adds to the wrapped optimizer's update over this device's `params`
    parameters (0 for another optimizer_impl): its per-tensor operators that the host waits on, then the rest. The
    stage's share of the model's parameter tensors is taken in proportion to its parameters."""
    wrapper = WRAPPERS.get(plan.optimizer_impl)
    if wrapper is None:
        return 0.0
    device = hw.device
    bw = device.achieved_memory_bandwidth()
    tensors = parameter_tensors(model) * params / model.total_params
    op = (OPTIMIZER_OP_HOST + LAUNCH_CALL) / device.host_speed
    waited = wrapper.waited_bytes * params / bw + tensors * wrapper.waited_ops * (op + device.launch_latency)
    launches = tensors * wrapper.tensor_ops + wrapper.group_ops
    passes = wrapper.pass_bytes * params / bw + launches * device.launch_latency
    return waited + mathx.maximum(passes, tensors * wrapper.tensor_ops * op)
