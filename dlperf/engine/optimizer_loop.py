"""A per-tensor optimizer step (plan.optimizer_impl "per-tensor"): PyTorch < 2.0's torch.optim for-loop.

Before PyTorch 2.0 the optimizers loop over the parameters in Python (pytorch/pytorch torch/optim/_functional.py
@09d19787, the loop of PyTorch 1.9/1.10): SGD issues `param.add_(d_p, alpha=-lr)` per tensor, momentum SGD
`buf.mul_(momentum).add_(d_p)` before it, Adam `exp_avg.mul_().add_()`, `exp_avg_sq.mul_().addcmul_()`, `sqrt`,
a division, `add_(eps)` and `param.addcdiv_()`; weight decay adds `d_p.add(param)` per decayed tensor (not
counted: the plan does not say which tensors decay, so the count is a lower bound). `optimizer.zero_grad()`
then zeroes every gradient in place (`p.grad.zero_()`, PyTorch < 2.0's default set_to_none=False): one more
kernel per tensor. Each kernel is tiny for most tensors, so the device spends a launch on each and the host its
per-operator cost (OPTIMIZER_OP_HOST, measured) plus the driver's launch call.

Whether the host's time shows: under fp16 training, PyTorch's GradScaler checks for infinities with
`sum(v.item() for v in found_inf_per_device.values())` before it calls optimizer.step() (torch/cuda/amp/
grad_scaler.py `_maybe_opt_step`), a device-to-host sync: the device has drained when the loop starts, so the
step lasts as long as the host takes to issue it (or the device to run it, if longer). Without the sync the
host issued the loop while the device was still running backward, and only the device's time shows.
"""

from __future__ import annotations

from typing import Any

from dlperf.engine.zero_impl import layer_tensors
from dlperf.plan import Plan
from dlperf.spec.hardware import LAUNCH_CALL, Hardware
from dlperf.spec.model import Model

# Kernels per parameter tensor in torch/optim/_functional.py @09d19787 (sgd, sgd with momentum, adam), without
# weight decay; plus the gradient's zero_() in optimizer.zero_grad().
KERNELS_PER_TENSOR = {"sgd": 1, "momentum": 3, "adam": 8}
ZERO_GRAD_KERNELS = 1
# Host seconds per operator of the loop at the reference CPU (spec/hardware.py HOST_REFERENCE), the driver's
# launch call not included: benchmarks/optimizer_host.py (torch 2.13 CPU, torch.optim.SGD foreach=False over
# ResNet-50's 161 one-element tensors in DeepLearningExamples' two groups, step + zero_grad: 703 ATen operators)
# printed 2.11 and 2.19 us per operator on the 2-vCPU Intel Xeon VM (family 6 model 207) of spec/hardware.py's Xeon
# measurement, whose quiet single-thread speed is 0.966 of the reference there; the faster run (the floor: load
# only adds time) x 0.966 = 2.04 us.
OPTIMIZER_OP_HOST = 2.11e-6 * 0.966


def parameter_tensors(model: Model) -> int:
    """Parameter tensors the model holds (PyTorch's len(list(model.parameters()))), as zero_impl.layer_tensors
    splits each layer."""
    return sum(len(layer_tensors(layer)) * repeat for layer, repeat in model.layers() if layer.params)


def loop_launches(model: Model, plan: Plan) -> float:
    """Kernels one optimizer step launches per parameter, averaged (0 for a fused step): the loop's and the
    zero_grad's per tensor, over the parameters, so that a stage or an expert group pays its share."""
    if plan.optimizer_impl != "per-tensor":
        return 0.0
    per_tensor = KERNELS_PER_TENSOR[plan.optimizer] + ZERO_GRAD_KERNELS
    return parameter_tensors(model) * per_tensor / model.total_params


def loop_time(hw: Hardware, launches: Any, update: Any, dtype: str) -> Any:
    """Seconds of a per-tensor step of `launches` kernels whose memory traffic takes `update` seconds: the device
    runs it in `update` plus a launch per kernel; after fp16's GradScaler sync the host's issuing time bounds it."""
    device = update + launches * hw.device.launch_latency
    if dtype != "fp16":
        return device
    host = launches * (OPTIMIZER_OP_HOST + LAUNCH_CALL) / hw.device.host_speed
    return max(device, host)
