"""Values made the same on every rank, or combined over the ranks, outside a traced step: a model's or an
optimizer's variables broadcast from one rank (only the dtypes whose bytes differ somewhere) or averaged,
and small float64 / int64 arrays summed or all-gathered (what auto and the DiLoCo rounds decide from).
Each is a collective: every rank calls it."""
import hashlib

import numpy as np
import tensorflow as tf

from tf_commlib import primitives
from tf_commlib.topology import topology as current_topology


def _by_dtype(variables):
    """[(the variables of one dtype, their values packed into one flat tensor)], in the variables'
    order (the same on every rank): one collective per dtype instead of one per variable (ResNet-50's
    320 variables one by one cost ~1 s per call on 4 ranks)."""
    groups = {}
    for v in variables:
        groups.setdefault(str(v.dtype), []).append(v)
    return [(group, tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in group], 0))
            for group in groups.values()]


def _assign(group, flat):
    for v, part in zip(group, tf.split(flat, [int(np.prod(v.shape, dtype=np.int64)) for v in group])):
        v.assign(tf.reshape(part, v.shape))


def _digest(flat):
    """63 bits of the sha256 of a tensor's bytes."""
    return int.from_bytes(hashlib.sha256(np.ascontiguousarray(flat.numpy()).tobytes()).digest()[:8], "big") >> 1


def broadcast_variables(variables, root_rank=0):
    """Sets every variable to its value on root_rank; returns the dtypes it sent. One all-gather of
    a digest per dtype first: a dtype whose values are already the same bytes on every rank (a model
    built from one seed on every rank, an optimizer's state after the same first update) is not sent
    (ResNet-50's 100 MB take 8 s at 100 Mbit/s)."""
    topo = current_topology()
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < topo.size:
        raise ValueError(f"root_rank must be a rank, 0 to {topo.size - 1}, got {root_rank!r}")
    groups = _by_dtype(variables)
    if not groups or topo.size == 1:
        return []
    mine = tf.constant([[_digest(flat) for _, flat in groups]], tf.int64)
    every = primitives.allgather(mine, topo.world, name="broadcast_digests").numpy()
    sent = []
    for j, (group, flat) in enumerate(groups):
        if (every[:, j] != every[root_rank, j]).any():
            _assign(group, primitives.broadcast(flat, int(root_rank), topo.world))
            sent.append(flat.dtype.name)
    return sent


def average_variables(variables):
    """Sets every variable to its mean over the ranks (e.g. batch-norm statistics)."""
    world = current_topology().world
    for group, flat in _by_dtype(variables):
        _assign(group, primitives.allreduce(flat, world, average=True))


def summed(values):
    """values (float64) summed over every rank (one allreduce; as they are on one rank)."""
    topo = current_topology()
    x = tf.constant(values, tf.float64)
    return (primitives.allreduce(x, topo.world) if topo.size > 1 else x).numpy()


def gathered(rows, name):
    """rows (int64, one row per rank) of every rank, in rank order (one all-gather; as they are on one rank)."""
    topo = current_topology()
    x = tf.constant(rows, tf.int64)
    return (primitives.allgather(x, topo.world, name=name) if topo.size > 1 else x).numpy()
