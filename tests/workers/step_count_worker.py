"""Training that hangs on no callback, on 2x2: a linear model (one Dense kernel, MSE), each rank its own
batches. Reports the weights of every rank after
* a custom loop of ``apply_gradients`` alone with DiLoCo (H = 3, 7 steps, then ``synchronize()``);
* model.fit without callbacks with DiLoCo (H = 3, 2 epochs of the first 4 batches), steps_per_execution 1 and 2;
* a custom loop of ``apply_gradients`` alone with the default DistributedOptimizer (algorithm "auto"), on a
  kernel of WIDE entries (one that a lossy candidate could aggregate);
* LossScaleOptimizer(DiLoCo(H = 4)) where node 0 skips step 2 (an infinite loss on rank 0);
and the numbers tests/test_step_count.py simulates them from (the per-rank data)."""
import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib.keras import DiLoCo, DistributedOptimizer, LossScaleOptimizer

D, BATCH, STEPS = 5, 4, 8


WIDE = 1200   # a kernel of 1200 entries: compressible (RedSync sends tensors under 1024 entries dense)


def data(rank, d=D):
    """(x [STEPS * BATCH, d], y [STEPS * BATCH, 1]) of a rank: the test rebuilds them from the same seed."""
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((STEPS * BATCH, d)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, d, dtype=np.float32)[:, None] + rank).astype(np.float32)
    return x, y


def model(d=D):
    return keras.Sequential([keras.Input((d,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])


def loop(net, opt, x, y, rank, steps, scaled=False, blow_at=None):
    """A custom loop whose step ends with opt.apply_gradients and nothing else."""
    blow = tf.Variable(1.0)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(xb) - yb)) * blow
            if scaled:
                loss = opt.scale_loss(loss)
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))

    for i in range(steps):
        blow.assign(np.inf if (blow_at is not None and i == blow_at and rank == 0) else 1.0)
        j = i % STEPS
        step(x[j * BATCH:(j + 1) * BATCH], y[j * BATCH:(j + 1) * BATCH])


def kernel(net):
    return net.trainable_variables[0].numpy().ravel().tolist()


def main():
    topo = tf_commlib.init()
    out = {"rank": topo.rank, "node": topo.node}
    x, y = data(topo.rank)

    # a custom loop of apply_gradients alone: syncs at steps 3 and 6 by the step's own count, then the end
    net, opt = model(), DiLoCo(keras.optimizers.SGD(0.05), sync_every=3, overlap=False)
    loop(net, opt, x, y, topo.rank, 7)
    out["loop_steps"], out["loop_synced_at"] = int(opt.steps_done.numpy()), int(opt.synced_at.numpy())
    out["loop_before_sync"] = kernel(net)
    opt.synchronize()
    out["loop"] = kernel(net)

    # model.fit without callbacks: syncs at steps 3 and 6, and at fit's end (finalize_variable_values)
    for spe in (1, 2):
        net, opt = model(), DiLoCo(keras.optimizers.SGD(0.05), sync_every=3, overlap=False)
        net.compile(opt, "mse", jit_compile=False, steps_per_execution=spe)
        net.fit(x[:STEPS // 2 * BATCH], y[:STEPS // 2 * BATCH], batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        out[f"fit_{spe}"] = kernel(net)
        out[f"fit_{spe}_steps"] = int(opt.steps_done.numpy())

    # the default optimizer ("auto") in a custom loop of apply_gradients alone, on a compressible kernel:
    # it measures the link and times its candidates itself when it is built
    wide_x, wide_y = data(topo.rank, WIDE)
    net, opt = model(WIDE), DistributedOptimizer(keras.optimizers.SGD(0.01))
    loop(net, opt, wide_x, wide_y, topo.rank, STEPS)
    out["default"] = kernel(net)
    out["default_algorithm"] = opt.algorithm_at(0)
    out["default_measured"] = [opt.calibrated_link is not None, sorted(opt.probed or {})]
    out["default_log"] = opt.auto_log

    # a loss-scaled step skipped by node 0 inside an interval: counted on every rank all the same
    net = model()
    opt = LossScaleOptimizer(DiLoCo(keras.optimizers.SGD(0.05), sync_every=4, overlap=False), initial_scale=8.0)
    loop(net, opt, x, y, topo.rank, STEPS, scaled=True, blow_at=2)
    out["skip"] = kernel(net)
    out["skip_steps"] = int(opt.inner_optimizer.steps_done.numpy())
    out["skip_scale"] = float(opt.dynamic_scale.numpy())
    report(topo.rank, out)


if __name__ == "__main__":
    main()
