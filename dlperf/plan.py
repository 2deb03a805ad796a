"""A plan says how one training step runs on the cluster; `validate(plan)` checks its rules with one-line errors."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dlperf.errors import PlanError

SCHEDULES = ("gpipe", "1f1b", "interleaved", "dualpipe")
RECOMPUTE = ("none", "selective", "full", "except_last")
OPTIMIZERS = ("sgd", "momentum", "adam")
CONSISTENCY = ("sync", "ssp", "async")
# Compute dtypes; fp8, mxfp8 and nvfp4 name low-precision training recipes (dlperf.ops.fp8); gradients never travel
# in a block-scaled format (mxfp8, nvfp4).
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
GRAD_DTYPES = DTYPES[:-2]
CP_ALGORITHMS = ("ring", "ulysses")
# Parts of a layer whose outputs are not kept for backward but recomputed there (Megatron-Core's
# --recompute-modules names; DeepSeek-V3, arXiv:2412.19437, Sec. 3.2.3 and 3.3.3): "layernorm", every
# RMSNorm/LayerNorm (its output, the next projection's input, is rebuilt from its kept input); "mla_up_proj",
# MLA's query and key/value up-projections (their per-head Q, K, V rebuilt from the kept latents); "moe_act", the
# experts' SwiGLU/GELU (its input kept, its output rebuilt). dlperf.ops.recompute prices each.
RECOMPUTE_MODULES = ("layernorm", "mla_up_proj", "moe_act")
# How expert tokens travel: "alltoall", Megatron-Core's all-to-all dispatcher (BF16 both ways, hierarchical legs
# one after the other); "deepep", DeepSeek's DeepEP kernels (arXiv:2412.19437 Sec. 3.2.2 and 3.3.3: dispatch
# quantized to FP8 under an FP8 recipe, combine in BF16, IB and NVLink legs overlapped, 20 SMs); "hybridep",
# NVIDIA's Hybrid-EP kernels in DeepEP's hybrid-ep branch as Megatron-Core's flex dispatcher runs them (BF16 both
# ways, legs overlapped as DeepEP's, 32 SMs: dlperf.engine.context.HYBRIDEP_SMS).
EP_DISPATCHERS = ("alltoall", "deepep", "hybridep")
FP8_SCALINGS = ("delayed", "current")  # the fp8 recipe's scales: from an amax history, or from the tensor cast
# Which FP8 copies of a weight the fp8 recipe keeps between the per-step cast and its GEMMs (dlperf.ops.fp8
# weight_copy_bytes): "cached", the FP8 weight and its FP8 transpose (Transformer Engine caches both across a
# step's micro-batches, Hopper's FP8 GEMMs taking only the TN layout); "per_use", one FP8 copy, transposed by a
# kernel of its own before each GEMM that reads the other layout, as DeepSeek-V3's own training framework does
# (deepseek-ai/profile-data @4496024 train.json, one DualPipe forward/backward chunk pair at the DeepSeek-V3
# pre-training settings: no weight is quantized inside either chunk, and `batched_transpose<512, 128, 1, 1>`
# kernels over FP8 bytes, each the size of a weight, run before the routed experts' forward grouped GEMMs and
# before every other FP8 linear's data-gradient GEMM).
FP8_WEIGHT_TRANSPOSES = ("cached", "per_use")
# The dtype an optimizer keeps its moments in (Adam's first and second, momentum SGD's buffer): fp32, or bf16 as
# DeepSeek-V3 does ("We adopt the BF16 data format instead of FP32 to track the first and second moments in the
# AdamW optimizer ... the master weights (stored by the optimizer) and gradients (used for batch size
# accumulation) are still retained in FP32", arXiv:2412.19437 Sec. 3.3.3, "Low-Precision Optimizer States").
MOMENT_DTYPES = ("fp32", "bf16")
# Which MXFP8 GEMM operands have their scales swizzled for cuBLASLt by kernels of their own (dlperf.ops.fp8._SWIZZLED):
# "quantize", Transformer Engine >= 2.12 (the quantizers write activations' and gradients' scales swizzled; weights
# and sequence-parallel gathers are swizzled per GEMM); "gemm", Transformer Engine < 2.12 (both operands of every GEMM).
MX_SWIZZLES = ("quantize", "gemm")
# How ZeRO gathers and reduces. At stage 3 (dlperf.engine.zero_impl): "fsdp", one collective per repeated block with
# prefetch (PyTorch FSDP, the default); "megatron-fsdp", Megatron-Core's FSDP (use_megatron_fsdp), which gathers and
# reduces as "fsdp" does but keeps a 16-bit or FP8 model-weight shard beside the fp32 main weights
# (dlperf.engine.memory); "deepspeed-0.3", DeepSpeed v0.3.12-v0.4.0's stage 3 (per-tensor gathers through list
# collectives, device-wide synchronisation, bucketed gradient allreduce). At stage 2 with overlap, "fsdp" is FSDP's
# SHARD_GRAD_OP (per-block gathers in every forward); at stage 1 it prices DeepSpeed ZeRO-1's gather after the step
# (FSDP has no stage 1), and "megatron" is Megatron-Core's distributed optimizer, whose overlap_param_gather hides
# the gather bucket by bucket behind the next forward (dlperf.engine.step._megatron_param_gather).
ZERO_IMPLS = ("fsdp", "megatron-fsdp", "deepspeed-0.3", "megatron")
PER_BLOCK_ZERO_IMPLS = ("fsdp", "megatron-fsdp")  # one gather per repeated block with prefetch
# Who runs the data-parallel gradient allreduce (dlperf.engine.horovod): "nccl", the framework calling NCCL itself
# (PyTorch DDP's buckets, Megatron-LM); "horovod-0.19", Horovod v0.18-v0.20's background thread (5 ms negotiation
# cycle, 64 MiB fusion buffer, TensorFlow frontend's compression casts and averaging), as NVIDIA's TensorFlow 1
# examples ran it; "post-backward", the gradients flattened, all-reduced and copied back after the backward pass,
# nothing overlapped (DeepSpeed's engine without ZeRO, Megatron-LM's local DDP of 2019-2021: engine.post_backward).
DP_IMPLS = ("nccl", "horovod-0.19", "post-backward")
# Activation layout of convolutional networks: "nhwc" (PyTorch channels_last, TensorFlow's default, what cuDNN's
# tensor-core convolutions read and write) or "nchw" (PyTorch's default contiguous format), in which every
# tensor-core convolution pays cuDNN's NCHW <-> NHWC transposes (dlperf.ops.conv.layout_transpose_kernel).
MEMORY_FORMATS = ("nhwc", "nchw")
# Where training samples come from (dlperf.engine.input): "synthetic", tensors already on the device (no input
# pipeline, no cap); "cpu", a PyTorch DataLoader whose `loader_workers` processes per training process run
# `input_ops` (names in dlperf.engine.input.INPUT_COSTS) on the host's CPU, which caps the step when slower.
DATA_BACKENDS = ("synthetic", "cpu")
# How the optimizer step runs (dlperf.engine.optimizer_loop): "fused", one pass over all parameters (apex and
# Megatron fused optimizers, PyTorch >= 2.0's foreach/fused defaults on GPU); "per-tensor", PyTorch < 2.0's
# torch.optim for-loop: a few small kernels per parameter tensor, and zero_grad zeroes each gradient;
# "deepspeed-fp16" and "megatron-fp16-2020", DeepSpeed's and Megatron-LM's 2019-2020 FP16_Optimizer around a fused
# update (per-tensor overflow checks with a host sync each, gradient copies, fp16 weight refresh:
# dlperf.engine.fp16_wrappers).
FP16_WRAPPERS = ("deepspeed-fp16", "megatron-fp16-2020")
OPTIMIZER_IMPLS = ("fused", "per-tensor", "tf1-graph", *FP16_WRAPPERS)  # tf1-graph: dlperf.engine.tf1_update
# The cuDNN library Transformer Engine's fused attention runs (plan `cudnn`, e.g. "9.13.1"): a hardware file may
# measure its fused-attention curve per cuDNN version (`efficiency.attention_fa3.by_cudnn`), and a plan that names
# its version is priced at the newest one measured at or below it (dlperf.spec.hardware.Device.for_cudnn). None:
# the file's default curve. major.minor.patch, optionally .build as NVIDIA's release notes write it (9.13.1.26).
CUDNN_VERSION = re.compile(r"(0|[1-9][0-9]{0,3})(\.(0|[1-9][0-9]{0,3})){2,3}")
# Which modules run as CUDA graphs (plan `cuda_graphs`), Megatron-Core's cuda_graph_scope names (CudaGraphScope in
# megatron/core/transformer/enums.py, NVIDIA/Megatron-LM @3758b54b:61-71): "attn", a layer's input norm and attention
# block; "mlp", a dense layer's pre-MLP norm and MLP; "moe", a MoE layer whole (drop-and-pad layers only);
# "moe_router", a MoE layer's pre-MLP norm and router; "moe_preprocess", the dispatcher's preprocessing (requires
# moe_router); "mamba", a hybrid stack's Mamba layers (CudaGraphScope.mamba); "full_iteration", Megatron-Core's whole
# forward-backward (cuda_graph_impl local). Empty: eager.
# dlperf.engine.cuda_graphs prices them.
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration")
MAX_LOADER_WORKERS = 1024  # per training process; more is a typo (a node has a few hundred cores)
# Default load imbalance of dropless expert routing: the busiest expert-parallel rank gets this many times the
# mean number of routed tokens. Source: Switch Transformer (Fedus et al. 2022, JMLR 23, Sec. 2.2 and Table 1),
# whose capacity factor -- expert buffer / mean tokens per expert -- of 1.25 is the headroom over the mean load
# that its auxiliary-loss-balanced router needs to drop few tokens; dropless routing (Megatron-Core's default)
# instead runs the busiest rank at that load. A plan knob (--moe-imbalance); 1.0 is perfect balance.
MOE_IMBALANCE = 1.25
# Budgets (issue #15): the engine keeps per-device state for some collectives, and a plan of 10^9 devices
# asked for 15 GB. The largest published training clusters have ~10^5 accelerators.
MAX_DEVICES = 2**20
MAX_BATCH = 2**40


@dataclass(frozen=True)
class Plan:
    devices: int = 1
    dp: int | None = None
    tp: int = 1
    pp: int = 1
    global_batch: int = 1
    micro_batch: int | None = None
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    overlap: bool | None = None          # DP allreduce overlapped with backward; None = default for the plan
    compression: str = "none"
    consistency: str = "sync"
    staleness: int = 0
    dtype: str | None = None             # None = the model's dtype
    optimizer: str = "adam"
    moment_dtype: str = "fp32"           # dtype of the optimizer's moments (MOMENT_DTYPES)
    parameter_server: int = 0            # >0: data parallelism through that many sharded servers instead
    grad_dtype: str | None = None        # None = the compute dtype's storage type
    hybrid_fc: bool = False              # Krizhevsky 2014: data-parallel convolutions, model-parallel FC head
    tp_overlap: bool = False             # tp all-gather/reduce-scatter pipelined with the GEMMs (needs SP)
    fp8_param_gather: bool = False       # ZeRO parameter all-gathers in FP8, MXFP8's in bf16 (needs an FP8 recipe)
    fp8_scaling: str = "delayed"         # how the fp8 recipe takes its scales (FP8_SCALINGS)
    fp8_weight_transpose: str = "cached"  # FP8 weight copies: with transposes, or one (FP8_WEIGHT_TRANSPOSES)
    mx_swizzle: str = "quantize"         # which mxfp8 GEMM operands are swizzled by kernels of their own (MX_SWIZZLES)
    ep: int = 1                          # expert parallelism: experts sharded over ep ranks of the dp*cp group
    etp: int | None = None               # expert tensor parallelism (expert_tp); None: tp, the dense layers' split
    cp: int = 1                          # context parallelism: each sequence split over cp ranks
    cp_algorithm: str = "ring"           # ring attention (KV passed around) or ulysses (all-to-all over heads)
    moe_imbalance: float | None = None   # busiest expert rank's tokens / mean (None: MOE_IMBALANCE)
    ep_overlap: bool = False             # dispatch/combine hidden behind an adjacent micro-batch (combined 1F1B)
    p2p_overlap: bool = False            # interleaved 1F1B's steady pipeline sends beside compute (overlap_p2p_comm)
    zero_impl: str = "fsdp"              # which ZeRO implementation runs (ZERO_IMPLS)
    dp_impl: str = "nccl"                # who runs the data-parallel gradient allreduce (DP_IMPLS)
    recompute_modules: tuple[str, ...] = ()  # layer parts recomputed in backward (RECOMPUTE_MODULES)
    fp8_activations: bool = False        # Linear inputs inside MLA/MoE cached in FP8 (DeepSeek-V3 Sec. 3.3.3)
    ep_dispatcher: str = "alltoall"      # how expert tokens travel (EP_DISPATCHERS)
    memory_format: str = "nhwc"          # activation layout of convolutions (MEMORY_FORMATS)
    data_backend: str = "synthetic"      # where samples come from (DATA_BACKENDS)
    loader_workers: int = 0              # CPU loader worker processes per training process (data_backend cpu)
    input_ops: tuple[str, ...] = ()      # per-sample CPU work of the loader (dlperf.engine.input.INPUT_COSTS)
    grad_passes: tuple[str, ...] = ()    # per-micro-batch passes over the gradient (engine.grad_passes.GRAD_PASSES)
    offload_layers: int = 0              # blocks whose saved activations go to host memory (dlperf.engine.offload)
    optimizer_impl: str = "fused"        # how the optimizer step runs (OPTIMIZER_IMPLS)
    cudnn: str | None = None             # cuDNN version fused attention runs (CUDNN_VERSION); None: the file's default
    cuda_graphs: tuple[str, ...] = ()    # modules captured as CUDA graphs (CUDA_GRAPH_SCOPES); empty: eager

    @property
    def data_parallel(self) -> int:
        return self.dp if self.dp is not None else self.devices // (self.tp * self.pp * self.cp)

    @property
    def expert_tp(self) -> int:
        """Ranks each expert's matrices are split over (Megatron-Core's --expert-tensor-parallel-size, whose
        default is the tensor-parallel size: megatron/training/arguments.py @92c8482e:465-466)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_data_parallel(self) -> int:
        """Replicas of each expert shard, over which expert gradients are reduced (Megatron-Core's expert-data-
        parallel group): the data- and context-parallel ranks that hold the same experts; with the experts
        folded onto their own grid (expert_tp < tp), tp*dp*cp / (ep*expert_tp), as initialize_model_parallel
        sizes it (world / (etp*ep*pp): megatron/core/parallel_state.py @92c8482e:743-752)."""
        if self.expert_tp == self.tp:
            return self.data_parallel * self.cp // self.ep
        return self.tp * self.data_parallel * self.cp // (self.ep * self.expert_tp)

    @property
    def imbalance(self) -> float:
        return MOE_IMBALANCE if self.moe_imbalance is None else self.moe_imbalance

    @property
    def micro(self) -> int:
        per_replica = self.global_batch // self.data_parallel
        return self.micro_batch if self.micro_batch is not None else per_replica

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.data_parallel * self.micro)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(dp=self.data_parallel, micro_batch=self.micro, micro_batches=self.micro_batches)
        return out

    def with_(self, **changes: Any) -> Plan:
        """dataclasses.replace(self, **changes), as `fast_replace` does it: search calls it hundreds of thousands
        of times."""
        return fast_replace(self, _FIELDS, changes)


_FIELDS = frozenset(f.name for f in fields(Plan))


def _etp(plan: Plan) -> str:
    """The plan's etp for an error's `found` when it folds its experts (`folded`), else nothing."""
    return f" etp={plan.etp}" if folded(plan) else ""


def folded(plan: Plan) -> bool:
    """Whether the experts run on a grid of their own (expert_tp < tp, Megatron-Core's MoE parallel folding), whose
    expert-data-parallel group is not the dense layers' dp*cp/ep."""
    return plan.expert_tp != plan.tp


def fast_replace(obj: Any, names: frozenset[str], changes: dict[str, Any]) -> Any:
    """dataclasses.replace(obj, **changes) without re-running __init__, for a dataclass without __post_init__
    whose field names are `names` (Plan, engine.stage.StageCost); the copy shares mutable fields, as replace's
    does, and a name that is not a field still raises replace's error."""
    if not changes.keys() <= names:
        return replace(obj, **changes)
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


def _positive(name: str, value: Any, limit: int = MAX_DEVICES) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{name} must be a positive integer", expected="an integer >= 1", found=value)
    if value > limit:
        raise PlanError(f"{name} must be at most {limit:,} (the limit dlperf.plan)", found=value)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise PlanError(f"{name}", expected="one of " + ", ".join(choices), found=value)


def _check_knobs(plan: Plan) -> None:
    """Options that are not degrees: each must name something dlperf can price."""
    from dlperf.comm.compression import parse_compression

    parse_compression(plan.compression)
    for name in ("parameter_server", "staleness"):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanError(name, expected="an integer >= 0", found=value)
    if plan.parameter_server > plan.devices:
        # a server is a process on one of the cluster's devices (survey section 5.2, sharded PS): more servers
        # than devices would be links that do not exist, and would beat the network's bandwidth
        raise PlanError("parameter_server", expected=f"at most one server per device (<= {plan.devices})",
                        found=plan.parameter_server)
    if plan.grad_dtype is not None:
        _choice("grad_dtype", plan.grad_dtype, GRAD_DTYPES)
    _choice("cp_algorithm", plan.cp_algorithm, CP_ALGORITHMS)
    _choice("memory_format", plan.memory_format, MEMORY_FORMATS)
    if plan.cudnn is not None:
        cudnn_version(plan.cudnn)
    _check_impls(plan)
    _check_activation_knobs(plan)
    _check_offload(plan)
    _check_input(plan)
    _check_grad_passes(plan)
    check_cuda_graphs(plan.cuda_graphs)
    value = plan.moe_imbalance
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 1 <= value <= 1000):  # also refuses NaN and infinity
        raise PlanError("moe_imbalance", expected="a number from 1 to 1000 (busiest rank's tokens / mean)",
                        found=value)


def cudnn_version(text: Any, field: str = "cudnn") -> tuple[int, ...]:
    """A cuDNN version string ("9.13.1", or "9.13.1.26" with the build) as a tuple of integers, ordered as the
    library's releases are; anything else is refused with the field it came from."""
    if not isinstance(text, str) or not CUDNN_VERSION.fullmatch(text):
        raise PlanError(field, expected='a cuDNN version string, major.minor.patch[.build], such as "9.13.1"',
                        found=text)
    return tuple(int(part) for part in text.split("."))


def _check_impls(plan: Plan) -> None:
    """Which implementation runs the optimizer step, ZeRO stage 3 and the data-parallel allreduce: each is priced
    for the plans its code runs."""
    _choice("optimizer_impl", plan.optimizer_impl, OPTIMIZER_IMPLS)
    if plan.optimizer_impl in ("per-tensor", "tf1-graph", *FP16_WRAPPERS) and plan.zero:
        # ZeRO updates flat shards of the parameters, not the model's tensors one by one
        raise PlanError(f"optimizer_impl {plan.optimizer_impl} updates whole parameter tensors one by one; ZeRO "
                        "updates flat shards", expected="zero: 0", found=plan.zero)
    if plan.optimizer_impl in FP16_WRAPPERS and plan.dtype not in (None, "fp16"):  # None: the model's (StepModel)
        raise PlanError(f"optimizer_impl {plan.optimizer_impl} is an fp16 optimizer wrapper", expected="dtype: fp16",
                        found=plan.dtype)
    _choice("zero_impl", plan.zero_impl, ZERO_IMPLS)
    if plan.zero_impl == "megatron" and plan.zero != 1:
        raise PlanError("zero_impl megatron is Megatron-Core's distributed optimizer, ZeRO stage 1", expected="zero: 1",
                        found=plan.zero)
    if plan.zero_impl not in ("fsdp", "megatron") and plan.zero != 3:
        raise PlanError(f"zero_impl {plan.zero_impl} describes ZeRO stage 3", expected="zero: 3", found=plan.zero)
    if plan.zero_impl == "deepspeed-0.3" and (plan.pp > 1 or plan.cp > 1 or plan.ep > 1 or folded(plan)):
        # priced for a flat data-parallel group only (dlperf.engine.zero_impl counts one stage's tensors, dp ranks)
        raise PlanError("zero_impl deepspeed-0.3 runs without pipeline, context or expert parallelism",
                        expected="pp = cp = ep = 1, etp = tp",
                        found=f"pp={plan.pp} cp={plan.cp} ep={plan.ep}{_etp(plan)}")
    _check_dp_impl(plan)


def _check_dp_impl(plan: Plan) -> None:
    """Horovod is priced for what its TensorFlow frontend offers: an allreduce of whole gradients (no ZeRO, no
    parameter server) with Compression.none or Compression.fp16, over a flat data-parallel group; post-backward
    likewise whole, uncompressed and flat (_check_post_backward)."""
    from dlperf.comm.compression import parse_compression
    from dlperf.engine.horovod import SCHEMES

    _choice("dp_impl", plan.dp_impl, DP_IMPLS)
    if plan.dp_impl == "nccl":
        return
    if plan.zero or plan.parameter_server:
        raise PlanError(f"dp_impl {plan.dp_impl} allreduces whole gradients", expected="zero 0, parameter_server 0",
                        found=f"zero {plan.zero}, parameter_server {plan.parameter_server}")
    if plan.dp_impl == "post-backward":
        _check_post_backward(plan)
    elif parse_compression(plan.compression) not in [parse_compression(name) for name in SCHEMES]:
        raise PlanError(f"dp_impl {plan.dp_impl} compresses with Compression.none or Compression.fp16",
                        expected="compression " + " or ".join(SCHEMES), found=plan.compression)
    if plan.cp > 1 or plan.ep > 1 or folded(plan):
        raise PlanError(f"dp_impl {plan.dp_impl} is priced for a flat data-parallel group",
                        expected="cp = ep = 1, etp = tp", found=f"cp={plan.cp} ep={plan.ep}{_etp(plan)}")


def _check_post_backward(plan: Plan) -> None:
    """A post-backward all-reduce runs after the backward pass (never overlapped), uncompressed (dlperf.engine.
    post_backward); over one flat data-parallel group, as Horovod's (_check_dp_impl)."""
    if plan.overlap:
        raise PlanError("dp_impl post-backward all-reduces after the backward pass: nothing overlaps it",
                        expected="overlap false or unset", found=plan.overlap)
    if plan.compression != "none":
        raise PlanError("dp_impl post-backward all-reduces uncompressed gradients", expected="compression none",
                        found=plan.compression)


def _check_activation_knobs(plan: Plan) -> None:
    """Recomputed modules must be named in RECOMPUTE_MODULES (each once); FP8 activation caching and DeepEP
    describe an FP8 recipe's and an expert-parallel run's machinery."""
    modules = plan.recompute_modules
    _check_names("recompute_modules", modules, RECOMPUTE_MODULES)
    if modules and plan.recompute in ("full", "except_last"):
        raise PlanError("recompute_modules names parts of a layer to recompute: full recomputation already reruns "
                        "them", expected="--recompute none or selective", found=plan.recompute)
    if plan.fp8_activations and plan.dtype != "fp8":
        raise PlanError("--fp8-activations caches activations in FP8: it needs --dtype fp8", found=plan.dtype)
    _choice("ep_dispatcher", plan.ep_dispatcher, EP_DISPATCHERS)
    _choice("fp8_scaling", plan.fp8_scaling, FP8_SCALINGS)
    if plan.fp8_scaling != "delayed" and plan.dtype != "fp8":
        raise PlanError(f"--fp8-scaling {plan.fp8_scaling} is how the per-tensor FP8 recipe scales (mxfp8 and nvfp4 "
                        "carry block scales)", expected="--dtype fp8", found=plan.dtype)
    check_fp8_weight_transpose(plan.fp8_weight_transpose, plan.dtype)
    _choice("mx_swizzle", plan.mx_swizzle, MX_SWIZZLES)
    if plan.mx_swizzle != "quantize" and plan.dtype != "mxfp8":
        raise PlanError(f"--mx-swizzle {plan.mx_swizzle} is how the MXFP8 recipe lays out its block scales",
                        expected="--dtype mxfp8", found=plan.dtype)
    if plan.ep_dispatcher != "alltoall" and plan.ep == 1:
        raise PlanError(f"--ep-dispatcher {plan.ep_dispatcher} moves expert tokens: it needs ep > 1", found=plan.ep)


def check_fp8_weight_transpose(value: Any, dtype: str | None) -> None:
    """One of FP8_WEIGHT_TRANSPOSES; per_use transposes the per-tensor FP8 recipe's one weight copy, so it needs
    that recipe (MXFP8 and NVFP4 quantize their column-wise copies from the 16-bit weight on their own)."""
    _choice("fp8_weight_transpose", value, FP8_WEIGHT_TRANSPOSES)
    if value != "cached" and dtype != "fp8":
        raise PlanError(f"--fp8-weight-transpose {value} transposes the per-tensor FP8 recipe's weight copy (mxfp8 "
                        "and nvfp4 quantize their column-wise copies on their own)", expected="--dtype fp8",
                        found=dtype)


def _check_offload(plan: Plan) -> None:
    """Activation offloading as Megatron-Core runs it through Transformer Engine (dlperf.engine.offload): one model
    chunk per device whose forward and backward alternate, every layer's activations kept (TE's synchroniser
    counts the model's layers, TransformerBlock passes config.num_layers; pipelines, full recomputation and
    DualPipe's paired chunks are not priced)."""
    n = plan.offload_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise PlanError("offload_layers", expected="an integer >= 0", found=n)
    if n and plan.pp > 1:
        raise PlanError("offload_layers is priced for one pipeline stage", expected="pp = 1", found=plan.pp)
    if n and plan.recompute in ("full", "except_last"):
        raise PlanError("offload_layers moves kept activations: full recomputation keeps none to move",
                        expected="--recompute none or selective", found=plan.recompute)


def _check_input(plan: Plan) -> None:
    """A CPU input pipeline needs workers and the per-sample work they do; synthetic data has neither."""
    from dlperf.engine.input import INPUT_COSTS

    _choice("data_backend", plan.data_backend, DATA_BACKENDS)
    workers, ops = plan.loader_workers, plan.input_ops
    if isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= MAX_LOADER_WORKERS:
        raise PlanError("loader_workers", expected=f"an integer from 0 to {MAX_LOADER_WORKERS}", found=workers)
    _check_names("input_ops", ops, INPUT_COSTS)
    if plan.data_backend == "cpu" and (workers == 0 or not ops):
        raise PlanError("data_backend cpu runs a loader: it needs loader_workers >= 1 and input_ops",
                        expected="loader_workers >= 1, input_ops named", found=f"{workers} workers, {len(ops)} ops")
    if plan.data_backend == "synthetic" and (workers or ops):
        raise PlanError("loader_workers and input_ops describe a CPU loader: they need data_backend cpu",
                        expected="data_backend cpu", found=plan.data_backend)


def _check_grad_passes(plan: Plan) -> None:
    """Per-micro-batch gradient passes must be named in GRAD_PASSES, each once."""
    from dlperf.engine.grad_passes import GRAD_PASSES

    _check_names("grad_passes", plan.grad_passes, GRAD_PASSES)


def check_cuda_graphs(scopes: Any) -> None:
    """Scope names Megatron-Core accepts together (megatron/core/transformer/enums.py @3758b54b:61-71): distinct
    names of CUDA_GRAPH_SCOPES; moe_preprocess only with moe_router; full_iteration alone (the local
    implementation's whole-iteration graph); moe (the whole MoE layer) not beside its own router part."""
    _check_names("cuda_graphs", scopes, CUDA_GRAPH_SCOPES)
    if "moe_preprocess" in scopes and "moe_router" not in scopes:
        raise PlanError("cuda_graphs moe_preprocess captures the dispatcher after the router: it needs moe_router",
                        expected="moe_router,moe_preprocess", found=",".join(scopes))
    if "full_iteration" in scopes and len(scopes) > 1:
        raise PlanError("cuda_graphs full_iteration captures the whole iteration: it takes no other scope",
                        expected="full_iteration alone", found=",".join(scopes))
    if "moe" in scopes and "moe_router" in scopes:
        raise PlanError("cuda_graphs moe captures the whole MoE layer, its router included",
                        expected="moe or moe_router", found=",".join(scopes))


def _check_names(field: str, names: Any, known: Any) -> None:
    """A tuple of distinct names, each a key of `known`."""
    if not isinstance(names, tuple) or any(n not in known for n in names) or len(set(names)) != len(names):
        raise PlanError(field, expected="distinct names among " + ", ".join(known),
                        found=",".join(map(str, names)) if isinstance(names, tuple) else names)


def check_degrees(plan: Plan) -> None:
    """dp*tp*pp(*cp) = devices, and expert parallelism carved out of the data- and context-parallel ranks."""
    inner, names = plan.tp * plan.pp * plan.cp, "tp*pp" + ("*cp" if plan.cp > 1 else "")
    if plan.dp is None and plan.devices % inner:
        raise PlanError(f"{names} = {inner} must divide the device count {plan.devices}")
    dp = plan.data_parallel
    if dp < 1 or dp * inner != plan.devices:
        cp = f"*{plan.cp}" if plan.cp > 1 else ""
        raise PlanError(f"dp*{names} must equal the device count: {dp}*{plan.tp}*{plan.pp}{cp} != {plan.devices}")
    if plan.etp is not None:
        _check_expert_grid(plan, dp)
    if plan.expert_tp == plan.tp and (dp * plan.cp) % plan.ep:
        within = f"dp*cp={dp * plan.cp}" if plan.cp > 1 else f"the data-parallel degree dp={dp}"
        raise PlanError(f"ep={plan.ep} must divide {within} (expert parallelism is carved out of the data- and "
                        "context-parallel ranks, as Megatron-Core's expert_decoder_rank_generator folds cp into them)")


def _check_expert_grid(plan: Plan, dp: int) -> None:
    """Megatron-Core's MoE parallel folding (Liu et al. 2025, arXiv:2504.14960): the experts' own grid, etp x ep x
    edp, covers the same tp*dp*cp ranks of a pipeline stage as the dense layers' (megatron/core/parallel_state.py
    @92c8482e:743-763, expert_decoder_rank_generator). dlperf prices the experts split as the dense layers are
    (etp = tp) or unsplit (etp = 1), with sequence parallelism: Megatron-Core's MoE layer refuses tensor
    parallelism without it in training (moe_layer.py @92c8482e:288-292)."""
    etp, ranks = plan.etp, plan.tp * dp * plan.cp
    _positive("etp", etp)
    if plan.tp % etp:
        raise PlanError(f"etp={etp} must divide tp={plan.tp} (the experts are split over a subset of the "
                        "tensor-parallel ranks, Megatron-Core's --expert-tensor-parallel-size)")
    if etp not in (1, plan.tp):
        raise PlanError(f"etp={etp}: dlperf prices the experts split as the dense layers or not at all",
                        expected=f"etp 1 or {plan.tp} (= tp)", found=etp)
    if ranks % (plan.ep * etp):
        raise PlanError(f"ep*etp = {plan.ep * etp} must divide tp*dp*cp = {ranks} (the expert grid folds onto the "
                        "stage's ranks: Megatron-Core's expert data parallelism is world / (etp*ep*pp))")
    if etp < plan.tp and not plan.sequence_parallel:
        raise PlanError(f"etp={etp} < tp={plan.tp} needs --sequence-parallel (Megatron-Core's MoE layer refuses "
                        "tensor parallelism without it in training, moe_layer.py @92c8482e:288-292)")


def _check_ep_overlap(plan: Plan) -> None:
    """Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm) pairs one micro-batch's forward with
    another's backward: it needs ep > 1, two or more micro-batches, no full recomputation, and with pp > 1 the
    interleaved schedule (Megatron-Core user guide, "Combined 1F1B: Expert-Parallel All-to-All Overlap")."""
    if plan.ep == 1:
        raise PlanError("--ep-overlap hides expert all-to-alls: it needs ep > 1")
    if plan.recompute in ("full", "except_last"):
        raise PlanError("--ep-overlap does not combine with full recomputation (Megatron-Core)")
    if plan.pp > 1 and plan.schedule not in ("interleaved", "dualpipe"):
        raise PlanError("--ep-overlap with pp > 1 needs the interleaved schedule (Megatron-Core) or dualpipe")
    if plan.micro_batches < 2:
        raise PlanError("--ep-overlap pairs micro-batches: it needs 2 or more per replica",
                        expected="micro-batches >= 2", found=plan.micro_batches)


def dualpipe_micro_batches_ok(m: Any, pp: int) -> Any:
    """DualPipe's rule on the micro-batch count m (an int or an array of them): even and at least 2*pp
    (deepseek-ai/DualPipe dualpipe/dualpipe.py @3da1bbe, DualPipe.step)."""
    return (m % 2 == 0) & (m >= 2 * pp)


def _check_dualpipe(plan: Plan) -> None:
    """DeepSeek-V3's DualPipe (arXiv:2412.19437, Sec. 3.2.1) feeds micro-batches from both ends of the pipeline:
    it needs an even number of stages and of micro-batches, and its reference implementation at least two
    micro-batches per stage (deepseek-ai/DualPipe dualpipe/dualpipe.py @3da1bbe, DualPipe.step: `num_ranks % 2
    == 0`, `num_chunks % 2 == 0 and num_chunks >= num_ranks * 2`). Each forward chunk is paired with another
    micro-batch's backward chunk, as combined 1F1B pairs them, so full recomputation does not combine with it
    (dlperf.plan._check_ep_overlap)."""
    m, pp = plan.micro_batches, plan.pp
    if pp == 1 or pp % 2:
        raise PlanError("the dualpipe schedule feeds the pipeline from both ends: it needs an even pp >= 2",
                        expected="pp even, >= 2", found=pp)
    if not dualpipe_micro_batches_ok(m, pp):
        raise PlanError(f"the dualpipe schedule needs an even number of micro-batches, at least 2*pp = {2 * pp} "
                        "(deepseek-ai/DualPipe)", expected=f"even micro-batches >= {2 * pp}", found=m)
    if plan.recompute in ("full", "except_last"):
        raise PlanError("the dualpipe schedule pairs forward and backward chunks: it does not combine with full "
                        "recomputation", expected="--recompute none or selective", found=plan.recompute)


def validate(plan: Plan, heads: int | None = None, layers: int | None = None) -> Plan:
    """Check degrees multiply to the device count, batches divide, tp <= heads, pp <= layers, ..."""
    for name in ("devices", "tp", "pp", "virtual_stages", "ep", "cp"):
        _positive(name, getattr(plan, name))
    _positive("global_batch", plan.global_batch, MAX_BATCH)
    if plan.dp is not None:
        _positive("dp", plan.dp)
    if plan.micro_batch is not None:
        _positive("micro_batch", plan.micro_batch, MAX_BATCH)
    _choice("schedule", plan.schedule, SCHEDULES)
    _choice("recompute", plan.recompute, RECOMPUTE)
    _choice("optimizer", plan.optimizer, OPTIMIZERS)
    _choice("moment_dtype", plan.moment_dtype, MOMENT_DTYPES)
    if plan.moment_dtype != "fp32" and plan.optimizer == "sgd":
        raise PlanError(f"--moment-dtype {plan.moment_dtype} is the dtype of the optimizer's moments: plain SGD "
                        "keeps none", expected="--optimizer momentum or adam", found=plan.optimizer)
    _choice("consistency", plan.consistency, CONSISTENCY)
    if plan.dtype is not None:
        _choice("dtype", plan.dtype, DTYPES)
    if plan.zero not in (0, 1, 2, 3):
        raise PlanError("zero", expected="0, 1, 2 or 3", found=plan.zero)
    check_degrees(plan)
    dp = plan.data_parallel
    if plan.global_batch % dp:
        raise PlanError(f"global batch {plan.global_batch} is not divisible by dp={dp}")
    per_replica = plan.global_batch // dp
    if per_replica % plan.micro:
        raise PlanError(f"per-replica batch {per_replica} is not divisible by micro-batch {plan.micro}")
    if heads is not None and isinstance(heads, int) and plan.tp > 1 and heads % plan.tp:
        raise PlanError(f"tp={plan.tp} must divide the attention heads ({heads})")
    if heads is not None and isinstance(heads, int) and plan.cp_algorithm == "ulysses" and heads % (plan.tp * plan.cp):
        raise PlanError(f"Ulysses context parallelism splits heads: tp*cp = {plan.tp * plan.cp} must divide the "
                        f"attention heads ({heads})")
    if layers is not None and plan.pp > layers:
        raise PlanError(f"pp={plan.pp} exceeds the number of layers that can be staged ({layers})")
    if plan.schedule == "interleaved":
        if plan.pp == 1:
            raise PlanError("the interleaved schedule needs pp > 1")
        if plan.micro_batches % plan.pp:
            raise PlanError(f"interleaved 1F1B needs micro-batches ({plan.micro_batches}) divisible by pp={plan.pp}")
        if plan.virtual_stages < 2:
            raise PlanError("the interleaved schedule needs --virtual-stages 2 or more")
        if layers is not None and plan.pp * plan.virtual_stages > layers:
            raise PlanError(f"pp*virtual_stages = {plan.pp * plan.virtual_stages} exceeds the layers that can be "
                            f"staged ({layers})")
    elif plan.virtual_stages != 1:
        raise PlanError("virtual stages need --schedule interleaved")
    if plan.schedule == "dualpipe":
        _check_dualpipe(plan)
    if plan.hybrid_fc and (plan.tp > 1 or plan.pp > 1):
        raise PlanError("--hybrid-fc spreads the fully connected head over all devices: it needs tp = pp = 1")
    if plan.ep_overlap:
        _check_ep_overlap(plan)
    if plan.p2p_overlap and plan.schedule != "interleaved":
        # NVIDIA/Megatron-LM @3758b54b megatron/core/pipeline_parallel/schedules.py:2041-2044: the non-interleaved
        # schedule raises "Non-interleaved pipeline parallelism does not support overlapping p2p communication"
        raise PlanError("--p2p-overlap overlaps interleaved 1F1B's pipeline sends with compute: it needs --schedule "
                        "interleaved (Megatron-Core's non-interleaved schedule refuses overlap_p2p_comm)",
                        expected="schedule interleaved", found=plan.schedule)
    if plan.sequence_parallel and plan.tp == 1:
        raise PlanError("sequence parallelism needs tp > 1")
    if plan.tp_overlap and not plan.sequence_parallel:
        raise PlanError("--tp-overlap overlaps the all-gathers and reduce-scatters of sequence parallelism: it "
                        "needs --sequence-parallel (as Megatron-Core's --tp-comm-overlap does)")
    if plan.fp8_param_gather and plan.zero == 0:
        raise PlanError("--fp8-param-gather all-gathers ZeRO-sharded parameters in FP8: it needs --zero 1, 2 or 3")
    _check_knobs(plan)
    if plan.consistency == "sync" and plan.staleness:
        raise PlanError("staleness needs --consistency ssp or async")
    return plan
