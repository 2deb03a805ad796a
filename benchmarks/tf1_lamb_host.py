"""Host seconds per TensorFlow graph op of DeepLearningExamples' BERT LAMB update step (TF1 graph mode).

NVIDIA/DeepLearningExamples TensorFlow/LanguageModeling/BERT @729963dd, optimization.py create_optimizer with
num_accumulation_steps > 1 and allreduce_post_accumulation (run_pretraining_lamb.sh): on the step that applies
the accumulated gradients, the `update` branch of a tf.cond (lines 149-157) all-reduces every accumulator with
hvd.allreduce (line 151-152: Compression.fp16 under AMP casts it to fp16 and back; horovod/tensorflow/__init__.py
@v0.19.5 allreduce divides the sum by the rank count), then LAMBOptimizer.apply_gradients (lines 315-390) runs per
variable: m and v updates, bias corrections from the global step, the update with weight decay where the name
does not match LayerNorm/layer_norm/bias, the two l2 norms, the nested tf.where trust ratio, the new parameter and
three assigns. Under AMP the optimizer is wrapped by enable_mixed_precision_graph_rewrite (line 100), whose
MixedPrecisionLossScaleOptimizer.apply_gradients checks every gradient for inf/nan and applies under another cond.

This script builds that branch for BERT-large's 398 trainable variables (google-research/bert modeling.py
layout: embeddings 5, 24 layers x 16, pooler 2, MLM head 5, NSP head 2), named as there so that the weight-decay
exclusion matches as in the run, on one-element CPU tensors so that each kernel does next to nothing, with
tf.identity standing for the HorovodAllreduce op (one op). It runs the train op with the branch taken and not
taken, and prints the ops the branch executes (RunMetadata step stats) and the host seconds per op (median of
RUNS runs of STEPS steps, one inter-op and one intra-op thread), with XLA auto-clustering off and on
(TF_XLA_FLAGS --tf_xla_auto_jit=2 --tf_xla_cpu_global_jit; the CPU stands in for the GPU device).

    /path/to/venv-with-tensorflow/bin/python benchmarks/tf1_lamb_host.py [fp16|tf32] [xla]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "tf32"
XLA = len(sys.argv) > 2 and sys.argv[2] == "xla"
if XLA:
    os.environ["TF_XLA_FLAGS"] = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"

import tensorflow as tf  # noqa: E402

v1 = tf.compat.v1
STEPS, RUNS = 20, 5
LAYERS, RANKS = 24, 256
DECAY_EXCLUDED = ("LayerNorm", "layer_norm", "bias")  # optimization.py @729963dd line 82


def variable_names() -> list[str]:
    """BERT-large's trainable variables (google-research/bert modeling.py names)."""
    names = ["bert/embeddings/word_embeddings", "bert/embeddings/token_type_embeddings",
             "bert/embeddings/position_embeddings", "bert/embeddings/LayerNorm/gamma",
             "bert/embeddings/LayerNorm/beta"]
    for i in range(LAYERS):
        p = f"bert/encoder/layer_{i}"
        for dense in ("attention/self/query", "attention/self/key", "attention/self/value",
                      "attention/output/dense", "intermediate/dense", "output/dense"):
            names += [f"{p}/{dense}/kernel", f"{p}/{dense}/bias"]
        names += [f"{p}/attention/output/LayerNorm/gamma", f"{p}/attention/output/LayerNorm/beta",
                  f"{p}/output/LayerNorm/gamma", f"{p}/output/LayerNorm/beta"]
    names += ["bert/pooler/dense/kernel", "bert/pooler/dense/bias",
              "cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/bias",
              "cls/predictions/transform/LayerNorm/gamma", "cls/predictions/transform/LayerNorm/beta",
              "cls/predictions/output_bias", "cls/seq_relationship/output_weights",
              "cls/seq_relationship/output_bias"]
    return names


def allreduce(accum: tf.Tensor) -> tf.Tensor:
    """hvd.allreduce's TF side: compression cast, the HorovodAllreduce op (an identity here), cast back, average."""
    wire = tf.cast(accum, tf.float16) if MODE == "fp16" else accum
    summed = tf.identity(wire)
    summed = tf.cast(summed, tf.float32) if MODE == "fp16" else summed
    return summed / float(RANKS)


def lamb_apply(grads: list, params: list, step: tf.Tensor, lr: tf.Tensor) -> tf.Operation:
    """The per-variable ops of LAMBOptimizer.apply_gradients (optimization.py @729963dd lines 319-390)."""
    assigns = []
    steps = tf.cast(step, tf.float32)
    for grad, param in zip(grads, params, strict=True):
        name = param.op.name
        m = v1.get_variable(name + "/adam_m", shape=[1], trainable=False, initializer=v1.zeros_initializer())
        v = v1.get_variable(name + "/adam_v", shape=[1], trainable=False, initializer=v1.zeros_initializer())
        next_m = tf.multiply(0.9, m) + tf.multiply(1.0 - 0.9, grad)
        next_v = tf.multiply(0.999, v) + tf.multiply(1.0 - 0.999, tf.square(grad))
        m_hat = next_m / (1 - 0.9 ** steps)
        v_hat = next_v / (1 - 0.999 ** steps)
        update = m_hat / (tf.sqrt(v_hat) + 1e-6)
        if not any(s in name for s in DECAY_EXCLUDED):
            update += 0.01 * param
        w_norm = tf.norm(param, ord=2)
        g_norm = tf.norm(update, ord=2)
        ratio = tf.where(tf.greater(w_norm, 0), tf.where(tf.greater(g_norm, 0), w_norm / g_norm, 1.0), 1.0)
        next_param = param - ratio * lr * update
        assigns += [param.assign(next_param), m.assign(next_m), v.assign(next_v)]
    return tf.group(*assigns)


def update_branch(accums: list, params: list, step: tf.Tensor, lr: tf.Tensor) -> tf.Operation:
    """optimization.py @729963dd lines 149-153, with the AMP loss-scale optimizer's finite check and cond."""
    grads = [allreduce(a) for a in accums]
    if MODE != "fp16":
        return lamb_apply(grads, params, step, lr)
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    return tf.cond(finite, lambda: lamb_apply(grads, params, step, lr), tf.no_op)


def build() -> tuple:
    v1.disable_control_flow_v2()  # TF 1.15's tf.cond: Switch and Merge ops in the graph
    if MODE == "tf32":
        v1.disable_resource_variables()  # run_pretraining.py @729963dd line 591: resource variables only with AMP
    params = [v1.get_variable(n, shape=[1], initializer=v1.ones_initializer()) for n in variable_names()]
    accums = [v1.get_variable(p.op.name + "/accum", shape=[1], trainable=False, initializer=v1.ones_initializer())
              for p in params]
    step = v1.train.get_or_create_global_step()
    lr = tf.constant(1e-3)
    take = v1.placeholder(tf.bool, [])
    train = tf.cond(take, lambda: update_branch(accums, params, step, lr), tf.no_op)
    return train, take, len(params)


def timed(sess: v1.Session, train: tf.Operation, take: tf.Tensor, value: bool) -> float:
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(STEPS):
            sess.run(train, {take: value})
        runs.append((time.perf_counter() - start) / STEPS)
    return statistics.median(runs)


def executed_ops(sess: v1.Session, train: tf.Operation, take: tf.Tensor, value: bool) -> int:
    meta = v1.RunMetadata()
    sess.run(train, {take: value}, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE), run_metadata=meta)
    return sum(len(d.node_stats) for d in meta.step_stats.dev_stats)


def main() -> None:
    v1.disable_eager_execution()
    train, take, variables = build()
    config = v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    with v1.Session(config=config) as sess:
        sess.run(v1.global_variables_initializer())
        for value in (True, False):  # warm-up (and XLA compilation)
            for _ in range(3):
                sess.run(train, {take: value})
        ops = executed_ops(sess, train, take, True) - executed_ops(sess, train, take, False)
        taken, skipped = timed(sess, train, take, True), timed(sess, train, take, False)
    branch = taken - skipped
    print(f"tensorflow {tf.__version__} {MODE} xla={XLA}, {variables} variables: update branch {ops} ops, "
          f"{branch * 1e3:.2f} ms ({taken * 1e3:.2f} taken - {skipped * 1e3:.2f} skipped), "
          f"{branch / ops * 1e6:.2f} us per op")


if __name__ == "__main__":
    main()
