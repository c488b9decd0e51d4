"""Dense values on the wire in 16 bits (issue 29 §2): the option ``compression`` of dense and 2dtar,
as Horovod's Compression.fp16: cast before sending, sum in that type on the wire, cast back.

* "none": float32 (the default).
* "fp16": float16, summed by Horovod's allreduce (Gloo sums halves).
* "bf16": bfloat16. Horovod 0.28 has no bfloat16 allreduce (its allgather and alltoall move the bits
  as uint16, tf_commlib.primitives), so an allreduce is a reduce-scatter (each rank sums its slice in
  bfloat16) and an all-gather: 2(p-1)/p of the input per rank, as a ring.

Every rank sends x/p in the wire type and the result is cast back times p: the sum over the p ranks
within the type's rounding (eps 2^-10 for fp16, 2^-7 for bf16, per rank and per addition), the same
bits on every rank. The 1/p keeps a sum of in-range values in range: fp16 overflows (±inf, NaN where
+inf meets -inf, on every rank) only where the ranks' mean is beyond 65504; x/p below fp16's
smallest subnormal (6e-8) is lost. bf16 has float32's range.
"""
import math

import tensorflow as tf

from tf_commlib import costmodel as C
from tf_commlib import link_bytes as L
from tf_commlib import primitives as P

COMPRESSIONS = ("none", "fp16", "bf16")
_WIRE = {"fp16": tf.float16, "bf16": tf.bfloat16}


def check(compression, algorithm):
    if not isinstance(compression, str) or compression not in COMPRESSIONS:
        raise ValueError(f"algorithm_options[{algorithm!r}]['compression'] must be one of {COMPRESSIONS}, "
                         f"got {compression!r}")


def value_bytes(compression):
    return C.BYTES if compression == "none" else 2


def to_wire(x, size, compression):
    """x/size in the wire type (x itself for "none")."""
    return x if compression == "none" else tf.cast(x / tf.cast(size, x.dtype), _WIRE[compression])


def from_wire(y, dtype, size, compression):
    """The inverse of to_wire: y in dtype, times size."""
    return y if compression == "none" else tf.cast(y, dtype) * tf.cast(size, dtype)


def allreduce(x, process_set):
    """Sum of the flat tensor x over the set in x's type (bfloat16 as reduce-scatter + all-gather)."""
    if x.dtype != tf.bfloat16 or process_set.size() == 1:
        return P.allreduce(x, process_set)
    p, d = process_set.size(), tf.shape(x)[0]
    shard = P.reducescatter(tf.pad(x, [[0, (-d) % p]]), process_set)
    return P.allgather(shard, process_set)[:d]


def allreduce_bytes(d, compression, kind, m, n):
    """{"intra": B, "inter": B} per rank of allreduce on d entries on a set of this kind."""
    if compression != "bf16":
        return L.per_rank("allreduce", value_bytes(compression) * d, kind, m, n)
    p = {"intra": n, "inter": m, "world": m * n}[kind]
    s = math.ceil(d / p)
    return L.add(L.per_rank("reducescatter", 2 * p * s, kind, m, n), L.per_rank("allgather", 2 * s, kind, m, n))


def allreduce_time(d, compression, p, alpha, beta):
    """Seconds of allreduce on d entries over p ranks (ring, or reduce-scatter + ring all-gather)."""
    if compression != "bf16":
        return C.ring_allreduce(value_bytes(compression) * d, p, alpha, beta)
    s = math.ceil(d / p)
    return C.reducescatter(2 * p * s, p, alpha, beta) + C.allgather(2 * s, p, alpha, beta)


def cast_cost(d, compression, params):
    """The casts to and from the wire type (two passes over d)."""
    return 0.0 if compression == "none" else 2 * C.copy_cost(d, params)
