"""cached_dataset: a tf.data pipeline that reads pre-processed samples from the cache.

Per epoch: one Python call shuffles the shard's indices (with (seed, epoch)), the graph cuts them
into batches of ``read_batch`` → one MGET per batch (several in flight, one connection each),
through the C++ op of datacache.direct where the server allows it, else redis-py in a
``tf.numpy_function``, that checks and unpacks the hits into the batch → one Python call reads the
files of the misses (none from epoch 2 on) through level 1 → ``preprocess`` of the misses (in
parallel, in a tf.function traced once) and their writes to Redis, in one call → unbatch →
``augment`` (after the cache, so it is random every epoch). Python runs once per batch, not once
per sample. Every epoch yields each sample of the shard exactly once.
"""
import hashlib
import os
import threading

import numpy as np
import tensorflow as tf

from datacache import direct
from datacache.cache import DataCache
from datacache.codec import Codec
from datacache.fingerprint import preprocess_fingerprint
from datacache.shards import _Shard, resolve_shard
from datacache.sources import ImageFolderSource, TfdsSource, missing_members

AUTOTUNE = tf.data.AUTOTUNE


def as_source(source):
    if isinstance(source, (str, os.PathLike)):
        return ImageFolderSource(source)
    if isinstance(source, ImageFolderSource):
        return source
    if not isinstance(source, type) and hasattr(source, "fingerprint") and hasattr(source, "path"):
        missing = missing_members(source)   # meant as a datacache.sources.Source: say what it lacks
        if missing:
            raise TypeError(f"source: {type(source).__name__} lacks {', '.join(missing)} of the "
                            "datacache.sources.Source protocol")
        return source
    try:
        import tensorflow_datasets as tfds
        if isinstance(source, tfds.folder_dataset.ImageFolder):
            return TfdsSource(source)
    except ImportError:
        pass
    raise TypeError("source must be a datacache.sources.Source (ImageFolderSource, TfdsSource or an object "
                    "with its members), a tfds.folder_dataset.ImageFolder or a folder path, "
                    f"got {type(source).__name__}")


def _probe(preprocess, data):
    """Runs preprocess once eagerly: the (dtype, shape) of every sample."""
    try:
        x = preprocess(tf.constant(data))
    except Exception as e:
        raise ValueError(f"preprocess failed on the first sample: {type(e).__name__}: {e}") from e
    if not isinstance(x, (tf.Tensor, np.ndarray)):
        raise TypeError(f"preprocess must return one tensor, got {type(x).__name__}")
    x = tf.convert_to_tensor(x)
    Codec(x.dtype.as_numpy_dtype, x.shape)   # checks that the dtype can be stored
    return x.dtype, tuple(x.shape)


def _aligned_empty(shape, dtype, align=64):
    """np.empty aligned for TensorFlow, which then wraps the array a numpy_function returns
    instead of copying it (numpy's own arrays are 16-byte aligned)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class _Plan:
    """The Python side of one cached dataset: index batches, lookups, misses, counters."""

    def __init__(self, source, shard, cache, codec, prefix, preprocess):
        self.source, self.shard, self.cache, self.codec = source, shard, cache, codec
        self.preprocess = preprocess   # (files, paths) -> the batch of pre-processed misses
        self.prefix = prefix.encode()
        self.direct = cache.direct()   # (op attrs, password) or None: the redis-py path
        self.epoch = 0
        self.records = {}
        self.bars = {}
        self._lock = threading.Lock()

    def start_epoch(self):
        """The epoch's order of the shard's indices and the epoch's number (one call per epoch)."""
        self.epoch += 1
        epoch = self.epoch
        self.cache.flush()   # the last epoch's writes are in Redis before this epoch reads
        self.records[epoch] = self.cache.new_epoch(self.prefix.decode(), epoch, self.shard.size)
        return self.shard.order(epoch), np.int64(epoch)

    def key(self, i):
        return self.prefix + b"%d" % i

    def lookup(self, idx, epoch):
        """One MGET through redis-py for a batch of indices: (values, hit, labels, positions of the
        misses, their encoded files read through level 1, their paths)."""
        out = _aligned_empty((len(idx),) + self.codec.shape, self.codec.dtype)
        hit = np.zeros(len(idx), bool)
        store = self.cache.store
        values, failed = store.mget([self.key(i) for i in idx]) if store is not None else (None, None)
        corrupt, fallbacks = 0, 0
        if values is not None:   # failed: keys of a cluster node that is down (values None)
            hit = self.codec.decode_batch(values, idx, out)
            corrupt = sum(v is not None for v in values) - int(hit.sum())
            fallbacks = int(np.count_nonzero(failed))
        elif store is not None:
            fallbacks = len(idx)
        return (out, hit) + self._finish(idx, epoch, hit, corrupt, fallbacks)

    def redis_state(self):
        """(password, Redis is up) for the direct path's next batch (reconnects at retry times)."""
        return self.direct[1], np.bool_(self.cache.store.available())

    def after_direct(self, idx, epoch, hit, present, ok, enabled, error):
        """The direct path's counters and misses: (labels, positions of the misses, files, paths)."""
        if enabled and not ok:   # the op quotes an error reply of the server as "<command> failed: -..."
            self.cache.store.failed(RuntimeError(error.decode(errors="replace")), refused=b" failed: -" in error)
        elif ok:
            self.cache.store.succeeded()
        corrupt = int(np.count_nonzero(present & ~hit))
        return self._finish(idx, epoch, hit, corrupt, 0 if ok else len(idx))

    def _finish(self, idx, epoch, hit, corrupt, fallbacks):
        record = self.records[int(epoch)]
        hits = int(hit.sum())
        self.cache.count(record, samples=len(idx), hits=hits, misses=len(idx) - hits - fallbacks,
                         fallbacks=fallbacks, corrupt=corrupt)
        self._progress(record, hits)
        missing = np.flatnonzero(~hit)
        files = np.array([self.fetch(int(idx[j]), record) for j in missing], object)
        paths = np.array([self.source.path(int(idx[j])).encode() for j in missing], object)
        return self.source.labels[idx], missing.astype(np.int64), files, paths

    def fetch(self, i, record):
        data = self.cache.read(self.source, i, record)
        self.source.check(i, data)
        return data

    def fill(self, idx, epoch, files, paths):
        """Pre-processes the misses of a batch (in parallel, through a tf.function traced once per
        process, so a new iterator of the dataset does not build it again) and queues them for
        Redis; returns them."""
        xs = self.preprocess(files, paths).numpy()
        if self.cache.store is not None:
            for i, x in zip(idx.tolist(), xs):
                self.cache.store.put(self.key(i), self.codec.encode(i, x))
        self._progress(self.records[int(epoch)], len(idx))
        return xs

    def _progress(self, record, done):
        """A progress bar for an epoch that fills the cache (shown once it has a miss)."""
        if not self.cache.progress:
            return
        import keras

        with self._lock:
            epoch = record["epoch"]
            record.setdefault("done", 0)
            record["done"] += done
            if epoch not in self.bars and record["misses"] + record["fallbacks"] == 0:
                return
            bar = self.bars.get(epoch)
            if bar is None:
                print(f"datacache: filling the cache, epoch {epoch}", flush=True)
                bar = self.bars[epoch] = keras.utils.Progbar(record["size"], unit_name="sample",
                                                             stateful_metrics=["hits", "misses"])
            if bar is not False:
                bar.update(record["done"], [("hits", record["hits"]), ("misses", record["misses"])],
                           finalize=record["done"] >= record["size"])
                if record["done"] >= record["size"]:
                    self.bars[epoch] = False


def cached_dataset(source, preprocess, cache=None, shard=None, shuffle=True, seed=None, *,
                   augment=None, preprocess_key=None, num_parallel_calls=AUTOTUNE, shard_seed=0,
                   global_shuffle=False, samples_per_epoch=None, first_epoch=1, done=()):
    """A tf.data.Dataset of ``(preprocess(encoded file), label)`` over this process' shard.

    source: a datacache.Source (ImageFolderSource, TfdsSource, or any object with its members), a
        tfds ImageFolder builder or a folder path.
    preprocess: maps one encoded file (scalar tf.string) to a tensor of one fixed shape and dtype
        (decode, resize, crop, cast): the deterministic part, and what is cached.
    cache: a DataCache; None creates the default one (embedded Redis), closed at exit; False reads
        and preprocesses every epoch (no cache, same sharding and order).
    shard: (index, count) of this process; default: Horovod's (rank, size) once initialised,
        else (0, 1). A shard is a random sample of the data set, every class in proportion
        (``shard_indices`` with the source's labels and ``shard_seed``, the same on every
        process), fixed across epochs, so node i caches only its ranks' part.
    shuffle, seed: a new permutation of the shard every epoch, reproducible with ``seed``.
    first_epoch: the number (1, 2, ...) of the epoch the data set's first iteration yields; each
        further iteration (``repeat``, a new iterator) yields the next. The order (and with
        global_shuffle the shard) of epoch e follows from (seed, e), so a data set built with
        first_epoch=e to resume a run yields what the uninterrupted run's e-th iteration yielded.
    shard_seed: the seed of the shards (every process must pass the same); None cuts the source's
        own order into contiguous shards (a source already in random order).
    samples_per_epoch: yield only the first samples_per_epoch of each epoch's order (e.g. the same
        number of full batches on every rank, whose shards differ by one sample). Prefer it to a
        ``take`` downstream: the pipeline then ends by itself, while a truncated one still had
        reads and decodes in flight, which the iterator's destruction waited for (up to 8 s at
        the end of an epoch on 2 busy cores).
    global_shuffle: draw the shards anew every epoch from (shard_seed, epoch), so a process sees
        other samples each epoch, as one process shuffling the whole set would. Costs cache
        locality: with one Redis per node every node ends up caching (and, until then, reading and
        pre-processing) the whole data set; use it with a shared Redis (redis_url) or none.
    done: what earlier layouts of an elastic job read of epoch ``first_epoch``, in order: (count,
        samples) pairs, each meaning that under ``count`` shards every process read the first
        ``samples`` of its order. The data set then yields this process' shard of the samples left
        (re-dealt among the current ``shard``'s count; a node's cache fills with what it now reads)
        once: build another with first_epoch + 1 for the epochs after it. Over the epoch every
        sample is read once, whatever the layouts (samples_per_epoch: of this rest). Needs the same
        ``seed`` on every process (the parts' orders are replayed from it).
    augment: a function x -> x run after the cache (random flips, crops, colour), every epoch anew.
    preprocess_key: names the preprocess configuration in the cache key (else ``preprocess.config()``
        or a fingerprint of the function; see datacache.fingerprint).
    """
    source = as_source(source)
    if not callable(preprocess):
        raise TypeError(f"preprocess must be callable, got {type(preprocess).__name__}")
    if augment is not None and not callable(augment):
        raise TypeError(f"augment must be callable or None, got {type(augment).__name__}")
    index, count = resolve_shard(shard, len(source))
    if isinstance(first_epoch, bool) or not isinstance(first_epoch, (int, np.integer)) or first_epoch < 1:
        raise ValueError(f"first_epoch must be an int >= 1, got {first_epoch!r}")
    if not isinstance(global_shuffle, bool):
        raise ValueError(f"global_shuffle must be True or False, got {global_shuffle!r}")
    shard = _Shard(len(source), index, count, shard_seed, global_shuffle, shuffle, seed, source.labels,
                   samples_per_epoch, done, int(first_epoch))
    if cache is None:
        cache = DataCache()
    elif cache is not False and not isinstance(cache, DataCache):
        raise TypeError(f"cache must be a DataCache, None or False, got {type(cache).__name__}")
    if cache is False:
        ds = _uncached(source, preprocess, shard, num_parallel_calls, int(first_epoch))
    else:
        ds = _cached(source, preprocess, cache, shard, preprocess_key, num_parallel_calls, int(first_epoch))
    # Static shapes for model code: a scalar label, and (cached) the preprocessed value's shape.
    if ds.element_spec[1].shape.rank != 0:
        ds = ds.map(lambda x, y: (x, tf.ensure_shape(y, [])))
    if augment is not None:
        ds = ds.map(lambda x, y: (augment(x), y), num_parallel_calls=num_parallel_calls)
    return ds.apply(tf.data.experimental.assert_cardinality(shard.size))


def _uncached(source, preprocess, shard, parallel, first_epoch):
    """Every epoch's order as in _cached, each sample read and pre-processed anew."""
    table = np.arange(len(source)) if shard.every_epoch or shard.done else shard.fixed   # the samples it may read
    paths = tf.constant([source.path(int(i)) for i in table])
    labels = tf.constant(source.labels[table])
    epoch = [first_epoch - 1]

    def positions():
        epoch[0] += 1
        return np.searchsorted(table, shard.order(epoch[0]))

    def epoch_positions(_):
        pos = tf.numpy_function(positions, [], tf.int64, stateful=True, name="datacache_epoch")
        return tf.data.Dataset.from_tensor_slices(tf.ensure_shape(pos, [shard.size]))

    ds = tf.data.Dataset.range(1).flat_map(epoch_positions)
    return ds.map(lambda j: (preprocess(tf.io.read_file(paths[j])), labels[j]), num_parallel_calls=parallel)


_MISSES = {}   # (id(preprocess), dtype, shape, read_batch) -> (preprocess, its traced preprocess_misses)


def _misses_fn(preprocess, key):
    """A tf.function that runs the misses of one batch through ``preprocess``, in parallel. It runs
    in Python (Plan.fill), not in the graph of ``load``: a nested dataset there made every new
    iterator (every epoch) optimise it again (~20 ms). Traced once per preprocess object (kept
    alive here, so its id is not reused) and shape: a data set rebuilt every epoch with the same
    preprocess, as the DAWNBench script's, spent ~0.3 s per build tracing it."""
    if key in _MISSES:
        return _MISSES[key][1]
    _, dtype, shape, read_batch = key
    dtype = tf.as_dtype(dtype)
    want = tf.constant(shape, tf.int32)

    def checked(data, path):
        x = tf.convert_to_tensor(preprocess(data))
        if x.dtype != dtype:
            raise TypeError(f"preprocess returned {x.dtype.name} in the pipeline but {dtype.name} on the first sample")
        got = tf.shape(x)
        same = tf.logical_and(tf.equal(tf.size(got), len(shape)),
                              tf.reduce_all(tf.equal(tf.pad(got, [[0, len(shape)]])[:len(shape)], want)))
        check = tf.debugging.Assert(same, ["preprocess returned shape", got, "for", path, "but", want,
                                           "for the first sample: preprocess must return one fixed shape "
                                           "(resize or crop to a fixed size)"])
        with tf.control_dependencies([check]):
            return tf.reshape(x, shape)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)] * 2, autograph=False)
    def preprocess_misses(files, paths):
        return (tf.data.Dataset.from_tensor_slices((files, paths))
                .map(checked, num_parallel_calls=AUTOTUNE, deterministic=True)
                .batch(read_batch).get_single_element())

    preprocess_misses.get_concrete_function()   # traced now: a wrong dtype fails here, not mid-epoch
    _MISSES[key] = (preprocess, preprocess_misses)
    return preprocess_misses


def _cached(source, preprocess, cache, shard, preprocess_key, parallel, first_epoch):
    probe = int(shard.indices(shard.resumed if shard.done else 1)[0])
    first = cache.read(source, probe)
    source.check(probe, first)
    dtype, shape = _probe(preprocess, first)
    codec = Codec(dtype.as_numpy_dtype, shape)
    key = "\0".join([source.fingerprint(), preprocess_fingerprint(preprocess, preprocess_key),
                      dtype.name, repr(shape)])
    plan = _Plan(source, shard, cache, codec, f"dc:{hashlib.sha256(key.encode()).hexdigest()[:24]}:",
                 _misses_fn(preprocess, (id(preprocess), dtype.name, shape, cache.read_batch)))
    plan.epoch = first_epoch - 1

    def load(idx, epoch):
        """One MGET for the batch; only the misses go through preprocess (in parallel)."""
        if plan.direct is None:
            values, hit, labels, missing, files, paths = tf.numpy_function(
                plan.lookup, [idx, epoch], [dtype, tf.bool, tf.int32, tf.int64, tf.string, tf.string],
                stateful=True, name="datacache_mget")
        else:
            password, up = tf.numpy_function(plan.redis_state, [], [tf.string, tf.bool], stateful=True,
                                             name="datacache_state")
            keys = tf.strings.join([plan.prefix, tf.strings.as_string(idx)])
            values, hit, present, ok, error = direct.mget(keys, idx, password, up, plan.direct[0], codec)
            labels, missing, files, paths = tf.numpy_function(
                plan.after_direct, [idx, epoch, hit, present, ok, up, error],
                [tf.int32, tf.int64, tf.string, tf.string], stateful=True, name="datacache_misses")
        values.set_shape((None,) + shape)
        labels.set_shape([None])
        missing.set_shape([None])

        def fill():
            fixed = tf.numpy_function(plan.fill, [tf.gather(idx, missing), epoch, files, paths], dtype,
                                      stateful=True, name="datacache_fill")
            return tf.tensor_scatter_nd_update(values, missing[:, None], tf.ensure_shape(fixed, (None,) + shape))
        return tf.cond(tf.size(missing) > 0, fill, lambda: values), labels

    def epoch_batches(_):
        """One Python call per epoch for the order; the batches of indices are sliced in the graph."""
        order, epoch = tf.numpy_function(plan.start_epoch, [], [tf.int64, tf.int64], stateful=True,
                                         name="datacache_epoch")
        order.set_shape([shard.size])
        return tf.data.Dataset.from_tensor_slices(order).batch(cache.read_batch).map(lambda idx: (idx, epoch))

    batches = tf.data.Dataset.range(1).flat_map(epoch_batches)
    order = {} if parallel is None else {"deterministic": True}
    return batches.map(load, num_parallel_calls=parallel, **order).unbatch()
