"""The halves of aggregation that a sharded optimizer update (DistributedOptimizer(shard_optimizer=
True), tf_commlib.keras.sharded) runs instead of GradientAggregator.aggregate: a mixin of
GradientAggregator (its buckets, topology, options and consistency check).

* Over all P ranks (one dense / 2dtar algorithm): the collective's reduce-scatter
  (reduce_scatter_deferred), this rank's slice of each bucket (shard_slices), the all-gather of the
  updated slices (all_gather) and their bytes (sharded_bytes).
* Over the n ranks of a node (any other algorithm or schedule): aggregate_deferred(node_slices=True)
  gives the node slices, node_slices_layout where they lie, node_all_gather gathers the updated
  ones inside the node, node_sliced_bytes counts the aggregation.
"""
import tensorflow as tf

from tf_commlib import fusion, link_bytes, overlap
from tf_commlib import primitives
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.collectives import wire
from tf_commlib.collectives.interface import plain_python


class ShardedHalves:
    # -- over all ranks ----------------------------------------------------------------------
    def _sharding(self):
        names = {self._resolve(c, 1) for c in self.candidates}
        coll = ALGORITHMS[names.pop()] if len(names) == 1 else None
        if coll is None or coll.sharding is None:
            raise ValueError(f"a sharded update needs one algorithm with a reduce-scatter + all-gather "
                             f"form (dense, 2dtar); this aggregator runs {self.candidates}")
        return coll

    def shard_slices(self):
        """Per bucket, (padded length, start, length) of the slice this rank owns (after build)."""
        coll, p = self._sharding(), self.topo.size
        out = []
        for bucket in self.buckets:
            dp = -(-sum(bucket.sizes) // p) * p
            s = dp // p
            out.append((dp, coll.sharding.slot(self.topo) * s, s))
        return out

    @plain_python
    def reduce_scatter_deferred(self, grads, step=None):
        """(this rank's slice of every bucket's average (or sum) over the ranks, commit): the first
        half of the collective (Sharding.reduce_scatter), with the consistency check; commit()
        counts the step. No gradient may be None."""
        coll = self._sharding()
        if any(g is None for g in grads):
            raise ValueError("grads: a sharded update needs a gradient for every variable (got None)")
        grads = [tf.convert_to_tensor(g) for g in grads]
        self.build([(g.shape, g.dtype) for g in grads])
        if self.topo.size > 1:
            since = overlap.op_count()
            grads = self._check(grads, step)
            overlap.run_independently(since)
        if not self.overlap:
            grads = overlap.after_all(grads)
        pieces = []
        for i, bucket in enumerate(self.buckets):
            since = overlap.op_count()
            flat = fusion.flatten(grads, bucket)
            if self.timeline is not None:
                flat = self.timeline.stamp(("bucket", self.timeline_tag, i), flat)
            ctx = coll.context(tf.convert_to_tensor(self.step), None, self.algorithm_options.get(coll.name), i)
            piece = coll.sharding.reduce_scatter(flat, self.topo, ctx)
            if self.op == "average":
                piece = piece / tf.cast(self.topo.size, piece.dtype)
            pieces.append(piece)
            overlap.run_independently(since)
        return pieces, lambda: self.step.assign_add(1)

    @plain_python
    def all_gather(self, pieces, name=None):
        """Every bucket's slices from every rank (the second half, Sharding.all_gather): per bucket
        the flat vector of its d entries (in the pieces' dtype); ``name``: bucket b's ops are
        named name_b_... (the same on every rank)."""
        coll = self._sharding()
        return [coll.sharding.all_gather(piece, self.topo, None if name is None else f"{name}_{b}")[:sum(bucket.sizes)]
                for b, (piece, bucket) in enumerate(zip(pieces, self.buckets))]

    def sharded_bytes(self):
        """{"intra": B, "inter": B} per rank of reduce_scatter_deferred + all_gather (the formulas)."""
        coll = self._sharding()
        return link_bytes.add(*(coll.sharded_bytes(sum(b.sizes), self.topo.m, self.topo.n,
                                                   self.algorithm_options.get(coll.name))
                                for b in self.buckets or []))

    # -- over the ranks of a node -------------------------------------------------------------
    def node_slices_layout(self):
        """Per bucket, (padded length n*s, start l*s, length s) of this rank's node slice (local l)."""
        out = []
        for bucket in self.buckets:
            s = wire.node_size(sum(bucket.sizes), self.topo.n)
            out.append((self.topo.n * s, self.topo.local * s, s))
        return out

    @plain_python
    def node_all_gather(self, pieces, name):
        """Every bucket's node slices from the ranks of this node (the intra-node link only), per
        bucket the flat vector of its d entries; bucket b's op is named name_b (the same on every
        rank: Horovod would name it after its input, whose graph name may differ by rank)."""
        return [primitives.allgather(piece, self.topo.intra, name=f"{name}_{b}")[:sum(bucket.sizes)]
                for b, (piece, bucket) in enumerate(zip(pieces, self.buckets))]

    def node_sliced_bytes(self, algorithm=None, density=None):
        """sent_bytes of aggregate_deferred(node_slices=True): a reduce-scatter + all-gather
        collective without its intra-node all-gather (wire.node_reduce_bytes), any other whole."""
        per_bucket = []
        for bucket in self.buckets or []:
            d = sum(bucket.sizes)
            name = self._resolve(algorithm or self.candidates[0], d, bucket.shapes)
            coll, options = ALGORITHMS[name], self.algorithm_options.get(name) or {}
            if not coll.lossy and coll.sharding is not None:
                per_bucket.append(wire.node_reduce_bytes(d, coll.resolve_options(options).get("compression", "none"),
                                                      self.topo.m, self.topo.n))
            else:
                per_bucket.append(self._bucket_bytes(bucket, name, density))
        return link_bytes.add(*per_bucket)
