"""A data-parallel gradient all-reduce run after the backward pass over flattened copies of the gradients (plan.dp_impl
"post-backward"), as two stacks do it:

- DeepSpeed's engine without ZeRO (microsoft/DeepSpeed @38327e07 deepspeed/runtime/engine.py: DeepSpeedEngine.
  backward -> allreduce_gradients -> buffered_allreduce_fallback; the pipeline engine's ReduceGrads instruction
  calls the same allreduce_gradients after the last backward), as Megatron-DeepSpeed runs it: per bucket of 500M
  elements (allreduce_no_retain) allreduce_bucket flattens the gradients (torch.cat), all-reduces, scales by 1/dp
  in place (postscale_gradients, the default) and allreduce_and_copy copies each tensor back out;
- Megatron-LM's local DDP before its contiguous gradient buffers (NVIDIA/Megatron-LM @5281919, 2020-09, megatron/
  model/distributed.py allreduce_params, called by training.py backward_step after loss.backward(), its autograd
  hook commented out; @6fd78189, 2021-04, DistributedDataParallel.allreduce_gradients without
  --use-contiguous-buffers-in-ddp, called by train_step after the forward-backward schedule): flatten, divide by dp,
  all-reduce, copy back.

Either way the all-reduce starts when the backward pass has finished, so nothing hides it, and COPY_PASSES passes
over the gradient (each a read and a write) run on the compute stream around it.
"""

from __future__ import annotations

from typing import Any

from dlperf.spec.hardware import Hardware

COPY_PASSES = 3  # flatten, scale by 1/dp, copy back: each reads and writes the gradient once


def copies_time(hw: Hardware, grad_bytes: Any) -> Any:
    """Seconds of the flatten, scale and copy-back passes around the all-reduce of `grad_bytes` of this device's
    gradients."""
    return COPY_PASSES * 2 * grad_bytes / hw.device.achieved_memory_bandwidth()
