"""The gradient allreduce as Horovod's TensorFlow frontend runs it (plan.dp_impl "horovod-0.19").

Horovod (horovod/horovod) does not call NCCL from the framework's op: `hvd.allreduce` enqueues the tensor, and a
background thread negotiates which tensors every rank has ready, fuses them into a buffer and reduces the buffer.
What that adds over one NCCL allreduce of the whole gradient, from the code of v0.19.5 (tag 2020-06-24, the
release before NVIDIA's TensorFlow 20.06 container; the defaults below are the same from v0.18.2 to v0.20.3 and
changed in v0.21.0, horovod/horovod#2468 "Changed default cycle time from 5ms to 1ms and fusion threshold from
64MB to 128MB"):

- the cycle: horovod/common/operations.cc RunLoopOnce sleeps until `last_cycle_start + CycleTimeMs()` before each
  negotiation, and BackgroundThreadLoop sets the cycle to 5 ms unless HOROVOD_CYCLE_TIME says otherwise. A tensor
  enqueued at a moment unrelated to the thread's phase waits for the next negotiation: half a cycle on average.
- fusion: BackgroundThreadLoop sets the fusion threshold to 64 MiB (HOROVOD_FUSION_THRESHOLD); the controller
  packs ready tensors into responses of at most that many bytes, and PerformOperation runs them one after another,
  so a gradient of W bytes takes ceil(W / 64 MiB) NCCL allreduces, each paying the collective's latency.
- the fusion buffer: horovod/common/ops/nccl_operations.cc NCCLAllreduce::Execute copies every tensor of a fused
  response into the buffer (MemcpyInFusionBuffer) and the result back out (MemcpyOutFusionBuffer), device to device:
  two copies, each reading and writing the wire bytes. Tensors are fused whenever a response holds more than one,
  which is the case for any model with more than one weight tensor; a single tensor larger than the threshold
  skips the copies, so for a model with one such tensor this is an upper bound by that tensor's share.
- compression: horovod/tensorflow/compression.py FP16Compressor casts each floating-point gradient to fp16 before
  the allreduce and back to its dtype after (Compression.none sends it as is): dlperf.comm.compression prices the
  two casts as memory-bound passes.
- averaging: horovod/tensorflow/__init__.py allreduce, with op Average (the default), divides the decompressed sum
  by the number of ranks in TensorFlow, `summed_tensor / horovod_size`: one more pass reading and writing the
  gradient in its own dtype.
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx
from dlperf.comm.compression import compute_time, parse_compression
from dlperf.spec.hardware import Hardware

CYCLE_TIME = 5e-3  # s, operations.cc @v0.19.5: state.parameter_manager.SetCycleTimeMs(5)
FUSION_THRESHOLD = 64 * 1024 * 1024  # bytes, operations.cc @v0.19.5: SetTensorFusionThresholdBytes(64 * 1024 * 1024)
SCHEMES = ("none", "fp16")  # horovod/tensorflow/compression.py @v0.19.5: Compression.none and Compression.fp16


def fused_calls(wire_bytes: Any) -> Any:
    """NCCL allreduces Horovod issues for `wire_bytes` of gradients: one per fusion buffer (at least one)."""
    return mathx.maximum(mathx.ceil(wire_bytes / FUSION_THRESHOLD), 1)


def buffer_params(grad_element_bytes: float, compression: str) -> float:
    """Gradient elements one full fusion buffer holds on the wire."""
    return FUSION_THRESHOLD / parse_compression(compression).wire_bytes_per_element(grad_element_bytes)


def allreduce_time(comm: Any, hw: Hardware, group: Any, n_params: Any, grad_element_bytes: float,
                   compression: str) -> Any:
    """Seconds from the last gradient's enqueue to its averaged result: the wait for the next cycle, the fused NCCL
    allreduces, the copies through the fusion buffer, the compression casts and the division by the rank count."""
    scheme = parse_compression(compression)
    wire = n_params * scheme.wire_bytes_per_element(grad_element_bytes)
    calls = fused_calls(wire)
    nccl = calls * comm.collective_time("allreduce", wire / calls, group, hw)
    bw = hw.device.achieved_memory_bandwidth()
    copies = 2 * (2 * wire) / bw  # into and out of the buffer, each read once and written once
    casts = compute_time(n_params, grad_element_bytes, scheme, hw, group.size)
    average = 2 * n_params * grad_element_bytes / bw + hw.device.launch_latency
    return CYCLE_TIME / 2 + nccl + copies + casts + average
