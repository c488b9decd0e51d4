"""Overlap of gradient aggregation with backprop: buckets packed in backprop order, a bucket's
aggregation out of TensorFlow's program-order chain of stateful ops, and, in model.fit on 2 ranks,
the last layer's buckets aggregating before the first layer's gradient exists."""
import numpy as np
import pytest
import tensorflow as tf

from tests import hvdrun
from tf_commlib import fusion
from tf_commlib.overlap import Timeline, run_independently, op_count

# one thread per op, as the other fit tests: the ranks share the cores
THREADS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}


def specs(*shapes_dtypes):
    return [None if s is None else tf.TensorSpec(s[0], s[1]) for s in shapes_dtypes]


def test_plan_packs_from_the_last_gradient():
    ts = specs(((100,), tf.float32), ((30,), tf.float32), None, ((20,), tf.float32), ((5,), tf.float16),
               ((10,), tf.float32))
    # 240 bytes: from the end, 10 + 20 + 30 floats fill the first float32 bucket; 100 floats the next
    buckets = fusion.plan(ts, 240)
    assert [b.positions for b in buckets] == [(1, 3, 5), (4,), (0,)]
    assert [b.dtype for b in buckets] == [tf.float32, tf.float16, tf.float32]
    assert buckets[0].sizes == (30, 20, 10) and buckets[0].shapes == ((30,), (20,), (10,))
    forward = fusion.plan(ts, 240, backprop_order=False)
    assert [b.positions for b in forward] == [(0,), (1, 3, 5), (4,)]
    # one bucket per dtype: the same layout in either order (residuals of one-bucket models unchanged)
    assert fusion.plan(ts, 1 << 20) == [fusion.Bucket(tf.float32, (0, 1, 3, 5), ((100,), (30,), (20,), (10,)),
                                                      (100, 30, 20, 10)),
                                        fusion.Bucket(tf.float16, (4,), ((5,),), (5,))]
    # threshold 0: one bucket per tensor, the last first
    assert [b.positions for b in fusion.plan(ts, 0)] == [(5,), (4,), (3,), (1,), (0,)]


def test_flatten_unflatten_round_trip_in_backprop_order():
    rng = np.random.default_rng(0)
    ts = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in [(3, 4), (7,), (2, 2, 2)]]
    out = [None] * 3
    for b in fusion.plan(ts, 40):
        fusion.unflatten(fusion.flatten(ts, b) * 2, b, out)
    for t, o in zip(ts, out):
        np.testing.assert_array_equal(o.numpy(), t.numpy() * 2)


def _control_inputs(graph, op_type):
    return {op.name: {c.name for c in op.control_inputs} for op in graph.get_operations() if op.type == op_type}


def test_stateful_ops_of_a_bucket_leave_the_program_order_chain():
    """Two tf.timestamp()s (stateful, no resource input) traced in one order: automatic control
    dependencies chain the second after the first; run_independently frees it."""
    def body(independent):
        since = op_count()
        a = tf.timestamp()
        if independent:
            run_independently(since)
        since = op_count()
        b = tf.timestamp()
        if independent:
            run_independently(since)
        return a + b

    for independent, chained in ((False, True), (True, False)):
        graph = tf.function(lambda: body(independent)).get_concrete_function().graph
        deps = _control_inputs(graph, "Timestamp")
        assert len(deps) == 2
        assert any(deps.values()) == chained, deps


def test_timeline_records_eagerly_and_in_tf_function():
    timeline = Timeline()
    x = timeline.stamp("eager", tf.constant(1.0))
    assert float(x) == 1.0 and np.isfinite(timeline.times()["eager"])
    step = tf.function(lambda v: timeline.stamp("graph", v * 2))
    before = tf.timestamp().numpy()
    assert float(step(tf.constant(3.0))) == 6.0
    assert timeline.times()["graph"] >= before
    assert timeline.stamp("none", None) is None


def _times(step):
    return {tuple(k): t for k, t in step}


def _bucket_of(groups, variable):
    """The timeline key of the bucket that holds the variable."""
    for g in groups:
        if variable in g["variables"]:
            p = g["variables"].index(variable)
            return ("bucket", g["tag"], next(b for b, pos in enumerate(g["buckets"]) if p in pos))
    raise AssertionError(f"variable {variable} is in no group")


def test_buckets_aggregate_while_backprop_runs(tmp_path):
    """model.fit on 2 ranks, one bucket per variable, the first layer expensive in backward: the
    buckets of the last layer (its kernel through the sparse algorithm, its bias through dense)
    start aggregating before the first layer's gradient exists; with local_clip_norm (a global
    barrier) or overlap=False (aggregation after backprop) no bucket starts before it. Under
    mixed_float16 (loss scaling with its global finite check) the buckets still start early, and so do
    the sharded update's (shard_optimizer=True: dense's reduce-scatter, hitopk's node slices). The first step is left out (the ranks trace it at
    different speeds). A rank that is ahead waits in the step's consistency check for the other, so
    overlap is asserted on the rank that waits least (the later one) of each step."""
    cases = ["hitopk", "clip:dense", "serial:hitopk", "mixed:hitopk", "shard:dense", "shard:hitopk"]   # hitopk: shared-memory reduce-scatter and all-gather (2 ranks, one node)
    reports = hvdrun.run("overlap_worker.py", 2, tmp_path, args=cases, timeout=400, env=THREADS)
    for case in cases:
        results = [r["cases"][case] for r in reports]
        assert len({c["weights"] for c in results}) == 1, case   # replicas bit-identical
        c0 = results[0]
        last = c0["n_variables"] - 1
        groups = c0["groups"]
        assert len(groups) == 2   # sparse (conv and last kernels), dense (biases, small kernels)
        for g in groups:   # one bucket per variable, packed from the last
            assert g["buckets"] == [[p] for p in reversed(range(len(g["variables"])))]
        keys = {_bucket_of(groups, last), _bucket_of(groups, last - 1)}
        assert {k[1] for k in keys} == {0, 1}   # the last layer has a bucket in each group
        for step in range(1, len(c0["steps"])):
            times = [_times(c["steps"][step]) for c in results]
            first_grad = [t[("gradient", 0)] for t in times]
            if case.startswith(("clip:", "serial:")):   # every bucket waits for every gradient
                for t, g0 in zip(times, first_grad):
                    assert all(v >= g0 for k, v in t.items() if k[0] == "bucket"), (case, step, t)
                continue
            lead = [g0 - max(t[k] for k in keys) for t, g0 in zip(times, first_grad)]
            assert max(lead) > 0, (case, step, lead, times)


def _ancestors(op):
    """Every op that op waits for (data and control inputs, transitively)."""
    seen, todo = set(), [op]
    while todo:
        cur = todo.pop()
        for dep in [t.op for t in cur.inputs] + list(cur.control_inputs):
            if dep.name not in seen:
                seen.add(dep.name)
                todo.append(dep)
    return seen


@pytest.mark.parametrize("algorithm", ["dense", "hitopk"])
def test_buckets_aggregate_one_after_another(algorithm):
    """Inside tf.function bucket b + 1's aggregation starts after bucket b's results (one bucket's
    collectives in flight at a time: each waiting shared-memory collective polls on a thread of its
    own), and never the other way round; bucket 0 still waits for no other bucket."""
    from tf_commlib.aggregator import GradientAggregator
    from tf_commlib.topology import Topology

    class Alone:   # a process set of this one rank: the collectives pass the tensor through
        def size(self):
            return 1

    one = Topology(m=1, n=1, rank=0, node=0, local=0, intra_ranks=(0,), inter_ranks=(0,), intra=Alone(),
                   inter=Alone(), world=Alone())
    agg = GradientAggregator(algorithm, density=0.5, topology=one, fusion_threshold_bytes=40)
    grads = [tf.constant(np.arange(n, dtype=np.float32)) for n in (10, 10, 10)]
    # without commit(): the function's outputs also wait for every state write (automatic control deps)
    graph = tf.function(lambda gs: agg.aggregate_deferred(gs)[0]).get_concrete_function(grads).graph
    assert [b.positions for b in agg.buckets] == [(2,), (1,), (0,)]   # bucket b holds gradient 2 - b
    waits = [_ancestors(t.op) for t in graph.outputs]   # what the result for each gradient waits for
    inputs = [t.op.name for t in graph.inputs[:3]]      # the gradients
    for b in (0, 1):   # bucket b + 1 (gradient 1 - b) waits for bucket b (gradient 2 - b), not back
        assert inputs[2 - b] in waits[1 - b]
        assert inputs[1 - b] not in waits[2 - b]
    assert waits[2].isdisjoint(inputs[:2])   # bucket 0 waits for no other gradient
