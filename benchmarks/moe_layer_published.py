"""Published per-layer timings of Megatron-Core's MoELayer against dlperf's price of the same layer.

    PYTHONPATH=$PWD python benchmarks/moe_layer_published.py [--case SUBSTRING] [--csv]

Each case is one MoELayer (router, token dispatcher, TEGroupedMLP experts; no norm, no residual, no attention) run
forward and backward on an expert-parallel group of 8 GPUs with `seq x micro_batch` tokens per rank, timed with
CUDA events around `layer(input)` and `output.backward(grad)` (mean of 20 iterations after 5 warm-ups), the way
Megatron-LM's MoE performance test does it (tests/functional_tests/test_cases/common/moe_perf/__main__.py,
NVIDIA/Megatron-LM @cf39a4dd, PR #2673). dlperf prices the same layer as a one-layer model (`layer_model`) under the
plan devices = dp = ep = 8, micro-batch 1, force-balanced routing (moe_imbalance 1.0, moe_router_force_load_balancing
in every source), through the engine's own stage pricing (StepModel.stages -> StageCost.passes): each pass is the
longer of the device's work and the host's issuing of it, the forward a flow shop cut at the dispatcher's host sync.

Two timing details matter when reading host-bound cases (neither is modelled, both are recorded per case):
- before each iteration both harnesses launch a "dummy GEMM" so that the host can queue work ahead of the device:
  Megatron-LM's is `torch.randn(8192, 8192)` in fp32 (PyTorch's default dtype; ~1.1 TFLOP at fp32 rates, tens of
  ms on H100), Marin's copy of it uses bf16 (~1.5 ms on H100): Marin's timings therefore carry nearly all the host
  time of the forward up to its first sync, Megatron-LM's hide it;
- the forward and backward events bracket host-issued work, so after the dispatcher's device-to-host sync every
  remaining kernel waits for the host: the timings are max(device, host) per segment, as dlperf's flow shop.

Components printed per case (dlperf, milliseconds per layer, forward / backward):
  router    router GEMM (fp32), fused top-k, aux-loss kernels, backward gradient sums
  permute   TE fused permute/unpermute-side bookkeeping: row-id map, permute, dispatch counts, chunk sorts,
            DeepEP/HybridEP metadata kernels
  dispatch  the dispatch-direction transfer (NCCL all-to-all or the dispatcher's published kernel bandwidth) plus
            the dispatcher's extras (count all-gather, probability all-to-all, the host-sync gap, HybridEP's
            routing-map all-gather)
  experts   the grouped GEMMs, the SwiGLU, shared experts
  combine   the unpermute (weighted sum) kernel plus the combine-direction transfer
  host      host seconds to issue the pass (framework operators, launches, TE's per-expert cuBLASLt calls)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dlperf.engine import context as ctx  # noqa: E402
from dlperf.engine import stage as st  # noqa: E402
from dlperf.engine.step import StepModel, _parallel  # noqa: E402
from dlperf.ops.fp8 import kernel_dtype  # noqa: E402
from dlperf.plan import Plan  # noqa: E402
from dlperf.spec.hardware import load_hardware  # noqa: E402
from dlperf.spec.model import model_from_dict  # noqa: E402

MEGATRON = ("NVIDIA/Megatron-LM @cf39a4ddcfe6882cf578a26c00d0b76f6daf19cd (2025-12-17, PR #2673 'Add moe layer perf "
            "UT.') tests/functional_tests/test_cases/common/moe_perf/baseline.json (values), test_cases.py (shapes: "
            "gpu_platform H100, TP 1, EP 8, moe_permute_fusion, moe_router_fusion, force load balancing, router "
            "fp32), __main__.py (method: fp32 8192^2 dummy GEMM, 5 warm-up + 20 timed, mean; a baseline is only "
            "recorded with std/mean <= 2%); unchanged at @d98e8a64")
MARIN = ("marin-community/marin issue #3666 (2026-03-14, 'Experiment: Megatron-style Qwen3 MoE scaling sweep on "
         "H100x8'; the same totals in issue #4311's 2026-04-13 comment by chloechiaw) and its logbook "
         ".agents/logbooks/moe-megatron-qwen-scale.md @8106c189 (tables 'alltoall/deepep/hybridep total ms', "
         "forward + backward); harness .agents/scripts/megatron_qwen_moe_perf.py @093449c1 (bf16 8192^2 dummy "
         "GEMM, 5 + 20 iterations, mean, max over ranks) launched by .agents/scripts/megatron_qwen_krt_bench.py "
         "@d3d6d4c8 on a CoreWeave H100x8 pod with 32 CPU cores for 8 ranks, image pytorch/pytorch:2.9.0-"
         "cuda12.8-cudnn9-devel, Megatron-LM @f8becec6, DeepEP @7febc6e2, Transformer Engine from PyPI")


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    hardware: str
    dispatcher: str
    seq: int
    micro_batch: int
    hidden: int
    experts: int
    top_k: int
    ffn: int
    fwd_ms: float | None          # published forward mean (None: only the total is published)
    bwd_ms: float | None
    total_ms: float | None = None
    ep: int = 8
    dtype: str = "bf16"
    moe: dict[str, Any] = field(default_factory=dict)  # extra moe attributes (shared experts, groups, ...)
    note: str = ""

    @property
    def published_total(self) -> float:
        return self.total_ms if self.total_ms is not None else self.fwd_ms + self.bwd_ms


MIXTRAL = dict(seq=4096, micro_batch=1, hidden=4096, experts=8, top_k=2, ffn=14336)
# test_cases.py DEEPSEEK_PROXY: seq_aux_loss, 8 groups / top-4 groups, sigmoid scores, expert bias, one shared expert
# of 2048 (dlperf prices the aux-loss kernels alike, the sigmoid as the softmax)
DEEPSEEK = dict(seq=4096, micro_batch=1, hidden=7168, experts=32, top_k=8, ffn=2048,
                moe=dict(shared_experts=1, shared_ffn=2048, groups=8, top_groups=4, router_bias=True))
QWEN30 = dict(seq=4096, micro_batch=1, hidden=2048, experts=128, top_k=8, ffn=768)


def _q(**changes: Any) -> dict[str, Any]:
    return {**QWEN30, **changes}


# Megatron-LM's CI baseline (bf16 cases; the FP8-blockwise ones are listed in FP8_BASELINE, dlperf has no
# blockwise-scaled FP8 recipe to price them with)
CASES: list[Case] = [
    Case("megatron mixtral_a2a_tp1ep8_bf16", MEGATRON, "dgx-h100", "alltoall", fwd_ms=4.32688798904419,
         bwd_ms=7.684332823753357, **MIXTRAL),
    Case("megatron mixtral_deepep_tp1ep8_bf16", MEGATRON, "dgx-h100", "deepep", fwd_ms=4.635550403594971,
         bwd_ms=7.854356813430786, **MIXTRAL),
    Case("megatron mixtral_hybridep_tp1ep8_bf16", MEGATRON, "dgx-h100", "hybridep", fwd_ms=4.342604804039001,
         bwd_ms=7.740782427787781, **MIXTRAL),
    Case("megatron deepseek_a2a_tp1ep8_bf16", MEGATRON, "dgx-h100", "alltoall", fwd_ms=7.119169592857361,
         bwd_ms=10.482670497894286, **DEEPSEEK),
    Case("megatron deepseek_deepep_tp1ep8_bf16", MEGATRON, "dgx-h100", "deepep", fwd_ms=5.681718397140503,
         bwd_ms=9.055137538909912, **DEEPSEEK),
    Case("megatron deepseek_hybridep_tp1ep8_bf16", MEGATRON, "dgx-h100", "hybridep", fwd_ms=5.390828824043274,
         bwd_ms=8.795001602172851, **DEEPSEEK),
]

# Marin's Qwen3-shaped sweep: forward + backward totals only (the per-pass means sit in RESULT rows that were not
# published); every case 4096 x micro-batch tokens per rank, EP 8, bf16, fp32 router, aux_loss coefficient 1.0
MARIN_TOTALS = {  # case: (alltoall, deepep, hybridep) total ms, shape
    "qwen3_30b_a3b_anchor": ((34.95, 12.41, 18.05), _q()),
    "qwen3_235b_a22b_anchor": ((25.62, 11.75, 13.08), _q(hidden=4096, ffn=1536)),
    "qwen3_batch_mb2": ((33.77, 12.42, 16.61), _q(micro_batch=2)),
    "qwen3_batch_mb4": ((35.27, 18.09, 21.09), _q(micro_batch=4)),
    "qwen3_hidden_3072": ((45.10, 10.55, 19.46), _q(hidden=3072)),
    "qwen3_hidden_4096": ((27.22, 9.71, 14.59), _q(hidden=4096)),
    "qwen3_expert_1152": ((30.56, 10.13, 12.50), _q(ffn=1152)),
    "qwen3_expert_1536": ((24.62, 9.59, 11.38), _q(ffn=1536)),
    "qwen3_topk_2": ((31.90, 9.04, 14.41), _q(top_k=2)),
    "qwen3_topk_4": ((33.48, 9.40, 15.73), _q(top_k=4)),
    "qwen3_experts_32": ((16.12, 22.82, 11.91), _q(experts=32)),
    "qwen3_experts_64": ((25.38, 15.52, 14.55), _q(experts=64)),
}
MARIN_NOTES = {
    "qwen3_experts_32": "focused rerun (pod iris-task-3e98021abb0d); deepep forward_std 29.98 ms, backward_std 15.24",
    "qwen3_experts_64": "focused rerun (pod iris-task-3e98021abb0d); deepep forward_std 11.44 ms, backward_std 15.45",
}
for _name, (_totals, _shape) in MARIN_TOTALS.items():
    for _disp, _total in zip(("alltoall", "deepep", "hybridep"), _totals, strict=True):
        CASES.append(Case(f"marin {_name} {_disp}", MARIN, "dgx-h100", _disp, fwd_ms=None, bwd_ms=None,
                          total_ms=_total, note=MARIN_NOTES.get(_name, "full matrix (pod iris-task-f278733d7cc3)"),
                          **_shape))

# Published but not priced here: Megatron-LM's FP8 (E4M3, blockwise scaling) baseline, forward / backward ms
FP8_BASELINE = {
    "mixtral_a2a_tp1ep8_fp8": (3.7876319885253906, 6.618246412277221),
    "mixtral_deepep_tp1ep8_fp8": (4.101150441169739, 6.82720000743866),
    "mixtral_hybridep_tp1ep8_fp8": (3.7007392168045046, 6.57167682647705),
    "deepseek_a2a_tp1ep8_fp8": (7.609272027015686, 10.126460886001587),
    "deepseek_deepep_tp1ep8_fp8": (6.034772801399231, 8.60211353302002),
    "deepseek_hybridep_tp1ep8_fp8": (5.142886424064637, 7.6874864339828495),
}

# Marin's 2-iteration smoke of the Qwen3-30B anchor (logbook entry 2026-03-14 20:08, bf16 router probabilities,
# warmup 1, measure 2): the only per-pass split published for the Qwen3 shape; exploratory, not compared.
MARIN_SMOKE = {"alltoall": (23.48, 40.26), "deepep": (48.13, 49.11), "hybridep": (25.23, 37.12)}

COMPONENTS = ("router", "permute", "dispatch", "experts", "combine")
KERNEL_COMPONENT = {"router": "router", "topk_gating": "router", "aux_loss": "router", "grad_accumulate": "router",
                    "permute": "permute", "row_id_map": "permute", "dispatch_counts": "permute",
                    "chunk_sort": "permute", "deepep_metadata": "permute", "hybridep_metadata": "permute",
                    "combine": "combine"}


def layer_model(case: Case) -> Any:
    """One MoE layer over a [seq, hidden] input, as Megatron-Core's MoELayer with TEGroupedMLP runs it: SwiGLU
    experts weighted by the routing probabilities in the activation (probs_in_expert), aux-loss router."""
    moe = {"op": "moe", "experts": case.experts, "top_k": case.top_k, "ffn": case.ffn, "gated": True,
           "probs_in_expert": True, "name": "moe", **case.moe}
    return model_from_dict({"name": "moe-layer", "input": [case.seq, case.hidden], "dtype": case.dtype,
                            "layers": [moe]}, "<benchmarks/moe_layer_published.py>", {})


def plan_for(case: Case) -> Plan:
    return Plan(devices=case.ep, dp=case.ep, ep=case.ep, global_batch=case.ep * case.micro_batch,
                micro_batch=case.micro_batch, ep_dispatcher=case.dispatcher, moe_imbalance=1.0, dtype=case.dtype)


@dataclass
class Priced:
    fwd: float
    bwd: float
    device_fwd: float
    device_bwd: float
    host_fwd: float
    host_bwd: float
    parts: dict[str, tuple[float, float]]

    @property
    def bound(self) -> str:
        fwd = "host" if self.host_fwd > self.device_fwd else "device"
        bwd = "host" if self.host_bwd > self.device_bwd else "device"
        return fwd if fwd == bwd else f"{fwd}/{bwd}"


_HW: dict[str, Any] = {}


def price(case: Case) -> Priced:
    """dlperf's forward and backward seconds of the case's layer, and their components (module docstring)."""
    hw = _HW.setdefault(case.hardware, load_hardware(case.hardware))
    plan = plan_for(case)
    model = layer_model(case)
    sm = StepModel(model, hw)
    e = 2  # bf16 activations
    _, slow, _, _ = sm.stages(plan, case.dtype, e)
    fwd, bwd, dev_fwd, dev_bwd = slow.passes()
    par = _parallel(sm.comm, hw, plan)
    (use,) = [u for uses in sm._uses.values() for u in uses if u.layer.op == "moe"]
    parts = {c: [0.0, 0.0] for c in COMPONENTS}
    for kernel in st._use_kernels(use, plan.micro, e, hw, case.dtype, 1, False, plan.ep, plan.ep_dispatcher, None,
                                  False, (plan.fp8_scaling, plan.mx_swizzle, None)):
        kf, kb, _, _ = st._kernel_times(kernel, hw.device, kernel_dtype(kernel, case.dtype), 1, use.tp_dim, None)
        part = parts[KERNEL_COMPONENT.get(kernel.name, "experts")]
        part[0] += use.count * kf
        part[1] += use.count * kb
    # the transfers: dispatch direction (with the dispatcher's extras) and combine direction, as ctx.ep_exchange
    layer = use.layer
    nbytes = ctx.dispatch_bytes(layer, plan.micro, e, plan.tp, par.cp)
    column = "dispatch_fp8" if par.fp8_dispatch else "dispatch_bf16"
    dispatch = ctx._transfer(layer, par, nbytes, column)
    combine = ctx._transfer(layer, par, nbytes, "combine")
    extra_fwd, extra_bwd = ctx.ep_dispatch_extra(use, plan.micro, plan.tp, par)
    parts["dispatch"][0] += use.count * (dispatch + extra_fwd)
    parts["dispatch"][1] += use.count * (dispatch + extra_bwd)
    parts["combine"][0] += use.count * combine
    parts["combine"][1] += use.count * combine
    total_fwd = sum(p[0] for p in parts.values())
    assert abs(total_fwd - dev_fwd) < 1e-9 + 1e-6 * dev_fwd, (case.name, total_fwd, dev_fwd)
    return Priced(float(fwd), float(bwd), float(dev_fwd), float(dev_bwd), float(slow.host_fwd),
                  float(slow.host_bwd), {k: (float(f), float(b)) for k, (f, b) in parts.items()})


def _ms(x: float | None) -> str:
    return "    -" if x is None else f"{x * 1e3:5.2f}" if x < 1 else f"{x * 1e3:5.1f}" if x < 10 else f"{x * 1e3:5.0f}"


def _diagnostics(cases: list[Case]) -> None:
    """What the published figures say about where dlperf's price goes wrong (README of the numbers in the module
    docstring): Megatron-LM's device-bound shapes against dlperf's expert GEMMs alone; Marin's Qwen3 sweep as an
    excess over dlperf (published - dlperf, ms) that does not follow the device work; its expert-count slope."""
    priced = {c.name: (c, price(c)) for c in cases}
    mega = [(c, p) for c, p in priced.values() if c.name.startswith("megatron")]
    if mega:
        print("\nMegatron-LM CI (device-bound shapes): published pass minus dlperf's expert kernels alone, ms "
              "(what is left for router, permute, dispatch, combine; dlperf prices those at the second figure)")
        for c, p in mega:
            rest_f, rest_b = (sum(v[i] for k, v in p.parts.items() if k != "experts") for i in (0, 1))
            print(f"  {c.name:40s} fwd {c.fwd_ms - p.parts['experts'][0] * 1e3:5.2f} (dlperf {rest_f * 1e3:4.2f})  "
                  f"bwd {c.bwd_ms - p.parts['experts'][1] * 1e3:5.2f} (dlperf {rest_b * 1e3:4.2f})")
    marin = [(c, p) for c, p in priced.values() if c.name.startswith("marin")]
    if not marin:
        return
    print("\nMarin (Qwen3 shapes): excess = published - dlperf total (ms), by case, beside dlperf's device total and "
          "host total (ms, fwd + bwd) of the deepep layer")
    print(f"  {'case':24s} {'dl device':>9s} {'dl host':>7s} | {'alltoall':>8s} {'deepep':>8s} {'hybridep':>8s}")
    table: dict[str, dict[str, float]] = {}
    device: dict[str, tuple[float, float]] = {}
    for c, p in marin:
        shape = c.name.split()[1]
        table.setdefault(shape, {})[c.dispatcher] = c.published_total - (p.fwd + p.bwd) * 1e3
        if c.dispatcher == "deepep":
            device[shape] = ((p.device_fwd + p.device_bwd) * 1e3, (p.host_fwd + p.host_bwd) * 1e3)
    for shape in sorted(table, key=lambda k: device.get(k, (0.0, 0.0))[0]):
        dev, host = device.get(shape, (float("nan"), float("nan")))
        print(f"  {shape.removeprefix('qwen3_'):24s} {dev:9.2f} {host:7.2f} | "
              + " ".join(f"{table[shape].get(d, float('nan')):+8.1f}" for d in ("alltoall", "deepep", "hybridep")))
    for disp in ("alltoall", "deepep", "hybridep"):
        by_experts = {c.experts: (c.published_total, (p.fwd + p.bwd) * 1e3) for c, p in marin
                      if c.dispatcher == disp and c.name.split()[1] in
                      ("qwen3_experts_32", "qwen3_experts_64", "qwen3_30b_a3b_anchor")}
        if len(by_experts) == 3:
            (pub4, dl4), (pub16, dl16) = by_experts[32], by_experts[128]
            print(f"  {disp:9s} expert-count slope (4 -> 16 local experts): published {(pub16 - pub4) / 12:+.2f} ms "
                  f"per local expert, dlperf {(dl16 - dl4) / 12:+.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="", help="only cases whose name contains this")
    parser.add_argument("--csv", action="store_true", help="comma-separated rows instead of the table")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.case in c.name]
    head = ("case", "disp", "tok/rk", "pub fwd", "pub bwd", "pub tot", "dl fwd", "dl bwd", "dl tot", "ratio",
            *(f"{c} f/b" for c in COMPONENTS), "host f/b", "bound")
    if args.csv:
        print(",".join(head))
    else:
        print("ms per MoE layer; ratio = published total / dlperf total (>1: dlperf too fast); components are dlperf's "
              "device ms fwd/bwd")
        print(f"{'case':40s} {'tok/rk':>6s} {'pub fwd':>7s} {'pub bwd':>7s} {'pub tot':>7s} | {'dl fwd':>6s} "
              f"{'dl bwd':>6s} {'dl tot':>6s} | {'ratio':>5s} | " + " ".join(f"{c + ' f/b':>13s}" for c in COMPONENTS)
              + f" {'host f/b':>13s} bound")
    ratios: dict[str, list[float]] = {}
    for case in cases:
        p = price(case)
        total = p.fwd + p.bwd
        ratio = case.published_total / (total * 1e3)
        ratios.setdefault(f"{case.name.split()[0]} {case.dispatcher}", []).append(ratio)
        tokens = case.seq * case.micro_batch
        pub = [case.fwd_ms, case.bwd_ms, case.published_total]
        comps = [f"{_ms(f)}/{_ms(b)}" for f, b in p.parts.values()]
        if args.csv:
            print(",".join([case.name, case.dispatcher, str(tokens),
                            *("" if v is None else f"{v:.3f}" for v in pub),
                            f"{p.fwd * 1e3:.3f}", f"{p.bwd * 1e3:.3f}", f"{total * 1e3:.3f}", f"{ratio:.2f}",
                            *(f"{f * 1e3:.3f}/{b * 1e3:.3f}" for f, b in p.parts.values()),
                            f"{p.host_fwd * 1e3:.3f}/{p.host_bwd * 1e3:.3f}", p.bound]))
            continue
        pubs = " ".join("      -" if v is None else f"{v:7.2f}" for v in pub)
        print(f"{case.name:40s} {tokens:6d} {pubs} | {p.fwd * 1e3:6.2f} {p.bwd * 1e3:6.2f} {total * 1e3:6.2f} | "
              f"{ratio:5.2f} | " + " ".join(f"{c:>13s}" for c in comps)
              + f" {_ms(p.host_fwd) + '/' + _ms(p.host_bwd):>13s} {p.bound}")
        if case.fwd_ms is not None:
            print(f"{'':40s} {'':6s} per pass: forward {case.fwd_ms / (p.fwd * 1e3):.2f}x, backward "
                  f"{case.bwd_ms / (p.bwd * 1e3):.2f}x")
    if not args.csv:
        print("\nratio published/dlperf by source and dispatcher (min / median / max):")
        for key, values in ratios.items():
            values = sorted(values)
            mid = values[len(values) // 2]
            print(f"  {key:22s} n={len(values):2d}  {values[0]:.2f} / {mid:.2f} / {values[-1]:.2f}")
        _diagnostics(cases)
        print("\nsources:\n  megatron: " + MEGATRON + "\n  marin: " + MARIN)
        print("\nnot priced: Megatron-LM FP8-blockwise baseline (fwd/bwd ms): "
              + ", ".join(f"{k} {f:.2f}/{b:.2f}" for k, (f, b) in FP8_BASELINE.items()))
        print("not compared: Marin's Qwen3-30B anchor smoke (warmup 1, measure 2, bf16 router; fwd/bwd ms): "
              + ", ".join(f"{k} {f:.2f}/{b:.2f}" for k, (f, b) in MARIN_SMOKE.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
