"""Rank 1 fails in its first step, where its node's other rank waits for it in a shared-memory
exchange (whose control segment it has created). Each rank first writes its node's segment-name
prefix to $HVD_TEST_OUT so the test can check that nothing with it is left in /dev/shm."""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import tf_commlib  # noqa: E402
from tf_commlib import shm  # noqa: E402
from tf_commlib.aggregator import GradientAggregator  # noqa: E402

topo = tf_commlib.init()
assert shm.available(topo.intra)
with open(os.path.join(os.environ["HVD_TEST_OUT"], f"prefix{topo.rank}"), "w") as f:
    f.write(shm._prefixes[topo.intra.process_set_id])
agg = GradientAggregator(algorithm="hitopk", density=0.1, seed=1)
if topo.rank == 1:   # passes the step's consistency check, then fails at its first shm exchange
    def fail(x, process_set):
        raise RuntimeError("rank 1 fails in its first step")
    shm.allgather = shm.reducescatter = fail
agg.aggregate([tf.constant(np.ones(200, np.float32))])
