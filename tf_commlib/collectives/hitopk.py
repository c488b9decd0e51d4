"""HiTopKComm (shi2021 Alg. 2): intra-node reduce-scatter, top-k of the own shard, allgather of
values and indices among the ranks with the same local index (one per node), then the node's
ranks exchange what they gathered and scatter-add it.

Step 4 gathers the sparse shards (m·k values and indices per rank, the volume of eq. (10)) while
that is fewer bytes than the dense d/n shard, i.e. while 2·m·density < 1; above it, each rank
scatter-adds its shard and the dense shards are gathered. Both give the same bits; the option
step4 ("auto", "sparse" or "dense") forces one. The option value_codec ("none", "fp16" or "mean",
value_codec.py) sets how steps 3 and 4 carry the values: the rank quantises its selection (the
loss stays in its residual) and step 4 forwards what step 3 decoded (for "mean", one header per
node's part), so every codec gives the same bits in both step 4s, with bytes per entry of the codec
(the auto break-even becomes entry_bytes·m·density < 4).
"""
import math

import tensorflow as tf

from tf_commlib import alphabeta
from tf_commlib import link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import value_codec
from tf_commlib.collectives.count import num_selected
from tf_commlib.collectives.error_feedback import unsent
from tf_commlib.collectives.interface import Collective
from tf_commlib.ops import scatter_add


STEP4 = ("auto", "sparse", "dense")


def shard_size(d, n):
    return math.ceil(d / n)


def real_size(d, n, local):
    """Entries of x in shard `local` (the last shards may be short or empty)."""
    s = shard_size(d, n)
    return max(0, min(s, d - local * s))


def state_size(d, topo, options=None):
    return shard_size(d, topo.n)


def residual_to_input(residual, d, topo):
    """The shard's residual at its place in a length-d input (the node sums it back up)."""
    s = shard_size(d, topo.n)
    return tf.pad(residual, [[topo.local * s, (topo.n - 1 - topo.local) * s]])[:d]


def input_to_residual(x, d, topo, residual):
    """This rank's shard of what the node's ranks owe (a reduce-scatter over the node)."""
    return reduce_shard(x, topo)


def pad_cost(d, n, params):
    """tf.pad copies x when n does not divide d (with no padding it forwards x)."""
    return alphabeta.copy_cost(n * shard_size(d, n), params) if n * shard_size(d, n) > d else 0.0


def reduce_shard(x, topo):
    """Step 1: this rank's shard (length ceil(d/n)) of the node's sum; x is padded to n shards."""
    d, s = x.shape[0], shard_size(x.shape[0], topo.n)
    return primitives.reducescatter(tf.pad(x, [[0, topo.n * s - d]]), topo.intra)


def select_shard(shard, d, topo, density, select):
    """Step 2: top-k of the shard with k = density·d/n; the padding is never selected."""
    real = real_size(d, topo.n, topo.local)
    if real == 0:
        return tf.zeros([0], shard.dtype), tf.zeros([0], tf.int32)
    return select(shard[:real], num_selected(density, d / topo.n))


def inter_gather(values, indices, topo, codec="none"):
    """Step 3: what the ranks of this local index selected on every node, in node order:
    (values, indices, part) as SparseCodec.allgather (values must be quantised for the codec)."""
    return value_codec.get(codec).allgather(values, indices, topo.inter)


def sparse_step4(density, m, step4="auto", codec="none"):
    """True (a bool or a bool tensor) when step 4 sends the sparse shards: forced by step4, or while
    m·k entries of the codec cost fewer bytes than the dense shard (2·m·density < 1 for "none")."""
    if step4 != "auto":
        return step4 == "sparse"
    per_entry = value_codec.get(codec).entry_bytes / alphabeta.BYTES
    if tf.is_tensor(density):
        return tf.less(per_entry * m * tf.cast(density, tf.float64), 1.0)
    return per_entry * m * density < 1


def _branch(pred, if_true, if_false):
    """tf.cond for a bool tensor (every rank takes the same branch); a Python bool picks at once."""
    if isinstance(pred, bool):
        return if_true() if pred else if_false()
    return tf.cond(pred, if_true, if_false)


def intra_gather(gathered, indices, d, topo, density, step4="auto", codec="none"):
    """Step 4: the node's ranks exchange their gathered shards -> (sum over all ranks, sent), sent
    being the indices of x that this node's ranks selected."""
    s = shard_size(d, topo.n)
    values, node_indices, part = gathered
    offset = tf.cast(topo.local * s, indices.dtype)

    def sparse():   # every rank's gathered entries, moved to their place in x, summed into d
        all_values, all_indices, _ = value_codec.get(codec).allgather(values, node_indices + offset, topo.intra,
                                                            part, topo.m)
        return scatter_add(all_indices, all_values, d)

    def dense():    # the shard's sum, then an allgather of the dense shards
        return primitives.allgather(scatter_add(node_indices, values, s), topo.intra)[:d]

    aggregated = _branch(sparse_step4(density, topo.m, step4, codec), sparse, dense)
    return aggregated, primitives.allgather(indices + offset, topo.intra)


def hitopk(x, topo, density, select, residual=None, ctx=None):
    """Sparse hierarchical sum over all ranks of the flat tensor x (static length d).

    The residual (error feedback) lives on this rank's shard after the reduce-scatter; returns
    (aggregated, new residual, sent), sent being the indices of x that this rank's node sent.
    """
    options = (ctx or COLLECTIVE.context()).options
    step4, codec = options["step4"], value_codec.get(options["value_codec"])
    d = x.shape[0]
    shard = reduce_shard(x, topo)
    if residual is not None:
        shard = shard + residual
    values, indices = select_shard(shard, d, topo, density, select)
    values = codec.quantise(values)
    aggregated, sent = intra_gather(inter_gather(values, indices, topo, codec), indices, d, topo,
                                    density, step4, codec)
    return aggregated, unsent(shard, values, indices), sent


def time(d, m, n, density, params, options):
    """the pad of x to n shards + eq. (7) + eq. (8) selection on d/n + eq. (9) (8 bytes per entry, the n streams share the
    node's link) + eq. (10) (sparse shards and a scatter-add into d, or dense shards, plus the k
    sent indices) + error feedback."""
    s, k = shard_size(d, n), num_selected(density, d / n)
    a, b = params.alpha_intra, params.beta_intra
    codec = value_codec.get(options["value_codec"])
    sent = alphabeta.allgather(alphabeta.BYTES * k, n, a, b)
    if sparse_step4(density, m, options["step4"], codec):
        step4 = alphabeta.allgather(codec.bytes(m * k, m), n, a, b) + alphabeta.scatter_add_cost(n * m * k, d, params)
    else:
        step4 = alphabeta.scatter_add_cost(m * k, s, params) + alphabeta.allgather(alphabeta.BYTES * s, n, a, b)
    return {
        "reducescatter": pad_cost(d, n, params) + alphabeta.reducescatter(alphabeta.BYTES * n * s, n, a, b),
        "select": alphabeta.select_cost(s, params),
        "inter_allgather": alphabeta.allgather(codec.bytes(k) * n, m, params.alpha_inter, params.beta_inter),
        "intra_allgather": step4 + sent,
        "residual": alphabeta.residual_cost(k, s, params),
    }


def sent_bytes(d, m, n, density, options):
    """Steps 1, 3, 4 and the sent indices, averaged over the shards (short shards select fewer)."""
    s, k = shard_size(d, n), num_selected(density, d / n)
    codec = value_codec.get(options["value_codec"])
    sparse4 = sparse_step4(density, m, options["step4"], codec)
    total = {link: 0.0 for link in link_bytes.LINKS}
    for local in range(n):
        kj = min(k, real_size(d, n, local))
        shard = link_bytes.add(link_bytes.per_rank("reducescatter", alphabeta.BYTES * n * s, "intra", m, n),
                      link_bytes.per_rank("allgather", codec.bytes(kj), "inter", m, n),
                      link_bytes.per_rank("allgather", codec.bytes(m * kj, m) if sparse4 else alphabeta.BYTES * s,
                                 "intra", m, n),
                      link_bytes.per_rank("allgather", alphabeta.BYTES * kj, "intra", m, n))
        total = link_bytes.add(total, {link: v / n for link, v in shard.items()})
    return total


def check_options(options):
    if options["step4"] not in STEP4:
        raise ValueError(f"algorithm_options['hitopk']['step4'] must be one of {STEP4}, got {options['step4']!r}")
    value_codec.check(options["value_codec"], "hitopk")


REFERENCE = "shard_topk"   # the top-k of each shard (tests/test_collectives.py's references)

COLLECTIVE = Collective("hitopk", hitopk, time, sent_bytes, lossy=True, state_size=state_size,
                        residual_to_input=residual_to_input, input_to_residual=input_to_residual,
                        options={"step4": "auto", "value_codec": "none"},
                        check_options=check_options, auto_candidate=True)
