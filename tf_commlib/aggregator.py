"""GradientAggregator: the user entry point of the collectives (fusion, error feedback, choice)."""
import zlib

import tensorflow as tf

from tf_commlib import fusion, ops
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.topology import topology as current_topology

OPS = ("average", "sum")


def check_config(algorithm, density, selector, op="average"):
    """Raises ValueError for an unknown algorithm/selector/op or a density outside (0, 1]."""
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS) + ['auto']}, got {algorithm!r}")
    if selector not in ops.SELECTORS:
        raise ValueError(f"selector must be one of {sorted(ops.SELECTORS)}, got {selector!r}")
    if not isinstance(density, (int, float)) or not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")


class GradientAggregator:
    """Aggregates a list of gradients (any shapes, None allowed) over all ranks.

    Gradients are fused into flat buckets per dtype of at most ``fusion_threshold_bytes``; each
    bucket goes through ``algorithm`` ("dense", "2dtar", "naive_ag", "hitopk", or "auto": the
    cheapest by the cost model). Sparse algorithms select ``density`` of each bucket with
    ``selector`` and keep what they did not send in a residual (error feedback) that is added
    back at the next call. Works eagerly and inside tf.function.
    """

    def __init__(self, algorithm="hitopk", density=0.01, selector="mstopk", op="average",
                 fusion_threshold_bytes=64 << 20, topology=None, seed=None, cost_params=None,
                 check_consistency=True):
        check_config(algorithm, density, selector, op)
        self.algorithm, self.density, self.selector, self.op = algorithm, density, selector, op
        self.fusion_threshold_bytes = int(fusion_threshold_bytes)
        self.topo = topology or current_topology()
        self.seed = seed
        self.cost_params = cost_params
        self.check_consistency = check_consistency
        self._plan_key = None
        self._residuals = {}   # bucket index -> tf.Variable
        self._checked = set()
        self.step = None       # tf.Variable, created with the residuals

    # -- state -----------------------------------------------------------------------------
    def residual_variables(self):
        return [self._residuals[i] for i in sorted(self._residuals)]

    def _algorithm_for(self, bucket, d):
        if self.algorithm != "auto":
            return self.algorithm
        from tf_commlib import costmodel
        params = self.cost_params or costmodel.LinkParams()
        return costmodel.choose(d, self.topo.m, self.topo.n, self.density, params)

    def _select(self, k_seed):
        fn = ops.SELECTORS[self.selector]
        if self.selector in ("mstopk", "dgc_topk", "randomk") and self.seed is not None:
            base = {"mstopk": ops.mstopk, "dgc_topk": ops.dgc_topk, "randomk": ops.randomk}[self.selector]
            return lambda x, k: base(x, k, seed=k_seed)
        return fn

    def _make_state(self, buckets, dtypes_sizes):
        with tf.init_scope():
            if self.step is None:
                self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="aggregator_step")
            for i, (bucket, name) in enumerate(zip(buckets, dtypes_sizes)):
                coll = ALGORITHMS[name]
                if coll.sparse and i not in self._residuals:
                    d = sum(bucket.sizes)
                    self._residuals[i] = tf.Variable(
                        tf.zeros([coll.residual_size(d, self.topo)], bucket.dtype),
                        trainable=False, name=f"residual_{i}")

    def _fingerprint(self, grads):
        sig = repr([(None if g is None else (tuple(g.shape), g.dtype.name)) for g in grads])
        sig += f"|{self.algorithm}|{self.density}|{self.selector}|{self.op}"
        return zlib.crc32(sig.encode()) & 0x7FFFFFFF

    def _check(self, grads):
        """All ranks must pass the same shapes and dtypes; a mismatch raises on every rank."""
        from tf_commlib import primitives as P
        fp = self._fingerprint(grads)
        if tf.executing_eagerly():
            if fp in self._checked:
                return
            seen = P.allgather(tf.constant([fp], tf.int64), self.topo.world).numpy().tolist()
            if len(set(seen)) != 1:
                raise ValueError("ranks passed gradients of different shapes or dtypes "
                                 f"(fingerprints by rank: {seen})")
            self._checked.add(fp)
        else:
            seen = P.allgather(tf.constant([fp], tf.int64), self.topo.world)
            tf.debugging.assert_equal(seen, tf.fill(tf.shape(seen), tf.constant(fp, tf.int64)),
                                      message="ranks passed gradients of different shapes or dtypes")

    # -- the call ----------------------------------------------------------------------------
    def __call__(self, grads):
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        if self.check_consistency and self.topo.size > 1:
            self._check(grads)
        buckets = fusion.plan(grads, self.fusion_threshold_bytes)
        key = tuple(buckets)
        if self._plan_key is not None and key != self._plan_key:
            raise ValueError("the gradient list changed shape since the first call; "
                             "create a new GradientAggregator for a new model")
        self._plan_key = key
        names = [self._algorithm_for(b, sum(b.sizes)) for b in buckets]
        self._make_state(buckets, names)
        out = list(grads)
        for i, (bucket, name) in enumerate(zip(buckets, names)):
            flat = fusion.flatten(grads, bucket)
            coll = ALGORITHMS[name]
            if coll.sparse:
                seed = None if self.seed is None else \
                    (self.seed + self.step * 1_000_003 + i * 7919) * self.topo.size + self.topo.rank
                agg, residual = coll.fn(flat, self.topo, self.density, self._select(seed),
                                        self._residuals[i])
                self._residuals[i].assign(residual)
            else:
                agg = coll.fn(flat, self.topo)
            if self.op == "average":
                agg = agg / tf.cast(self.topo.size, agg.dtype)
            fusion.unflatten(agg, bucket, out)
        self.step.assign_add(1)
        return out
