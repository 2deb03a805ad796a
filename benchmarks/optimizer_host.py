"""Host seconds per kernel of a per-tensor (for-loop) optimizer step: torch.optim.SGD with foreach=False.

PyTorch's optimizers before 2.0 loop over the parameters in Python and issue a few small kernels per tensor
(torch/optim/_functional.py sgd: `d_p.add(param, alpha=weight_decay)` where the group decays, then
`buf.mul_(momentum).add_(d_p)` and `param.add_(d_p, alpha=-lr)`), and `optimizer.zero_grad()` zeroes each
gradient (`p.grad.zero_()`). On a GPU each is a launch of a kernel that does next to nothing for most tensors, so
the step costs the host per launch. This script runs that loop for ResNet-50's 161 parameter tensors, split into
the two groups NVIDIA DeepLearningExamples builds (image_classification/optimizers.py @7bdfc81d
get_sgd_optimizer: batch-norm weights and biases without weight decay, the rest with it), on one-element CPU
tensors so that the kernels do next to nothing, and prints the ATen operators issued per step (counted with
PyTorch's dispatcher) and the host seconds per operator (median of 5 runs of 300 steps, one thread). The CUDA
launch call a GPU host also pays per kernel is not in it (spec/hardware.py LAUNCH_CALL adds it).

    .venv/bin/python benchmarks/optimizer_host.py
"""

from __future__ import annotations

import statistics
import time

import torch
from host_ops import CountOps  # the same ATen operator counter (run as benchmarks/optimizer_host.py)

CONVS, BATCH_NORMS, LINEAR_TENSORS = 53, 53, 2   # torchvision / DLE ResNet-50: 161 parameter tensors
STEPS, RUNS = 300, 5


def make_optimizer() -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    def tensor() -> torch.Tensor:
        p = torch.zeros(1, requires_grad=True)
        p.grad = torch.ones(1)
        return p

    norms = [tensor() for _ in range(2 * BATCH_NORMS)]
    rest = [tensor() for _ in range(CONVS + LINEAR_TENSORS)]
    groups = [{"params": norms, "weight_decay": 0.0}, {"params": rest, "weight_decay": 3.0517578125e-05}]
    optimizer = torch.optim.SGD(groups, lr=2.048, momentum=0.875, foreach=False)
    return optimizer, norms + rest


def one_step(optimizer: torch.optim.Optimizer) -> None:
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)   # PyTorch < 2.0's default: zero each gradient in place


def main() -> None:
    torch.set_num_threads(1)
    optimizer, params = make_optimizer()
    one_step(optimizer)   # the first step creates the momentum buffers (a clone each)
    with CountOps() as counter:
        one_step(optimizer)
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(STEPS):
            one_step(optimizer)
        runs.append((time.perf_counter() - start) / STEPS)
    step = statistics.median(runs)
    ops = counter.count
    print(f"torch {torch.__version__}, {len(params)} tensors: {ops} ATen operators per step "
          f"(optimizer.step + zero_grad), {step * 1e6:.0f} us per step, {step / ops * 1e6:.2f} us per operator")


if __name__ == "__main__":
    main()
