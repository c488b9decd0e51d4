"""Which samples each process reads: shards that are random, class-balanced samples of the data
set (fixed across epochs or drawn anew), each process' order within an epoch, and the same
shards for any tf.data set."""
import numpy as np
import tensorflow as tf

from datacache.cache import _topology


def shard_range(n, index, count):
    """[lo, hi) of shard ``index`` of ``count`` over n positions: contiguous, sizes differ by <= 1.
    With node-major ranks, the shards of a node's ranks form one contiguous part per node."""
    return index * n // count, (index + 1) * n // count


def shard_indices(n, index, count, seed=0, labels=None):
    """The sample indices of shard ``index`` of ``count`` over n samples, sorted: a random sample of
    the data set, the same on every process for the same ``seed``. The samples are permuted with
    ``seed`` (with ``labels``: grouped by class after that, each class in random order) and dealt
    out in turn, so shard sizes differ by <= 1 and, with labels, so does each class's count: every
    shard holds every class in proportion (a source listed class by class, cut into contiguous
    ranges, gave each rank a few classes). seed=None: the contiguous shard_range of the source's
    own order (a source already in random order)."""
    if seed is None:
        return np.arange(*shard_range(n, index, count), dtype=np.int64)
    order = np.random.default_rng(seed).permutation(n)
    if labels is not None:
        order = order[np.argsort(np.asarray(labels)[order], kind="stable")]
    return np.sort(order[index::count]).astype(np.int64)


def node_shards(node, nodes, ranks_per_node):
    """The (rank, size) shards of node ``node`` of ``nodes``, each running ``ranks_per_node`` ranks
    numbered node-major, as Horovod numbers them on hosts of equal slots (node i runs ranks
    i*n .. i*n+n-1 of nodes*n)."""
    for name, value in (("node", node), ("nodes", nodes), ("ranks_per_node", ranks_per_node)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if ranks_per_node < 1 or not 0 <= node < nodes:
        raise ValueError(f"node {node} of {nodes} with {ranks_per_node} ranks per node: need "
                         "0 <= node < nodes and ranks_per_node >= 1")
    size = nodes * ranks_per_node
    return [(int(rank), int(size)) for rank in range(node * ranks_per_node, (node + 1) * ranks_per_node)]


def node_indices(n, node, nodes, ranks_per_node, seed=0, labels=None):
    """The sample indices node ``node`` reads (and so caches), sorted: the union of its ranks'
    ``shard_indices`` (node_shards) with the training's shard seed and labels."""
    return np.sort(np.concatenate([shard_indices(n, rank, size, seed, labels)
                                   for rank, size in node_shards(node, nodes, ranks_per_node)]))


def shard_of(dataset, n, shard=None, seed=0):
    """``dataset`` (n elements in a fixed order, e.g. a tfds split read without file shuffling)
    restricted to this process' shard_indices (no labels: a plain permutation), in the same
    order. Every process reads all n elements and keeps its share (count reads per element kept;
    decode after this, so that only the kept ones are decoded)."""
    index, count = resolve_shard(shard, n)
    mine = np.zeros(n, bool)
    mine[shard_indices(n, index, count, seed)] = True
    mine = tf.constant(mine)
    return dataset.enumerate().filter(lambda i, *x: mine[i]).map(lambda i, *x: x[0] if len(x) == 1 else x)


def _check_done(done, n):
    """``done`` as a list of (count, samples) pairs of ints, count in [1, n], samples >= 0."""
    try:
        pairs = [(c, s) for c, s in done]
    except (TypeError, ValueError):
        raise ValueError(f"done must be a list of (count, samples) pairs, got {done!r}") from None
    for c, s in pairs:
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in (c, s)) or not (
                1 <= c <= n and s >= 0):
            raise ValueError(f"done: ({c!r}, {s!r}) is not (count, samples) with 1 <= count <= {n} and samples >= 0")
    return [(int(c), int(s)) for c, s in pairs]


class _Shard:
    """Which samples this process reads in epoch e (1, 2, ...) and in which order: its shard_indices
    (fixed, or with ``every_epoch`` drawn anew from (shard_seed, e)), shuffled with (seed, e, index).

    ``done`` (with ``resumed``, the epoch it is of): the parts of that epoch that earlier layouts of the
    job read, in order, as (count, samples): under ``count`` shards each process read the first
    ``samples`` of its order. Each part's shards are drawn from the samples no earlier part read (the
    first part's are the plain shards), and this process' shard of that epoch from those left after
    the last part: the epoch ends with every sample read once (beyond what samples_per_epoch leaves
    out), whatever the layouts were. An elastic job that lost or gained ranks mid-epoch resumes so; the
    parts' orders are replayed from ``seed``, which every process must pass alike."""

    def __init__(self, n, index, count, shard_seed, every_epoch, shuffle, seed, labels=None, limit=None,
                 done=(), resumed=None):
        if shard_seed is not None and (isinstance(shard_seed, bool) or not isinstance(shard_seed, (int, np.integer))
                                       or shard_seed < 0):
            raise ValueError(f"shard_seed must be None or an int >= 0, got {shard_seed!r}")
        if every_epoch and shard_seed is None:
            raise ValueError("global_shuffle=True needs a shard_seed (not None)")
        self.n, self.index, self.count, self.labels = n, index, count, labels
        self.shard_seed, self.every_epoch, self.shuffle, self.seed = shard_seed, every_epoch, shuffle, seed
        self.done, self.resumed = _check_done(done, n), resumed
        if self.done and shuffle and seed is None:
            raise ValueError("done= needs a seed (the same on every process): the earlier parts' orders are "
                             "replayed from it")
        self.fixed = None if every_epoch else shard_indices(n, index, count, shard_seed, labels)
        self.left = None
        if self.done:
            self.left = self._left(resumed)
            if len(self.left) < count:
                raise ValueError(f"done: {n - len(self.left)} of the epoch's {n} samples were read, which leaves "
                                 f"{len(self.left)}, fewer than the {count} shards")
        self.size = len(self.indices(resumed if self.done else 1))
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 1 <= limit <= self.size:
                raise ValueError(f"samples_per_epoch must be None or an int in [1, {self.size}] (the shard's "
                                 f"size), got {limit!r}")
            self.size = int(limit)

    def _seed(self, epoch):
        return [self.shard_seed, epoch] if self.every_epoch else self.shard_seed

    def _of(self, pool, index, count, epoch):
        """Shard index of count over the samples ``pool`` (sorted) in epoch ``epoch``."""
        labels = None if self.labels is None else np.asarray(self.labels)[pool]
        return pool[shard_indices(len(pool), index, count, self._seed(epoch), labels)]

    def _left(self, epoch):
        """The samples of ``epoch`` that no part of ``done`` read, sorted."""
        pool = np.arange(self.n, dtype=np.int64)
        for count, samples in self.done:
            shards = [self._of(pool, i, count, epoch) for i in range(count)]
            if samples > min(len(s) for s in shards):
                raise ValueError(f"done: ({count}, {samples}) reads more than the smallest of those {count} "
                                 f"shards ({min(len(s) for s in shards)} samples)")
            read = np.concatenate([self._shuffled(s, epoch, i)[:samples] for i, s in enumerate(shards)])
            pool = np.setdiff1d(pool, read)
        return pool

    def indices(self, epoch):
        if self.done and epoch != self.resumed:
            raise ValueError(f"a data set resumed with done= yields epoch {self.resumed} once (asked for epoch "
                             f"{epoch}): build another for the epochs after it")
        if self.left is not None:
            return self._of(self.left, self.index, self.count, epoch)
        if self.fixed is not None:
            return self.fixed
        return shard_indices(self.n, self.index, self.count, self._seed(epoch), self.labels)

    def _shuffled(self, indices, epoch, index):
        if not self.shuffle:
            return indices
        # the shard's index in the seed: shards of equal size (indices in class order) shuffled
        # with one seed would put the same class at the same position on every rank
        return np.random.default_rng(None if self.seed is None else [self.seed, epoch, index]).permutation(indices)

    def order(self, epoch):
        return self._shuffled(self.indices(epoch), epoch, self.index)[:self.size]


def resolve_shard(shard, n):
    """(index, count): ``shard`` if given, else Horovod's (rank, size) once initialised, else (0, 1)."""
    if shard is None:
        topo = _topology()
        return (topo.rank, topo.size) if topo is not None else (0, 1)
    try:
        index, count = (int(v) for v in shard)
    except (TypeError, ValueError):
        raise ValueError(f"shard must be (index, count), got {shard!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"shard={shard!r}: need 0 <= index < count")
    if count > n:
        raise ValueError(f"shard={shard!r}: {count} shards of a data set of {n} samples leave some empty")
    return index, count
