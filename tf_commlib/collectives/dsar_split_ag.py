"""DSAR_Split_allgather (renggli2019 §5.3.3): the split phase of ssar_split_ag, then each owner
switches its slice (N = ceil(d/P') entries) to the dense format when it holds more than δ entries
and the slices are allgathered (sparcml.py has the streams, folding, order and cost).

Each owner's message starts with one int32 word, as SparCML's streams do: its number of entries
(sparse rows follow) or -1 (the dense slice follows). Options: ``delta`` (δ, default None = N/2,
the break-even of fp32 values with int32 indices; must be > 0) and ``qsgd_bits`` (None, or 2, 4
or 8: the dense slices are QSGD-quantised in buckets of 1024 with a stochastic rounding seeded by
the Context's seed (else its step) and the owner, so every rank decodes the same bits; the sparse
phase stays lossless) and ``value_codec`` ("none" or "fp16", sparcml.py: the sparse streams and
sparse slices; δ's default becomes the break-even N·4/(bytes per entry))."""
import math
import numbers

import tensorflow as tf

from tf_commlib import costmodel as C
from tf_commlib import primitives as P
from tf_commlib.collectives import naive_ag, qsgd
from tf_commlib.collectives import value_codec as V
from tf_commlib.collectives import sparcml as S
from tf_commlib.collectives.interface import Collective
from tf_commlib.collectives.sparse_message import unpack
from tf_commlib.ops import scatter_add

OPTIONS = {"delta": None, "qsgd_bits": None, "value_codec": "none"}


def check_options(options):
    delta, bits = options["delta"], options["qsgd_bits"]
    if delta is not None and (isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not delta > 0):
        raise ValueError(f"algorithm_options['dsar_split_ag']['delta'] must be a number > 0 "
                         f"(or None for N/2), got {delta!r}")
    integral = isinstance(bits, numbers.Integral) and not isinstance(bits, bool)
    if bits is not None and not (integral and bits in qsgd.BITS):
        raise ValueError(f"algorithm_options['dsar_split_ag']['qsgd_bits'] must be one of "
                         f"{qsgd.BITS} (or None), got {bits!r}")
    S.check_codec(options, "dsar_split_ag")


def delta_of(d, p, options):
    if options["delta"] is None:
        return S.slice_size(d, p) * C.BYTES / V.entry_bytes(options["value_codec"])
    return options["delta"]


def dense_bytes(n_slice, bits):
    return 4 * n_slice if bits is None else qsgd.wire_bytes(n_slice, bits)


def payload(d, p, options):
    """The bytes owner j allgathers for a slice of `entries` entries (sparcml.schedule)."""
    n_slice, delta, bits = S.slice_size(d, p), delta_of(d, p, options), options["qsgd_bits"]
    entry = V.entry_bytes(options["value_codec"])
    return lambda j, entries: 4 + (dense_bytes(n_slice, bits) if entries > delta else entry * entries)


def _word(value):
    return tf.reshape(tf.bitcast(tf.cast(value, tf.int32), tf.uint8), [4])


def _flat_bytes(t):
    return tf.reshape(tf.bitcast(t, tf.uint8), [-1])


def _encode_dense(dense, bits, seed):
    if bits is None:
        return _flat_bytes(dense)
    levels, norms = qsgd.encode(dense, bits, seed)
    return tf.concat([_flat_bytes(norms), qsgd.pack(levels, bits)], 0)


def _decode_dense(data, n_slice, bits):
    if bits is None:
        return tf.bitcast(tf.reshape(data, [n_slice, 4]), tf.float32)
    buckets = math.ceil(n_slice / qsgd.BUCKET)
    norms = tf.bitcast(tf.reshape(data[:4 * buckets], [buckets, 4]), tf.float32)
    levels = tf.reshape(qsgd.unpack(data[4 * buckets:], bits), [buckets, qsgd.BUCKET])
    return qsgd.decode(levels, norms, n_slice, bits)


def _seed(ctx, owner):
    base = 0 if ctx is None else (ctx.step if ctx.seed is None else ctx.seed)
    return tf.cast(base, tf.int64) * 65537 + owner


def reduce_streams(stream, d, topo, ctx, wire):
    world = topo.world
    p, me = world.size(), world.rank()
    q, n_slice = S.lower_power_of_two(p), S.slice_size(d, p)
    options = ctx.options
    delta, bits, entry = delta_of(d, p, options), options["qsgd_bits"], V.entry_bytes(wire.codec)
    owned = S.split_reduce(S.fold_in(stream, world, wire), d, world, wire)
    values, indices = unpack(owned, tf.float32, tf.int32)
    count = tf.shape(indices)[0]
    is_dense = tf.cast(count, tf.float64) > delta
    sparse_rows = wire.send(wire.round(owned, keep=True, lose=tf.logical_not(is_dense)))

    def dense():
        slice_ = scatter_add(indices - me * n_slice, values, n_slice)
        return tf.concat([_word(-1), _encode_dense(slice_, bits, _seed(ctx, me))], 0)

    blob = tf.cond(is_dense, dense, lambda: tf.concat([_word(count), tf.reshape(sparse_rows, [-1])], 0))
    gathered = P.allgather(S.keep_if(blob, me < q), world)   # the owners' messages in order
    offset, slices = tf.constant(0, tf.int32), []
    for j in range(q):
        head = tf.bitcast(tf.reshape(gathered[offset:offset + 4], [4]), tf.int32)
        is_dense = head < 0
        length = tf.where(is_dense, dense_bytes(n_slice, bits), entry * head)
        data = gathered[offset + 4:offset + 4 + length]

        def sparse(data=data, j=j):
            v, i = unpack(wire.receive(tf.reshape(data, [-1, entry])), tf.float32, tf.int32)
            return scatter_add(i - j * n_slice, v, n_slice)
        slices.append(tf.cond(is_dense, lambda data=data: _decode_dense(data, n_slice, bits), sparse))
        offset = offset + 4 + length
    return tf.concat(slices, 0)[:d]


dsar_split_ag = S.sparse_collective(reduce_streams, lambda: COLLECTIVE)
split_time, sent_bytes, actual_bytes = S.cost("split", payload)


def time(d, m, n, density, params, options):
    """ssar_split_ag's phases with this payload, and the q decoded slices concatenated (a copy of d)."""
    return {**split_time(d, m, n, density, params, options), "concat": C.copy_cost(d, params)}

COLLECTIVE = Collective("dsar_split_ag", dsar_split_ag, time, sent_bytes, sparse=True,
                        residual_size=naive_ag.residual_size,
                        residual_to_input=naive_ag.residual_to_input, options=OPTIONS,
                        check_options=check_options, actual_bytes=actual_bytes)
