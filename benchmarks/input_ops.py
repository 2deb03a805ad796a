"""CPU seconds per sample a PyTorch ImageNet loader spends after the JPEG decode: crop, resize, flip, collate.

dlperf's CPU input pipeline (dlperf/engine/input.py) prices a sample as decode + augmentation + collate. The
decode is a published figure (ternaus/imread_benchmark, see INPUT_COSTS there); no published benchmark times
torchvision's PIL transforms at ImageNet sizes on a named CPU, so this script does, on this machine, one thread:

- augment: torchvision.transforms.RandomResizedCrop(224, bilinear) + RandomHorizontalFlip() on a PIL RGB image,
  reproduced from torchvision/transforms/transforms.py (RandomResizedCrop.get_params: up to 10 draws of a scale
  in [0.08, 1] and a log-uniform aspect ratio in [3/4, 4/3], torch RNG; forward: crop, then PIL resize, which
  always antialiases; RandomHorizontalFlip: torch.rand(1) < 0.5, then Image.transpose). Resampling cost depends
  on the pixel counts, not the content, so the source is random noise at 500x375, ImageNet's modal image size.
- collate: the per-sample part of NVIDIA DeepLearningExamples' fast_collate (@729963dd PyTorch/Classification/
  ConvNets/image_classification/dataloaders.py: np.asarray, np.rollaxis, copy, add into a uint8 batch tensor).
- collate into a channels_last batch: DLE's AMP runs pass memory_format=torch.channels_last to fast_collate
  (@7bdfc81d dataloaders.py:320-336, main.py:411-412, configs.yml memory_format nhwc), which then allocates the
  batch NHWC (`torch.zeros(...).contiguous(memory_format=...)`) and adds each CHW sample into an NHWC slice. The
  whole fast_collate of a 256-sample batch is timed in both layouts, back to back, and the per-sample difference
  printed: what the NHWC batch adds to the contiguous figure above.

It prints the median over 5 runs of 2,000 samples. The engine wants Zen 4 reference seconds
(spec/hardware.py HOST_REFERENCE); INPUT_COSTS says how this machine's figure is converted.

    .venv/bin/python benchmarks/input_ops.py
"""

from __future__ import annotations

import math
import platform
import statistics
import time

import numpy as np
import PIL
import torch
from PIL import Image

SIZE = 224
SOURCE = (500, 375)       # width, height: the most common ImageNet image size
SAMPLES, RUNS = 2000, 5
BATCH = 256              # DLE's per-GPU batch for ResNet-50 AMP (configs.yml @7bdfc81d)


def crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params(scale=(0.08, 1), ratio=(3/4, 4/3)): (top, left, h, w)."""
    area = width * height
    log_ratio = torch.log(torch.tensor((3 / 4, 4 / 3)))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    side = min(width, height)      # torchvision's fallback is a central crop; rarely reached at 4:3
    return (height - side) // 2, (width - side) // 2, side, side


def augment(img: Image.Image) -> Image.Image:
    top, left, h, w = crop_box(*img.size)
    out = img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BILINEAR)
    if torch.rand(1) < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return out


def collate_one(batch: torch.Tensor, i: int, img: Image.Image) -> None:
    array = np.rollaxis(np.asarray(img, dtype=np.uint8), 2)
    batch[i] += torch.from_numpy(array.copy())


def fast_collate(memory_format: torch.memory_format, imgs: list[Image.Image]) -> torch.Tensor:
    """DLE's fast_collate (@7bdfc81d dataloaders.py:320-336) without the targets."""
    w, h = imgs[0].size
    tensor = torch.zeros((len(imgs), 3, h, w), dtype=torch.uint8).contiguous(memory_format=memory_format)
    for i, img in enumerate(imgs):
        array = np.rollaxis(np.asarray(img, dtype=np.uint8), 2)
        tensor[i] += torch.from_numpy(array.copy())
    return tensor


def per_sample(fn: object, source: Image.Image) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn(source)  # type: ignore[operator]
        times.append((time.perf_counter() - start) / SAMPLES)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    source = Image.fromarray(rng.integers(0, 256, (SOURCE[1], SOURCE[0], 3), dtype=np.uint8), "RGB")
    crops = [augment(source) for _ in range(SAMPLES)]
    batch = torch.zeros((SAMPLES, 3, SIZE, SIZE), dtype=torch.uint8)

    def run_augment(img: Image.Image) -> None:
        for _ in range(SAMPLES):
            augment(img)

    def run_collate(_: Image.Image) -> None:
        for i, crop in enumerate(crops):
            collate_one(batch, i, crop)

    cpu = platform.processor() or platform.machine()
    print(f"Pillow {PIL.__version__}, torch {torch.__version__}, {cpu}, one thread")
    print(f"augment (RandomResizedCrop {SIZE} + flip, {SOURCE[0]}x{SOURCE[1]}): "
          f"{per_sample(run_augment, source) * 1e6:.1f} us/sample")
    print(f"collate (fast_collate per sample): {per_sample(run_collate, source) * 1e6:.1f} us/sample")
    batches = [crops[i:i + BATCH] for i in range(0, SAMPLES - BATCH + 1, BATCH)]

    def whole(fmt: torch.memory_format) -> float:
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            for imgs in batches:
                fast_collate(fmt, imgs)
            times.append((time.perf_counter() - start) / (len(batches) * BATCH))
        return statistics.median(times)

    pairs = [(whole(torch.contiguous_format), whole(torch.channels_last)) for _ in range(RUNS)]
    nchw, nhwc = min(p[0] for p in pairs), min(p[1] for p in pairs)
    print(f"fast_collate, whole {BATCH}-sample batch: contiguous {nchw * 1e6:.1f}, channels_last {nhwc * 1e6:.1f} "
          f"us/sample; channels_last adds {(nhwc - nchw) * 1e6:.1f} us/sample")


if __name__ == "__main__":
    main()
