"""Value codecs for sparse messages (issue 12 §2): how the values of [index | value] rows travel.

* "none": float32 values, today's rows (8 bytes per entry with int32 indices).
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

from tf_commlib import primitives as P
from tf_commlib.collectives.sparse_message import allgather_sparse, pack, unpack

CODECS = ("none", "fp16", "mean")
INDEX_BYTES, HEADER_BYTES = 4, 8
_VALUE_BYTES = {"none": 4, "fp16": 2, "mean": 0}


def check(codec, algorithm, codecs=CODECS):
    if not isinstance(codec, str) or codec not in codecs:
        raise ValueError(f"algorithm_options[{algorithm!r}]['value_codec'] must be one of {codecs}, "
                         f"got {codec!r}")


def entry_bytes(codec):
    """Bytes per sent entry (int32 index and its value)."""
    return INDEX_BYTES + _VALUE_BYTES[codec]


def message_bytes(codec, entries, parts=1):
    """Bytes of one rank's message of `entries` entries in `parts` parts."""
    return entries * entry_bytes(codec) + (HEADER_BYTES * parts if codec == "mean" else 0)


def quantise(values, codec):
    """What receivers decode from this rank's float32 values: themselves, their float16 rounding,
    or k copies of their mean (v0 + mean(v - v0): exactly v0 when all are equal)."""
    if codec == "fp16":
        return tf.cast(tf.cast(values, tf.float16), values.dtype)
    if codec == "mean":
        first = values[:1]   # [1], or [0] when nothing was selected
        return tf.zeros_like(values) + (first + tf.reduce_mean(values - first))
    return values


def encode_rows(rows, codec):
    """Packed float32 rows [int32 index | value] -> the rows a "none" or "fp16" message sends."""
    if codec == "none":
        return rows
    values, indices = unpack(rows, tf.float32, tf.int32)
    return pack(tf.cast(values, tf.float16), indices)


def decode_rows(rows, codec):
    """The inverse of encode_rows (float32 rows again)."""
    if codec == "none":
        return rows
    values, indices = unpack(rows, tf.float16, tf.int32)
    return pack(tf.cast(values, tf.float32), indices)


def _encode_mean(values, indices, part, parts):
    """Int32 words: per part [count, value bits, its indices...]; the values are constant per part
    (quantise, or decoded mean messages); entries are stably ordered by part."""
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


def _decode_mean(rows, segments):
    """The inverse of _encode_mean for `segments` concatenated parts: (values, indices, part)."""
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
    return tf.gather(means, part), tf.boolean_mask(words, ~is_head), part


def allgather(values, indices, process_set, codec, part=None, parts=1):
    """(values, indices, part) of every rank of the set, concatenated in rank order; part (for
    "mean" only, else None) numbers the parts (sender · parts + own part). values must be quantised
    (or decoded from this codec); part: [k] in [0, parts), default all 0."""
    if codec == "mean" and indices.dtype.size > 4:   # selectors give int64 only for d >= 2^31
        raise ValueError("value_codec 'mean' sends int32 indices; this bucket has 2^31 entries or "
                         "more (int64 indices): use value_codec 'none' or 'fp16', or smaller buckets")
    if codec != "mean":   # [index | value] rows, the values as float16 for "fp16"
        wire = tf.float16 if codec == "fp16" else values.dtype
        got, idx = allgather_sparse(tf.cast(values, wire), indices, process_set)
        return tf.cast(got, values.dtype), idx, None
    if part is None:
        part = tf.zeros_like(indices, tf.int32)
    if process_set.size() == 1:   # the identity, no packing (as allgather_sparse)
        return tf.identity(values), tf.identity(indices), part
    rows = _encode_mean(tf.cast(values, tf.float32), tf.cast(indices, tf.int32), part, parts)
    got, idx, part = _decode_mean(P.allgather(rows, process_set), process_set.size() * parts)
    return tf.cast(got, values.dtype), tf.cast(idx, indices.dtype), part
