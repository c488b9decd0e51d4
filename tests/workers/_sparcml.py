"""SparCML's collectives (ssar_rd, ssar_split_ag, dsar_split_ag) in a worker: on integer-valued
inputs with error feedback (exact sums) and the bytes moved, on float inputs (the summation order
matters), dsar_split_ag forced dense and with QSGD over seeds; checked by
tests/test_collectives.py (check_sparcml)."""
import numpy as np
import tensorflow as tf

from tf_commlib import link_bytes, ops
from tf_commlib.collectives import ALGORITHMS

NAMES = ("ssar_rd", "ssar_split_ag", "dsar_split_ag")
D, STEPS, SEEDS = 1001, 3, 24


def seed(step, rank):
    return 100 * step + rank


def counted(fn):
    """fn()'s result (numpy) and the bytes this rank's primitives sent during it."""
    with link_bytes.counting() as counter:
        result = tf.nest.map_structure(lambda t: t.numpy(), fn())
        return result, counter.result()


def select_at(step, rank):
    return lambda v, k: ops.mstopk(v, k, seed=seed(step, rank))


def inputs_of(rank):
    rng = np.random.default_rng(1000 + rank)
    return [rng.integers(-50, 51, D).astype(np.float32) for _ in range(STEPS)]


def steps(topo, out):
    """Every SparCML collective for STEPS steps with error feedback (out[name@density], bytes)."""
    inputs = inputs_of(topo.rank)
    out.setdefault("inputs", [x.tolist() for x in inputs])
    for name in NAMES:
        coll = ALGORITHMS[name]
        for density in (0.05, 1.0):
            residual, results, sent = tf.zeros([D]), [], []
            for step, x in enumerate(inputs):
                (agg, residual, _), b = counted(lambda: coll.fn(tf.constant(x), topo, density,
                                                                select_at(step, topo.rank), residual))
                results.append(agg.tolist())
                sent.append(b)
            out[f"{name}@{density}"] = {"results": results, "residual": residual.tolist()}
            out["bytes"][f"{name}@{density}"] = sent


def extras(topo, out):
    """Float inputs, dsar_split_ag with delta=1 and with QSGD (eager over SEEDS seeds, and once in
    tf.function), on step 0's inputs."""
    x0 = inputs_of(topo.rank)[0]
    floats = np.random.default_rng(2000 + topo.rank).standard_normal(D).astype(np.float32)
    for name in NAMES:
        agg, _, sent = ALGORITHMS[name].fn(tf.constant(floats), topo, 0.05, select_at(0, topo.rank))
        out[f"{name}:float"] = {"result": agg.numpy().tolist(), "sent": sent.numpy().tolist()}
    out["floats"] = floats.tolist()
    coll = ALGORITHMS["dsar_split_ag"]
    for option in ("delta=1", "qsgd_bits=4,delta=1"):
        options = {k: int(v) for k, v in (kv.split("=") for kv in option.split(","))}
        runs = []
        for s in range(SEEDS if "qsgd" in option else 1):
            (agg, _, _), b = counted(lambda: coll.fn(tf.constant(x0), topo, 0.05, select_at(0, topo.rank), None,
                                                     coll.context(seed=s, options=options)))
            runs.append(agg.tolist())
        out[f"dsar_split_ag:{option}"] = runs
        out["bytes"][f"dsar_split_ag@0.05:{option}"] = [b]
    ctx = coll.context(seed=tf.constant(SEEDS - 1, tf.int64), options={"qsgd_bits": 4, "delta": 1})
    f = tf.function(lambda x: coll.fn(x, topo, 0.05, select_at(0, topo.rank), None, ctx))
    out["dsar_split_ag:qsgd:graph"] = f(tf.constant(x0))[0].numpy().tolist()
