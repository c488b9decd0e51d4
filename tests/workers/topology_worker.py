"""Reports this rank's topology, the members of its process sets as seen by a real allgather on
each set, a hierarchical allreduce (intra reduce-scatter, inter allreduce, intra allgather), and the
intra-node reduce-scatter in each of its modes (TF_COMMLIB_REDUCESCATTER, read at each call)."""
import os

import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib import primitives
from tf_commlib import shm
from tf_commlib.collectives.two_d_tar import two_d_tar

topo = tf_commlib.init()
me = tf.constant([topo.rank], tf.int32)
d = 1001  # not a multiple of any n used in the tests
x = np.random.default_rng(100 + topo.rank).standard_normal(d).astype(np.float32)


@tf.function
def in_graph(v):
    return two_d_tar(v, topo)


def reducescatter(mode):
    os.environ["TF_COMMLIB_REDUCESCATTER"] = mode
    try:
        return primitives.reducescatter(tf.constant(x[:topo.n * (d // topo.n)]), topo.intra).numpy().tolist()
    finally:
        del os.environ["TF_COMMLIB_REDUCESCATTER"]


modes = ["alltoall", "allreduce", "native"] + (["shm"] if shm.available(topo.intra) else [])
report(topo.rank, {
    "m": topo.m, "n": topo.n, "node": topo.node, "local": topo.local,
    "intra_ranks": list(topo.intra_ranks), "inter_ranks": list(topo.inter_ranks),
    "intra_members": primitives.allgather(me, topo.intra).numpy().tolist(),
    "inter_members": primitives.allgather(me, topo.inter).numpy().tolist(),
    "input": x.tolist(),
    "reducescatter": {mode: reducescatter(mode) for mode in modes},
    "hier": two_d_tar(tf.constant(x), topo).numpy().tolist(),
    "hier_graph": in_graph(tf.constant(x)).numpy().tolist(),
    "shared_memory": {k: shm.available(getattr(topo, k)) for k in ("intra", "inter", "world")},
})
