"""Value codecs of sparse messages: how the values of [index | value] rows travel.
The option ``value_codec`` names one (CODECS); ``get(name)`` gives its SparseCodec.

* "none": float32 values, the plain rows (8 bytes per entry with int32 indices).
* "fp16": the values as float16 (6 bytes per entry).
* "mean": indices only, and per part of the message (a sender's selection) one 8-byte header
  [count int32 | value float32]: the part's mean. Exact when the part's values are all equal, as
  RedSync's qRGC selector makes them.

A collective first calls ``quantise`` on what its rank selected: the values every receiver will
decode. It sends those and keeps x minus them in its residual, so error feedback conserves mass.
``allgather`` encodes, gathers and decodes, the same bits on every rank (the rank's own message
included); decoded values re-encode exactly, so a collective may forward what it received.
"""
import tensorflow as tf

from tf_commlib import primitives
from tf_commlib.collectives import codec
from tf_commlib.collectives.sparse_message import allgather_sparse, pack, unpack

CODECS = ("none", "fp16", "mean")   # what the option value_codec accepts
INDEX_BYTES, HEADER_BYTES = 4, 8


def check(name, algorithm, codecs=CODECS):
    codec.check(name, "value_codec", algorithm, codecs)


class Mean(codec.Codec):
    """k values sent as one: their mean (v0 + mean(v - v0): exactly v0 when all are equal)."""
    name, value_bytes, header_bytes = "mean", 0, HEADER_BYTES

    def encode(self, x, seed=None):
        """[1] float32 (or [0] for no values): the mean."""
        first = x[:1]
        return first + tf.reduce_mean(x - first)

    def decode(self, wire, n, dtype=tf.float32):
        return tf.zeros([n], dtype) + tf.cast(wire, dtype)

    def round(self, x):
        first = x[:1]   # [1], or [0] when nothing was selected
        return tf.zeros_like(x) + (first + tf.reduce_mean(x - first))


MEAN = codec.register(Mean())


class SparseCodec:
    """k values and their k indices as one message of rows [index | value], the values in the value
    codec's wire type: ``bytes(n, parts)`` of n entries (in `parts` parts), ``entry_bytes`` (per
    entry, without headers), ``quantise(values)`` (what receivers decode), ``encode(values,
    indices, part, parts)`` -> uint8 rows, ``decode(rows, value_dtype, index_dtype, segments)`` ->
    (values, indices, part), ``allgather``; ``encode_rows``/``decode_rows`` re-encode packed float32
    rows (SparCML's streams)."""

    def __init__(self, values):
        self.values, self.name, self.exact = values, values.name, values.exact
        self.entry_bytes = INDEX_BYTES + values.value_bytes

    def __repr__(self):
        return f"<sparse codec {self.name}>"

    def bytes(self, n, parts=1):
        """Bytes of one rank's message of n entries in `parts` parts."""
        return n * INDEX_BYTES + self.values.bytes(n, parts)

    def quantise(self, values):
        return self.values.round(values)

    def encode(self, values, indices, part=None, parts=1):
        return pack(self.values.encode(values), indices)

    def decode(self, rows, value_dtype=tf.float32, index_dtype=tf.int32, segments=1):
        wire = value_dtype if self.values.exact else self.values.wire_dtype
        values, indices = unpack(rows, wire, index_dtype)
        return self.values.decode(values, None, value_dtype), indices, None

    def encode_rows(self, rows):
        """Packed float32 rows [int32 index | value] -> the rows this codec sends."""
        if self.exact:
            return rows
        return self.encode(*unpack(rows, tf.float32, tf.int32))

    def decode_rows(self, rows):
        """The inverse of encode_rows (float32 rows again)."""
        if self.exact:
            return rows
        values, indices, _ = self.decode(rows)
        return pack(values, indices)

    def allgather(self, values, indices, process_set, part=None, parts=1):
        """(values, indices, part) of every rank of the set, concatenated in rank order; part (for
        "mean" only, else None) numbers the parts (sender · parts + own part). values must be
        quantised (or decoded from this codec); part: [k] in [0, parts), default all 0."""
        got, idx = allgather_sparse(self.values.encode(values), indices, process_set)
        return self.values.decode(got, None, values.dtype), idx, None


class MeanSparse(SparseCodec):
    """"mean": per part [count int32, value bits, its indices...] (int32 words)."""

    def encode(self, values, indices, part=None, parts=1):
        """The values are constant per part (quantise, or decoded mean messages); entries are
        stably ordered by part."""
        part = tf.zeros_like(indices, tf.int32) if part is None else part
        order = tf.argsort(part, stable=True)
        part, values, indices = (tf.gather(t, order) for t in (part, values, indices))
        counts = tf.math.bincount(part, minlength=parts, maxlength=parts, dtype=tf.int32)
        value = tf.math.unsorted_segment_max(values, part, parts)
        value = tf.where(counts > 0, value, tf.zeros_like(value))
        heads = 2 * tf.range(parts) + tf.math.cumsum(counts, exclusive=True)
        k = tf.shape(indices)[0]
        words = tf.scatter_nd(tf.concat([heads, heads + 1, tf.range(k) + 2 * (part + 1)], 0)[:, None],
                              tf.concat([counts, tf.bitcast(value, tf.int32), indices], 0),
                              [k + 2 * parts])
        return tf.bitcast(words, tf.uint8)

    def decode(self, rows, value_dtype=tf.float32, index_dtype=tf.int32, segments=1):
        """The inverse of encode for `segments` concatenated parts."""
        words = tf.reshape(tf.bitcast(rows, tf.int32), [-1])
        position, heads, counts = tf.constant(0), [], []
        for _ in range(segments):
            count = words[position]
            heads.append(position)
            counts.append(count)
            position = position + 2 + count
        heads, counts = tf.stack(heads), tf.stack(counts)
        means = tf.bitcast(tf.gather(words, heads + 1), tf.float32)
        is_head = tf.scatter_nd(tf.concat([heads, heads + 1], 0)[:, None],
                                tf.ones([2 * segments], tf.bool), tf.shape(words))
        part = tf.repeat(tf.range(segments), counts)
        values, indices = tf.gather(means, part), tf.boolean_mask(words, ~is_head)
        return tf.cast(values, value_dtype), tf.cast(indices, index_dtype), part

    def encode_rows(self, rows):
        raise ValueError("value_codec 'mean' has no [index | value] rows")

    decode_rows = encode_rows

    def allgather(self, values, indices, process_set, part=None, parts=1):
        if indices.dtype.size > 4:   # selectors give int64 only for d >= 2^31
            raise ValueError("value_codec 'mean' sends int32 indices; this bucket has 2^31 entries or "
                             "more (int64 indices): use value_codec 'none' or 'fp16', or smaller buckets")
        if part is None:
            part = tf.zeros_like(indices, tf.int32)
        if process_set.size() == 1:   # the identity, no packing (as allgather_sparse)
            return tf.identity(values), tf.identity(indices), part
        rows = self.encode(tf.cast(values, tf.float32), tf.cast(indices, tf.int32), part, parts)
        return self.decode(primitives.allgather(rows, process_set), values.dtype, indices.dtype,
                           process_set.size() * parts)


_SPARSE = {"mean": MeanSparse(MEAN)}


def get(which):
    """The SparseCodec carrying the values of a value codec (its name, or a Codec or SparseCodec)."""
    if isinstance(which, SparseCodec):
        return which
    values = codec.get(which)
    if values.name not in _SPARSE:
        _SPARSE[values.name] = SparseCodec(values)
    return _SPARSE[values.name]
