"""What an accumulation run of DeepLearningExamples' TensorFlow 1 BERT leaves to the host after its mid-run sync.

NVIDIA/DeepLearningExamples TensorFlow/LanguageModeling/BERT/optimization.py @729963dd, with AMP and
num_accumulation_steps > 1, computes in every session.run (one micro-batch) `all_are_finite` (line 130: reduce_all
of is_finite over every gradient, on the GPU) and makes it the predicate of the tf.cond that picks the global norm
clip_by_global_norm uses (lines 138-143). A GPU Switch keeps its predicate in host memory (NVIDIA/tensorflow
@91fc0fc3 tensorflow/core/kernels/control_flow_ops.cc:77-82, REGISTER_GPU_SWITCH ... HostMemory("pred")), so the
executor can dispatch nothing downstream of that cond (the global norm, the clip of every gradient, the
accumulators' assign/assign_add cond of lines 145-147) before the predicate has been copied to the host, i.e. before
the device has finished the whole backward pass that every gradient depends on. What the host then has to issue is
this script's figure: the host seconds of an accumulation run minus those of a run of what does not wait for
all_are_finite (the ops it and the rest of the run need that are not downstream of it), both on BERT-Large's 398
trainable variables with tiny shapes so that only the ops' count and the executor's cost per op show, as
benchmarks/tf1_lamb_step.py builds them (its Horovod stand-in and its optimization.py import; XLA auto-clustering as
run_pretraining.py sets it, with --tf_xla_cpu_global_jit so that the same clustering pass runs for the CPU).
Without AMP all_are_finite is tf.constant(True): no sync.

    python3.7 -m venv /tmp/tf115 && /tmp/tf115/bin/pip install tensorflow==1.15.5 'protobuf<3.21'
    git show 729963dd:TensorFlow/LanguageModeling/BERT/optimization.py > /tmp/dle_optimization.py
    /tmp/tf115/bin/python benchmarks/tf1_accumulate_sync.py /tmp/dle_optimization.py

What it printed on the 2-vCPU Intel Xeon VM (family 6 model 207) of spec/hardware.py's Xeon measurement, TensorFlow
1.15.5, is in dlperf/engine/tf1_update.py (ACCUMULATE_SYNC_HOST).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf1_lamb_step import GA, build, op_type  # noqa: E402


def all_are_finite(graph):
    """optimization.py's all_are_finite: the reduce_all over the stacked per-gradient reduce_alls (an All of a Pack)
    outside any cond (the loss-scale optimizer's own finite check of the update branch is inside one)."""
    outer = [op for op in graph.get_operations() if op.type == "All" and op.inputs[0].op.type == "Pack"
             and op._get_control_flow_context() is None]
    assert len(outer) == 1, [op.name for op in outer]
    return outer[0].outputs[0]


def _walk(start, step) -> set:
    seen, stack = set(), [start]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(step(op))
    return seen


def before_the_sync(train_op, finite) -> list:
    """The ops of an accumulation run that do not wait for all_are_finite: train_op's ancestors (data and control
    inputs) that are not its descendants (data and control outputs): the conds' Switches of variable handles and
    the ops of their branches that need nothing downstream of the sync run too."""
    after = _walk(finite.op, lambda op: [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs))
    needed = _walk(train_op, lambda op: [t.op for t in op.inputs] + list(op.control_inputs))
    pre = [op for op in needed if op not in after]
    # one NoOp with control inputs from them all (a Switch is not fetchable, its untaken output being dead, nor is
    # an op inside a cond's branch; and one target keeps the Python client's per-fetch work that of the
    # accumulation run's two fetches)
    with train_op.graph.as_default(), train_op.graph.control_dependencies(pre):
        return train_op.graph.create_op("NoOp", [], [], name="before_the_sync")


def traced_ops(tf, sess, fetches) -> collections.Counter:
    """The kinds of the ops one run of `fetches` executes (RunMetadata step_stats, FULL_TRACE)."""
    graph = tf.get_default_graph()
    meta = tf.RunMetadata()
    sess.run(fetches, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE), run_metadata=meta)
    names = {node.node_name.partition(":")[0]: node.node_name for dev in meta.step_stats.dev_stats
             for node in dev.node_stats if node.node_name not in ("_SOURCE", "_SINK")}
    return collections.Counter(op_type(graph, name) for name in names.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("optimization_py")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    os.environ["TF_XLA_FLAGS"] = "--tf_xla_cpu_global_jit --tf_xla_enable_lazy_compilation=false"
    tf, train_op, n_vars = build(args.optimization_py, fp16=True)
    graph = tf.get_default_graph()
    finite = all_are_finite(graph)
    update_step = graph.get_tensor_by_name("update_step:0")
    pre_sync = before_the_sync(train_op, finite)
    config = tf.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    config.graph_options.optimizer_options.global_jit_level = tf.OptimizerOptions.ON_1
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(2 * GA):  # warm up both kinds of run and the all_are_finite run
            sess.run([train_op, update_step])
            sess.run(pre_sync)
        while not sess.run([train_op, update_step])[1]:  # end on an update: the next GA - 1 runs accumulate
            pass
        ops_full = traced_ops(tf, sess, [train_op, update_step])
        ops_pre = traced_ops(tf, sess, pre_sync)
        full, pre = [], []
        for _ in range(args.runs):
            for _ in range(GA):
                t0 = time.perf_counter()
                _, is_update = sess.run([train_op, update_step])
                if not is_update:
                    full.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                sess.run(pre_sync)
                pre.append(time.perf_counter() - t0)
    t_full, t_pre = statistics.median(full), statistics.median(pre)
    print(f"tensorflow {tf.__version__}, {n_vars} trainable variables, fp16 (AMP) with XLA, GA={GA}")
    print(f"accumulation run: {sum(ops_full.values())} ops, host {t_full * 1e3:.2f} ms (median of {len(full)})")
    print(f"what does not wait for all_are_finite: {sum(ops_pre.values())} ops, host {t_pre * 1e3:.2f} ms "
          f"(median of {len(pre)})")
    print(f"quickest runs: accumulation {min(full) * 1e3:.2f} ms, before the sync {min(pre) * 1e3:.2f} ms")
    after = ops_full - ops_pre
    print(f"after the sync: {sum(after.values())} ops, {(t_full - t_pre) * 1e3:.2f} ms, "
          f"{(t_full - t_pre) / n_vars * 1e6:.2f} us per variable")
    print("ops after the sync:", ", ".join(f"{k} {v}" for k, v in after.most_common(25)))


if __name__ == "__main__":
    main()
