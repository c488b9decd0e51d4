"""Shared memory as the intra-node link: reduce-scatter and all-gather among the ranks of a process
set that run on one machine, through /dev/shm (what NCCL's shared-memory transport is to the ranks
of a GPU node; Horovod's Gloo sends them through loopback TCP).

A set uses it when every rank sees the same /dev/shm and the same network stack (an emulated node
is a network namespace); that is checked once per set with one allgather on the set, which also
gives the set a secret that names its segments. Segments are files of mode 0600 created exclusively
under unguessable names, opened only after checking their owner (ops/shm/shm_segment.h): another
local user can neither read them nor make the job use a file of theirs. Each
collective op instance gets its own segments (eagerly: one per set; in a tf.function: one per op),
so every rank must run the same collectives in the same order, as with Horovod; a failure on one
rank (bad shape, full /dev/shm) makes every rank of the set raise. A rank that does not
arrive within TF_COMMLIB_SHM_TIMEOUT seconds (default 600) makes the others raise DeadlineExceeded;
ranks that pass different lengths or dtypes raise InvalidArgument. TF_COMMLIB_SHM=0 turns it off; an
elastic job (tf_commlib.elastic) never uses it: there a rank that is killed must make the others raise
at once, as Gloo's closed connection does, not after the timeout (a survivor waited in the next
shared-memory all-gather of an elastic 4-rank job on one machine until its timeout).
Files are named /dev/shm/tfcl_<TF_COMMLIB_SHM_TAG>_<random>...: a launcher sets the tag per job so
that it can remove what killed ranks left behind (tfc_apps.slurm does).
"""
import hashlib
import hmac
import os
import re
import stat
import uuid

import numpy as np
import tensorflow as tf

from tf_commlib._loader import ops as _ops
from tf_commlib.topology import elastic_job

_secrets = {}   # process set id -> the set's secret (bytes), or None when its ranks do not share memory
TAG_VAR = "TF_COMMLIB_SHM_TAG"


def name_prefix():
    """'tfcl_' and the launcher's tag (letters and digits, may be empty) before a segment's name."""
    tag = os.environ.get(TAG_VAR, "")
    if not re.fullmatch(r"[A-Za-z0-9]{0,24}", tag):
        raise ValueError(f"{TAG_VAR} may hold only letters and digits (at most 24), got {tag!r}")
    return f"tfcl_{tag}_" if tag else "tfcl_"


def forget():
    """Forgets every set's secret (Horovod started again: process set ids name other sets)."""
    _secrets.clear()


def _machine():
    """What ranks that share /dev/shm have in common: boot id, network namespace (an emulated node is
    one), the /dev/shm file system and directory, and uid; then 1 when /dev/shm is safe to use (a
    directory of root or this user where others cannot remove what is ours: sticky or not writable).
    Not the mount namespace: `ip netns exec` gives each process of an emulated node its own."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = np.frombuffer(uuid.UUID(f.read().strip()).bytes, np.int64).tolist()
    shm, uid = os.stat("/dev/shm"), os.geteuid()
    safe = stat.S_ISDIR(shm.st_mode) and shm.st_uid in (0, uid) and \
        bool(shm.st_mode & stat.S_ISVTX or not shm.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    return boot + [os.stat("/proc/self/ns/net").st_ino, shm.st_dev, shm.st_ino, uid, int(safe)]


def _handshake(process_set):
    """One allgather on the set: each rank's _machine() and 32 random bytes. The set shares memory
    when every rank has the same safe machine; its secret, a hash of every rank's random bytes, names
    its segments (_segment) and never leaves the ranks: no file in /dev/shm reveals it."""
    import horovod.tensorflow as hvd

    try:
        ident = _machine()
    except (OSError, ValueError):
        ident = [0] * 7
    row = np.array(ident + np.frombuffer(os.urandom(32), np.int64).tolist(), np.int64)
    everyone = hvd.allgather(tf.constant(row[None]), process_set=process_set,
                             name=f"tf_commlib_shm_handshake_{process_set.process_set_id}").numpy()
    ids = everyone[:, :len(ident)]
    shared = bool((ids == ids[0]).all() and ids[0, -1] == 1)
    return hashlib.sha256(everyone[:, len(ident):].tobytes()).digest() if shared else None


def available(process_set):
    """True when the ranks of the set share memory (and TF_COMMLIB_SHM is not 0, and the job is not elastic)."""
    if os.environ.get("TF_COMMLIB_SHM", "1") == "0" or process_set.size() == 1 or elastic_job():
        return False
    key = process_set.process_set_id
    if key not in _secrets:
        with tf.init_scope():   # once, eagerly, even when first reached while tracing a tf.function
            _secrets[key] = _handshake(process_set)
    return _secrets[key] is not None


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
    return dict(segment=_segment(process_set, key), rank=process_set.rank(), size=process_set.size(),
                timeout_seconds=_timeout())


def _segment(process_set, key):
    """The control segment's name for a key of the set: an HMAC under the set's secret, so the names
    seen in /dev/shm tell nothing about the next one."""
    mac = hmac.new(_secrets[process_set.process_set_id], key.encode(), hashlib.sha256)
    return name_prefix() + mac.hexdigest()[:32]


def reducescatter(x, process_set):
    """Sum of float32 vector x over the set; rank i keeps slice i (len(x) divisible by the size)."""
    return _ops.commlib_shm_reduce_scatter(tf.convert_to_tensor(x, tf.float32), **_attrs(process_set, "rs"))


def allgather(x, process_set):
    """Rows of every rank's x (any dtype, rank >= 1) concatenated in rank order."""
    return _ops.commlib_shm_allgather(tf.convert_to_tensor(x), **_attrs(process_set, "ag"))
