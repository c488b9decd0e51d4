"""Topology check (run under horovodrun by `make demo` first): prints the topology and checks that a
hierarchical (2DTAR) allreduce equals a plain allreduce on every rank."""
import numpy as np
import tensorflow as tf

import tf_commlib
from tf_commlib import primitives
from tf_commlib.collectives.two_d_tar import two_d_tar


def main():
    topo = tf_commlib.init()
    rng = np.random.default_rng(topo.rank)
    # Integer-valued floats: both summation orders are exact, so the check is equality.
    x = tf.constant(rng.integers(-1000, 1000, size=1_000_003).astype(np.float32))
    hier = two_d_tar(x, topo).numpy()
    flat = primitives.allreduce(x, topo.world).numpy()
    ok = bool(np.array_equal(hier, flat))
    every = primitives.allreduce(tf.constant([int(ok)]), topo.world).numpy()[0]
    print(f"rank {topo.rank}: node {topo.node}/{topo.m} local {topo.local}/{topo.n} "
          f"intra {list(topo.intra_ranks)} inter {list(topo.inter_ranks)}", flush=True)
    if topo.rank == 0:
        print(f"topology {topo.m}x{topo.n}: 2DTAR allreduce of {x.shape[0]} floats "
              f"{'equals' if every == topo.size else 'DIFFERS FROM'} plain allreduce on "
              f"{every}/{topo.size} ranks -> {'PASS' if every == topo.size else 'FAIL'}", flush=True)
    if every != topo.size:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
