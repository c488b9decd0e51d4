"""Shared memory as the intra-node link: reduce-scatter and all-gather among the ranks of a process
set that run on one machine, through /dev/shm (what NCCL's shared-memory transport is to the ranks
of a GPU node; Horovod's Gloo sends them through loopback TCP).

A set uses it when every rank sees the same /dev/shm and the same network stack (an emulated node
is a network namespace); that is checked once per set with two collectives on the set. Each
collective op instance gets its own segments (eagerly: one per set; in a tf.function: one per op),
so every rank must run the same collectives in the same order, as with Horovod; a failure on one
rank (bad shape, full /dev/shm) makes every rank of the set raise. A rank that does not
arrive within TF_COMMLIB_SHM_TIMEOUT seconds (default 600) makes the others raise DeadlineExceeded;
ranks that pass different lengths or dtypes raise InvalidArgument. TF_COMMLIB_SHM=0 turns it off.
Files are named /dev/shm/tfcl_<TF_COMMLIB_SHM_TAG>_<random>...: a launcher sets the tag per job so
that it can remove what killed ranks left behind (tf_commlib.apps.slurm does).
"""
import os
import re

import tensorflow as tf

from tf_commlib._loader import ops as _ops

_prefixes = {}   # process set id -> segment name prefix, or None when the set spans machines
TAG_VAR = "TF_COMMLIB_SHM_TAG"


def name_prefix():
    """'tfcl_' and the launcher's tag (letters and digits, may be empty) before a segment's name."""
    tag = os.environ.get(TAG_VAR, "")
    if not re.fullmatch(r"[A-Za-z0-9]*", tag):
        raise ValueError(f"{TAG_VAR} may hold only letters and digits, got {tag!r}")
    return f"tfcl_{tag}_" if tag else "tfcl_"


def _machine_id():
    """(boot id, network namespace): equal for the ranks of one (emulated) node."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = int(f.read().strip().replace("-", "")[:15], 16)
    return [boot, os.stat("/proc/self/ns/net").st_ino]


def _probe(process_set):
    """The set's root creates a file in /dev/shm and broadcasts its random token; the set may use
    shared memory if every rank sees that file and has the root's machine id."""
    import horovod.tensorflow as hvd

    root, tag = process_set.ranks[0], f"tf_commlib_shm_probe_{process_set.process_set_id}"
    token, probe, prefix = 0, None, name_prefix()
    if hvd.rank() == root:
        try:
            token = int.from_bytes(os.urandom(6), "little") | 1
            probe = f"/dev/shm/{prefix}{token:x}_probe"
            open(probe, "x").close()
        except OSError:
            token = 0
    token = int(hvd.broadcast(tf.constant(token, tf.int64), root, process_set=process_set,
                              name=tag + "_token").numpy())
    try:
        seen = [int(os.path.exists(f"/dev/shm/{prefix}{token:x}_probe") and token != 0)] + _machine_id()
    except OSError:
        seen = [0, 0, 0]
    everyone = hvd.allgather(tf.constant([seen], tf.int64), process_set=process_set,
                             name=tag + "_seen").numpy()
    if probe:
        os.unlink(probe)
    shared = token != 0 and all(row[0] == 1 and list(row[1:]) == list(everyone[0][1:]) for row in everyone)
    return f"{prefix}{token:x}_{process_set.process_set_id}" if shared else None


def available(process_set):
    """True when the ranks of the set share memory (and TF_COMMLIB_SHM is not 0)."""
    if os.environ.get("TF_COMMLIB_SHM", "1") == "0" or process_set.size() == 1:
        return False
    key = process_set.process_set_id
    if key not in _prefixes:
        with tf.init_scope():   # once, eagerly, even when first reached while tracing a tf.function
            _prefixes[key] = _probe(process_set)
    return _prefixes[key] is not None


def _timeout():
    text = os.environ.get("TF_COMMLIB_SHM_TIMEOUT", "600")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"TF_COMMLIB_SHM_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value


def _graph_key(kind):
    """A name for an op being traced, the same on every rank that traces the same function: the
    outermost tf.function's name (its uid dropped) and a name unique within it (cond branches and
    nested functions share the outermost namespace)."""
    graph = tf.compat.v1.get_default_graph()
    while hasattr(getattr(graph, "outer_graph", None), "outer_graph"):
        graph = graph.outer_graph
    return f"{re.sub(r'_[0-9]+$', '', graph.name)}-{graph.unique_name('shm_' + kind)}"


def _attrs(process_set, kind):
    """Segment, rank, size and timeout of a call. Eagerly, the calls on a set share one channel; in
    a graph each op instance has its own, so that ops in flight at once never pair up wrongly (an op
    must not run twice at once, as in a parallel loop body)."""
    if not available(process_set):
        raise ValueError(f"process set {process_set.ranks} does not share memory (ranks on different "
                         "machines or network namespaces, or TF_COMMLIB_SHM=0)")
    key = kind if tf.executing_eagerly() else _graph_key(kind)
    key = re.sub(r"[^A-Za-z0-9_-]", "_", key)
    return dict(segment=f"{_prefixes[process_set.process_set_id]}_{key}", rank=process_set.rank(),
                size=process_set.size(), timeout_seconds=_timeout())


def reducescatter(x, process_set):
    """Sum of float32 vector x over the set; rank i keeps slice i (len(x) divisible by the size)."""
    return _ops.commlib_shm_reduce_scatter(tf.convert_to_tensor(x, tf.float32), **_attrs(process_set, "rs"))


def allgather(x, process_set):
    """Rows of every rank's x (any dtype, rank >= 1) concatenated in rank order."""
    return _ops.commlib_shm_allgather(tf.convert_to_tensor(x), **_attrs(process_set, "ag"))
