"""The halves of aggregation that a sharded optimizer update (DistributedOptimizer(shard_optimizer=
True), tf_commlib.keras.sharded) runs instead of GradientAggregator.aggregate: ``ShardedHalves``,
a GradientAggregator's ``sharded``, over its buckets, topology, options and opening of a step.

* Over all P ranks (one dense / 2dtar algorithm): the collective's reduce-scatter
  (reduce_scatter_deferred), this rank's slice of each bucket (shard_slices), the all-gather of the
  updated slices (all_gather) and their bytes (sharded_bytes).
* Over the n ranks of a node (any other algorithm or schedule): the aggregator's
  aggregate_deferred(node_slices=True) gives the node slices, node_slices_layout where they lie,
  node_all_gather gathers the updated ones inside the node, node_sliced_bytes counts the aggregation.
"""
import tensorflow as tf

from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.collectives import wire
from tf_commlib.collectives.interface import plain_python


class ShardedHalves:
    """The sharded halves of ``aggregator``'s aggregation (a GradientAggregator)."""

    def __init__(self, aggregator):
        self.aggregator = aggregator

    # -- over all ranks ----------------------------------------------------------------------
    def _sharding(self):
        agg = self.aggregator
        names = {agg.chooser.resolve(c, 1) for c in agg.candidates}
        coll = ALGORITHMS[names.pop()] if len(names) == 1 else None
        if coll is None or coll.sharding is None:
            raise ValueError(f"a sharded update needs one algorithm with a reduce-scatter + all-gather "
                             f"form (dense, 2dtar); this aggregator runs {agg.candidates}")
        return coll

    def shard_slices(self):
        """Per bucket, (padded length, start, length) of the slice this rank owns (after build)."""
        coll, topo = self._sharding(), self.aggregator.topo
        out = []
        for bucket in self.aggregator.buckets:
            dp = -(-sum(bucket.sizes) // topo.size) * topo.size
            s = dp // topo.size
            out.append((dp, coll.sharding.slot(topo) * s, s))
        return out

    @plain_python
    def reduce_scatter_deferred(self, grads, step=None):
        """(this rank's slice of every bucket's average (or sum) over the ranks, commit): the first
        half of the collective (Sharding.reduce_scatter), with the consistency check; commit()
        counts the step. No gradient may be None."""
        agg, coll = self.aggregator, self._sharding()
        if any(g is None for g in grads):
            raise ValueError("grads: a sharded update needs a gradient for every variable (got None)")
        grads = agg.open_step([tf.convert_to_tensor(g) for g in grads], step)
        pieces = []
        for i, _, flat in agg.plan.walk(grads, pieces):
            ctx = coll.context(tf.convert_to_tensor(agg.step), None, agg.algorithm_options.get(coll.name), i)
            pieces.append(agg.apply_op(coll.sharding.reduce_scatter(flat, agg.topo, ctx)))
        return pieces, lambda: agg.step.assign_add(1)

    @plain_python
    def all_gather(self, pieces, name=None):
        """Every bucket's slices from every rank (the second half, Sharding.all_gather): per bucket
        the flat vector of its d entries (in the pieces' dtype); ``name``: bucket b's ops are
        named name_b_... (the same on every rank)."""
        coll, topo = self._sharding(), self.aggregator.topo
        return [coll.sharding.all_gather(piece, topo, None if name is None else f"{name}_{b}")[:sum(bucket.sizes)]
                for b, (piece, bucket) in enumerate(zip(pieces, self.aggregator.buckets))]

    def sharded_bytes(self):
        """{"intra": B, "inter": B} per rank of reduce_scatter_deferred + all_gather (the formulas)."""
        agg, coll = self.aggregator, self._sharding()
        return link_bytes.add(*(coll.sharded_bytes(sum(b.sizes), agg.topo.m, agg.topo.n,
                                                   agg.algorithm_options.get(coll.name))
                                for b in agg.buckets or []))

    # -- over the ranks of a node -------------------------------------------------------------
    def node_slices_layout(self):
        """Per bucket, (padded length n*s, start l*s, length s) of this rank's node slice (local l)."""
        topo, out = self.aggregator.topo, []
        for bucket in self.aggregator.buckets:
            s = wire.node_size(sum(bucket.sizes), topo.n)
            out.append((topo.n * s, topo.local * s, s))
        return out

    @plain_python
    def node_all_gather(self, pieces, name):
        """Every bucket's node slices from the ranks of this node (the intra-node link only), per
        bucket the flat vector of its d entries; bucket b's op is named name_b (the same on every
        rank: Horovod would name it after its input, whose graph name may differ by rank)."""
        return [primitives.allgather(piece, self.aggregator.topo.intra, name=f"{name}_{b}")[:sum(bucket.sizes)]
                for b, (piece, bucket) in enumerate(zip(pieces, self.aggregator.buckets))]

    def node_sliced_bytes(self, algorithm=None, density=None):
        """sent_bytes of aggregate_deferred(node_slices=True): a reduce-scatter + all-gather
        collective without its intra-node all-gather (wire.node_reduce_bytes), any other whole."""
        agg, per_bucket = self.aggregator, []
        for bucket in agg.buckets or []:
            d = sum(bucket.sizes)
            name = agg.chooser.resolve(algorithm or agg.candidates[0], d, bucket.shapes)
            coll, options = ALGORITHMS[name], agg.algorithm_options.get(name) or {}
            if not coll.lossy and coll.sharding is not None:
                per_bucket.append(wire.node_reduce_bytes(d, coll.resolve_options(options).get("compression", "none"),
                                                      agg.topo.m, agg.topo.n))
            else:
                per_bucket.append(agg.bucket_bytes(bucket, name, density))
        return link_bytes.add(*per_bucket)
