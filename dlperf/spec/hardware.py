"""Hardware specs: one accelerator and the network as levels from the innermost out.

Minimal form (accepted as it stands):

    name: dgx-a100
    source: "..."
    device: {name, peak_flops: {dtype: '312 TFLOP/s'}, memory: '80 GiB', memory_bandwidth: '2039 GB/s'}
    network:                      # innermost first; bandwidth per device, per direction
      - {name: nvswitch, size: 8, bandwidth: 300 GB/s, latency: 3 us}
      - {name: infiniband-hdr, bandwidth: 200 Gb/s, latency: 5 us}   # outermost: no size

`size` of a level is the number of devices in one domain of that level (8 GPUs per NVSwitch node); the
outermost level has no size (it spans the whole cluster). Optional level keys: `efficiency` (achieved fraction of
`bandwidth`), `links_per_domain` (NICs shared by one inner domain), `link` (nvlink | pci | net: NCCL's latency
class, derived when absent, see link_kind), `nvls_bandwidth` (measured NVLink SHARP all-reduce busbw) and
`net_latency` (the latency a network level's NCCL transport reports, which NCCL's tuner adds to every network hop;
0 for NCCL's own InfiniBand/RoCE transport, set by a net plugin such as AWS's aws-ofi-nccl for EFA).

Optional device keys: `launch_latency`, `efficiency` (per kernel class: peak, half or startup, source; a conv
curve fitted per direct FLOP to a library's chosen algorithms may say `algorithm_choice: true`; an attention curve
may give `seq_half`, its n_1/2 in keys, and `head_dim_64`, its forward and backward rate at head dim 64 over head dim
128's; the fused-attention curve `attention_fa3` may give `by_cudnn`, whole curves keyed by the cuDNN version they
were measured at, "major.minor.patch", each with its source, for a plan's `cudnn`: Device.for_cudnn), and what the
runtime keeps for itself, so that "fits" means it fits:

    memory_reserved: 1 GiB        # fixed per device: CUDA context, communication buffers (default below)
    memory_fragmentation: 0.05    # fraction of the allocated bytes lost to the caching allocator's fragmentation

Set both to 0 for a device where nothing is reserved (`memory_reserved: 0 B`, `memory_fragmentation: 0`).

`speed_spread` (default 0) is sigma over median of one device's compute time across devices of this SKU, from a
cited per-device measurement; a step's kernels then run at the pace of the slowest of its devices
(dlperf.engine.straggler).

`host` (optional) names the CPU that issues the kernels and runs the data loader:

    host: {cpu: "2x AMD EPYC 7742", speed: 0.683, cores: 128, source: "DGX A100 datasheet"}

`speed` (0.01 to 100) is its single-thread speed over HOST_REFERENCE's; the host time per launch is divided by it
unless a measured `dispatch` is given. `cores` (optional) are the node's physical cores: more than its devices,
one per training process and the rest shared by their loader workers (dlperf.engine.input). A file that extends
another merges `host` key by key, so name `cores` again (or null it) when the CPU changes.

A file may start from another one and say only what differs (a 40GB variant of an 80GB machine):

    extends: dgx-a100             # a built-in name, or a .yaml path relative to this file
    name: a100-40gb
    device: {name: A100-SXM4-40GB, memory: 40 GiB, memory_bandwidth: 1555 GB/s}

Mappings merge key by key (the extending file wins), lists such as `network` and scalars are replaced whole, and
a key set to null (`price_per_device_hour: null`) is dropped; a required one (`network: null`) is reported at the
null's line. The base must load on its own, and the file needs its own `name`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlperf import builtins
from dlperf.errors import DlperfError, SpecError
from dlperf.spec.yamlio import LineDict, check_keys, field_name, line_of, load_yaml_file
from dlperf.units import parse_quantity

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
KERNEL_CLASSES = ("matmul", "conv", "attention", "attention_fa3", "memory", "transcendental")

# Defaults when a hardware file gives no efficiency curve. Sources:
# - matmul 0.87: A100 SXM BF16 maximum achievable matmul 271.2/312 TF/s (stas00/ml-engineering,
#   compute/accelerator/README.md, "MAMF"); H100 SXM is 80.3%.
# - matmul startup 11 us (Hockney t0 = n_1/2 / r_inf, launch excluded): square FP16 GEMM sweeps give
#   t(1024^3) - 2.15 GFLOP / r_inf = 16.8 us on an A100-PCIE-40GB (83.66 vs 241.49 TF/s at 4096^3) and 15.4 us
#   on a V100-SXM2-16GB (57.30 vs 97.36 TF/s at 8192^3) (zzc0721/torch-performance-test-data issues #108 and
#   #140, torch 2.7-2.8), i.e. ~16 us on both chips, of which ~5 us is the launch latency counted separately.
#   A startup time transfers across chips; a fixed n_1/2 in FLOPs would not (it scales with the peak).
# - memory startup 2.3 us: dlperf's earlier n_1/2 of 4 MiB at an A100's 0.9 x 2039 GB/s, kept as a time so
#   that it does not grow on slower memories; not a measurement (calibrate to replace it).
# - memory 0.9: STREAM-like copy reaches ~90% of HBM peak on V100/A100 (Jia et al. 2018/2019,
#   "Dissecting the NVIDIA Volta/Ampere GPU architecture via microbenchmarking").
# - launch 5 us: CUDA kernel launch overhead is ~3-7 us (same microbenchmark papers).
# A convolution without its own curve uses the device's matmul curve: cuDNN's default algorithms are implicit
# GEMMs (Chetlur et al. 2014, "cuDNN", section 3), so the GEMM efficiency is the best sourced stand-in -- on
# tensor cores, scaled down by CONV_OVER_GEMM. cuDNN's convolutions do not reach cuBLAS's GEMM rate on the same
# units, and the one tensor-core device whose file measures both, V100 (dgx1-v100.yaml: DeepBench's FP16 ResNet
# and Vision convolutions, r_inf 0.409 of peak with an 8 us startup, against its GEMMs' 0.880), gives the ratio:
# a tensor-core convolution on a device that measures none runs on the device's GEMM curve at 0.465 of its
# asymptote, with V100's convolution startup and no tile quantization (the measured convolution curves are
# per-FLOP Hockney fits). A carry-over, not a measurement: it holds best from V100 to A100, which keep about the
# same DRAM bytes per tensor FLOP (900 GB/s per 125 TFLOP/s, 2,039 per 312), and extrapolates to Hopper and later
# (3.35 TB/s per 989); a file's own `conv` curve (dlperf calibrate writes one) replaces it. CUDA-core
# convolutions (fp32, and fp16 on parts without matrix units) keep the GEMM curve, as P40's measured FP32 curve
# (0.678 of peak, p40-pcie.yaml) stays near a GEMM's. tests/test_hardware_conv.py checks the ratio against
# dgx1-v100.yaml.
CONV_OVER_GEMM = 0.409 / 0.880
CONV_STARTUP = 8e-6
CONV_MATRIX_DTYPES = ("tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
# Matrix units (tensor cores, matrix cores) multiply a part's 16-bit peak over its fp32 one (V100 8x, A100 16x,
# MI300X 8x); packed fp16 on CUDA cores only doubles it (P100 2x).
MATRIX_UNIT_SPEEDUP = 4
DEFAULT_EFFICIENCY = {
    "matmul": (0.87, 0.0, 11e-6),
    "memory": (0.90, 0.0, 2.3e-6),
}
DEFAULT_LAUNCH_LATENCY = 5e-6
# Host seconds an eager framework spends per kernel launch the engine counts (Python, dispatcher, autograd, the
# framework's own Python, the driver's launch call). While kernels are shorter than this the GPU waits for the CPU,
# so a pass costs max(device time, host time). Two parts:
# - FRAMEWORK_HOST: an eager layer issues several operators per kernel (views, splits, allocations, autograd
#   bookkeeping) and Megatron adds Python around them (custom autograd functions, TorchScript fusions, RNG-state
#   forks, CheckpointFunction). benchmarks/host_ops.py runs a layer laid out as Megatron-DeepSpeed's (file@commit in
#   the script) at the smallest width it allows (so the CPU's own arithmetic is negligible) and divides its host
#   time by the launches dlperf counts for one `gpt` layer (20 forward, 43 backward): 20.1 us forward and 10.7 us
#   backward per launch (70 and 102 ATen operators, 5.7 and 4.5 us each; median of 6 runs on our 2-core AMD EPYC
#   family 25 model 17, Zen 4, VM, torch 2.13 CPU build, one thread). Per-operator costs published for eager
#   PyTorch agree: 6.8 us forward for a Python-level op recorded by autograd (pytorch/pytorch#41383), 4 us per
#   backward op from C++ (#82793).
# - LAUNCH_CALL: that measurement ran on the CPU device, so it has no CUDA launch call; on a GPU host each launch
#   adds the driver's: 3.0 us for a cuLaunchKernel of a kernel without arguments, 3.3 us with 19, measured on GB200's
#   Grace CPU, not on the reference (meta-pytorch/tritonbench#1017's table, benchmark "nop_triton_direct_culaunch"
#   from #1003, which calls the driver through Python ctypes: a little more than PyTorch's C++ call pays). It is
#   converted to the reference like any host figure, by Grace's speed in the table the engine divides by
#   (GRACE_HOST_SPEED, hardware/gb200-nvl72.yaml and dgx-gb300.yaml `device.host.speed`): 3.0 us x 0.362 = 1.09 us
#   at the reference, so a Grace host is charged the 3.0 us measured there again. That speed comes from a
#   torch.nn.Linear forward (NVIDIA/TransformerEngine#2053: Python, ATen dispatch, one cuBLAS launch), and the ctypes
#   benchmark is also mostly interpreter work around the C call; no source found times the same C-level launch on
#   Grace and on an x86 host, so if Grace runs the driver's C less slowly than 0.362 says, the reference figure is
#   higher (at most 3.0 us, were Grace as fast as Zen 4 there). 4.90 us from statically compiled C in 2017
#   (JuliaGPU/CUDAdrv.jl#15, a host of that era) is the other published figure. The smaller, recent one is used:
#   the sum stays a lower bound.
# - BACKWARD_HOST_RATIO: on the CPU device backward runs on the calling thread with no CUDA allocator, so its
#   launches look cheap (10.7 vs 20.1 us). On GPU hosts they are not: the median interval between consecutive
#   kernel launches of one thread, backward over forward, is 1.28 over the 8 distinct eager-training traces that
#   facebookresearch/HolisticTraceAnalysis publishes as test data (@f4d0062c, tests/data/; V100 and A100 hosts;
#   per trace 0.55-2.55; benchmarks/trace_launch_gaps.py prints them). Profiled traces pay the profiler per operator
#   in both passes, so only their ratio is used: a backward launch costs 1.28 x the forward one.
# - The host CPU: these are Zen 4 figures, and Python and the dispatcher run on one thread, so they scale with that
#   thread's speed (DGX A100's Zen 2 EPYC 7742 is 0.683 of it, Grace 0.362: HOST_REFERENCE). A hardware file names its
#   host in `device.host` with `speed`, its single-thread speed relative to this Zen 4 reference, and the engine divides
#   the per-launch cost by it (HOST_REFERENCE says how speeds are derived). A file without it gets the
#   reference's figures, i.e. a fast host.
# Still a lower bound on a GPU host: the counted launches are fewer than the kernels an eager layer really
# launches. `dlperf calibrate --device cuda` measures the whole (framework and launch call together) on the
# user's machine, and a measured `device.dispatch` overrides `device.host`.
FRAMEWORK_HOST = (20.1e-6, 10.7e-6)
GRACE_HOST_SPEED = 0.362  # Grace's single-thread speed over HOST_REFERENCE's (hardware/gb200-nvl72.yaml, TE#2053)
LAUNCH_CALL_ON_GRACE = 3.0e-6  # tritonbench#1017, nop_triton_direct_culaunch without arguments, on GB200's Grace
LAUNCH_CALL = LAUNCH_CALL_ON_GRACE * GRACE_HOST_SPEED  # 1.09 us at the reference
BACKWARD_HOST_RATIO = 1.28
DEFAULT_DISPATCH = (FRAMEWORK_HOST[0] + LAUNCH_CALL, BACKWARD_HOST_RATIO * (FRAMEWORK_HOST[0] + LAUNCH_CALL))
# Host seconds of one cublasLtMatmulAlgoGetHeuristic query that hits cuBLASLt's internal heuristic cache: caching
# the result outside cuBLASLt "saves ~0.7-0.9us on the cuBLASLt hot path", "the bulk of the time is the heuristic
# call itself" (pytorch/pytorch#191700, NVIDIA's eqy, 2026-07-31; the host CPU is not stated, so it is taken at
# the reference's speed). The smaller figure: a lower bound. Transformer Engine queries it on every GEMM call, no
# cache of its own (dlperf.ops.moe.per_expert_gemm_host).
CUBLASLT_HEURISTIC = 0.7e-6
# The CPU FRAMEWORK_HOST was measured on, which `device.host.speed` 1.0 means: AMD Zen 4 (EPYC 9004 "Genoa",
# family 25 model 17) in a cloud VM; its SKU is hidden, so its clock is taken as the 3.7 GHz max boost of the
# Genoa parts clouds rent (EPYC 9654: 2.4-3.7 GHz). A host's speed is then (its IPC / Zen 4's) x (its max boost /
# 3.7 GHz), with AMD's generational IPC figures: Zen 3 = 1.19x Zen 2 (AMD's Zen 3 launch, "+19%", as reported
# in AnandTech's EPYC Milan review, 2021-03-15), Zen 4 = 1.13x Zen 3 (AMD's Ryzen 7000 launch, 2022-08-29:
# geomean of 22 workloads at a fixed 4 GHz, reported by PC Gamer and Club386). An estimate from vendor figures,
# not a measurement of the host: Python's branchy, front-end-bound interpreter may gain more or less per
# generation than AMD's workload mix.
# Intel Xeon hosts (Golden Cove / Raptor Cove P-cores) have no vendor IPC figure against Zen 4, so their speed is
# measured: benchmarks/host_ops.py on an Intel Emerald Rapids VM (family 6 model 207; a dependent imul+add loop
# clocks it at 3.69 GHz when quiet), 2 vCPUs shared with other jobs. Interference only adds time, and the floor
# reproduces where the median follows the load: forward per launch over two sets of runs (11 and 12, each run the
# median of 5 x 300 passes) had minima 21.0 and 20.8 us, medians 29.9 and 32.5 us; the runs whose clock loop read
# >= 3.5 GHz before and after had 20.8-24.3 us. The floor, 20.8 us (backward 11.4 us, vs 10.7), over the reference's
# 20.1 gives 0.966 at 3.69 GHz, scaled to a part by its max boost clock as for the AMD hosts (Sapphire Rapids taken
# at Emerald Rapids' IPC: the same P-core generation, 2 MB L2 per core; Emerald Rapids has the larger L3). The
# reference's 20.1 us is a median of 6 on its own VM: if that VM was loaded too, Xeon speeds are overstated.
# An earlier session on a VM of the same model, whose clock loop read ~2.7 GHz, printed 38-40 us (28-29 us at 3.69
# GHz, 1.35x the floor; engine/input.py): if that rather than the floor is the quiet figure, Xeon speeds are 0.74x.
# Grace (Neoverse V2) is related to the DGX H100's Xeon 8480C by one benchmark run on both
# (NVIDIA/TransformerEngine#2053: a torch.nn.Linear forward's host time, 37.08 us on GB200 vs 13.48 us).
HOST_REFERENCE = "AMD Zen 4 (EPYC 9004) VM at 3.7 GHz"
MEASURED_HOST = "the host that measured device.dispatch"
DEFAULT_CHANNELS = 2  # "it should just launch 2 SMs" on a one-NIC system, NCCL's minimum (NVIDIA/nccl#689)
# What the runtime reserves on a GPU before the model's own tensors, unless the hardware file says otherwise:
# - 1 GiB fixed: the CUDA context alone takes ~0.7-0.8 GiB once PyTorch touches a GPU (723 MiB for a one-element
#   tensor, discuss.pytorch.org/t/73021; "~700+MB depending on the CUDA version", discuss.pytorch.org/t/81330),
#   plus NCCL's communicator buffers (NCCL_BUFFSIZE = 4 MiB per channel and peer, NCCL environment-variable
#   documentation; tens of channels over ring and tree give a few hundred MiB) and cuBLAS workspaces.
# - 5% of what is allocated, for the caching allocator's fragmentation: an assumption, not a measurement; ZeRO
#   saw out-of-memory errors with over 30% of memory still free in extreme cases (Rajbhandari et al. 2020,
#   section 6.3, "memory fragmentation"), so 5% is the optimistic end. Override per hardware file.
DEFAULT_MEMORY_RESERVED = float(2**30)
DEFAULT_MEMORY_FRAGMENTATION = 0.05


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of peak as a saturating (Hockney) curve: peak * size / (size + half).

    `size` is FLOPs for matmul/conv and bytes for memory; `half` is Hockney's n_1/2. Alternatively `startup`
    gives Hockney's t0 = n_1/2 / r_inf directly (seconds per kernel, on top of the launch latency).
    """

    peak: float
    half: float = 0.0
    source: str = ""
    startup: float | None = None
    # GEMM tiling (matmul curves only): the output tile one SM computes and a tile's fixed prologue/epilogue in
    # K-elements of its main loop; with the device's SM count they price tile and wave quantization
    # (engine/device.py). 128: a tile's pipeline fill (cuBLAS/CUTLASS Ampere kernels prefetch 3-4 K-stages of 32)
    # plus writing its output; dlperf's estimate, scored against the kernel tables by fit_kernel_curves.py.
    tile: tuple[int, int] | None = None
    tile_overhead_k: int = 128
    # fused-attention curves only: Hockney's n_1/2 in tokens of the sequence each query block loops over, so a
    # kernel over s keys runs at peak * s / (s + seq_half) (each block's prologue and epilogue against a loop that
    # grows with s; fitted to a per-length table such as dlperf/data/kernels/cudnn-*-sdpa-*.csv). 0: no term.
    seq_half: float = 0.0
    # fused-attention curves only, all measured at head dim 128: (forward, backward) rate of the kernel at head dim
    # 64 over its rate at 128, from a benchmark that times both (dlperf.ops.headdim interpolates between them).
    # None: head dim 64 not measured for this curve's kernel on this device, and no head-dim term.
    head_dim_64: tuple[float, float] | None = None
    # conv curves only: fitted per direct-convolution FLOP (2*N*K*P*Q*C*R*S) to timings of whatever algorithm the
    # library chose (DeepBench's cuDNN tables: implicit GEMM, Winograd, FFT), so the curve already holds cuDNN's
    # choice; `auto` then prices the direct form on it instead of re-deriving Winograd/FFT savings on top.
    algorithm_choice: bool = False

    def at(self, size: Any) -> Any:
        if self.half == 0:
            return self.peak
        return self.peak * size / (size + self.half)


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: dict[str, float]
    memory: float
    memory_bandwidth: float
    launch_latency: float = DEFAULT_LAUNCH_LATENCY
    efficiency: dict[str, Efficiency] = field(default_factory=dict)
    sms: int | None = None                          # streaming multiprocessors (compute units)
    dispatch_forward: float = DEFAULT_DISPATCH[0]   # host seconds to issue one forward kernel
    dispatch_backward: float = DEFAULT_DISPATCH[1]  # ... one backward kernel
    memory_reserved: float = DEFAULT_MEMORY_RESERVED
    memory_fragmentation: float = DEFAULT_MEMORY_FRAGMENTATION
    # relative spread (sigma / median) of one device's compute time over devices of this SKU (manufacturing and
    # power-management variation); 0 where no per-device measurement is cited. dlperf.engine.straggler
    speed_spread: float = 0.0
    host_cpu: str = ""  # the CPU that issues the kernels (device.host.cpu), "" when the file names none
    # input pipeline (dlperf.engine.input): device.host.speed itself, and the node's physical cores (0: not given)
    host_speed: float = 1.0
    host_cores: int = 0
    # host memory <-> device copy bandwidth per device (device.host_link; 0: not given), for activation offloading
    host_to_device: float = 0.0
    device_to_host: float = 0.0
    # fused-attention curves measured per cuDNN version (efficiency.attention_fa3.by_cudnn), oldest first: (version
    # as integers, as written, curve); `for_cudnn` prices a plan's version at one of them. `cudnn`: the measured
    # version whose curve efficiency["attention_fa3"] is after for_cudnn (None: the file's default curve).
    cudnn_curves: tuple[tuple[tuple[int, ...], str, Efficiency], ...] = ()
    cudnn: str | None = None
    dtype_curves: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    # the convolution curves derived from GEMM curves (_conv_from_gemm), one per GEMM curve key
    derived_convs: dict[str, Efficiency] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype_curves", frozenset(k for k in self.efficiency if "/" in k))

    def for_cudnn(self, version: str | None) -> Device:
        """This device with its fused-attention curve (attention_fa3) measured at the cuDNN `version` a plan runs
        (dlperf.plan.CUDNN_VERSION): the newest version the file measures at or below it. A version older than
        every measured one gets the oldest curve: cuDNN's attention got faster release by release (e.g. GB300
        causal 8k, 1,496 / 1,130 TFLOP/s forward / backward at 9.13.1 against 1,887 / 1,385 at 9.19.1,
        dlperf/data/kernels/cudnn-gb300-*), so that curve prices an older library fast, a lower bound on the gap.
        None, or a file without `by_cudnn`: the device unchanged (the file's default curve)."""
        if version is None or not self.cudnn_curves:
            return self
        from dlperf.plan import cudnn_version

        wanted = cudnn_version(version)[:3]
        at_or_below = [entry for entry in self.cudnn_curves if entry[0] <= wanted]
        _, measured, curve = at_or_below[-1] if at_or_below else self.cudnn_curves[0]
        return replace(self, efficiency={**self.efficiency, "attention_fa3": curve}, cudnn=measured)

    @property
    def host_label(self) -> str:
        """The CPU the host time is priced for, as notes and `dlperf show` name it."""
        return self.host_cpu or "the reference CPU (no device.host in the hardware file)"

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype; fp32 stands in for a dtype the device does not list."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype == "tf32" or dtype not in DTYPES:
            return self.peak_flops["fp32"]
        listed = ", ".join(self.peak_flops)
        why = {"mxfp8": "MXFP8 needs block-scaled tensor cores, Blackwell's or later, and the file's mxfp8 peak; ",
               "nvfp4": "NVFP4 needs FP4 tensor cores, Blackwell's or later, and the file's nvfp4 peak; ",
               }.get(dtype, "")
        raise SpecError(f"device {self.name} has no peak_flops for {dtype} ({why}it lists {listed}: try --dtype with "
                        f"one of them)", field="device.peak_flops")

    def achieved_memory_bandwidth(self) -> float:
        """Bytes/s a streaming memory-bound pass achieves: the bandwidth at the `memory` curve's asymptote
        (BabelStream-class copy kernels where the file measures them)."""
        return self.memory_bandwidth * self.eff("memory").peak

    def eff(self, kernel_class: str, dtype: str | None = None) -> Efficiency:
        """The curve of a kernel class; a dtype whose kernels run on other units (fp32 on CUDA cores, tf32, fp8)
        may have its own curve (`efficiency.matmul.dtypes.fp32`), else the class's curve stands in."""
        key = self.curve_key(kernel_class, dtype)
        if key in self.efficiency:
            curve = self.efficiency[key]
        else:
            peak, half, startup = DEFAULT_EFFICIENCY[key]
            curve = Efficiency(peak, half, "dlperf default", startup)
        if kernel_class == "conv" and self.derived_conv(dtype, key):
            return self._conv_from_gemm(key, curve)
        return curve

    def derived_conv(self, dtype: str | None, key: str | None = None) -> bool:
        """Whether a convolution in `dtype` runs on a GEMM curve scaled by CONV_OVER_GEMM: the file measures no
        convolution curve for it (`key`: its curve_key, when the caller has it) and it runs on matrix units."""
        key = self.curve_key("conv", dtype) if key is None else key
        sixteen = max(self.peak_flops.get("fp16", 0.0), self.peak_flops.get("bf16", 0.0))
        return (not key.startswith("conv") and dtype in CONV_MATRIX_DTYPES
                and sixteen >= MATRIX_UNIT_SPEEDUP * self.peak_flops["fp32"])

    def _conv_from_gemm(self, key: str, gemm: Efficiency) -> Efficiency:
        """A tensor-core convolution's curve where the file measures none: the GEMM curve `key` at CONV_OVER_GEMM
        of its asymptote, V100's convolution startup, no tiles (memoised per curve: the engine asks per kernel)."""
        derived = self.derived_convs
        if key not in derived:
            derived[key] = Efficiency(
                gemm.peak * CONV_OVER_GEMM, 0.0,
                f"no convolution measured: the {key} curve ({gemm.peak:.3f}) x {CONV_OVER_GEMM:.3f}, cuDNN's "
                "convolution over GEMM rate on V100 (DeepBench; spec/hardware.py CONV_OVER_GEMM)", CONV_STARTUP)
        return derived[key]

    def curve_key(self, kernel_class: str, dtype: str | None = None) -> str:
        """Which curve `eff` prices the class at: a key of `efficiency` ("matmul", "matmul/fp8", ...), or, where
        the chain of stand-ins ends without a measured curve, the class whose DEFAULT_EFFICIENCY applies."""
        if kernel_class == "matmul_fp8":  # an FP8 recipe's GEMM: the matmul curve measured in its format
            return self.curve_key("matmul", dtype if dtype in ("mxfp8", "nvfp4") else "fp8")
        if dtype is not None and self.dtype_curves:
            for key in (f"{kernel_class}/{dtype}", f"matmul/{dtype}" if kernel_class == "conv" else ""):
                if key in self.dtype_curves:  # a conv in a dtype with its own units runs at their GEMM rate
                    return key
        if dtype == "nvfp4" and kernel_class == "matmul":  # FP4 units: no sourced stand-in for their efficiency
            self.peak(dtype)  # a device without FP4 units (Hopper) is refused for that first
            raise SpecError(f"device {self.name} has no NVFP4 GEMM curve (efficiency.matmul.dtypes.nvfp4): give one "
                            f"from a published NVFP4 GEMM benchmark", field="efficiency.matmul.dtypes")
        if dtype == "mxfp8":  # block-scaled FP8 runs on the FP8 tensor cores: FP8's curve where MXFP8 has none
            return self.curve_key(kernel_class, "fp8")
        if kernel_class in self.efficiency:
            return kernel_class
        if kernel_class == "attention_fa3":  # FlashAttention-3 class kernels, else the FlashAttention-2 curve
            return self.curve_key("attention", dtype)
        if kernel_class == "attention" and "attention_fa3" in self.efficiency:
            # FlashAttention-2 unmeasured where the newer fused kernel (cuDNN, FA3) is: that curve bounds it from
            # above (FA2 runs below FA3 on H100: Shah et al. 2024, section 4.1), the GEMM's would not
            return "attention_fa3"
        if kernel_class in ("conv", "attention"):  # no measured curve of its own: the GEMM's
            return self.curve_key("matmul", dtype)
        if kernel_class == "transcendental":  # exp/tanh-bound element-wise kernels, when not measured apart
            return self.curve_key("memory")
        return kernel_class


@dataclass(frozen=True)
class NetworkLevel:
    name: str
    size: int | None
    bandwidth: float
    latency: float
    efficiency: float = 1.0
    # How many links of this level one domain of the next level in (a node, for the inter-node level) has,
    # for contention: devices of that domain crossing this level at once share them. None = one per device
    # (full rails), and `bandwidth` is then per device; with a count, `bandwidth` is per link.
    links_per_domain: int | None = None
    # SMs an NCCL collective over this level occupies (one CTA per channel, never shared with compute kernels:
    # sjeaugey, NVIDIA/nccl#689); compute overlapped with it runs on the rest. Default: NCCL's minimum of 2.
    channels: int | None = None  # None: not given (overlap charges DEFAULT_CHANNELS; NCCL derives its own)
    # NCCL's link class for this level's per-hop latencies (tuning.cc hwLat: NVLINK, PCI, NET); None = derived
    # by link_kind(): the innermost level is NVLink unless its name says PCIe, every outer level is NET.
    link: str | None = None
    # Measured NVLink SHARP (NCCL_ALGO=NVLS) all-reduce bus bandwidth inside one domain of this level, B/s;
    # None = the switch has no NVLS (H100/H200-class NVSwitch and Blackwell's NVLink 5 switches have it).
    nvls_bandwidth: float | None = None
    # Seconds the network transport reports as its latency (ncclNetProperties_t.latency), which NCCL's tuner adds to
    # every network hop of every algorithm (tuning.cc: interLat += graphs[a]->latencyInter, and once more for Simple,
    # "the flush extra latency"). NCCL's own IB/RoCE transport reports 0 (src/transport/net_ib/init.cc "props->latency
    # = 0; // Not set"); a net plugin sets it for its fabric (aws-ofi-nccl: 75 us on p5.48xlarge EFA).
    net_latency: float = 0.0


LINK_KINDS = ("nvlink", "pci", "net")


def link_kind(level: NetworkLevel, index: int) -> str:
    """NCCL's hardware class of a level (tuning.cc hwLatencies rows): as the file says, else derived."""
    if level.link is not None:
        return level.link
    if index > 0:
        return "net"
    return "pci" if "pci" in level.name.lower() else "nvlink"


@dataclass(frozen=True)
class Hardware:
    name: str
    source: str
    device: Device
    network: tuple[NetworkLevel, ...]
    path: str = ""
    price_per_device_hour: float | None = None
    calibration: dict[str, Any] = field(default_factory=dict)

    def for_cudnn(self, version: str | None) -> Hardware:
        """This hardware with the fused-attention curve measured at a plan's cuDNN version (Device.for_cudnn)."""
        device = self.device.for_cudnn(version)
        return self if device is self.device else replace(self, device=device)

    @property
    def devices_per_node(self) -> int:
        return self.network[0].size or 1 if self.network else 1



_TOP_KEYS = ("name", "source", "description", "device", "network", "price_per_device_hour", "calibration",
             "extends")
MAX_EXTENDS_DEPTH = 8  # bases above a file; more is a mistake (a chain, not a cycle: cycles are caught apart)
_DEVICE_KEYS = (
    "name", "peak_flops", "memory", "memory_bandwidth", "launch_latency", "efficiency", "source", "sms", "dispatch",
    "memory_reserved", "memory_fragmentation", "speed_spread", "host", "host_link",
)
_HOST_LINK_KEYS = ("h2d", "d2h", "source")
_DISPATCH_KEYS = ("forward", "backward", "source")
_HOST_KEYS = ("cpu", "speed", "source", "cores")
MAX_HOST_SPEED = 100.0  # single-thread speed over the reference CPU; more is a typo, not a CPU
MIN_HOST_SPEED = 1 / MAX_HOST_SPEED  # and less: 1e-300 priced a launch at 1e295 s, 5e-324 at infinity (NaN steps)
_LEVEL_KEYS = ("name", "size", "bandwidth", "latency", "efficiency", "links_per_domain", "channels", "link",
               "nvls_bandwidth", "net_latency", "source")
_EFF_KEYS = ("peak", "half", "startup", "source", "tile", "tile_overhead_k", "algorithm_choice", "seq_half",
             "head_dim_64", "dtypes", "by_cudnn")
# one curve of `by_cudnn` (a whole fused-attention curve, measured at that version; its source is required)
_CUDNN_CURVE_KEYS = ("peak", "half", "startup", "source", "seq_half", "head_dim_64")
_CUDNN_KEY = re.compile(r"(0|[1-9][0-9]{0,3})(\.(0|[1-9][0-9]{0,3})){2}")  # major.minor.patch, as measured


def _quantity(node: dict, key: str, kind: str, file: str, where: str) -> float:
    try:
        return parse_quantity(node[key], kind)
    except DlperfError as err:
        raise err.located(file=file, line=line_of(node, key), field=field_name(where, key)) from None


def _positive_int(node: dict, key: str, file: str, where: str) -> int:
    from dlperf.plan import MAX_DEVICES

    value = node[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES:
        limit = f" of at most {MAX_DEVICES:,} (dlperf.plan.MAX_DEVICES)" if isinstance(value, int) and value > 1 else ""
        raise SpecError(expected=f"a positive integer{limit}", found=value, file=file, line=line_of(node, key),
                        field=field_name(where, key))
    return value


def _fraction(value: Any, file: str, line: int | None, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1 or \
            (isinstance(value, float) and value < 1e-6):
        raise SpecError(expected="a number in [1e-6, 1]", found=value, file=file, line=line, field=where)
    return float(value)


def _finite(value: int | float) -> float:
    """NaN and infinity, and an integer too large for a float, as infinity (which every bound rejects)."""
    try:
        number = float(value)
    except OverflowError:
        return math.inf
    return number if not math.isnan(number) else math.inf


def _text(node: dict, key: str, file: str, where: str) -> str:
    value = node[key]
    if not isinstance(value, str) or not value.strip():
        raise SpecError(
            expected="a non-empty string", found=value, file=file, line=line_of(node, key),
            field=field_name(where, key),
        )
    return value


def _efficiency(node: Any, file: str, where: str) -> dict[str, Efficiency]:
    check_keys(node, KERNEL_CLASSES, file, where)
    out = {}
    for cls in node:
        here = field_name(where, cls)
        curve = _section(node, cls, file, here)
        out[cls] = _curve(curve, cls, file, here)
        dtypes = _section(curve, "dtypes", file, field_name(here, "dtypes")) if "dtypes" in curve else {}
        check_keys(dtypes, DTYPES, file, field_name(here, "dtypes"))
        for dtype, sub in dtypes.items():
            for nested in ("dtypes", "by_cudnn"):
                if isinstance(sub, dict) and nested in sub:
                    raise SpecError(f"a per-dtype curve cannot nest {nested}", file=file, line=line_of(sub, nested),
                                    field=field_name(field_name(field_name(here, "dtypes"), dtype), nested))
            sub_where = field_name(field_name(here, "dtypes"), dtype)
            out[f"{cls}/{dtype}"] = _curve(_section(dtypes, dtype, file, sub_where), cls, file, sub_where)
    return out


def _by_cudnn(curve: dict, file: str, here: str) -> tuple[tuple[tuple[int, ...], str, Efficiency], ...]:
    """efficiency.attention_fa3.by_cudnn: {version: curve} -> Device.cudnn_curves, oldest first. Each version is a
    quoted or plain "major.minor.patch" string (9.19.1), each curve a whole attention_fa3 curve with its source."""
    where = field_name(here, "by_cudnn")
    node = _section(curve, "by_cudnn", file, where)
    if "dtypes" in curve:  # by_cudnn replaces the class's curve; per-dtype curves would keep the default's
        raise SpecError(expected="by_cudnn or dtypes on a fused-attention curve, not both", found="both", file=file,
                        line=line_of(curve, "by_cudnn"), field=where)
    if not node:
        raise SpecError(expected='one curve or more, keyed by a cuDNN version such as "9.19.1"', found="{}",
                        file=file, line=line_of(curve, "by_cudnn"), field=where)
    out: dict[tuple[int, ...], tuple[tuple[int, ...], str, Efficiency]] = {}
    for key in node:  # distinct keys are distinct versions: _CUDNN_KEY has no leading zeros
        entry = field_name(where, str(key))
        if not isinstance(key, str) or not _CUDNN_KEY.fullmatch(key):
            raise SpecError(expected='a cuDNN version, major.minor.patch in quotes, such as "9.19.1"', found=key,
                            file=file, line=line_of(node, key), field=entry)
        version = tuple(int(part) for part in key.split("."))
        sub = _section(node, key, file, entry)
        check_keys(sub, _CUDNN_CURVE_KEYS, file, entry, required=("peak", "source"))
        _text(sub, "source", file, entry)
        out[version] = (version, key, _curve(sub, "attention_fa3", file, entry))
    return tuple(out[v] for v in sorted(out))


def _curve(curve: Any, cls: str, file: str, here: str) -> Efficiency:
    check_keys(curve, _EFF_KEYS, file, here, required=("peak",))
    if "by_cudnn" in curve and cls != "attention_fa3":
        raise SpecError(expected="by_cudnn only on the attention_fa3 curve (cuDNN's fused attention)",
                        found=f"on {cls}", file=file, line=line_of(curve, "by_cudnn"),
                        field=field_name(here, "by_cudnn"))
    peak = _fraction(curve["peak"], file, line_of(curve, "peak"), field_name(here, "peak"))
    half = 0.0
    if "half" in curve:
        kind = "bytes" if cls in ("memory", "transcendental") else "flops"
        half = _quantity(curve, "half", kind, file, here)
    startup = _startup(curve, file, here) if "startup" in curve else None
    if "half" not in curve and startup is None:  # a file that gives only the peak keeps the default t0
        if cls in ("matmul", "attention", "attention_fa3"):
            startup = DEFAULT_EFFICIENCY["matmul"][2]
        elif cls == "memory":
            startup = DEFAULT_EFFICIENCY["memory"][2]
    tile = _tile(curve, file, here) if "tile" in curve else None
    overhead = _positive_int(curve, "tile_overhead_k", file, here) if "tile_overhead_k" in curve else 128
    choice = _algorithm_choice(curve, cls, file, here) if "algorithm_choice" in curve else False
    seq_half = _seq_half(curve, cls, file, here) if "seq_half" in curve else 0.0
    head_dim_64 = _head_dim_64(curve, cls, file, here) if "head_dim_64" in curve else None
    return Efficiency(peak, half, str(curve.get("source", "")), startup, tile, overhead, seq_half=seq_half,
                      head_dim_64=head_dim_64,
                      algorithm_choice=choice)


def _seq_half(curve: dict, cls: str, file: str, here: str) -> float:
    value, where = curve["seq_half"], field_name(here, "seq_half")
    if cls not in ("attention", "attention_fa3"):
        raise SpecError(expected="seq_half only on an attention or attention_fa3 curve", found=f"on {cls}",
                        file=file, line=line_of(curve, "seq_half"), field=where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e6:
        raise SpecError(expected="a number of tokens, 0 to 1e6", found=value, file=file,
                        line=line_of(curve, "seq_half"), field=where)
    return float(value)


def _head_dim_64(curve: dict, cls: str, file: str, here: str) -> tuple[float, float]:
    value, where, line = curve["head_dim_64"], field_name(here, "head_dim_64"), line_of(curve, "head_dim_64")
    if cls not in ("attention", "attention_fa3"):
        raise SpecError(expected="head_dim_64 only on an attention or attention_fa3 curve", found=f"on {cls}",
                        file=file, line=line, field=where)
    if not (isinstance(value, list) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1 for v in value)):
        raise SpecError(expected="[forward, backward] rate at head dim 64 over head dim 128's, each in (0, 1]",
                        found=value, file=file, line=line, field=where)
    return float(value[0]), float(value[1])


def _algorithm_choice(curve: dict, cls: str, file: str, here: str) -> bool:
    value, where = curve["algorithm_choice"], field_name(here, "algorithm_choice")
    if cls != "conv":
        raise SpecError(expected="algorithm_choice only on a conv curve", found=f"on {cls}", file=file,
                        line=line_of(curve, "algorithm_choice"), field=where)
    if not isinstance(value, bool):
        raise SpecError(expected="true or false", found=value, file=file, line=line_of(curve, "algorithm_choice"),
                        field=where)
    return value


def _startup(curve: dict, file: str, here: str) -> float:
    """Hockney's t0 beyond the launch: a positive time, or zero ('0 us') when the fitted t0 is all launch."""
    if isinstance(curve["startup"], str) and re.fullmatch(r"\s*0*\.?0*\s*(s|ms|us|ns)\s*", curve["startup"]):
        return 0.0
    return _quantity(curve, "startup", "time", file, here)


def _tile(curve: dict, file: str, here: str) -> tuple[int, int]:
    tile = curve["tile"]
    if not (isinstance(tile, list) and len(tile) == 2
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 < t <= 4096 for t in tile)):
        raise SpecError(expected="[rows, columns] of the output tile, e.g. [256, 128]", found=tile, file=file,
                        line=line_of(curve, "tile"), field=field_name(here, "tile"))
    return tile[0], tile[1]


def _section(parent: Any, key: Any, file: str, where: str) -> Any:
    """parent[key] (a mapping's key or a list's index), which must be a mapping. A null or a scalar carries no
    line of its own: it is reported at its key's line."""
    value = parent[key]
    if not isinstance(value, dict):
        raise SpecError("null" if value is None else "", expected="a mapping", found=value, file=file,
                        line=line_of(parent, key), field=where)
    return value


def _dispatch(node: Any, file: str) -> tuple[float, float]:
    where = "device.dispatch"
    check_keys(node, _DISPATCH_KEYS, file, where)
    fwd = _quantity(node, "forward", "time", file, where) if "forward" in node else DEFAULT_DISPATCH[0]
    bwd = _quantity(node, "backward", "time", file, where) if "backward" in node else DEFAULT_DISPATCH[1]
    return fwd, bwd


def _host(node: Any, file: str) -> tuple[str, float, int]:
    """device.host: the CPU's name, its single-thread speed over HOST_REFERENCE's (spec/hardware.py) and the node's
    physical cores, which the input pipeline's workers share (0: not given)."""
    where = "device.host"
    check_keys(node, _HOST_KEYS, file, where, required=("cpu", "speed"))
    cpu = _text(node, "cpu", file, where)
    value = node["speed"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not MIN_HOST_SPEED <= _finite(value) <= MAX_HOST_SPEED:
        raise SpecError(expected=f"a number from {MIN_HOST_SPEED:g} to {MAX_HOST_SPEED:g} (single-thread speed over "
                                 f"{HOST_REFERENCE})", found=value, file=file, line=line_of(node, "speed"),
                        field="device.host.speed")
    cores = _positive_int(node, "cores", file, where) if "cores" in node else 0
    return cpu, float(value), cores


def _device(node: Any, file: str) -> Device:
    where = "device"
    check_keys(node, _DEVICE_KEYS, file, where, required=("name", "peak_flops", "memory", "memory_bandwidth"))
    flops = _section(node, "peak_flops", file, "device.peak_flops")
    check_keys(flops, DTYPES, file, "device.peak_flops", required=("fp32",))
    peak = {dt: _quantity(flops, dt, "flop_rate", file, "device.peak_flops") for dt in flops}
    cpu, speed, cores = _host(_section(node, "host", file, "device.host"), file) if "host" in node else ("", 1.0, 0)
    if "dispatch" in node:  # measured (dlperf calibrate) on whatever host ran it: device.host no longer applies
        dispatch, cpu = _dispatch(_section(node, "dispatch", file, "device.dispatch"), file), MEASURED_HOST
    else:
        dispatch = (DEFAULT_DISPATCH[0] / speed, DEFAULT_DISPATCH[1] / speed)
    return Device(
        name=_text(node, "name", file, where),
        peak_flops=peak,
        memory=_quantity(node, "memory", "bytes", file, where),
        memory_bandwidth=_quantity(node, "memory_bandwidth", "bandwidth", file, where),
        launch_latency=(
            _quantity(node, "launch_latency", "time", file, where)
            if "launch_latency" in node else DEFAULT_LAUNCH_LATENCY
        ),
        efficiency=_efficiency(_section(node, "efficiency", file, "device.efficiency"), file, "device.efficiency")
        if "efficiency" in node else {},
        cudnn_curves=_cudnn_curves(node, file),
        sms=_positive_int(node, "sms", file, where) if "sms" in node else None,
        dispatch_forward=dispatch[0],
        dispatch_backward=dispatch[1],
        speed_spread=_speed_spread(node, file),
        host_cpu=cpu,
        host_speed=speed,
        host_cores=cores,
        **_reserve(node, file),
        **_host_link(node, file),
    )


def _cudnn_curves(node: dict, file: str) -> tuple[tuple[tuple[int, ...], str, Efficiency], ...]:
    """device.efficiency.attention_fa3.by_cudnn, parsed (the curve itself was checked by _efficiency)."""
    fused = node.get("efficiency", {}).get("attention_fa3")
    if not isinstance(fused, dict) or "by_cudnn" not in fused:
        return ()
    return _by_cudnn(fused, file, "device.efficiency.attention_fa3")


def _host_link(node: dict, file: str) -> dict[str, float]:
    """device.host_link: measured copy bandwidths per device, host to device (h2d) and device to host (d2h), each
    a copy engine's cudaMemcpyAsync rate to or from pinned host memory (nvbandwidth's *_memcpy_ce)."""
    if "host_link" not in node:
        return {}
    link = _section(node, "host_link", file, "device.host_link")
    check_keys(link, _HOST_LINK_KEYS, file, "device.host_link", required=("h2d", "d2h", "source"))
    return {"host_to_device": _quantity(link, "h2d", "bandwidth", file, "device.host_link"),
            "device_to_host": _quantity(link, "d2h", "bandwidth", file, "device.host_link")}


def _speed_spread(node: dict, file: str) -> float:
    """device.speed_spread (sigma over median of per-device compute time), default 0."""
    return _device_fraction(node, "speed_spread", file) if "speed_spread" in node else 0.0


def _device_fraction(node: dict, key: str, file: str) -> float:
    """device.<key>: a fraction in [0, 1)."""
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise SpecError(expected="a fraction in [0, 1)", found=value, file=file, line=line_of(node, key),
                        field=f"device.{key}")
    return float(value)


def _reserve(node: dict, file: str) -> dict[str, float]:
    """memory_reserved (bytes, may be 0) and memory_fragmentation (a fraction in [0, 1)) when the file gives them."""
    out: dict[str, float] = {}
    if "memory_reserved" in node:
        value = node["memory_reserved"]
        zero = value == 0 or (isinstance(value, str) and re.fullmatch(r"\s*0+(\.0*)?\s*[A-Za-z]*\s*", value))
        out["memory_reserved"] = 0.0 if zero else _quantity(node, "memory_reserved", "bytes", file, "device")
    if "memory_fragmentation" in node:
        out["memory_fragmentation"] = _device_fraction(node, "memory_fragmentation", file)
    return out


def _network(node: Any, file: str, line: int | None = None) -> tuple[NetworkLevel, ...]:
    """The levels of `network:` (`line`: the key's, for a value that carries none, such as null)."""
    if not isinstance(node, list) or not node:
        raise SpecError("null" if node is None else "", expected="a non-empty list of levels", found=node,
                        file=file, line=line_of(node) or line, field="network")
    levels, previous = [], 1
    for i in range(len(node)):
        where = f"network[{i}]"
        level = _section(node, i, file, where)
        last = i == len(node) - 1
        check_keys(level, _LEVEL_KEYS, file, where, required=("name", "bandwidth", "latency"))
        size = _positive_int(level, "size", file, where) if "size" in level else None
        if size is None and not last:
            raise SpecError("every level but the outermost needs a size", file=file, line=line_of(level),
                            field=field_name(where, "size"))
        if size is not None and (size < previous or size % previous):
            raise SpecError(expected=f"a multiple of the inner level's size {previous}", found=size,
                            file=file, line=line_of(level, "size"), field=field_name(where, "size"))
        previous = size or previous
        eff = level.get("efficiency", 1.0)
        links = _positive_int(level, "links_per_domain", file, where) if "links_per_domain" in level else None
        link = level.get("link")
        if link is not None and link not in LINK_KINDS:
            raise SpecError(expected="one of " + ", ".join(LINK_KINDS), found=link, file=file,
                            line=line_of(level, "link"), field=field_name(where, "link"))
        nvls = _quantity(level, "nvls_bandwidth", "bandwidth", file, where) if "nvls_bandwidth" in level else None
        net_latency = _quantity(level, "net_latency", "time", file, where) if "net_latency" in level else 0.0
        levels.append(NetworkLevel(
            name=_text(level, "name", file, where),
            size=size,
            bandwidth=_quantity(level, "bandwidth", "bandwidth", file, where),
            latency=_quantity(level, "latency", "time", file, where),
            efficiency=_fraction(eff, file, line_of(level, "efficiency"), field_name(where, "efficiency")),
            links_per_domain=links,
            channels=_positive_int(level, "channels", file, where) if "channels" in level else None,
            link=link,
            nvls_bandwidth=nvls,
            net_latency=net_latency,
        ))
    return tuple(levels)


def _base_path(data: dict, file: str) -> Path:
    """The file `extends:` names: a built-in hardware name, or a .yaml path relative to the extending file."""
    base = data["extends"]
    if not isinstance(base, str) or not base.strip():
        raise SpecError(expected="a built-in hardware name or a .yaml path", found=base, file=file,
                        line=line_of(data, "extends"), field="extends")
    path = builtins.resolve(base, "hardware")
    if path.parent != builtins.data_dir("hardware") and not path.is_absolute():
        path = Path(file).parent / path
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name too long for the system, a NUL byte in it
        found = False
    if not found:
        names = builtins.builtin_names("hardware")
        from dlperf.spec.yamlio import closest

        hint = closest(base, names)
        raise SpecError(f"no hardware file {base!r} to extend" + (f" (did you mean {hint!r}?)" if hint else ""),
                        expected="a built-in name (" + ", ".join(names) + ") or an existing .yaml path",
                        file=file, line=line_of(data, "extends"), field="extends")
    return path


def _merged(base: Any, over: Any) -> Any:
    """`over` on top of `base`: mappings key by key (a null value drops the key), anything else replaced."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    out = LineDict(base)
    out.line = getattr(over, "line", 0)
    out.key_lines = dict(getattr(base, "key_lines", {}))
    for key, value in over.items():
        out.key_lines[key] = line_of(over, key) or 0
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(base.get(key), value)
    return out


def _resolve_extends(data: Any, file: str, chain: tuple[str, ...] = ()) -> Any:
    """The document with its `extends:` chain applied; each base is checked as a whole hardware file first, so
    that an error in it names the base's file and line."""
    if not isinstance(data, dict) or "extends" not in data:
        return data
    path = _base_path(data, file)
    here = str(Path(file).resolve())
    seen = chain + (here,)
    if str(path.resolve()) in seen or len(seen) > MAX_EXTENDS_DEPTH:
        what = "extends itself (a cycle)" if str(path.resolve()) in seen else \
            f"more than {MAX_EXTENDS_DEPTH} bases deep (MAX_EXTENDS_DEPTH)"
        raise SpecError(f"{data['extends']!r} {what}", file=file, line=line_of(data, "extends"), field="extends")
    if "name" not in data:  # else it would load, and be reported, under its base's name
        raise SpecError("a hardware file that extends another needs its own name", file=file,
                        line=line_of(data, "extends"), field="name", expected="name: <this machine>")
    base = _resolve_extends(load_yaml_file(path), str(path), seen)
    _hardware(base, str(path))
    child = LineDict((k, v) for k, v in data.items() if k != "extends")
    child.line, child.key_lines = getattr(data, "line", 0), dict(getattr(data, "key_lines", {}))
    return _merged(base, child)


def hardware_from_dict(data: Any, file: str) -> Hardware:
    """A hardware spec from a parsed YAML document (its `extends:` chain applied)."""
    return _hardware(_resolve_extends(data, file), file)


def _hardware(data: Any, file: str) -> Hardware:
    check_keys(data, _TOP_KEYS, file, "", required=("name", "device", "network"))
    price = data.get("price_per_device_hour")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))
                              or not 0 < _finite(price) <= 1e9):
        raise SpecError(expected="a positive number (USD, finite, at most 1e9)", found=price, file=file,
                        line=line_of(data, "price_per_device_hour"), field="price_per_device_hour")
    calibration = data.get("calibration", {})
    if not isinstance(calibration, dict):
        raise SpecError(expected="a mapping", found=calibration, file=file, line=line_of(data, "calibration"),
                        field="calibration")
    hw = Hardware(
        name=_text(data, "name", file, ""),
        source=str(data.get("source", "")),
        device=_device(_section(data, "device", file, "device"), file),
        network=_network(data["network"], file, line_of(data, "network")),
        path=file,
        price_per_device_hour=float(price) if price is not None else None,
        calibration=dict(calibration),
    )
    _check_host_cores(hw, data["device"], file)
    return hw


def _check_host_cores(hw: Hardware, device: dict, file: str) -> None:
    """device.host.cores must outnumber the node's devices: each training process keeps a core busy issuing
    kernels and its loader workers share the rest (dlperf.engine.input); with none left they would supply no
    samples, and the step would never end."""
    cores, devices = hw.device.host_cores, hw.devices_per_node
    if cores and cores <= devices:
        raise SpecError(expected=f"more than the node's {devices} devices (network[0].size; one core per training "
                                 "process, the rest for its loader workers)", found=cores, file=file,
                        line=line_of(device["host"], "cores"), field="device.host.cores")


def load_hardware(name_or_path: str | Path) -> Hardware:
    """Load a built-in hardware spec by name (`dgx-a100`) or a YAML file by path."""
    path = builtins.resolve(str(name_or_path), "hardware")
    if not path.exists() and not builtins.is_builtin(str(name_or_path), "hardware") and path.parent == \
            builtins.data_dir("hardware"):
        names = builtins.builtin_names("hardware")
        from dlperf.spec.yamlio import closest

        hint = closest(str(name_or_path), names)
        raise SpecError(f"unknown hardware {str(name_or_path)!r}" + (f" (did you mean {hint!r}?)" if hint else ""),
                        expected="a built-in name (" + ", ".join(names) + ") or a .yaml path")
    return hardware_from_dict(load_yaml_file(path), str(path))
