"""Target of tests/test_shm_security.py: shared-memory collectives while someone attacks /dev/shm.

`attack`: the world set's secret is replaced by one the test knows (as if the segment names had
leaked, like the old probe file's), so that another user could pre-create them: its eager calls
must fail on every rank, at once; a graph call whose control segment the test corrupts must fail on
every rank. The intra-node sets keep their random secrets; their results go to the test, which
compares them with numpy, while another user opens every name it sees in /dev/shm. The last rank of
each node arrives late at each call, so that names stay in /dev/shm for a while.
`first_step`: the last rank fails before its first collective once the others wait in one (their
control and data segments are in /dev/shm).
"""
import hashlib
import json
import os
import sys
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib import shm

LEAKED = hashlib.sha256(b"tf_commlib test: a leaked secret").digest()
mode = sys.argv[1]
topo = tf_commlib.init()
world, intra = topo.world, topo.intra
real_handshake, real_segment, names = shm._handshake, shm._segment, {}


def leaky_handshake(process_set):
    secret = real_handshake(process_set)
    return LEAKED if secret and process_set.process_set_id == world.process_set_id else secret


def logged_segment(process_set, key):
    names[f"{process_set.process_set_id}/{key}"] = real_segment(process_set, key)
    return names[f"{process_set.process_set_id}/{key}"]


shm._handshake, shm._segment = leaky_handshake, logged_segment
assert shm.available(world) and shm.available(intra)

if mode == "first_step":
    if topo.rank == topo.size - 1:   # once the others are inside the collective, their segments made
        control = "/dev/shm/" + shm._segment(world, "rs")
        deadline = time.monotonic() + 60
        while not os.path.exists(control) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)
        raise RuntimeError(f"this rank fails in its first step (control segment seen: {os.path.exists(control)})")
    shm.reducescatter(tf.ones([8]), world)   # waits for the failed rank until horovodrun stops it
    sys.exit("the reduce-scatter returned without the failed rank")

rng = np.random.default_rng(11 + topo.rank)
late = topo.local == topo.n - 1
out = {"rank": topo.rank, "intra": [], "world": {}}


def attempt(call):
    start = time.monotonic()
    try:
        call()
        return ["ok", time.monotonic() - start]
    except tf.errors.OpError as e:
        return [f"{type(e).__name__}: {e.message}", time.monotonic() - start]


for step in range(3):
    x = rng.standard_normal(4 * intra.size()).astype(np.float32)
    rows = rng.integers(-9, 9, (intra.rank() + 1, 3)).astype(np.int32)
    if late:
        time.sleep(0.5)
    out["intra"].append([x.tolist(), shm.reducescatter(x, intra).numpy().tolist(),
                         rows.tolist(), shm.allgather(rows, intra).numpy().tolist()])

# the names of the world set's eager segments were pre-created by the attacker
out["world"]["rs"] = attempt(lambda: shm.reducescatter(tf.ones([8]), world))
out["world"]["ag"] = attempt(lambda: shm.allgather(tf.ones([2, 3]), world))


@tf.function
def corrupted(x):
    return shm.reducescatter(x, world)


corrupted.get_concrete_function(tf.TensorSpec([8], tf.float32))
if topo.rank == 0:   # the test corrupts this control segment once it appears
    out_dir = os.environ["HVD_TEST_OUT"]
    with open(os.path.join(out_dir, "segments.tmp"), "w") as f:
        json.dump(names, f)
    os.rename(os.path.join(out_dir, "segments.tmp"), os.path.join(out_dir, "segments.json"))
if topo.rank == topo.size - 1:
    time.sleep(1.5)
out["world"]["corrupted"] = attempt(lambda: corrupted(tf.ones([8])))

hvd.allreduce(tf.zeros([1]), name="shm_attack_worker_done")
out["names"] = names
out["left_in_dev_shm"] = [line.split()[-1] for line in open("/proc/self/maps")
                          if "/dev/shm/tfcl_" in line and not line.rstrip().endswith("(deleted)")]
report(topo.rank, out)
