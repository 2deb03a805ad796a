"""Memory-bound passes a framework makes over the whole weight gradient in every micro-batch (plan.grad_passes).

Some training scripts do more to each micro-batch's gradient than add it to the accumulator: NVIDIA
DeepLearningExamples' TensorFlow 1 BERT (TensorFlow/LanguageModeling/BERT/optimization.py @729963dd,
create_optimizer with num_accumulation_steps > 1) unscales it, checks it is finite, takes its global norm and
clips it before every assign_add, and TensorFlow's AMP graph rewrite (and PyTorch's autocast, entered per
micro-batch) casts every fp32 weight to fp16 and its gradient back in every run. Each pass streams the gradient
(or weight) through HBM once per micro-batch, so it costs bytes / achieved bandwidth and does not shrink as the
GEMMs get faster.

Bytes are per parameter, as a function of g (bytes of a gradient element: the plan's grad_dtype, else the
weight's) and h (bytes of an element in the compute dtype). One launch per pass is charged: a lower bound, since
the scripts run one op per trainable variable (~400 in BERT-Large); XLA auto-clustering may fuse some of them,
and how many is not known without a profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlperf.engine.layers import element_bytes

FP32 = element_bytes("fp32")
BOOL = 1


@dataclass(frozen=True)
class GradPass:
    nbytes: Callable[[int, int], int]  # (g, h) -> bytes moved per parameter
    source: str


GRAD_PASSES: dict[str, GradPass] = {
    "amp-casts": GradPass(
        lambda g, h: 2 * (FP32 + h),
        "TensorFlow's AMP graph rewrite (tensorflow/core/grappler/optimizers/auto_mixed_precision.cc; MatMul and "
        "BatchMatMul on the WhiteList of auto_mixed_precision_lists.h): the trainable variables stay fp32, so each "
        "run casts every weight read by a MatMul to fp16 (read 4, write h) and the Cast's gradient casts its fp16 "
        "gradient back to the variable's fp32 (read h, write 4). PyTorch's autocast does the same once per autocast "
        "region: aten/src/ATen/autocast_mode.cpp cached_cast caches the fp16 cast of an fp32 leaf weight that "
        "requires grad, and torch/cuda/amp/autocast_mode.py autocast.__exit__ clears that cache when the outermost "
        "region exits (torch.clear_autocast_cache()), so a script that enters autocast per micro-batch "
        "(DeepLearningExamples ConvNets image_classification/training.py @7bdfc81d:191) casts every conv and linear "
        "weight in every micro-batch, and the cast's backward (`to`) returns its gradient in fp32"),
    "unscale": GradPass(
        lambda g, h: 2 * g,
        "tensorflow/python/training/experimental/loss_scale_optimizer.py MixedPrecisionLossScaleOptimizer."
        "compute_gradients -> _unscale_grads: grad * (1 / loss_scale) for every gradient (read g, write g)"),
    "finite-check": GradPass(
        lambda g, h: g + 2 * BOOL,
        "DeepLearningExamples TensorFlow/LanguageModeling/BERT/optimization.py @729963dd: all_are_finite = "
        "reduce_all([reduce_all(is_finite(g)) for g in grads]) with AMP (read g, write and read a 1-byte bool)"),
    "global-norm": GradPass(
        lambda g, h: g,
        "DeepLearningExamples TensorFlow/LanguageModeling/BERT/optimization.py @729963dd: tf.global_norm(grads) "
        "as clip_by_global_norm's use_norm, one L2Loss per gradient (read g)"),
    "clip": GradPass(
        lambda g, h: 2 * g,
        "DeepLearningExamples TensorFlow/LanguageModeling/BERT/optimization.py @729963dd: tf.clip_by_global_norm"
        "(grads, clip_norm=1.0), which multiplies every gradient by clip_norm / max(norm, clip_norm) (read g, "
        "write g) before the accumulator's assign_add"),
}


def grad_pass_time(names: tuple[str, ...], params: Any, g: int, h: int, bandwidth: float,
                   launch_latency: float) -> Any:
    """Seconds per micro-batch of the named passes over `params` parameters at `bandwidth` achieved bytes/s."""
    if not names:
        return 0.0
    nbytes = sum(GRAD_PASSES[name].nbytes(g, h) for name in names)
    return nbytes * params / bandwidth + len(names) * launch_latency
