"""Tensor fusion: flat buckets of gradients (one dtype per bucket, at most a byte threshold
each unless a single tensor is larger), and the way back to the original shapes."""
import collections

import numpy as np
import tensorflow as tf

Bucket = collections.namedtuple("Bucket", "dtype positions shapes sizes")

# The default bucket size of GradientAggregator and DistributedOptimizer, chosen by measurement
# (docs/training.md, "Overlap with backprop": bench e2e, dense fp16 overlapped, emulated 2x2 at
# 100 Mbit/s): buckets must be small enough that a model of a few MB forms several of them (one
# bucket cannot overlap with backprop), large enough that per-bucket costs stay small.
DEFAULT_THRESHOLD_BYTES = 1 << 20
# The bucket size of a lossy collective where none is given (DistributedOptimizer's default,
# tf_commlib.collectives.bucket_bytes): a sparse or low-rank collective pays a fixed cost per bucket
# (a selection, an index exchange, a factorisation) that small buckets multiply; measured on
# ResNet-50 and the small model (docs/training.md, "Bucket size per collective").
LOSSY_THRESHOLD_BYTES = 25 << 20


def plan(tensors, threshold_bytes, backprop_order=True):
    """Groups the non-None tensors into buckets; returns a list of Bucket (static sizes).

    With ``backprop_order`` (the default) the tensors are packed from the last to the first, the
    order in which backprop produces the gradients of a model's layers: bucket 0 holds the last
    tensors, so it can be aggregated first, while the gradients of the first layers are still being
    computed. A bucket's positions stay in ascending order (one bucket's layout is the same in either
    order). ``backprop_order=False`` packs from the first tensor (forward order)."""
    order = range(len(tensors) - 1, -1, -1) if backprop_order else range(len(tensors))
    buckets, open_ = [], {}
    for pos in order:
        t = tensors[pos]
        if t is None:
            continue
        size = t.shape.num_elements()
        if size is None:
            raise ValueError(f"gradient {pos} has an unknown shape {t.shape}; static shapes are needed")
        nbytes = size * t.dtype.size
        cur = open_.get(t.dtype)
        if cur is None or (cur["bytes"] + nbytes > threshold_bytes and cur["members"]):
            cur = {"bytes": 0, "members": []}
            open_[t.dtype] = cur
            buckets.append((t.dtype, cur))
        cur["bytes"] += nbytes
        cur["members"].append((pos, tuple(t.shape.as_list()), size))
    out = []
    for dt, c in buckets:
        members = sorted(c["members"])
        out.append(Bucket(dt, tuple(m[0] for m in members), tuple(m[1] for m in members),
                          tuple(m[2] for m in members)))
    return out


def bucket_threshold(cap_bytes, variables):
    """The bucket size for these variables' gradients where the user gives none: a collective's own
    size `cap_bytes`, but at most a quarter of their bytes (backprop can then overlap a few buckets),
    and not under DEFAULT_THRESHOLD_BYTES. The small model's 1.65 MB keep three 1 MB buckets,
    ResNet-50's 97 MB get about 24 MB ones (docs/training.md, "Bucket size per collective")."""
    total = sum(tf.TensorSpec(v.shape, v.dtype).shape.num_elements() * tf.as_dtype(v.dtype).size
                for v in variables)
    return max(DEFAULT_THRESHOLD_BYTES, min(cap_bytes, total // 4))


def largest_bucket(variables, threshold_bytes):
    """Entries of the largest bucket that plan() makes of these variables' gradients (anything with
    a static .shape and .dtype; at least 1): the size the link is calibrated at."""
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in variables]
    return max([1] + [sum(b.sizes) for b in plan(specs, threshold_bytes)])


def flatten(tensors, bucket):
    return tf.concat([tf.reshape(tensors[p], [-1]) for p in bucket.positions], axis=0)


def unflatten(flat, bucket, out):
    """Writes the pieces of a bucket's flat tensor into the list out at their positions."""
    for p, piece, shape in zip(bucket.positions, tf.split(flat, bucket.sizes), bucket.shapes):
        out[p] = tf.reshape(piece, shape)


def split_indices(indices, bucket, out):
    """Writes into out, at each piece's position, the int64 flat indices into that piece of the
    given flat indices into the bucket (in their order)."""
    ends = np.cumsum(bucket.sizes, dtype=np.int64)
    owner = tf.searchsorted(tf.constant(ends), indices, side="right", out_type=tf.int32)
    local = indices - tf.gather(tf.constant(ends - np.asarray(bucket.sizes, np.int64)), owner)
    for p, part in zip(bucket.positions, tf.dynamic_partition(local, owner, len(bucket.sizes))):
        out[p] = part
