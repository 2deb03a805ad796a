"""The torch twins of check_models/*.yaml: the same layers, shapes and parameters (tests compare the counts).

Imported only when torch is installed. Each builder returns (module, make_batch) where make_batch(batch)
returns synthetic (inputs, targets) of the right shapes and dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

SPECS = Path(__file__).resolve().parent / "check_models"
Batch = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def spec_path(name: str) -> Path:
    return SPECS / f"{name}.yaml"


class MLP(nn.Module):
    def __init__(self, inputs: int = 784, hidden: int = 1024, classes: int = 10) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(inputs, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    """relu(x + bn(conv(relu(bn(conv(x)))))), He et al. 2016 Fig. 2 (identity shortcut)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)
        self.conv2, self.bn2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(x + y)


class CNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.block1 = BasicBlock(32)
        self.down = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU())
        self.block2 = BasicBlock(64)
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.down(self.block1(self.stem(x))))
        return self.fc(x.mean(dim=(2, 3)))


class Attention(nn.Module):
    """Multi-head self-attention with fused QKV and output projections (biases on), softmax materialised
    (the spec's flash: false)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, seq: int = 64, vocab: int = 2048, d: int = 256, heads: int = 4, ffn: int = 1024,
                 layers: int = 2) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.layers = nn.ModuleList(Layer(d, heads, ffn) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.head(self.ln(h)).flatten(0, 1)


def _images(shape: tuple[int, ...], classes: int) -> Batch:
    def make(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(batch)
        return torch.randn((batch, *shape), generator=gen), torch.randint(0, classes, (batch,), generator=gen)

    return make


def _tokens(seq: int, vocab: int) -> Batch:
    def make(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(batch)
        x = torch.randint(0, vocab, (batch, seq), generator=gen)
        return x, torch.randint(0, vocab, (batch * seq,), generator=gen)

    return make


BUILDERS: dict[str, Callable[[], tuple[nn.Module, Batch]]] = {
    "mlp": lambda: (MLP(), _images((784,), 10)),
    "cnn": lambda: (CNN(), _images((3, 32, 32), 10)),
    "transformer": lambda: (Transformer(), _tokens(64, 2048)),
}


def build(name: str, seed: int = 0) -> tuple[nn.Module, Batch]:
    torch.manual_seed(seed)
    return BUILDERS[name]()


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def train_step(model: nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One SGD step: zero the gradients, forward, cross-entropy, backward, update."""

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step
