"""Group primitives on a Horovod process set: every collective in tf_commlib is written with these.

Each works eagerly and inside tf.function. A one-rank set needs no communication and returns the
input (reduce-scatter and all-gather of one rank are the identity). Without NCCL, reduce-scatter
and all-gather on a set whose ranks share a machine go through shared memory (tf_commlib.shm), the
intra-node link; everything else goes through Horovod. Inside tf_commlib.link_bytes.counting(),
each counts the bytes this rank sends on each link (see link_bytes for the convention).
"""
import os

import horovod.tensorflow as hvd
import tensorflow as tf

from tf_commlib import link_bytes, shm


def _alone(process_set):
    return process_set.size() == 1


def allreduce(x, process_set, average=False, name=None):
    """Element-wise sum (or average) of x over the set."""
    if _alone(process_set):
        return tf.identity(x)
    link_bytes.record("allreduce", x, process_set)
    return hvd.allreduce(x, op=hvd.Average if average else hvd.Sum, process_set=process_set,
                         name=name)


def _shared_memory(process_set):
    return not hvd.nccl_built() and shm.available(process_set)


def allgather(x, process_set, name=None):
    """Concatenation along axis 0 of every rank's x, in rank order; lengths may differ by rank."""
    if _alone(process_set):
        return tf.identity(x)
    link_bytes.record("allgather", x, process_set)
    if _shared_memory(process_set):
        return shm.allgather(x, process_set)
    return hvd.allgather(x, process_set=process_set, name=name)


def _reducescatter_mode(x=None, process_set=None):
    """How reduce-scatter runs: with NCCL, Horovod's; else float32 on one machine through shared
    memory; else each rank sends every other rank its slice with one alltoall and adds what it
    receives to its own slice (the minimal (p-1)/p volume of eq. (7)), because Horovod 0.28's Gloo
    reduce-scatter is ~3x slower than its allreduce on CPU (230 vs 85 ms for 25M floats on 2 ranks).
    TF_COMMLIB_REDUCESCATTER=native|allreduce|alltoall|shm overrides."""
    mode = os.environ.get("TF_COMMLIB_REDUCESCATTER", "auto")
    if mode not in ("auto", "native", "allreduce", "alltoall", "shm"):
        raise ValueError(f"TF_COMMLIB_REDUCESCATTER must be native, allreduce, alltoall or shm, got {mode!r}")
    if mode == "auto":
        if hvd.nccl_built():
            return "native"
        vector = x.dtype == tf.float32 and x.shape.rank == 1
        return "shm" if vector and _shared_memory(process_set) else "alltoall"
    return mode


def _reducescatter_by_alltoall(x, process_set, shard, name):
    """Block i of x goes to rank i (the own block stays home); the blocks are summed in rank order."""
    size, me = process_set.size(), process_set.rank()
    blocks = tf.split(x, size)
    others = blocks[:me] + blocks[me + 1:]
    splits = tf.tensor_scatter_nd_update(tf.fill([size], shard), [[me]], [0])
    # Horovod names an unnamed op after its input: give every rank's input the same name
    send = tf.identity(others[0] if size == 2 else tf.concat(others, 0), name="reducescatter_send")
    received, _ = hvd.alltoall(send, splits=splits, process_set=process_set, name=name)
    if size == 2:   # a + b rounds the same in either order
        return blocks[me] + received
    parts = tf.split(received, size - 1)   # a fixed order, the same in eager and graph mode
    return tf.reduce_sum(tf.stack(parts[:me] + [blocks[me]] + parts[me:]), axis=0)


def reducescatter(x, process_set, name=None):
    """Sum over the set, then rank i of the set keeps the i-th of size() equal slices of axis 0.

    len(x) must be a multiple of the set size (callers pad); Horovod would otherwise split unevenly.
    """
    if _alone(process_set):
        return tf.identity(x)
    x = tf.convert_to_tensor(x)
    link_bytes.record("reducescatter", x, process_set)
    mode, size = _reducescatter_mode(x, process_set), process_set.size()
    shard = tf.shape(x)[0] // size
    if mode == "shm":
        out = shm.reducescatter(x, process_set)
    elif mode == "alltoall":
        out = _reducescatter_by_alltoall(x, process_set, shard, name)
    elif mode == "allreduce":
        me = process_set.rank()
        out = hvd.allreduce(x, op=hvd.Sum, process_set=process_set, name=name)[me * shard:(me + 1) * shard]
    else:
        out = hvd.reducescatter(x, op=hvd.Sum, process_set=process_set, name=name)
    if x.shape.rank is not None and x.shape[0] is not None:   # keep the static shape in graphs
        out.set_shape([x.shape[0] // size] + x.shape[1:])
    return out


def alltoall(x, splits, process_set, name=None):
    """Sends splits[i] consecutive rows of x to set rank i; returns the rows received, in rank order."""
    if _alone(process_set):
        return tf.identity(x)
    link_bytes.record("alltoall", x, process_set, splits=splits)
    received, _ = hvd.alltoall(x, splits=splits, process_set=process_set, name=name)
    return received


def broadcast(x, root_rank, process_set, name=None):
    """x of the set's root_rank (a global rank) on every rank of the set."""
    if _alone(process_set):
        return tf.identity(x)
    link_bytes.record("broadcast", x, process_set, root_rank=root_rank)
    return hvd.broadcast(x, root_rank, process_set=process_set, name=name)
