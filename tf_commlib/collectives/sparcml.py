"""SparCML (renggli2019 §5), shared by ssar_rd, ssar_split_ag and dsar_split_ag.

Every rank adds its residual to its bucket, selects k = density·d entries of the whole bucket and
sorts them by index: its sparse stream, sent as packed rows [index | value] (sparse_message.pack,
8 bytes per entry). The residual keeps what the rank did not send (error feedback, as naive_ag).

* Folding: with P not a power of two, the e = P - P' ranks r >= P' (P' the largest power of two
  <= P) first send their stream to rank r - P', which merges it into its own; the P' ranks run the
  algorithm; the extras get the result at the end (ssar_rd: from r - P'; the split variants: from
  the final allgather over all ranks, to which they contribute nothing).
* Summation order, the same on every rank so that every rank gets the same bits: a merge adds the
  streams in rank order (the lower rank's value first, from 0.0), and in the split variants each
  slice is summed by its one owner only.
* Messages of data-dependent length (the fill-in) go through the primitives' variable-length
  alltoall (a pairwise exchange is an alltoall with one non-zero split) and allgather, eagerly and
  inside tf.function; every rank builds the same ops (only their values depend on the rank), so
  Horovod's op names agree.

Bytes: ``schedule`` lists every message (phase, sender, receiver, bytes) from the sizes of the
unions of index sets it needs; ``sent_bytes`` feeds it the expected sizes for independent uniformly
random indices, the fill-in E[K] = L·(1 - (1 - k/d)^j) of j streams on a range of L indices, and
``actual_bytes`` the exact sizes from the ranks' selected index sets, so a test can check the bytes
the primitives moved exactly. ``time`` charges each phase its latency (an exchange α, the split
alltoall (P'-1)·α, the ring allgather (P-1)·α) and the bytes of its busiest sender on the phase's
link (inter-node if any of its messages crosses nodes), plus selection, merges and error feedback.
Merges (sparcml.merge: argsort by index, unique, segment sum; linear in the rows at the sizes seen
here, calibrated as merge_s_per_elem) are charged per row merged: the rank's own stream once
("sort"), then in each phase the busiest rank's own part plus what it received (SSAR round t
merges two streams of ~2^t·k rows: ~(2P'-2)·k rows over the rounds, not 2·k·log2 P').

* Value codec (option ``value_codec``, "none" or "fp16"; value_codec.py): every stream is rounded
  to the codec before it is sent (the sender then merges the rounded stream too, so partners agree)
  and travels as the codec's rows (6 bytes per entry for fp16). The rounding loss goes into the
  residual of exactly one holder of that stream (Wire: in SSAR round t the block's lowest rank,
  rank 0 for the final stream sent to the extras), so error feedback conserves the mass. "mean" is
  refused: merged streams carry sums of several ranks' values, not one rank's constant.
"""
import math

import numpy as np
import tensorflow as tf

from tf_commlib import alphabeta
from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import naive_ag
from tf_commlib.collectives import value_codec
from tf_commlib.collectives.count import num_selected
from tf_commlib.collectives.error_feedback import unsent
from tf_commlib.collectives.interface import Collective
from tf_commlib.collectives.sparse_message import pack, unpack
from tf_commlib.ops import scatter_add


def lower_power_of_two(p):
    return 1 << (p.bit_length() - 1)


def slice_size(d, p):
    """Entries per owner in the split variants: ceil(d / P')."""
    return math.ceil(d / lower_power_of_two(p))


# -- streams -------------------------------------------------------------------------------
def merge(rows):
    """Packed streams (one row tensor, the streams concatenated in rank order) -> one stream sorted
    by index, each index once, its values added in that order starting from 0.0."""
    values, indices = unpack(rows, tf.float32, tf.int32)
    order = tf.argsort(indices, stable=True)
    unique, segment = tf.unique(tf.gather(indices, order))
    return pack(scatter_add(segment, tf.gather(values, order), tf.size(unique)), unique)


CODECS = ("none", "fp16")


def check_codec(options, algorithm):
    value_codec.check(options["value_codec"], algorithm, CODECS)


class Wire:
    """Streams on the wire with the value codec (a name or value_codec.SparseCodec); collects what
    rounding lost, for the residual."""

    def __init__(self, codec):
        self.codec, self.lost = value_codec.get(codec), []

    def round(self, rows, keep, lose=True):
        """rows as receivers decode them; with keep, this rank's residual takes the loss (where the
        bool tensor `lose` holds)."""
        if self.codec.exact:
            return rows
        out = self.codec.decode_rows(self.codec.encode_rows(rows))
        if keep:
            (v, i), (r, _) = unpack(rows, tf.float32, tf.int32), unpack(out, tf.float32, tf.int32)
            self.lost.append((tf.where(lose, v - r, tf.zeros_like(v)), i))
        return out

    def send(self, rows):
        return self.codec.encode_rows(rows)

    def receive(self, rows):
        return self.codec.decode_rows(rows)

    def residual(self, d):
        """What rounding took from this rank's streams, as a dense length-d addition to its residual."""
        return sum(scatter_add(i, v, d) for v, i in self.lost) if self.lost else 0.0


def keep_if(rows, keep):
    """rows, or none of them when the Python bool keep is False (the same ops either way)."""
    return rows[:tf.shape(rows)[0] * int(keep)]


def exchange(rows, to, process_set, wire=None):
    """Sends rows (rounded by the wire) to set rank `to` (None: sends nothing) and returns the
    rows sent to this rank."""
    wire = wire or Wire("none")
    splits = [0] * process_set.size()
    if to is not None:
        splits[to] = 1
    rows = wire.send(keep_if(rows, to is not None))
    return wire.receive(primitives.alltoall(rows, tf.constant(splits, tf.int32) * tf.shape(rows)[0], process_set))


def fold_in(stream, process_set, wire=None):
    """Extras send their stream to rank - P' (which merges it after its own) and keep nothing."""
    wire = wire or Wire("none")
    p, me = process_set.size(), process_set.rank()
    q = lower_power_of_two(p)
    if p == q:
        return stream
    received = exchange(wire.round(stream, keep=me >= q), me - q if me >= q else None, process_set, wire)
    return merge(tf.concat([keep_if(stream, me < q), received], 0))


def recursive_double(stream, process_set, wire=None):
    """SSAR_Recursive_double on the folded streams: in round t, rank r < P' exchanges its whole
    stream with r XOR 2^t and merges (the lower rank's first); then the extras get the result."""
    wire = wire or Wire("none")
    p, me = process_set.size(), process_set.rank()
    q = lower_power_of_two(p)
    for t in range(q.bit_length() - 1):
        partner = me ^ (1 << t)
        stream = wire.round(stream, keep=me < q and me % (1 << t) == 0)   # the block's copies agree
        received = exchange(stream, partner if me < q else None, process_set, wire)
        first, second = (stream, received) if me < partner else (received, stream)
        stream = merge(tf.concat([first, second], 0))
    if p > q:
        stream = wire.round(stream, keep=me == 0)
        stream = tf.concat([stream, exchange(stream, me + q if me + q < p else None, process_set, wire)], 0)
    return stream


def split_reduce(stream, d, process_set, wire=None):
    """The split phase: each of the P' folded streams sends the entries of slice j (indices
    [j·N, (j+1)·N), N = slice_size) to rank j, which merges them in rank order."""
    wire = wire or Wire("none")
    n_slice = slice_size(d, process_set.size())
    stream = wire.round(stream, keep=True)
    _, indices = unpack(stream, tf.float32, tf.int32)
    splits = tf.math.bincount(indices // n_slice, minlength=process_set.size(),
                              maxlength=process_set.size(), dtype=tf.int32)
    return merge(wire.receive(primitives.alltoall(wire.send(stream), splits, process_set)))


def collective(name, reduce_streams, algorithm, payload=None, extra_time=None, options=None,
               check_options=None):
    """The Collective `name` of a SparCML variant: its fn from reduce_streams (sparse_collective),
    its bytes and time from the schedule of `algorithm` ("rd" or "split", with payload: cost) plus
    extra_time(d, m, n, density, params, options) -> {step: seconds}; options (default
    {"value_codec": "none"}) checked by check_options (default: the value codec, check_codec)."""
    base_time, sent_bytes, actual_bytes = cost(algorithm, payload)

    def time(d, m, n, density, params, options):
        return {**base_time(d, m, n, density, params, options),
                **(extra_time(d, m, n, density, params, options) if extra_time else {})}
    coll = Collective(name, sparse_collective(reduce_streams, lambda: coll), time, sent_bytes, lossy=True,
                      state_size=naive_ag.state_size, residual_to_input=naive_ag.residual_to_input,
                      input_to_residual=naive_ag.input_to_residual,
                      actual_bytes=actual_bytes, options=options or {"value_codec": "none"},
                      check_options=check_options or (lambda options: check_codec(options, name)))
    return coll


def sparse_collective(reduce_streams, collective):
    """The collective fn around reduce_streams(stream, d, topo, ctx, wire) -> dense sum of length
    d; collective() gives the Collective (for its default options)."""
    def fn(x, topo, density, select, residual=None, ctx=None):
        d = x.shape[0]
        if d >= 2 ** 31:
            raise ValueError(f"SparCML streams use int32 indices: a bucket of {d} entries is too long")
        if residual is not None:
            x = x + residual
        values, indices = select(x, num_selected(density, d))
        stream = merge(pack(tf.cast(values, tf.float32), tf.cast(indices, tf.int32)))
        ctx = ctx or collective().context()
        wire = Wire(ctx.options["value_codec"])
        aggregated = reduce_streams(stream, d, topo, ctx, wire)
        new_residual = unsent(x, values, indices) + tf.cast(wire.residual(d), x.dtype)
        return tf.reshape(tf.cast(aggregated, x.dtype), [d]), new_residual, indices
    return fn


def densify(rows, d):
    values, indices = unpack(rows, tf.float32, tf.int32)
    return scatter_add(indices, values, d)


# -- bytes and time --------------------------------------------------------------------------
def schedule(algorithm, d, p, union, payload=None, entry=alphabeta.SPARSE_BYTES):
    """Every message of one call: [(phase, sender, receiver, bytes)], and in the phases that merge
    (fold, rounds, split) the part of its own stream a rank merges with what it receives, as a
    message to itself (src == dst, not sent: per_link and phase_times skip it). union(ranks, lo,
    hi): entries in the union of those ranks' index sets within [lo, hi). payload(j, entries): the
    bytes owner j allgathers for a slice of `entries` (split variants; default the sparse rows);
    entry: the bytes of one sparse entry (the value codec's)."""
    q = lower_power_of_two(p)
    if p == 1:
        return []
    folded = {r: [r] + ([r + q] if r + q < p else []) for r in range(q)}
    out = [("fold", r, r - q, entry * union([r], 0, d)) for r in range(q, p)]
    out += [("fold", r - q, r - q, entry * union([r - q], 0, d)) for r in range(q, p)]
    if algorithm == "rd":
        for t in range(q.bit_length() - 1):
            for r in range(q):
                block = r >> t << t
                members = [x for b in range(block, block + (1 << t)) for x in folded[b]]
                nbytes = entry * union(members, 0, d)
                out += [(f"round{t}", r, r ^ (1 << t), nbytes), (f"round{t}", r, r, nbytes)]
        out += [("unfold", r - q, r, entry * union(range(p), 0, d)) for r in range(q, p)]
        return out
    n_slice = slice_size(d, p)
    bounds = [(j * n_slice, min(d, (j + 1) * n_slice)) for j in range(q)]
    out += [("split", r, j, entry * union(folded[r], *bounds[j])) for r in range(q) for j in range(q)]
    payload = payload or (lambda j, entries: entry * entries)
    for j in range(q):
        nbytes = payload(j, union(range(p), *bounds[j]))
        out += [("allgather", j, r, nbytes) for r in range(p) if r != j]
    return out


def expected_union(d, k):
    """E[entries] of the union of j independent uniformly random k-subsets of d within a range."""
    return lambda ranks, lo, hi: (hi - lo) * (1 - (1 - k / d) ** len(list(ranks)))


def actual_union(index_sets):
    """Entries of the union of the ranks' actual index sets (numpy) within a range."""
    def union(ranks, lo, hi):
        merged = np.unique(np.concatenate([np.asarray(index_sets[r]) for r in ranks]))
        return int(np.count_nonzero((merged >= lo) & (merged < hi)))
    return union


def per_link(messages, m, n):
    """{"intra": B, "inter": B} sent, averaged over the m·n ranks."""
    total = {link: 0.0 for link in link_bytes.LINKS}
    for _, src, dst, nbytes in messages:
        if src != dst:
            total["intra" if src // n == dst // n else "inter"] += nbytes
    return {link: v / (m * n) for link, v in total.items()}


def phase_times(messages, m, n, params):
    """{phase: seconds}: its latency and its busiest sender's bytes on its link."""
    p = m * n
    latency = {"split": lower_power_of_two(p) - 1, "allgather": p - 1}   # Gloo's ring allgatherv
    phases = {}
    for phase, src, dst, nbytes in messages:
        if src == dst:
            continue
        sent, crosses = phases.setdefault(phase, ({}, [False]))
        sent[src] = sent.get(src, 0.0) + nbytes
        crosses[0] |= src // n != dst // n
    out = {}
    for phase, (sent, crosses) in phases.items():
        a, b = ((params.alpha_inter, params.beta_inter) if crosses[0]
                else (params.alpha_intra, params.beta_intra))
        out[phase] = latency.get(phase, 1) * a + max(sent.values()) * b
    return out


def cost(algorithm, payload=None):
    """(time, sent_bytes, actual_bytes) for a Collective; payload(d, p, options) -> the schedule's
    payload for the split variants' allgather."""
    def messages(d, m, n, options, union):
        return schedule(algorithm, d, m * n, union, payload and payload(d, m * n, options),
                        value_codec.get(options["value_codec"]).entry_bytes)

    def time(d, m, n, density, params, options):
        k, p = num_selected(density, d), m * n
        msgs = messages(d, m, n, options, expected_union(d, k))
        merged = {}   # {phase: {rank: rows it merges}}; the busiest rank of each phase bounds it
        for phase, _, dst, nbytes in msgs:
            if phase not in ("allgather", "unfold"):
                rows = merged.setdefault(phase, {})
                rows[dst] = rows.get(dst, 0.0) + nbytes / value_codec.get(options["value_codec"]).entry_bytes
        merge_rows = sum(max(rows.values()) for rows in merged.values())
        result = expected_union(d, k)(range(p), 0, d)
        return {"select": alphabeta.select_cost(d, params), "sort": alphabeta.merge_cost(k, params),
                **phase_times(msgs, m, n, params), "merge": alphabeta.merge_cost(merge_rows, params),
                "scatter_add": alphabeta.scatter_add_cost(result, d, params),
                "residual": alphabeta.residual_cost(k, d, params)}

    def sent_bytes(d, m, n, density, options):
        return per_link(messages(d, m, n, options, expected_union(d, num_selected(density, d))), m, n)

    def actual_bytes(index_sets, d, m, n, options):
        return per_link(messages(d, m, n, options, actual_union(index_sets)), m, n)
    return time, sent_bytes, actual_bytes
