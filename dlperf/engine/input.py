"""The CPU input pipeline: a producer whose throughput caps the training step (plan.data_backend "cpu").

A PyTorch DataLoader gives each training process `loader_workers` worker processes; each decodes, augments and
collates one sample at a time on one CPU thread, and they run ahead of the GPU (prefetch), so the step lasts
max(GPU step, the time the workers need for its samples):

    samples/s per training process <= workers x host speed / (per-sample CPU seconds at the reference CPU)

with the per-sample seconds the sum of the plan's `input_ops` (INPUT_COSTS, each from a microbenchmark) and the
host speed device.host.speed (spec/hardware.py HOST_REFERENCE: single-thread speed over a Zen 4 at 3.7 GHz).
Workers share the node's cores (device.host.cores, where the hardware file gives them) with the training
processes, each of which keeps one core busy issuing kernels: a process gets at most (cores - processes on the
node) / (processes on the node) workers' worth of cores. Not priced: SMT, the lower all-core clock of a fully
loaded CPU, storage reads (a warm page cache is assumed), the main process's pinned-memory copy, and GPU-side
normalisation. "synthetic" (the default) has no pipeline and no cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlperf import mathx
from dlperf.plan import Plan
from dlperf.spec.hardware import Hardware


@dataclass(frozen=True)
class InputCost:
    seconds: float  # one sample on one thread of the reference CPU (spec/hardware.py HOST_REFERENCE)
    source: str


# benchmarks/input_ops.py ran on a 2-vCPU Intel Xeon VM (family 6 model 207, 2.3 GHz nominal, ~2.7 GHz by a
# dependent-multiply loop; Pillow 13.0.0, torch 2.13 CPU, one thread; fastest of 3 runs, the machine was shared):
# augment 1,208 us, collate 182.5 us per sample. In the same session, with the same other jobs on the machine,
# benchmarks/host_ops.py printed 32.2 us per forward launch on that VM against FRAMEWORK_HOST's 20.1 us on the Zen 4
# reference (alone on the VM it printed 38-40 us; the pair taken under the same load is used),
# i.e. a single-thread speed of 20.1 / 32.2 = 0.624, by which its figures are converted to the reference (the same
# conversion the engine applies to every host, device.host.speed).
# Python's interpreter and Pillow's scalar resampling loop need not speed up alike across CPUs: by imread_benchmark's
# Pillow decode (577 img/s on a Xeon Platinum 8581C of the same family and model against 537 on the Zen 4 EPYC
# 9B14) the VM would instead be ~1.07x the reference, making augment 1.30 ms and collate 0.20 ms.
MEASURED_VM_SPEED = 20.1 / 32.2
# DeepLearningExamples' AMP runs pass memory_format=torch.channels_last to fast_collate (@7bdfc81d
# PyTorch/Classification/ConvNets/image_classification/dataloaders.py:320-336 from main.py:411-412, configs.yml
# memory_format nhwc for AMP): the batch is allocated NCHW and converted to NHWC, and each CHW sample is added into
# a strided NHWC slice. benchmarks/input_ops.py times DLE's whole fast_collate of 256-sample batches in both layouts
# back to back on the same VM: channels_last added 422.0 us per sample in the quietest of 5 runs (the one whose
# contiguous figure was lowest; 422-638 us over the 5, load only adds time). torch 2.13 CPU; the runs used
# PyTorch 1.9 (pytorch-21.03), whose TensorIterator copy may order the strided add differently.
NHWC_COLLATE_EXTRA = 422.0e-6
INPUT_COSTS: dict[str, InputCost] = {
    "jpeg-decode-pillow": InputCost(
        1 / 536.55,
        "ternaus/imread_benchmark @0cd6d69 output/linux_AMD-EPYC-9B14/pillow_1t_results.json: Pillow 12.2.0 "
        "decodes the 50,000 ImageNet validation JPEGs (~500x375) from memory to RGB arrays at 536.6 img/s (mean of "
        "5 runs), one thread, AMD EPYC 9B14 (Zen 4, Google Cloud C3D)"),
    "rrc224-flip-pillow": InputCost(
        1208e-6 * MEASURED_VM_SPEED,
        "benchmarks/input_ops.py: torchvision RandomResizedCrop(224, bilinear) + RandomHorizontalFlip on a 500x375 "
        "PIL image, 1,208 us on a 2.3 GHz Xeon VM, x 0.624 (that VM's speed by benchmarks/host_ops.py)"),
    "fast-collate": InputCost(
        182.5e-6 * MEASURED_VM_SPEED,
        "benchmarks/input_ops.py: NVIDIA DeepLearningExamples' fast_collate per 224x224 sample (numpy view, "
        "rollaxis, copy, add into the uint8 batch), 182.5 us on the same VM, x 0.624"),
    "fast-collate-nhwc": InputCost(
        (182.5e-6 + NHWC_COLLATE_EXTRA) * MEASURED_VM_SPEED,
        "fast_collate into a channels_last batch, as DeepLearningExamples' AMP runs call it (memory_format nhwc: "
        "@7bdfc81d dataloaders.py:320-336, main.py:411-412): the contiguous 182.5 us plus the 422.0 us per sample "
        "benchmarks/input_ops.py measured a channels_last batch to add (whole 256-sample batches, back to back, "
        "same VM), x 0.624"),
}


def sample_seconds(plan: Plan) -> float:
    """CPU seconds one sample costs on one thread of the reference CPU."""
    return sum(INPUT_COSTS[name].seconds for name in plan.input_ops)


def effective_workers(plan: Plan, hw: Hardware) -> float:
    """Workers per training process that have a core each: the plan's, or the node's spare cores per process."""
    cores = hw.device.host_cores
    if not cores:
        return float(plan.loader_workers)
    processes = min(plan.devices, hw.devices_per_node)
    return float(max(min(plan.loader_workers, (cores - processes) / processes), 0.0))


def loader_rate(plan: Plan, hw: Hardware) -> float:
    """Samples per second one training process's loader supplies (inf without a CPU pipeline)."""
    if plan.data_backend != "cpu":
        return float("inf")
    return effective_workers(plan, hw) * hw.device.host_speed / sample_seconds(plan)


def input_time(plan: Plan, hw: Hardware, samples: Any) -> Any:
    """Seconds the loader of one data-parallel replica needs for `samples` per step (0 without a CPU pipeline)."""
    if plan.data_backend != "cpu":
        return 0.0
    rate = loader_rate(plan, hw)
    return samples / rate if rate > 0 else float("inf")


def input_wait(plan: Plan, hw: Hardware, samples: Any, step: Any) -> Any:
    """What the step waits for data beyond its own time: the loader runs ahead, so only its excess shows."""
    if plan.data_backend != "cpu":
        return 0.0
    return mathx.maximum(input_time(plan, hw, samples) - step, 0.0)


INPUT_NOTE_SHARE = 0.0  # any wait for data is reported: the GPU idles while it lasts


def input_note(plan: Plan, hw: Hardware, breakdown: dict[str, Any], step: float) -> list[str]:
    """An input-bound step is priced for the host's CPU and the plan's workers: say so."""
    wait = float(breakdown.get("input/cpu", 0.0))
    if plan.data_backend != "cpu" or wait <= INPUT_NOTE_SHARE * step or step <= 0:
        return []
    cpu = hw.device.host_label
    return [f"input-bound: {wait / step:.0%} of the step waits for data: {effective_workers(plan, hw):g} loader "
            f"workers per process supply {loader_rate(plan, hw):,.0f} samples/s at "
            f"{sample_seconds(plan) / hw.device.host_speed * 1e3:.2f} ms CPU per sample on {cpu}"]
