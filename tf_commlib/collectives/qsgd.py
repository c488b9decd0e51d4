"""QSGD (Alistarh et al., used by SparCML's DSAR in its dense phase): a codec step, not a
collective. Each bucket of BUCKET entries is sent as its L2 norm and, per entry, a signed level
in [-s, s] with s = 2^(bits-1) - 1, rounded stochastically so that E[decode(encode(x))] = x.
The randomness comes from a stateless generator seeded by (seed, bucket index): the same seed gives
the same bits on every rank, so a rank that quantises a shared dense vector gets the same result
as every other rank.

``scale="max"`` is the other way of scaling a bucket (the "int<bits>" codecs, e.g. for DiLoCo's
pseudo-gradients between nodes): by its largest magnitude, each entry rounded to the nearest level.
Biased, but a contraction: an entry's error is at most its own magnitude and at most half a level,
and the largest entry is exact (up to float32 rounding), so ||decode(encode(x)) - x||^2 <=
||x||^2 - max|x|^2 per bucket, and error feedback stays bounded. QSGD's own scaling is unbiased, and
its error can be larger than x (``error_bound``)."""
import math

import tensorflow as tf

BUCKET = 1024
BITS = (2, 4, 8)


def check_bits(bits):
    if bits not in BITS:
        raise ValueError(f"QSGD bits must be one of {BITS}, got {bits!r}")
    return bits


SCALES = ("l2", "max")


def check_scale(scale):
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    return scale


def error_bound(bits, scale="l2", bucket=BUCKET):
    """An upper bound of E||decode(encode(x)) - x||^2 / ||x||^2: QSGD's min(d/s^2, sqrt(d)/s) for d =
    bucket (Alistarh et al., Lemma 3.1). For "max": an entry's error is at most its magnitude and at
    most half a level, max|x|/(2s), and the largest entry is exact, so (d-1)/(4s^2 + d-1), reached
    where the other d-1 entries are all just under half a level. Error feedback stays bounded where it
    is below 1."""
    s = 2 ** (check_bits(bits) - 1) - 1
    if check_scale(scale) == "max":
        return (bucket - 1) / (4.0 * s ** 2 + bucket - 1)
    return min(bucket / s ** 2, math.sqrt(bucket) / s)


def encode(x, bits, seed, bucket=BUCKET, scale="l2"):
    """Flat float32 x -> (levels int8 [buckets, bucket], norms float32 [buckets]); x is padded
    with zeros to whole buckets. seed: an int (or int64 tensor), identical on the ranks that must
    agree. scale "l2" (QSGD: the L2 norm, stochastic rounding) or "max" (the largest magnitude,
    rounded to the nearest level; seed unused): the "norms" are the scales."""
    s = float(2 ** (check_bits(bits) - 1) - 1)
    check_scale(scale)
    d = tf.shape(x)[0]
    padded = tf.pad(x, [[0, (-d) % bucket]])
    rows = tf.reshape(padded, [-1, bucket])
    norms = tf.norm(rows, axis=1) if scale == "l2" else tf.reduce_max(tf.abs(rows), axis=1)
    scaled = tf.math.divide_no_nan(tf.abs(rows), norms[:, None]) * s     # in [0, s]
    if scale == "max":
        return tf.cast(tf.sign(rows) * tf.minimum(tf.round(scaled), s), tf.int8), norms
    lower = tf.floor(scaled)
    u = tf.random.stateless_uniform(tf.shape(rows), seed=tf.stack([tf.cast(seed, tf.int64),
                                                                   tf.constant(0x5153, tf.int64)]))
    level = lower + tf.cast(u < scaled - lower, tf.float32)
    return tf.cast(tf.sign(rows) * level, tf.int8), norms


def decode(levels, norms, d, bits):
    """The inverse of encode, in expectation: flat float32 of length d."""
    s = float(2 ** (check_bits(bits) - 1) - 1)
    rows = tf.cast(levels, tf.float32) / s * norms[:, None]   # the top level is the scale itself
    return tf.reshape(rows, [-1])[:d]


def pack(levels, bits):
    """int8 levels in [-s, s] -> uint8, 8/bits levels per byte (level + s in `bits` bits, the
    first level in the low bits); the number of levels must be a multiple of 8/bits (whole buckets
    are)."""
    s, per = 2 ** (check_bits(bits) - 1) - 1, 8 // bits
    codes = tf.reshape(tf.cast(tf.cast(levels, tf.int32) + s, tf.int32), [-1, per])
    codes = codes & ((1 << bits) - 1)   # a non-finite input's level stays in its own bits
    return tf.cast(tf.reduce_sum(tf.bitwise.left_shift(codes, bits * tf.range(per)), axis=1), tf.uint8)


def unpack(packed, bits):
    """The inverse of pack: flat int8 levels."""
    s, per = 2 ** (check_bits(bits) - 1) - 1, 8 // bits
    codes = tf.bitwise.right_shift(tf.cast(packed, tf.int32)[:, None], bits * tf.range(per)) & ((1 << bits) - 1)
    return tf.cast(tf.reshape(codes, [-1]) - s, tf.int8)


def wire_bytes(d, bits, bucket=BUCKET):
    """Bytes of one encoded vector of d entries: bits per entry (packed) and one float32 norm per
    bucket."""
    buckets = -(-d // bucket)
    return buckets * (bucket * bits // 8 + 4)
