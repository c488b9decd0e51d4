"""DataCache on a 2x2 layout: the embedded server of each node, the shard of each rank.

Reports the digests of the samples of two epochs, the hits per epoch, whether this rank started its
node's server, and the sample indices held by its node's Redis after every rank has written."""
import hashlib
import sys

import numpy as np
import tensorflow as tf

import tf_commlib
from tests.workers._report import report
from datacache import DataCache, DecodeResize, cached_dataset
from tf_commlib import primitives

topo = tf_commlib.init()
cache = DataCache(progress=False, read_batch=4)
ds = cached_dataset(sys.argv[1], DecodeResize(16), cache, seed=5)
epochs = [[hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest() for x, _ in ds.as_numpy_iterator()]
          for _ in range(2)]
cache.flush()
primitives.allreduce(tf.constant(1), topo.world, name="datacache_written")    # every rank has written
keys = sorted(int(k.rsplit(b":", 1)[1]) for k in cache.redis.scan_iter(match=b"dc:*"))
primitives.allreduce(tf.constant(1), topo.world, name="datacache_scanned")    # nobody stops a server in use
report(topo.rank, {"epochs": epochs, "keys": keys, "owns_server": cache.server is not None,
                   "hits": [e["hits"] for e in cache.stats()["epochs"]]})
cache.close()
