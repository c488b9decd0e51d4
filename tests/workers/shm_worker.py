"""Shared-memory reduce-scatter and all-gather on the intra-node sets and the world set: eager,
several in flight in one tf.function, different lengths by rank, and the errors (mismatched
lengths or dtypes, a rank that never arrives)."""
import os

import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib import shm

topo = tf_commlib.init()
rng = np.random.default_rng(7 + topo.rank)
out = {"rank": topo.rank, "available": {}, "rs": {}, "ag": {}}
sets = {"intra": topo.intra, "world": topo.world}


def vec(d):
    return rng.standard_normal(d).astype(np.float32)


for tag, pset in sets.items():
    out["available"][tag] = shm.available(pset)
    if not out["available"][tag]:
        continue
    size = pset.size()
    # eager: three calls (both slot sets and back), two lengths
    out["rs"][tag] = [(x.tolist(), shm.reducescatter(x, pset).numpy().tolist())
                      for x in (vec(6 * size), vec(6 * size), vec(3 * size))]
    rows = [rng.integers(0, 255, (pset.rank() + 1, 8)).astype(np.uint8),
            rng.integers(-9, 9, (2 * pset.rank(), 3)).astype(np.int32),   # rank 0 sends no rows
            vec(pset.rank() + 2)]
    out["ag"][tag] = [(r.tolist(), shm.allgather(r, pset).numpy().tolist()) for r in rows]

    @tf.function
    def buckets(a, b, c):   # three collectives in flight at once, twice in a row
        first = [shm.reducescatter(a, pset), shm.reducescatter(b, pset), shm.allgather(c, pset)]
        return first + [shm.reducescatter(a * 2, pset)]

    ins = [vec(4 * size), vec(8 * size), rng.integers(0, 9, (pset.rank() + 1, 2)).astype(np.int32)]
    out[f"graph_{tag}"] = {"inputs": [i.tolist() for i in ins],
                           "runs": [[t.numpy().tolist() for t in buckets(*ins)] for _ in range(2)]}

pset = topo.intra
errors = {}
k = pset.size()
for name, call in [
        # lengths 2k on rank 0 (used before, by "ok_2k") and 4k elsewhere, then 2k everywhere
        ("ok_2k", lambda: shm.reducescatter(tf.ones([2 * k]), pset)),
        ("rs_length", lambda: shm.reducescatter(tf.ones([2 * k if pset.rank() == 0 else 4 * k]), pset)),
        ("after_length", lambda: shm.reducescatter(tf.ones([2 * k]) * (1 + pset.rank()), pset)),
        ("rs_local", lambda: shm.reducescatter(tf.ones([k + (pset.rank() == k - 1)]), pset)),   # one rank
        ("after_local", lambda: shm.reducescatter(tf.ones([k]), pset)),
        ("ag_dtype", lambda: shm.allgather(tf.zeros([1], tf.float32 if pset.rank() else tf.int32), pset)),
        ("ag_row", lambda: shm.allgather(tf.zeros([1, 1 + pset.rank()]), pset)),
        ("after_ag", lambda: shm.allgather(tf.fill([1, 2], pset.rank()), pset))]:
    try:
        errors[name] = call().numpy().tolist()
    except (tf.errors.InvalidArgumentError, tf.errors.AbortedError) as e:
        errors[name] = type(e).__name__ + ": " + e.message
out["errors"] = errors
if pset.rank() == 0:   # the others never come: this rank must raise, not hang
    try:
        shm.allgather(tf.ones([1]), pset)
        out["timeout"] = None
    except tf.errors.DeadlineExceededError as e:
        out["timeout"] = e.message
tf_commlib.topology()  # keep the ranks alive until the timeout has fired
import horovod.tensorflow as hvd
hvd.allreduce(tf.zeros([1]), name="shm_worker_done")
# every segment this rank maps was unlinked once mapped ("(deleted)"); its control segments are gone
out["left_in_dev_shm"] = [line.split()[-1] for line in open("/proc/self/maps")
                          if "/dev/shm/tfcl_" in line and not line.rstrip().endswith("(deleted)")]
out["left_in_dev_shm"] += [name for name in (shm._segment(pset, key) for key in ("rs", "ag"))
                           if os.path.exists("/dev/shm/" + name)]
report(topo.rank, out)
