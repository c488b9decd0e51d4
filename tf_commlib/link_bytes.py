"""Bytes sent on each link: the one accounting convention shared by the group primitives (which
count what they move, when asked) and the collectives' byte formulas (which predict it).

A byte is *intra* when its sender and receiver are on the same node, *inter* otherwise; ranks are
node-major (node = rank // n). Each primitive sends what the algorithm behind its cost formula
sends (tf_commlib.alphabeta):

* allreduce:     ring, 2(p-1)/p of the input to the next rank of the set (eq. in tyagi Table I);
* reducescatter: ring, (p-1)/p of the input to the next rank of the set (shi2021 eq. (7));
* allgather:     its own rows to each of the p-1 others (eq. (3); rows may differ by rank);
* alltoall:      splits[i] rows to set rank i, none to itself;
* broadcast:     the root sends its tensor to each of the p-1 others; the others send nothing.

So a set inside one node moves only intra bytes, the inter-node sets (one rank per node) only
inter bytes, and a world ring on m > 1 nodes crosses a node boundary at the m ranks that are
last on their node (a share 1/n of its bytes) while a world allgather sends n-1 of its p-1 copies
inside the node. ``per_rank`` gives these numbers in closed form, averaged over all ranks, for
collectives whose every rank runs the primitive on its set of one kind ("intra", "inter" or
"world"); ``counting`` makes the primitives count what this rank sends.
"""
import contextlib

LINKS = ("intra", "inter")


def _members(kind, m, n):
    """(others on my node, others on other nodes, set size) of a set of this kind."""
    if kind == "intra":
        return n - 1, 0, n
    if kind == "inter":
        return 0, m - 1, m
    if kind == "world":
        return n - 1, m * n - n, m * n
    raise ValueError(f"set kind must be intra, inter or world, got {kind!r}")


def per_rank(op, nbytes, kind, m, n):
    """{"intra": B, "inter": B} one rank sends, averaged over the ranks, when every rank runs `op`
    on its set of `kind` with nbytes: the input (allreduce, reducescatter), its own rows (allgather),
    the rows for each other rank (alltoall, equal splits), the root's tensor (broadcast)."""
    same, other, p = _members(kind, m, n)
    if op in ("allreduce", "reducescatter"):
        sent = (2 if op == "allreduce" else 1) * (p - 1) / p * nbytes
        crossing = 0.0 if other == 0 else (1.0 if same == 0 else 1 / n)   # ring steps across nodes
        return {"intra": sent * (1 - crossing), "inter": sent * crossing}
    if op in ("allgather", "alltoall", "broadcast"):
        share = 1 / p if op == "broadcast" else 1   # only the root of each set sends
        return {"intra": same * nbytes * share, "inter": other * nbytes * share}
    raise ValueError(f"unknown primitive {op!r}")


def add(*counts):
    """Link-wise sum of {"intra": B, "inter": B} dicts."""
    return {link: sum(c[link] for c in counts) for link in LINKS}


# -- counting in the primitives --------------------------------------------------------------
_counter = None


class Counter:
    """Bytes this rank sent on each link while counting (float64 variables, so that calls inside
    tf.function count at run time, e.g. only the branch a tf.cond takes)."""

    def __init__(self):
        import tensorflow as tf
        from tf_commlib.topology import topology

        self.n = topology().n
        self.vars = {link: tf.Variable(0.0, dtype=tf.float64, trainable=False) for link in LINKS}

    def result(self):
        return {link: float(v.numpy()) for link, v in self.vars.items()}

    def reset(self):
        for v in self.vars.values():
            v.assign(0.0)


@contextlib.contextmanager
def counting():
    """Within it, every group primitive adds what this rank sends to the yielded Counter. Call it
    eagerly; a tf.function counts into the counter that was active when it was traced."""
    global _counter
    previous, _counter = _counter, Counter()
    try:
        yield _counter
    finally:
        _counter = previous


@contextlib.contextmanager
def not_counted():
    """Within it the primitives count nothing: control traffic (e.g. the consistency check) that is
    no part of a collective's bytes."""
    global _counter
    previous, _counter = _counter, None
    try:
        yield
    finally:
        _counter = previous


def record(op, x, process_set, splits=None, root_rank=None):
    """Adds what this rank sends in `op` on x to the active counter (no-op when not counting)."""
    if _counter is None:
        return
    import numpy as np
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    ranks, me = list(process_set.ranks), process_set.rank()
    p = len(ranks)
    same = np.array([r // _counter.n == ranks[me] // _counter.n for r in ranks], np.float64)
    nbytes = tf.cast(tf.size(x), tf.float64) * x.dtype.size
    if op in ("allreduce", "reducescatter"):
        to = np.zeros(p)
        to[(me + 1) % p] = (2 if op == "allreduce" else 1) * (p - 1) / p
        weights = tf.constant(to) * nbytes
    elif op == "allgather":
        weights = tf.constant(np.arange(p) != me, tf.float64) * nbytes
    elif op == "alltoall":
        rows = tf.cast(tf.shape(x)[0], tf.float64)
        row_bytes = tf.math.divide_no_nan(nbytes, rows)
        weights = tf.cast(splits, tf.float64) * tf.constant(np.arange(p) != me, tf.float64) * row_bytes
    elif op == "broadcast":
        is_root = tf.cast(tf.equal(tf.cast(root_rank, tf.int64), ranks[me]), tf.float64)
        weights = tf.constant(np.arange(p) != me, tf.float64) * nbytes * is_root
    else:
        raise ValueError(f"unknown primitive {op!r}")
    _counter.vars["intra"].assign_add(tf.reduce_sum(weights * same))
    _counter.vars["inter"].assign_add(tf.reduce_sum(weights * (1 - same)))
