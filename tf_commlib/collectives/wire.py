"""Dense values on the wire in 16 bits: the option ``compression`` of dense and 2dtar,
as Horovod's Compression.fp16: cast before sending, sum in that type on the wire, cast back.

(The codecs are codec.py's NONE, FP16 and BF16; a name or a Codec is accepted below.)

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

from tf_commlib import alphabeta
from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import codec

COMPRESSIONS = ("none", "fp16", "bf16")   # what the option compression accepts (codec.py's codecs)


def check(compression, algorithm):
    codec.check(compression, "compression", algorithm, COMPRESSIONS)


def to_wire(x, size, compression):
    """x/size in the wire type (x itself for "none")."""
    wire_codec = codec.get(compression)
    return x if wire_codec.exact else wire_codec.encode(x / tf.cast(size, x.dtype))


def from_wire(y, dtype, size, compression):
    """The inverse of to_wire: y in dtype, times size."""
    wire_codec = codec.get(compression)
    return y if wire_codec.exact else wire_codec.decode(y, None, dtype) * tf.cast(size, dtype)


def allreduce(x, process_set):
    """Sum of the flat tensor x over the set in x's type (bfloat16 as reduce-scatter + all-gather)."""
    if x.dtype != tf.bfloat16 or process_set.size() == 1:
        return primitives.allreduce(x, process_set)
    p, d = process_set.size(), tf.shape(x)[0]
    shard = primitives.reducescatter(tf.pad(x, [[0, (-d) % p]]), process_set)
    return primitives.allgather(shard, process_set)[:d]


def allreduce_bytes(d, compression, kind, m, n):
    """{"intra": B, "inter": B} per rank of allreduce on d entries on a set of this kind."""
    wire_codec = codec.get(compression)
    if wire_codec.summable:
        return link_bytes.per_rank("allreduce", wire_codec.bytes(d), kind, m, n)
    p = {"intra": n, "inter": m, "world": m * n}[kind]
    s = math.ceil(d / p)
    return link_bytes.add(link_bytes.per_rank("reducescatter", wire_codec.bytes(p * s), kind, m, n),
                 link_bytes.per_rank("allgather", wire_codec.bytes(s), kind, m, n))


def allreduce_time(d, compression, p, alpha, beta):
    """Seconds of allreduce on d entries over p ranks (ring, or reduce-scatter + ring all-gather)."""
    wire_codec = codec.get(compression)
    if wire_codec.summable:
        return alphabeta.ring_allreduce(wire_codec.bytes(d), p, alpha, beta)
    s = math.ceil(d / p)
    return (alphabeta.reducescatter(wire_codec.bytes(p * s), p, alpha, beta)
            + alphabeta.allgather(wire_codec.bytes(s), p, alpha, beta))


def cast_cost(d, compression, params):
    """The casts to and from the wire type (two passes over d)."""
    return 0.0 if codec.get(compression).exact else 2 * alphabeta.copy_cost(d, params)


def padded(d, p):
    """d rounded up to a multiple of p (the sharded halves' flat length)."""
    return -(-d // p) * p


def reduce_scatter_sharded(x, topo, compression, sets):
    """Sum over all ranks of x (flat, padded to a multiple of topo.size), reduce-scattered over each
    set of ``sets`` in turn (each keeps its set rank's slice of the previous one's), in the wire
    type of ``compression``; returned in x's dtype."""
    wire = to_wire(x, topo.size, compression)
    wire = tf.pad(wire, [[0, (-tf.shape(wire)[0]) % topo.size]])
    if x.shape[0] is not None:
        wire.set_shape([padded(x.shape[0], topo.size)])
    for process_set in sets:
        wire = primitives.reducescatter(wire, process_set)
    return from_wire(wire, x.dtype, topo.size, compression)


def all_gather_sharded(piece, sets, name=None):
    """The inverse order of reduce_scatter_sharded's sets: all-gathers of the slices (named
    name_0, name_1, ... when a name is given)."""
    for k, process_set in enumerate(reversed(sets)):
        piece = primitives.allgather(piece, process_set, name=None if name is None else f"{name}_{k}")
    return piece


# -- the node slice (a sharded update over the ranks of a node, tf_commlib.keras.sharded) ----------
def node_size(d, n):
    """Entries of a node slice: ceil(d/n)."""
    return -(-d // n)


def node_slice(x, topo, d):
    """Local rank l's slice [l*s, (l+1)*s) of the flat x of length d padded to n*s (s = node_size)."""
    s = node_size(d, topo.n)
    out = tf.pad(tf.reshape(x, [d]), [[0, topo.n * s - d]])[topo.local * s:(topo.local + 1) * s]
    out.set_shape([s])
    return out


def node_reduce(x, topo, compression):
    """node_slice of the sum over all ranks of x: 2dtar without its last all-gather (an intra-node
    reduce-scatter, an inter-node allreduce of the shard), in the wire type of compression; the
    same bits on every rank of this local index."""
    d, s = x.shape[0], node_size(x.shape[0], topo.n)
    wire = tf.pad(to_wire(x, topo.size, compression), [[0, topo.n * s - d]])
    if topo.n > 1:
        wire = primitives.reducescatter(wire, topo.intra)
    if topo.m > 1:
        wire = allreduce(wire, topo.inter)
    return from_wire(wire, x.dtype, topo.size, compression)


def node_reduce_bytes(d, compression, m, n):
    """{"intra": B, "inter": B} per rank of node_reduce on d entries."""
    wire_codec, s = codec.get(compression), node_size(d, n)
    return link_bytes.add(link_bytes.per_rank("reducescatter", wire_codec.bytes(n * s), "intra", m, n),
                 allreduce_bytes(s, compression, "inter", m, n))
