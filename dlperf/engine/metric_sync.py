"""Composer's per-batch bookkeeping across all ranks: latency-bound collectives and a training-metric sync whose
host and device work grow with the world size.

Read from composer's trainer (mosaicml/composer composer/trainer/trainer.py, `_train_loop`, the same at v0.13.4,
the llm-foundry A100 sweep's pin, mosaicml/llm-foundry@300cc5c5 setup.py, and v0.17.2, the H100 large-scale
sweep's, llm-foundry@5e85bd62 setup.py `mosaicml>=0.17.2,<0.18`; v0.16.4 L2058-2090): after every batch,

- the loss is all-reduced and read back (`map_collection(total_loss_dict, dist.all_reduce)`, `.cpu().item()`), a
  device-to-host sync: the device has drained when what follows starts, so everything below is exposed;
- `_accumulate_time_across_ranks` all-reduces the sample and token counts and broadcasts rank 0's batch time
  (two more collectives, read back with `.item()`);
- `_compute_and_log_metrics('train', ...)` calls `compute()` on every training metric. torchmetrics syncs each
  metric state over the world group in `compute()` (Metric._sync_dist -> `gather_all_tensors`,
  Lightning-AI/torchmetrics src/torchmetrics/utilities/distributed.py, same at v0.11.3, llm-foundry@300cc5c5's pin,
  and v1.0.3, the last release composer v0.17.2's `torchmetrics>=0.10.0,<1.1` admits): a `barrier` (an NCCL
  all-reduce), then, for a 0-d state, `_simple_gather_all_tensors`: `[torch.zeros_like(result) for _ in
  range(world_size)]` (one Python-level operator and one fill kernel per rank) and a list `all_gather`, which
  PyTorch's NCCL process group runs into one flat buffer and copies back into the list with one `copy_` per rank
  (ProcessGroupNCCL::allgather, "Copy the flattened output tensors to the outputs"; zero_impl's module doc reads
  the same loop at @00f5dfd5). composer's LanguageCrossEntropy has two 0-d states (`sum_loss`, `total_items`,
  composer/metrics/nlp.py v0.13.4 L92-93, v0.17.2 L101-102) and LanguagePerplexity inherits them.

So each synced state costs, per rank of the world, one Python-level operator on the host and two kernels on the
device: a cost in the world size, whatever the model. The host issues while the device runs what it issued, so the
slower of the two sets the pace. The model's cross-entropy head says how many such metrics the run computes
(`metrics`, models/mpt.yaml); without any, nothing here applies.
"""

from __future__ import annotations

from typing import Any

from dlperf.engine.device import host_scale
from dlperf.engine.zero_impl import SLICE_PYTHON_OP_S
from dlperf.plan import Plan
from dlperf.spec.hardware import LAUNCH_CALL, Hardware
from dlperf.spec.model import Model

# 0-d states per composer language metric: LanguageCrossEntropy's sum_loss and total_items (composer/metrics/nlp.py
# v0.13.4 L92-93, v0.17.2 L101-102); LanguagePerplexity subclasses it without adding any.
STATES_PER_METRIC = 2
# Device kernels per rank and state: the zeros_like fill and the all_gather's copy back into the list.
KERNELS_PER_RANK = 2
# composer's per-batch collectives besides the metrics (trainer.py v0.16.4 L2058, L1974, L1977): the loss all-reduce
# (one fp32), the sample/token all-reduce (two int32) and the batch-time broadcast (one fp32), as (op, bytes).
BATCH_COLLECTIVES = (("allreduce", 4), ("allreduce", 8), ("broadcast", 4))
BARRIER_BYTES = 4      # c10d's NCCL barrier all-reduces a one-element tensor
STATE_BYTES = 4        # a 0-d fp32 / int32 state, gathered from every rank


def synced_metrics(model: Model) -> int:
    """Training metrics the run computes and syncs every batch: the `metrics` of its cross-entropy layers."""
    return sum(int(layer.get("metrics") or 0) * count for layer, count in model.counted()
               if layer.op == "cross_entropy")


def metric_sync_time(metrics: int, hw: Hardware, plan: Plan, comm: Any) -> float:
    """Exposed seconds per step of composer's per-batch collectives and train-metric sync over the world group
    (module doc); 0 on one device or for a model that declares no training metrics."""
    ranks = plan.devices
    states = STATES_PER_METRIC * metrics
    if ranks == 1 or states == 0:
        return 0.0
    world = comm.Group(ranks, 1)
    collectives = sum(comm.collective_time(op, nbytes, world, hw) for op, nbytes in BATCH_COLLECTIVES)
    per_state = (comm.collective_time("allreduce", BARRIER_BYTES, world, hw)
                 + comm.collective_time("allgather", STATE_BYTES * ranks, world, hw)
                 + ranks * per_rank_time(hw))
    return collectives + states * per_state


def per_rank_time(hw: Hardware) -> float:
    """Seconds one rank adds to one state's gather: the host's zeros_like operator and copy_ launch call, or the
    device's two tiny kernels, whichever is slower (the host issues while the device runs). The host figures are
    the reference host's, scaled to this host as every other host cost is (dlperf.engine.device.host_scale)."""
    host = (SLICE_PYTHON_OP_S + LAUNCH_CALL) * host_scale(hw.device)
    device = KERNELS_PER_RANK * hw.device.launch_latency
    return max(host, device)
