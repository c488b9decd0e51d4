"""Collectives whose input is a constant on some ranks only, called again with other values:
Grappler must not run the Horovod op once at graph-optimisation time and reuse its result.
Run at the end of tests/workers/collectives_worker.py (checked by tests/test_collectives.py)."""
import tensorflow as tf

from tf_commlib import primitives


def run(topo):
    """Three calls of one tf.function on the world set (lengths 5, 9, 2), under op determinism (as
    the DAWNBench script's --deterministic, which forbids some unfoldable ops): what each call
    broadcast, all-gathered and summed."""
    tf.config.experimental.enable_op_determinism()
    world = topo.world
    length = tf.Variable(5)

    @tf.function
    def step():
        # the root is a constant, so the tf.cond on it folds and the others' input becomes a constant
        root = tf.math.floormod(tf.constant(0, tf.int64), world.size())
        mine = tf.cond(tf.equal(root, world.rank()), lambda: tf.range(length), lambda: tf.zeros([0], tf.int32))
        sent = primitives.broadcast(mine, root, world)
        # rank 0 contributes a variable's value, the others a constant
        value = tf.cond(tf.equal(root, world.rank()), lambda: tf.cast(length, tf.float32), lambda: tf.constant(1.0))
        return sent, primitives.allgather(tf.reshape(value, [1]), world), primitives.allreduce(value, world)

    out = []
    for n in (5, 9, 2):
        length.assign(n)
        sent, gathered, summed = step()
        out.append({"length": n, "sent": sent.numpy().tolist(), "gathered": gathered.numpy().tolist(),
                    "summed": float(summed.numpy())})
    return out
