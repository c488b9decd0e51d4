"""Tensor fusion: flat buckets of gradients (one dtype per bucket, at most a byte threshold
each unless a single tensor is larger), and the way back to the original shapes."""
import collections

import numpy as np
import tensorflow as tf

Bucket = collections.namedtuple("Bucket", "dtype positions shapes sizes")


def plan(tensors, threshold_bytes):
    """Groups the non-None tensors into buckets; returns a list of Bucket (static sizes)."""
    buckets, open_ = [], {}
    for pos, t in enumerate(tensors):
        if t is None:
            continue
        size = t.shape.num_elements()
        if size is None:
            raise ValueError(f"gradient {pos} has an unknown shape {t.shape}; static shapes are needed")
        nbytes = size * t.dtype.size
        cur = open_.get(t.dtype)
        if cur is None or (cur["bytes"] + nbytes > threshold_bytes and cur["positions"]):
            cur = {"bytes": 0, "positions": [], "shapes": [], "sizes": []}
            open_[t.dtype] = cur
            buckets.append((t.dtype, cur))
        cur["bytes"] += nbytes
        cur["positions"].append(pos)
        cur["shapes"].append(tuple(t.shape.as_list()))
        cur["sizes"].append(size)
    return [Bucket(dt, tuple(c["positions"]), tuple(c["shapes"]), tuple(c["sizes"]))
            for dt, c in buckets]


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
