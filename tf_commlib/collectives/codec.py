"""Value codecs: how values travel on the wire, one object each behind one interface (Codec), found
by name in one registry (the strings the options take: ``compression`` "none", "fp16", "bf16";
``value_codec`` "none", "fp16", "mean"; dsar_split_ag's ``qsgd_bits`` b as "qsgd<b>"; DiLoCo's
``inter_compression``: any with an ``error_bound`` below 1).

A Codec has
* ``bytes(n, parts=1)``: the bytes of n values on the wire (in ``parts`` messages, for codecs
  with a per-message header): the byte formulas of the collectives use it;
* ``encode(x, seed=None)`` -> the wire tensor, ``decode(wire, n, dtype)`` -> n values again, and
  ``round(x)``: what a receiver decodes from x (error feedback keeps x - round(x));
* ``to_bytes(x, seed=None)`` / ``from_bytes(data, n, dtype)``: the same as flat uint8, for messages
  that mix codecs and headers (dsar_split_ag's slices);
* ``value_bytes`` (per value, without headers), ``header_bytes`` (per message part), ``summable``
  (Horovod's allreduce sums the wire type: dense's and 2dtar's allreduce), ``exact`` (encode is the
  identity: nothing to scale, cast or round), ``error_bound`` (an upper bound of
  E||round(x) - x||^2 / ||x||^2, for values in the wire type's normal range; error feedback, which
  sends x plus what earlier rounds left, stays bounded where it is below 1; 1 where nothing smaller is
  known, so a registered codec that leaves it is not one DiLoCo sends).

The instances: NONE (float32, the input's own type), FP16, BF16 (casts), MEAN (one mean per
message part: value_codec.py), QSGD(bits) ("qsgd<bits>", qsgd.py) and QSGD(bits, "max") ("int<bits>":
8 or 4 bits scaled by each bucket's largest magnitude, rounded to the nearest level). The sparse
index/value messages that carry a codec's values are value_codec.SparseCodec. ``register`` adds one.
"""
import tensorflow as tf

from tf_commlib.collectives import qsgd

REGISTRY = {}   # name -> Codec


class Codec:
    """One way of sending values; see the module docstring."""
    name = None
    value_bytes = 4
    header_bytes = 0
    summable = True
    exact = False
    error_bound = 1.0         # no bound below the value's own norm
    wire_dtype = tf.float32   # of encode's result

    def bytes(self, n, parts=1):
        return n * self.value_bytes + self.header_bytes * parts

    def encode(self, x, seed=None):
        raise NotImplementedError

    def decode(self, wire, n, dtype=tf.float32):
        raise NotImplementedError

    def round(self, x):
        return self.decode(self.encode(x), tf.size(x), x.dtype)

    def to_bytes(self, x, seed=None):
        wire = self.encode(x, seed)
        return wire if wire.dtype == tf.uint8 else tf.reshape(tf.bitcast(wire, tf.uint8), [-1])

    def from_bytes(self, data, n, dtype=tf.float32):
        size = self.wire_dtype.size
        wire = data if size == 1 else tf.bitcast(tf.reshape(data, [n, size]), self.wire_dtype)
        return self.decode(wire, n, dtype)

    def __repr__(self):
        return f"<codec {self.name}>"


class Cast(Codec):
    """The values cast to a narrower float type (dtype None: sent as they are, 4 bytes each)."""

    def __init__(self, name, dtype=None, summable=True):
        self.name, self.dtype, self.summable = name, dtype, summable
        self.exact = dtype is None
        self.wire_dtype = dtype or tf.float32
        # a cast rounds each value to its type's significand: a relative error of at most 2^-11
        # (float16) or 2^-8 (bfloat16), within the type's normal range
        rounding = {tf.float16: 2.0 ** -22, tf.bfloat16: 2.0 ** -16}
        self.error_bound = 0.0 if dtype is None else rounding.get(dtype, 1.0)
        self.value_bytes = self.wire_dtype.size

    def encode(self, x, seed=None):
        return x if self.exact else tf.cast(x, self.dtype)

    def decode(self, wire, n=None, dtype=tf.float32):
        return wire if self.exact else tf.cast(wire, dtype)

    def round(self, x):
        return x if self.exact else self.decode(self.encode(x), None, x.dtype)


class QSGD(Codec):
    """QSGD (qsgd.py): per bucket of qsgd.BUCKET entries its float32 L2 norm, then `bits`-bit
    stochastically rounded levels (seeded: the same seed gives the same bits on every rank); with
    scale "max", its largest magnitude and levels rounded to the nearest."""
    wire_dtype = tf.uint8

    def __init__(self, bits, scale="l2"):
        self.bits, self.scale = qsgd.check_bits(bits), scale
        self.name = f"qsgd{bits}" if scale == "l2" else f"int{bits}"
        self.error_bound = qsgd.error_bound(bits, scale)

    def bytes(self, n, parts=1):
        return qsgd.wire_bytes(n, self.bits)

    def encode(self, x, seed=None):
        """Flat uint8: the norms (float32), then the packed levels."""
        levels, norms = qsgd.encode(x, self.bits, seed, scale=self.scale)
        return tf.concat([tf.reshape(tf.bitcast(norms, tf.uint8), [-1]), qsgd.pack(levels, self.bits)], 0)

    def decode(self, wire, n, dtype=tf.float32):
        buckets = -(-n // qsgd.BUCKET)
        norms = tf.bitcast(tf.reshape(wire[:4 * buckets], [buckets, 4]), tf.float32)
        levels = tf.reshape(qsgd.unpack(wire[4 * buckets:], self.bits), [buckets, qsgd.BUCKET])
        return tf.cast(qsgd.decode(levels, norms, n, self.bits), dtype)


def register(codec, name=None):
    """Adds a Codec under its name (ValueError if taken)."""
    name = name or codec.name
    if name in REGISTRY:
        raise ValueError(f"a codec named {name!r} is already registered")
    REGISTRY[name] = codec
    return codec


def get(codec):
    """The Codec of a name (KeyError if unknown); a Codec is returned as it is."""
    return codec if isinstance(codec, Codec) else REGISTRY[codec]


def check(name, option, algorithm, accepted):
    """ValueError naming algorithm_options[algorithm][option] unless name is one of `accepted`."""
    if not isinstance(name, str) or name not in accepted:
        raise ValueError(f"algorithm_options[{algorithm!r}][{option!r}] must be one of {accepted}, got {name!r}")


NONE = register(Cast("none"))
FP16 = register(Cast("fp16", tf.float16))
BF16 = register(Cast("bf16", tf.bfloat16, summable=False))   # Horovod 0.28 has no bfloat16 allreduce
for _bits in qsgd.BITS:
    register(QSGD(_bits))
for _bits in (4, 8):
    register(QSGD(_bits, "max"))
