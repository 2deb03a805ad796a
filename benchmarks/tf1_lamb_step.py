"""What the optimizer step of DeepLearningExamples' TensorFlow 1 BERT runs, counted and timed in TensorFlow 1.15.

NVIDIA/DeepLearningExamples TensorFlow/LanguageModeling/BERT/optimization.py @729963dd (the code the dle-bert-tf1
rows ran, in the TensorFlow 20.06 container, TensorFlow 1.15.2) accumulates gradients over
num_accumulation_steps session runs and, on the last one, runs update() inside a tf.cond: hvd.allreduce of every
accumulator, then LAMBOptimizer.apply_gradients, a Python loop that builds some 40 TensorFlow ops per variable.
This script imports that optimization.py (pass its path; it is not copied here), builds it over BERT-Large's 398
trainable variables (modeling.py's names, so exclude_from_weight_decay matches as in training, but with tiny
shapes: only the count of ops and the host's time per op should show), with a stand-in for Horovod
(horovod/tensorflow/__init__.py @v0.19.5 allreduce: a Cast of the size, the compression's casts, the allreduce op,
a division by the size; the stand-in's allreduce is a DeepCopy, which XLA cannot cluster, like the real
HorovodAllreduce), and reports for an accumulation run and an update run:
- the ops the executor ran (RunMetadata step_stats, FULL_TRACE), and what of them XLA clustered (`--xla`:
  global_jit_level ON_1 as run_pretraining.py sets it, with --tf_xla_cpu_global_jit so that the same
  mark_for_compilation pass clusters for the CPU);
- the host seconds of each kind of run (median of `--runs` runs, one inter-op thread and one intra-op thread, so
  that the figure is the executor's serial cost per op).

    python3.7 -m venv /tmp/tf115 && /tmp/tf115/bin/pip install tensorflow==1.15.5 'protobuf<3.21'
    git show 729963dd:TensorFlow/LanguageModeling/BERT/optimization.py > /tmp/dle_optimization.py
    /tmp/tf115/bin/python benchmarks/tf1_lamb_step.py /tmp/dle_optimization.py [--fp16] [--xla]

What it printed on the 2-vCPU Intel Xeon VM (family 6 model 207) of spec/hardware.py's Xeon measurement, TensorFlow
1.15.5 (the pip build; the container's 1.15.2+nv20.06 adds only an opt-in --tf_xla_ops_to_cluster whitelist and
_XlaInternalScope to tensorflow/compiler/jit/mark_for_compilation_pass.cc), per update run over an accumulation run:
- --xla (TF32 rows: ref variables): 1 XLA cluster (_XlaRun with 1595 inputs, 1194 outputs: all of LAMB's math for
  all 398 variables), 1194 Assign ops left outside it (3 per variable: param, adam_m, adam_v; ref-variable assigns
  do not cluster) and the 398 allreduce ops; host +11.90 ms (quiet run) and +28.81 ms (loaded run).
- --fp16 --xla (AMP rows: run_pretraining.py enables resource variables): 1 XLA cluster (1596 inputs; the
  AssignVariableOps are inside it), 398 fp16 Casts and 398 allreduce ops outside, 1600 Switch; host +12.25 ms
  (quiet) and +23.43 ms (loaded).
- without XLA (for scale): 13,452 more ops (33.8 per variable: Mul, RealDiv, AddV2, Sqrt, Square, Sum, Greater,
  Select, Squeeze, Sub, Assign, ...), host +12.43 ms, 0.92 us per op.
So under XLA the update's math is one compiled computation, not ~33 TensorFlow ops per variable, and the host's
TensorFlow-side work for it is ~12 ms on this CPU; a GPU host adds the compiled kernels' launches, not counted here.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import statistics
import sys
import time
import types

GA = 4  # accumulation runs per update: the 32-node rows' num_accumulation_steps
LAYERS = 24  # BERT-Large


def bert_large_variables():
    """(name, per-layer) trainable variables of DLE's modeling.py + run_pretraining.py heads, BERT-Large: 398."""
    names = ["bert/embeddings/word_embeddings", "bert/embeddings/token_type_embeddings",
             "bert/embeddings/position_embeddings", "bert/embeddings/LayerNorm/beta",
             "bert/embeddings/LayerNorm/gamma"]
    per_layer = ["attention/self/query/kernel", "attention/self/query/bias", "attention/self/key/kernel",
                 "attention/self/key/bias", "attention/self/value/kernel", "attention/self/value/bias",
                 "attention/output/dense/kernel", "attention/output/dense/bias", "attention/output/LayerNorm/beta",
                 "attention/output/LayerNorm/gamma", "intermediate/dense/kernel", "intermediate/dense/bias",
                 "output/dense/kernel", "output/dense/bias", "output/LayerNorm/beta", "output/LayerNorm/gamma"]
    names += [f"bert/encoder/layer_{i}/{n}" for i in range(LAYERS) for n in per_layer]
    names += ["bert/pooler/dense/kernel", "bert/pooler/dense/bias", "cls/predictions/transform/dense/kernel",
              "cls/predictions/transform/dense/bias", "cls/predictions/transform/LayerNorm/beta",
              "cls/predictions/transform/LayerNorm/gamma", "cls/predictions/output_bias",
              "cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias"]
    return names


def install_horovod_stand_in(tf):
    """horovod.tensorflow.compression.Compression (none / fp16 casts) and an hvd whose allreduce builds the ops
    horovod/tensorflow/__init__.py @v0.19.5 builds around HorovodAllreduce, with DeepCopy standing in for it."""
    class NoCompression:
        @staticmethod
        def compress(t):
            return t, None

        @staticmethod
        def decompress(t, ctx):
            return t

    class FP16Compression:
        @staticmethod
        def compress(t):
            return (tf.cast(t, tf.float16) if t.dtype.is_floating else t), t.dtype

        @staticmethod
        def decompress(t, dtype):
            return tf.cast(t, dtype) if dtype.is_floating else t

    compression = types.ModuleType("horovod.tensorflow.compression")
    compression.Compression = type("Compression", (), {"none": NoCompression, "fp16": FP16Compression})

    class Hvd:
        SIZE = 256

        @staticmethod
        def allreduce(tensor, compression=NoCompression):
            tensor = tf.convert_to_tensor(tensor)
            size = tf.cast(Hvd.SIZE, dtype=tensor.dtype)
            sent, ctx = compression.compress(tensor)
            summed = tf.raw_ops.DeepCopy(x=sent)  # stands in for HorovodAllreduce (no XLA kernel either)
            return compression.decompress(summed, ctx) / size

    for name in ("horovod", "horovod.tensorflow"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["horovod.tensorflow.compression"] = compression
    return Hvd


def build(optimization_py: str, fp16: bool):
    import tensorflow as tf
    hvd = install_horovod_stand_in(tf)
    spec = importlib.util.spec_from_file_location("dle_optimization", optimization_py)
    optimization = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(optimization)
    if fp16:
        tf.enable_resource_variables()  # run_pretraining.py: with XLA and AMP
    variables = [tf.get_variable(n, shape=[2], initializer=tf.ones_initializer()) for n in bert_large_variables()]
    loss = tf.add_n([tf.reduce_sum(v * v) for v in variables])
    train_op = optimization.create_optimizer(
        loss, 6e-3, 7038, 2000, hvd=hvd, use_fp16=fp16, num_accumulation_steps=GA, optimizer_type="lamb",
        allreduce_post_accumulation=True)
    return tf, train_op, len(variables)


def op_type(graph, node_name: str) -> str:
    """The op type of a node the executor ran: the graph's, or the name of a node the runtime added (an XLA
    cluster's _XlaCompile/_XlaRun, a constant folded by grappler)."""
    name, _, traced_type = node_name.partition(":")  # FULL_TRACE names some nodes "name:Type"
    try:
        return graph.get_operation_by_name(name).type
    except KeyError:
        if traced_type:
            return traced_type
        return "runtime:" + node_name.split("/")[-1].split("_")[0]


def run_kinds(tf, sess, train_op, runs: int):
    """Per kind of run (accumulation, update): the ops the executor ran and their kinds, and host seconds."""
    graph = tf.get_default_graph()
    update_step = graph.get_tensor_by_name("update_step:0")
    opts = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
    ops = {}
    for _ in range(2 * GA):  # traced runs: the first GA warm up, the next GA give each kind its count
        meta = tf.RunMetadata()
        _, is_update = sess.run([train_op, update_step], options=opts, run_metadata=meta)
        # each node once: the CPU trace reports a node from the executor's stats and again from its tracer
        names = {node.node_name.partition(":")[0]: node.node_name for dev in meta.step_stats.dev_stats
                 for node in dev.node_stats if node.node_name not in ("_SOURCE", "_SINK")}
        ops["update" if is_update else "accumulate"] = collections.Counter(
            op_type(graph, name) for name in names.values())
    seconds = collections.defaultdict(list)
    for _ in range(GA * runs):  # timed runs, untraced
        t0 = time.perf_counter()
        _, is_update = sess.run([train_op, update_step])
        seconds["update" if is_update else "accumulate"].append(time.perf_counter() - t0)
    return ops, {k: statistics.median(v) for k, v in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("optimization_py")
    parser.add_argument("--fp16", action="store_true", help="use_fp16 (AMP's loss-scale optimizer, fp16 casts)")
    parser.add_argument("--xla", action="store_true", help="global_jit_level ON_1, clustering for the CPU")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    if args.xla:
        os.environ["TF_XLA_FLAGS"] = "--tf_xla_cpu_global_jit --tf_xla_enable_lazy_compilation=false"
    tf, train_op, n_vars = build(args.optimization_py, args.fp16)
    config = tf.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    if args.xla:
        config.graph_options.optimizer_options.global_jit_level = tf.OptimizerOptions.ON_1
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        ops, seconds = run_kinds(tf, sess, train_op, args.runs)
    print(f"tensorflow {tf.__version__}, {n_vars} trainable variables, fp16={args.fp16}, xla={args.xla}, GA={GA}")
    runs = {"update": args.runs, "accumulate": (GA - 1) * args.runs}
    for kind in ("accumulate", "update"):
        count = sum(ops[kind].values())
        print(f"{kind:10s}: {count} ops run, host {seconds[kind] * 1e3:.2f} ms (median of {runs[kind]} runs)")
    extra = ops["update"] - ops["accumulate"]
    print("ops of an accumulation run:", ", ".join(f"{k} {v}" for k, v in ops["accumulate"].most_common(30)))
    n_extra = sum(extra.values())
    dt = seconds["update"] - seconds["accumulate"]
    print(f"update - accumulate: {n_extra} ops, {dt * 1e3:.2f} ms, {dt / max(n_extra, 1) * 1e6:.2f} us per op, "
          f"{n_extra / n_vars:.1f} ops per variable")
    print("most frequent extra ops:", ", ".join(f"{k} {v}" for k, v in extra.most_common(25)))


if __name__ == "__main__":
    main()
