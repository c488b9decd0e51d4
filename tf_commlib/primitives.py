"""Group primitives on a Horovod process set: every collective in tf_commlib is written with these.

Each works eagerly and inside tf.function. A one-rank set needs no communication and returns the
input (reduce-scatter and all-gather of one rank are the identity). Reduce-scatter and all-gather of
a host tensor on a set whose ranks share a machine go through shared memory (tf_commlib.shm), the
intra-node link; a tensor on a GPU goes through Horovod's process set (NCCL where Horovod has it), and
so does everything else (intra_link; TF_COMMLIB_INTRA_LINK=shm|horovod overrides). Inside tf_commlib.link_bytes.counting(),
each counts the bytes this rank sends on each link (see link_bytes for the convention).
"""
import os
import re

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from tf_commlib import link_bytes, shm


def _alone(process_set):
    return process_set.size() == 1


def _as_bits(x):
    """(x, back): Horovod's allgather and alltoall take no bfloat16, so its bits travel as uint16."""
    if x.dtype != tf.bfloat16:
        return x, lambda y: y
    return tf.bitcast(x, tf.uint16), lambda y: tf.bitcast(y, tf.bfloat16)


def allreduce(x, process_set, average=False, name=None):
    """Element-wise sum (or average) of x over the set."""
    if _alone(process_set):
        return tf.identity(x)
    link_bytes.record("allreduce", x, process_set)
    x, name = _unfoldable(x, "Allreduce", name)
    return hvd.allreduce(x, op=hvd.Average if average else hvd.Sum, process_set=process_set,
                         name=name)


INTRA_LINK_VAR = "TF_COMMLIB_INTRA_LINK"


def on_gpu(x):
    """True for a tensor on a GPU: by its device where it is placed, else (a graph tensor not yet
    placed) whether TensorFlow has a GPU and Horovod can reduce on it (NCCL)."""
    device = getattr(x, "device", "") or ""
    if "GPU" in device.upper():
        return True
    if device:
        return False
    return bool(tf.config.list_logical_devices("GPU")) and hvd.nccl_built()


def intra_link(x, process_set):
    """"shm" or "horovod": the path of a reduce-scatter or all-gather of x inside a node. auto: the
    shared-memory link for a host tensor whose set shares a machine, Horovod (NCCL) for a GPU
    tensor; TF_COMMLIB_INTRA_LINK=shm|horovod overrides (shm only where the set shares memory)."""
    mode = os.environ.get(INTRA_LINK_VAR, "auto")
    if mode not in ("auto", "shm", "horovod"):
        raise ValueError(f"{INTRA_LINK_VAR} must be auto, shm or horovod, got {mode!r}")
    if mode == "horovod" or (mode == "auto" and on_gpu(x)):
        return "horovod"
    return "shm" if shm.available(process_set) else "horovod"


def _shared_memory(x, process_set):
    return intra_link(x, process_set) == "shm"


def allgather(x, process_set, name=None):
    """Concatenation along axis 0 of every rank's x, in rank order; lengths may differ by rank."""
    if _alone(process_set):
        return tf.identity(x)
    link_bytes.record("allgather", x, process_set)
    if _shared_memory(x, process_set):
        return shm.allgather(x, process_set)
    x, back = _as_bits(x)
    x, name = _unfoldable(x, "Allgather", name)
    return back(hvd.allgather(x, process_set=process_set, name=name))


def _reducescatter_mode(x=None, process_set=None):
    """How reduce-scatter runs: a GPU tensor with NCCL, Horovod's; else float32 on one machine through
    shared memory (intra_link); else each rank sends every other rank its slice with one alltoall and adds what it
    receives to its own slice (the minimal (p-1)/p volume of eq. (7)), because Horovod 0.28's Gloo
    reduce-scatter is ~3x slower than its allreduce on CPU (230 vs 85 ms for 25M floats on 2 ranks).
    TF_COMMLIB_REDUCESCATTER=native|allreduce|alltoall|shm overrides."""
    mode = os.environ.get("TF_COMMLIB_REDUCESCATTER", "auto")
    if mode not in ("auto", "native", "allreduce", "alltoall", "shm"):
        raise ValueError(f"TF_COMMLIB_REDUCESCATTER must be native, allreduce, alltoall or shm, got {mode!r}")
    if mode == "auto":
        if x is not None and on_gpu(x) and hvd.nccl_built():
            return "native"
        vector = x is not None and x.dtype == tf.float32 and x.shape.rank == 1
        return "shm" if vector and _shared_memory(x, process_set) else "alltoall"
    return mode


def _reducescatter_by_alltoall(x, process_set, shard, name):
    """Block i of x goes to rank i (the own block stays home); the blocks are summed in rank order."""
    size, me = process_set.size(), process_set.rank()
    blocks = tf.split(x, size)
    others = blocks[:me] + blocks[me + 1:]
    splits = tf.tensor_scatter_nd_update(tf.fill([size], shard), [[me]], [0])
    # Horovod names an unnamed op after its input: give every rank's input the same name
    send, back = _as_bits(others[0] if size == 2 else tf.concat(others, 0))
    send = tf.identity(send, name="reducescatter_send")
    send, name = _unfoldable(send, "Alltoall", name)
    received, _ = hvd.alltoall(send, splits=splits, process_set=process_set, name=name)
    received = back(received)
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
        x, name = _unfoldable(x, "Allreduce", name)
        out = hvd.allreduce(x, op=hvd.Sum, process_set=process_set, name=name)[me * shard:(me + 1) * shard]
    else:
        x, name = _unfoldable(x, "Reducescatter", name)
        out = hvd.reducescatter(x, op=hvd.Sum, process_set=process_set, name=name)
    if x.shape.rank is not None and x.shape[0] is not None:   # keep the static shape in graphs
        out.set_shape([x.shape[0] // size] + x.shape[1:])
    return out


def alltoall(x, splits, process_set, name=None):
    """Sends splits[i] consecutive rows of x to set rank i; returns the rows received, in rank order."""
    if _alone(process_set):
        return tf.identity(x)
    link_bytes.record("alltoall", x, process_set, splits=splits)
    x, back = _as_bits(x)
    x, name = _unfoldable(x, "Alltoall", name)
    received, _ = hvd.alltoall(x, splits=splits, process_set=process_set, name=name)
    return back(received)


SMALL = 1 << 16   # elements: tensors up to this size are shielded from constant folding
_false = []   # a False tf.Variable, made by prepare()


def prepare():
    """Creates the variable that _unfoldable reads, eagerly. Call it where state is built (the
    aggregators and DiLoCo do): a variable first made while a tf.function is traced makes
    TensorFlow trace that function twice (once to create it, once to run)."""
    if not _false:
        with tf.init_scope():
            _false.append(tf.Variable(False, trainable=False, name="tf_commlib_never"))


def _never():
    """False, from a variable: a value Grappler cannot know."""
    prepare()
    return _false[0].read_value()


def _unfoldable(t, kind, name):
    """(t through an op Grappler cannot constant-fold, the Horovod name t would have had).

    Horovod's ops are not registered stateful, so Grappler's constant folding runs one whose input
    it can fold at graph-optimisation time, once, and bakes the result in. It did so to a
    non-root's broadcast of its length once the root was a constant and the tf.cond on it folded:
    the next call sent the first call's length ("Mismatched BROADCAST tensor shapes"). A select on
    a variable's value cannot be folded (one on tf.timestamp neither, but op determinism forbids
    Timestamp); a reshape or a control edge is optimised away. Large tensors are gradients, never
    constants, and are spared the copy. Horovod names an unnamed op after its input, so the name it
    would have given t is passed on (it must match across ranks).
    """
    t = tf.convert_to_tensor(t)
    size = t.shape.num_elements()
    if tf.executing_eagerly() or size is not None and size > SMALL:
        return t, name
    if name is None:
        name = f"Horovod{kind}_" + re.sub("[^a-zA-Z0-9_]", "_", t.name)
    return tf.where(_never(), tf.zeros_like(t), t), name


def broadcast(x, root_rank, process_set, name=None):
    """x of the set's root_rank (a global rank) on every rank of the set.

    root_rank may be a tensor, the same on every rank but known only at run time (AR-Topk's root
    inside tf.function); x's length along axis 0 may then differ by rank (the root's comes back):
    the root's length is broadcast first, then x, each by a tf.switch_case over one Horovod
    broadcast per possible root (counted as the two broadcasts). On Gloo that beat a masked
    allreduce and an allgather (tf_commlib/collectives/ar_topk.py has the numbers).
    """
    if _alone(process_set):
        return tf.identity(x)
    if isinstance(root_rank, (int, np.integer)):
        link_bytes.record("broadcast", x, process_set, root_rank=root_rank)
        x, name = _unfoldable(x, "Broadcast", name)
        return hvd.broadcast(x, root_rank, process_set=process_set, name=name)
    x, ranks = tf.convert_to_tensor(x), list(process_set.ranks)
    root = tf.cast(root_rank, tf.int64)
    match = tf.equal(tf.constant(ranks, tf.int64), root)
    tf.debugging.assert_equal(tf.reduce_any(match), True, message=f"broadcast: root_rank is not in {ranks}")
    position = tf.cast(tf.reduce_min(tf.where(match)), tf.int32)

    def from_root(t, tag):
        link_bytes.record("broadcast", t, process_set, root_rank=root)
        t, label = _unfoldable(t, "Broadcast", None if name is None else f"{name}_{tag}")
        return tf.switch_case(position, [
            (lambda r: lambda: hvd.broadcast(t, r, process_set=process_set, name=label))(r) for r in ranks])

    is_root = tf.equal(root, process_set.ranks[process_set.rank()])
    length = from_root(tf.shape(x, out_type=tf.int32)[:1], "length")
    shape = tf.concat([length, tf.shape(x, out_type=tf.int32)[1:]], 0)
    return from_root(tf.cond(is_root, lambda: x, lambda: tf.zeros(shape, x.dtype)), "data")
