"""Per-rank state moved to another layout (what tf_commlib.elastic does at a reset), on 4 ranks: for each
algorithm, a DistributedOptimizer with DGC's momentum correction steps 3 times on 2x2 with data that
differs by rank; each rank takes its rank_state() (what it owes the sum, per variable, and its momentum).
Horovod is then started again as 1x4 (hitopk's residuals become quarters of the node's sum) and as 4x1
(whole vectors); a fresh optimizer of each takes its rank's state with load_rank_state, rank 3 taking none
(as a rank that joined), and reports its rank_state() and its residual variables. Reports per rank and
layout: {algorithm: {"owed": per variable, "momentum": per variable, "residuals": lengths, "beyond": the
largest |entry| of a residual past its bucket (PowerSGD's Q)}}."""
import keras
import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

import tf_commlib
from tests.workers._report import report
from tf_commlib import costmodel, shm
from tf_commlib.keras import DistributedOptimizer, Selection

ALGORITHMS = ("hitopk", "powersgd", "naive_ag", "auto")
JOINED = 3   # the rank that loads no state


def build(algorithm):
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(33), keras.layers.Dense(4)])
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05), algorithm=algorithm, density=0.25,
                               selection=Selection(dense_layers=lambda v: len(v.shape) <= 1))   # kernels: the collective
    opt.measure(model.trainable_variables)   # "auto": the link and the candidates timed (a collective)
    opt.build(model.trainable_variables)
    return model, opt


def listed(state):
    return {"owed": [None if o is None else o.tolist() for o in state["owed"]],
            "momentum": [m.tolist() for m in state["momentum"]]}


def residual_lengths(opt):
    return [int(v.shape[0]) for g in opt.lossy_aggregators() for v in g.residual_variables()]


def beyond_buckets(opt):
    """The largest |entry| of any residual past its bucket's length (PowerSGD's Q)."""
    return max([0.0] + [float(np.abs(v.numpy()[sum(b.sizes):]).max(initial=0.0)) for g in opt.lossy_aggregators()
                        for i, b in enumerate(g.buckets) for _, v in g.state.named(i)])


def main():
    topo = tf_commlib.init("2x2")
    rng = np.random.default_rng(11 + topo.rank)
    states, out = {}, {}
    for algorithm in ALGORITHMS:
        model, opt = build(algorithm)
        if algorithm == "auto":   # the candidate hitopk running, with the residuals of every candidate
            for agg in opt.lossy_aggregators():
                agg.set_algorithm("hitopk")
        for _ in range(3):
            x, y = rng.standard_normal((8, 40)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        states[algorithm] = opt.rank_state()
        out[algorithm] = {**listed(states[algorithm]), "residuals": residual_lengths(opt), "beyond": beyond_buckets(opt),
                          "candidates": [list(a.candidates) for a in opt.lossy_aggregators()]}
    reports = {"2x2": out}
    for layout in ("1x4", "4x1"):
        hvd.shutdown()
        shm.forget()
        costmodel.forget_hosts()
        topo = tf_commlib.init(layout)
        out = {}
        for algorithm in ALGORITHMS:
            model, opt = build(algorithm)
            dropped = opt.load_rank_state(None if topo.rank == JOINED else states[algorithm])
            out[algorithm] = {**listed(opt.rank_state()), "residuals": residual_lengths(opt), "dropped": dropped,
                              "beyond": beyond_buckets(opt)}
        reports[layout] = out
    report(topo.rank, reports)


if __name__ == "__main__":
    main()
