"""A fault-free run whose second node is slower: node 1's last intra-node exchanges run after node 0
has finished and shut Horovod down. Every rank must still compute the right sum and exit 0.
argv: algorithm, mode (eager|graph), delay seconds of node 1's intra-node all-gathers."""
import sys
import time

import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from tf_commlib import shm
from tf_commlib.aggregator import GradientAggregator

ALGORITHM, MODE, DELAY = sys.argv[1], sys.argv[2], float(sys.argv[3])
STEPS = 3
topo = tf_commlib.init()
calls = {"ag": 0}
if topo.node == 1:   # the slow node: its intra-node all-gather of the last step comes late
    real_allgather = shm.allgather

    def slow_allgather(x, process_set):
        calls["ag"] += 1
        if tf.executing_eagerly():
            time.sleep(DELAY)
        return real_allgather(x, process_set)

    shm.allgather = slow_allgather

agg = GradientAggregator(algorithm=ALGORITHM, density=1.0, op="sum", fusion_threshold_bytes=1 << 20)
step = tf.function(agg.aggregate) if MODE == "graph" else agg.aggregate
grads = [np.arange(40, dtype=np.float32).reshape(20, 2) * (s + 1) * (topo.rank + 1) for s in range(STEPS)]
ok = True
for s in range(STEPS):
    out = step([tf.constant(grads[s])])[0][0].numpy()
    ok &= bool(np.array_equal(out, grads[s] / (topo.rank + 1) * sum(range(1, topo.size + 1))))
    print(f"rank {topo.rank} step {s} ok={ok}", flush=True)
report(topo.rank, {"ok": ok})
print(f"rank {topo.rank} done ok={ok}", flush=True)
