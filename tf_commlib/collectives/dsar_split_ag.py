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
import numbers

import tensorflow as tf

from tf_commlib import alphabeta
from tf_commlib import primitives
from tf_commlib.collectives import codec
from tf_commlib.collectives import qsgd
from tf_commlib.collectives import value_codec
from tf_commlib.collectives import sparcml
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
    sparcml.check_codec(options, "dsar_split_ag")


def delta_of(d, p, options):
    if options["delta"] is None:
        return sparcml.slice_size(d, p) * alphabeta.BYTES / value_codec.get(options["value_codec"]).entry_bytes
    return options["delta"]


def dense_codec(bits):
    """The codec of the dense slices: float32, or QSGD with `bits` bits."""
    return codec.get("none" if bits is None else f"qsgd{bits}")


def dense_bytes(n_slice, bits):
    return dense_codec(bits).bytes(n_slice)


def payload(d, p, options):
    """The bytes owner j allgathers for a slice of `entries` entries (sparcml.schedule)."""
    n_slice, delta, bits = sparcml.slice_size(d, p), delta_of(d, p, options), options["qsgd_bits"]
    entry = value_codec.get(options["value_codec"]).entry_bytes
    return lambda j, entries: 4 + (dense_bytes(n_slice, bits) if entries > delta else entry * entries)


def _word(value):
    return tf.reshape(tf.bitcast(tf.cast(value, tf.int32), tf.uint8), [4])


def _seed(ctx, owner):
    base = 0 if ctx is None else (ctx.step if ctx.seed is None else ctx.seed)
    return tf.cast(base, tf.int64) * 65537 + owner


def reduce_streams(stream, d, topo, ctx, wire):
    world = topo.world
    p, me = world.size(), world.rank()
    q, n_slice = sparcml.lower_power_of_two(p), sparcml.slice_size(d, p)
    options = ctx.options
    delta, entry = delta_of(d, p, options), wire.codec.entry_bytes
    dense_wire = dense_codec(options["qsgd_bits"])
    owned = sparcml.split_reduce(sparcml.fold_in(stream, world, wire), d, world, wire)
    values, indices = unpack(owned, tf.float32, tf.int32)
    count = tf.shape(indices)[0]
    is_dense = tf.cast(count, tf.float64) > delta
    sparse_rows = wire.send(wire.round(owned, keep=True, lose=tf.logical_not(is_dense)))

    def dense():
        slice_ = scatter_add(indices - me * n_slice, values, n_slice)
        return tf.concat([_word(-1), dense_wire.to_bytes(slice_, _seed(ctx, me))], 0)

    blob = tf.cond(is_dense, dense, lambda: tf.concat([_word(count), tf.reshape(sparse_rows, [-1])], 0))
    gathered = primitives.allgather(sparcml.keep_if(blob, me < q), world)   # the owners' messages in order
    offset, slices = tf.constant(0, tf.int32), []
    for j in range(q):
        head = tf.bitcast(tf.reshape(gathered[offset:offset + 4], [4]), tf.int32)
        is_dense = head < 0
        length = tf.where(is_dense, dense_wire.bytes(n_slice), entry * head)
        data = gathered[offset + 4:offset + 4 + length]

        def sparse(data=data, j=j):
            v, i = unpack(wire.receive(tf.reshape(data, [-1, entry])), tf.float32, tf.int32)
            return scatter_add(i - j * n_slice, v, n_slice)
        slices.append(tf.cond(is_dense, lambda data=data: dense_wire.from_bytes(data, n_slice), sparse))
        offset = offset + 4 + length
    return tf.concat(slices, 0)[:d]


def concat_time(d, m, n, density, params, options):
    """After ssar_split_ag's phases (with this payload), the q decoded slices concatenated (a copy of d)."""
    return {"concat": alphabeta.copy_cost(d, params)}


COLLECTIVE = sparcml.collective("dsar_split_ag", reduce_streams, "split", payload, concat_time, OPTIONS, check_options)
dsar_split_ag = COLLECTIVE.fn
