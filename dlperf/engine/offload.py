"""Activation offloading to host memory: Megatron-Core's `cpu_offloading` with Transformer Engine's offload context.

What runs (Megatron-LM @3758b54b, the submodule NVIDIA-NeMo/Megatron-Bridge @0a25f911 pins, with the
transformer-engine @71bbefbf its pyproject.toml pins): TransformerBlock enters TE's `get_cpu_offload_context(
cpu_offloading, cpu_offloading_num_layers, num_layers, ...)` around each layer's forward and calls its
synchronisation function on the layer's output (megatron/core/transformer/transformer_block.py lines 299-312 and
821-843). TE (transformer_engine/pytorch/cpu_offload.py @71bbefbf, DefaultOffloadSynchronizer) then:

- offloads layers 0..N-1 of the L layers: every tensor saved for backward inside the layer (saved_tensors_hooks)
  of at least 256k elements that is not a parameter nor marked not to offload (`_check_if_offload`, lines
  452-473; Linear marks its weights, module/linear.py line 430). A quantized (FP8) tensor is split into its data
  tensors and those are copied (`push_tensor`, lines 374-385): FP8-cast saved inputs travel as FP8. These are the
  block activations dlperf already counts as saved (StageCost.saved_blocks), at the bytes it counts them;
- copies layer i device-to-host on one side stream as soon as each tensor is saved (`start_offload`, lines
  258-310), and makes the compute stream wait for that copy before layer L-N+i's forward (`finish_offload_map`,
  lines 600-622, `release_activation_forward_gpu_memory`, line 322): the copies queue on one stream, and the
  layers may run ahead of them by L-N layers;
- in backward, starts layer i's host-to-device copy when backward reaches layer L-1-N+i, on the same stream after
  the compute queued so far (`start_reload_map`, `start_reload`, lines 340-357); layer i's backward waits for it
  (`pop_tensor`, line 439);
- so holds (L-N) layers' activations at most (the docstring of `_init_offload_synchronization_dicts`), and refuses
  N > L-1 (`get_cpu_offload_context`, lines 840-845).

Priced per micro-batch and pass, with c the pass's device seconds per layer and t the seconds to copy one layer's
saved activations over the host link: the N copies run back to back on their stream, starting once the first
layer has run (c) and the last layer waits for all of them before it runs (c), so a pass lasts
max(L*c, N*t + 2*c). Copies beside compute never cost it anything else: a copy engine moves the bytes, and its HBM
traffic (~0.2 TB/s on GB200 against 8 TB/s) is not charged to the kernels.

Transformer Engine before 2.10 (the v1 path, AsyncDoubleBufferGroupOffloadHandler, used by the 25.09 and 25.11
containers) synchronises both streams every L/N layers instead; it is not priced here.
"""

from __future__ import annotations

from typing import Any

from dlperf import mathx
from dlperf.errors import PlanError
from dlperf.plan import Plan
from dlperf.spec.hardware import Hardware


def check(plan: Plan, hw: Hardware, layers: int) -> None:
    """Offloading (a plan with offload_layers) needs the device's host link and at most L-1 offloaded layers (TE
    refuses all L)."""
    if layers < 2:
        raise PlanError("offload_layers", expected="a model with a repeated block of layers to offload (Transformer "
                        "Engine offloads the layers of a transformer block)", found=plan.offload_layers)
    if plan.offload_layers > layers - 1:
        raise PlanError("offload_layers", expected=f"at most {layers - 1} (the model's {layers} layers less the "
                        "last, which Transformer Engine never offloads)", found=plan.offload_layers)
    if not (hw.device.host_to_device and hw.device.device_to_host):
        raise PlanError(f"offload_layers copies activations to host memory: the hardware file {hw.name} gives no "
                        "device.host_link", expected="device.host_link with h2d and d2h bandwidths")


def pass_time(compute: Any, layers: int, offloaded: int, layer_bytes: Any, bandwidth: float) -> Any:
    """Seconds of one pass over `layers` layers whose device work takes `compute` seconds, while `offloaded`
    layers of `layer_bytes` each cross a host link of `bandwidth` bytes/s on one side stream (module docstring)."""
    per_layer = compute / layers
    return mathx.maximum(compute, offloaded * layer_bytes / bandwidth + 2 * per_layer)


def exposed(plan: Plan, hw: Hardware, layers: int, saved_blocks: Any, device_fwd: Any,
            device_bwd: Any) -> tuple[Any, Any]:
    """Seconds by which offloading (a plan with offload_layers) lengthens a micro-batch's forward and backward
    pass."""
    n = plan.offload_layers
    layer_bytes = saved_blocks / layers
    fwd = pass_time(device_fwd, layers, n, layer_bytes, hw.device.device_to_host) - device_fwd
    bwd = pass_time(device_bwd, layers, n, layer_bytes, hw.device.host_to_device) - device_bwd
    return fwd, bwd


def resident_blocks(plan: Plan, layers: int) -> float:
    """Share of the blocks' saved activations that stays on the device: (L-N)/L (module docstring)."""
    return (layers - plan.offload_layers) / layers
