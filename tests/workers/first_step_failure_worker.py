"""Rank 1 fails in its first step, where its node's other rank waits for it in a shared-memory
exchange (whose control segment it has created). The test gives the job its own segment-name tag
(TF_COMMLIB_SHM_TAG) to find what it might leave in /dev/shm."""
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import tf_commlib  # noqa: E402
from tf_commlib import shm  # noqa: E402
from tf_commlib.aggregator import GradientAggregator  # noqa: E402

topo = tf_commlib.init()
assert shm.available(topo.intra)
agg = GradientAggregator(algorithm="hitopk", density=0.1, seed=1)
if topo.rank == 1:   # passes the step's consistency check, then fails at its first shm exchange
    def fail(x, process_set):
        raise RuntimeError("rank 1 fails in its first step")
    shm.allgather = shm.reducescatter = fail
agg.aggregate([tf.constant(np.ones(200, np.float32))])
