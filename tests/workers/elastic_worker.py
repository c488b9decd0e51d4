"""A rank of an elastic job (tests/test_elastic.py): linear regression trained by a custom loop of
DistributedOptimizer(algorithm) under tf_commlib.elastic.run, on hosts that Horovod's discovery script
lists; argv: algorithm, epochs, seconds per step, and "sharded" for SGD with momentum MOMENTUM and the
sharded update (else plain SGD). Every epoch visits one permutation of the N samples (a function of the epoch) in global batches of
BATCH samples per rank: a step at world size S takes the S * BATCH samples after ``offset``, rank r the
r-th BATCH of them, so the samples an epoch uses do not depend on how many ranks there are. The state
commits every COMMIT steps and at each epoch's end.

Each process appends to $HVD_TEST_OUT/events.jsonl: its start (pid, Horovod host name), each (re)start of
train() with the committed position it resumes from and the world size, every COMMIT-th step; the ranks
alive at the end report their weights, step count, the link ranks on one machine use, and the steps of the
committed run (epoch, offset, world size): what the samples of each epoch were and what a numpy replay of
them gives. Each train() (re)start also logs its layout, its node's and local index's ranks, and the
process sets Horovod has registered."""
import json
import os
import sys
import time

import numpy as np

N, DIM, BATCH, COMMIT, LR, MOMENTUM = 96, 6, 2, 3, 0.05, 0.9


def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N, DIM)).astype(np.float32)
    y = (x @ rng.standard_normal(DIM).astype(np.float32) + 0.1 * rng.standard_normal(N).astype(np.float32))
    return x, y.astype(np.float32)


def order(epoch):
    return np.random.default_rng(1000 + epoch).permutation(N)


def event(**row):
    with open(os.path.join(os.environ["HVD_TEST_OUT"], "events.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.time(), "pid": os.getpid(), **row}) + "\n")


def main(algorithm, epochs, step_s, shard=False):
    import keras
    import tensorflow as tf

    import tf_commlib
    from tf_commlib import elastic
    from tf_commlib.keras import DGC, DistributedOptimizer
    from tests.workers._report import report

    tf_commlib.init()
    event(kind="start", host=os.environ.get("HOROVOD_HOSTNAME"))
    x, y = data()
    state = elastic.State(epoch=0, offset=0, steps=[])

    @elastic.run
    def train(state):
        topo = tf_commlib.topology()
        model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1, use_bias=False,
                                                                          kernel_initializer="zeros")])
        # sharded: the momentum in the wrapped SGD's slices (DGC's correction would keep it per rank)
        opt = DistributedOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM if shard else 0.0),
                                   algorithm=algorithm, shard_optimizer=shard,
                                   dgc=DGC(momentum_correction=not shard))
        state.bind(model, opt)
        from horovod.common import process_sets   # what Horovod registered (its table, by id)
        registered = process_sets._basics._get_process_set_ids_and_ranks()
        event(kind="train", rank=topo.rank, size=topo.size, layout=[topo.m, topo.n], epoch=state["epoch"],
              offset=state["offset"], iterations=int(opt.iterations.numpy()),
              intra=list(topo.intra_ranks), inter=list(topo.inter_ranks),
              sets=sorted(list(r) for i, r in registered.items() if i != 0),
              set_ids=[topo.intra.process_set_id, topo.inter.process_set_id])

        @tf.function
        def step(xb, yb, scale):
            # the global batch's mean loss, as the ranks' average of sum * size / samples in the global batch
            # (the last one of an epoch may be short where the world size changed mid-epoch)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum((tf.squeeze(model(xb), -1) - yb) ** 2) / 2 * scale
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        def commit():
            state.commit()
            event(kind="commit", rank=topo.rank, size=topo.size, epoch=state["epoch"], offset=state["offset"])

        since = 0   # steps since this (re)start
        while state["epoch"] < epochs:
            perm = order(state["epoch"])
            while state["offset"] < N:
                start = state["offset"] + topo.rank * BATCH
                idx = perm[start:start + BATCH]
                samples = min(topo.size * BATCH, N - state["offset"])
                step(tf.constant(x[idx]), tf.constant(y[idx]), tf.constant(topo.size / samples, tf.float32))
                time.sleep(step_s)   # a step of a real model's length: time to kill a node mid-epoch
                state["steps"] = state["steps"] + [[state["epoch"], state["offset"], topo.size]]
                state["offset"] += topo.size * BATCH
                since += 1
                if since % COMMIT == 0 and state["offset"] < N:
                    commit()
            state["epoch"], state["offset"] = state["epoch"] + 1, 0
            commit()
        return model, opt

    model, opt = train(state)
    topo = tf_commlib.topology()
    import horovod.tensorflow as hvd
    from tf_commlib import primitives
    link = primitives.intra_link(tf.zeros([4]), hvd.global_process_set)   # every rank is on this machine
    report(topo.rank, {"link": link, "weights": model.get_weights()[0].ravel().tolist(), "iterations": int(opt.iterations.numpy()),
                       "size": topo.size, "pid": os.getpid(), "steps": state["steps"]})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:] == ["sharded"])
