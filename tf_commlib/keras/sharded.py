"""The sharded optimizer update (ZeRO stage 1) of DistributedOptimizer(shard_optimizer=True).

With dense or 2dtar aggregation the allreduce is a reduce-scatter followed by an all-gather
(tf_commlib.collectives.interface.Sharding). Sharded, every bucket's flat gradient (fusion.plan's
buckets, padded to a multiple of the world size P) is only reduce-scattered: each rank receives the
average of its slice (the collective's own decomposition: dense, rank r keeps slice r; 2dtar, rank
(node i, local l) keeps slice l*m + i), updates that slice of the weights with a slice-wise form
of the wrapped optimizer, whose state (momentum, Adam moments) exists only for the slice, and the
all-gather then carries weights instead of gradients:

* compression "none": the updated weights of the slice; every rank then holds the bits the owner
  computed (replicas bit-identical);
* "fp16" / "bf16": the 16-bit weight delta w_old - w_new (codec.py's casts), and every rank, the
  owner included, applies w <- w - float(delta): replicas stay bit-identical, the update is exact
  within 16-bit rounding (relative 2^-11 fp16, 2^-8 bf16; fp16 also loses up to 2^-25 absolute
  below its normal range, 6.1e-5).

Bytes: those of the collective's reduce-scatter + all-gather (Collective.sharded_bytes, the same as
its allreduce when a bucket's length is a multiple of P, else its padding of < P entries), plus,
for layer-wise optimizers, one allreduce of (L + 1) * k float32 per step (L variables, k = 2
quantities for LARS and LAMB; the +1 is the padding's dummy layer).

Sharded over a node. Any other schedule (a lossy collective such as hitopk, auto, or a switch of
algorithm, e.g. DAWNBench's hitopk early and 2dtar late) ends with the same aggregated gradient on
every rank of a node, so the update is sharded over the n ranks of a node instead: local rank l
owns the node slice [l*s, (l+1)*s) of each bucket padded to n*s (s = ceil(d/n); the ranks with the
same local index on other nodes compute the same bits), its state is 1/n of the unsharded one, and
the weights are all-gathered over the intra-node link only (16-bit deltas under a group's fp16 /
bf16 compression, as above). A lossy collective runs whole and the rank keeps its node slice
(GradientAggregator.aggregate_deferred(node_slices=True)); dense and 2dtar stop before their
intra-node all-gather (wire.node_reduce: intra reduce-scatter, inter allreduce of the shard), so
they send 2dtar's bytes. The slices do not change with the algorithm: at a schedule switch
nothing moves and no state is lost. The norm exchange is over the node's ranks.

Layer-wise norms: a slice may cut a layer apart. The slice is a sequence of runs, each a piece of
one variable (or the padding), known when the optimizer is built; partial sums of squares per run,
summed per variable, and ONE small allreduce give every rank the exact per-layer norms (up to
summation order). Per-layer values reach the elements as one fill per run (a per-element gather
or segment sum costs 5-7 element-wise passes on CPU).

Slice-wise forms. Keras' SGD, Adam and AdamW get theirs from FORMS below (exact classes). Any other
optimizer may provide one by duck typing (pto.LARS and pto.LAMB do; tf_commlib imports neither):

    optimizer.sharded_build(var_list) -> (slots, k)
        called instead of build(): per-variable constants (exclusions, decay) are set up here, no
        full-size state is created. ``slots``: names of the per-element state it keeps (each a
        vector of this rank's slice, made by tf_commlib); ``k``: how many quantities it takes
        per-layer norms of per step (0: none).
    optimizer.sharded_update(view, learning_rate) -> the new weights of the slice
        ``view`` is a SliceView: ``g`` (the averaged gradient), ``w`` (the weights, after Keras'
        decoupled weight_decay), ``step`` (iterations + 1, as a float), ``slot(name)`` (the state
        variable to read and assign), ``per_layer(values)`` (per-variable values, a list of L or a
        [L + 1] tensor whose last entry is the padding's -> per element), ``layer_norms(*xs)``
        (the exact L2 norm of each x's whole layers, a [L + 1] tensor each; call it once): compute
        per-layer quantities on those small tensors and expand each once with per_layer.

The wrapped optimizer's ``iterations`` advances by one per applied step, its learning rate (a
schedule too) is read before, and Keras' ``weight_decay`` (with exclude_from_weight_decay) is applied
per element as Keras does (w <- w - w * wd * lr, before the step). Constraints are applied to the
whole variables after the all-gather. Not supported with sharding: clipnorm, clipvalue,
global_clipnorm, use_ema, gradient_accumulation_steps (ValueError at construction).
"""
import keras
import numpy as np
import tensorflow as tf

from tf_commlib import internals, link_bytes
from tf_commlib import primitives
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.collectives import codec
from tf_commlib.topology import topology as current_topology


class _SGDForm:
    @staticmethod
    def build(opt, var_list):
        return ("momentum",) if opt.momentum else (), 0

    @staticmethod
    def update(opt, view, learning_rate):
        g, w = view.g, view.w
        lr = tf.cast(learning_rate, w.dtype)
        if not opt.momentum:
            return w - g * lr
        m, momentum = view.slot("momentum"), tf.cast(opt.momentum, w.dtype)
        new = m * momentum - g * lr
        m.assign(new)
        return w + (new * momentum - g * lr) if opt.nesterov else w + new


class _AdamForm:
    @staticmethod
    def build(opt, var_list):
        return ("momentum", "velocity") + (("velocity_hat",) if opt.amsgrad else ()), 0

    @staticmethod
    def update(opt, view, learning_rate):
        g, w = view.g, view.w
        lr = tf.cast(learning_rate, w.dtype)
        beta_1_power = tf.pow(tf.cast(opt.beta_1, w.dtype), view.step)
        beta_2_power = tf.pow(tf.cast(opt.beta_2, w.dtype), view.step)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        m_var, v_var = view.slot("momentum"), view.slot("velocity")
        m = m_var + (g - m_var) * (1 - opt.beta_1)
        v = v_var + (tf.square(g) - v_var) * (1 - opt.beta_2)
        m_var.assign(m)
        v_var.assign(v)
        if opt.amsgrad:
            v = tf.maximum(view.slot("velocity_hat"), v)
            view.slot("velocity_hat").assign(v)
        return w - (m * alpha) / (tf.sqrt(v) + opt.epsilon)


# Keras built-ins with a slice-wise form (exact classes: a subclass may change update_step)
FORMS = {keras.optimizers.SGD: _SGDForm, keras.optimizers.Adam: _AdamForm, keras.optimizers.AdamW: _AdamForm}
SUPPORTED = "keras.optimizers.SGD, Adam, AdamW, pto.LARS, pto.LAMB (or an optimizer with sharded_build/sharded_update)"
_REFUSED = ("clipnorm", "clipvalue", "global_clipnorm", "use_ema", "gradient_accumulation_steps")


def world_sharded(schedule):
    """True where the update is sharded over all P ranks (one dense / 2dtar algorithm for the whole
    run), False where it is sharded over the ranks of a node (lossy collectives, auto, switches)."""
    names = set(schedule.values())
    return len(names) == 1 and "auto" not in names and ALGORITHMS[next(iter(names))].sharding is not None


def check_shardable(optimizer):
    """ValueError unless DistributedOptimizer(optimizer, shard_optimizer=True) can shard its update."""
    if type(optimizer) not in FORMS and not (hasattr(optimizer, "sharded_build") and hasattr(optimizer, "sharded_update")):
        raise ValueError(f"shard_optimizer: {type(optimizer).__name__} has no slice-wise form; supported: {SUPPORTED}")
    for arg in _REFUSED:
        if getattr(optimizer, arg, None):
            raise ValueError(f"shard_optimizer does not support the wrapped optimizer's {arg} "
                             f"(got {getattr(optimizer, arg)!r}); leave it unset")


def _form(optimizer):
    form = FORMS.get(type(optimizer))
    if form is not None:
        return (lambda var_list: form.build(optimizer, var_list),
                lambda view, lr: form.update(optimizer, view, lr))
    return optimizer.sharded_build, optimizer.sharded_update


class SliceView:
    """What a slice-wise form sees (see the module doc). ``runs``: (variable index, length) of the
    slice's consecutive pieces; index L (the number of variables) is the padding."""

    def __init__(self, g, w, step, runs, num_layers, slots, process_set):
        self.g, self.w, self.step = g, w, step
        self._runs, self._num, self._slots, self._set = runs, num_layers, slots, process_set

    def slot(self, name):
        return self._slots[name]

    def per_layer(self, values):
        """values[i] for variable i, per element of the slice (the padding: 0, or a tensor's entry L)."""
        table = values if tf.is_tensor(values) else tf.constant(list(map(float, values)) + [0.0], self.w.dtype)
        table = tf.cast(table, self.w.dtype)
        parts = [tf.fill([n], table[layer]) for layer, n in self._runs]
        if not parts:
            return tf.zeros([0], self.w.dtype)
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]

    def layer_norms(self, *xs):
        """The L2 norm of each x's whole layers, a [L + 1] tensor each: one allreduce of the partial sums."""
        ids, lengths = [layer for layer, _ in self._runs], [n for _, n in self._runs]
        partial = []
        for x in xs:
            runs = tf.split(x, lengths) if len(lengths) > 1 else [x] * len(lengths)
            sums = [tf.reduce_sum(tf.square(run)) for run in runs]
            partial.append(tf.math.unsorted_segment_sum(tf.stack(sums), ids, self._num + 1) if sums
                           else tf.zeros([self._num + 1], x.dtype))
        # named: Horovod would name it after its input, whose graph name differs by rank (a rank's
        # slice touches its own number of variables, so its trace has its own number of ops)
        total = tf.reshape(tf.stack(partial, 1), [-1])
        if self._set.size() > 1:
            total = primitives.allreduce(total, self._set, name="sharded_layer_norms")
        norms = tf.sqrt(tf.reshape(total, [self._num + 1, len(xs)]))
        return [norms[:, j] for j in range(len(xs))]


def _runs(ids):
    """[(id, length)] of the consecutive equal entries of ids."""
    if not len(ids):
        return []
    starts = np.flatnonzero(np.diff(ids)) + 1
    bounds = np.concatenate([[0], starts, [len(ids)]])
    return [(int(ids[a]), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:])]


class ShardedUpdate:
    """The slices this rank owns in every bucket of every group, their state, and the step."""

    def __init__(self, owner, var_list, groups):
        self.owner, self.inner, self.topo = owner, owner.inner_optimizer, current_topology()
        self.var_list, self.groups = list(var_list), groups
        self.world = world_sharded(owner.schedule)
        # the ranks whose slices make up the whole: all of them, or the ranks of this node
        self.owners = self.topo.world if self.world else self.topo.intra
        self._index = {id(g.aggregator): g.indices for g in groups}
        build, self._update = _form(self.inner)
        dtypes = {v.dtype for v in var_list}
        if len(dtypes) != 1:
            raise ValueError(f"shard_optimizer needs one dtype for all variables, got {sorted(map(str, dtypes))}")
        self.dtype = tf.as_dtype(dtypes.pop())
        # per (group, bucket): (aggregator, bucket, padded, start, length)
        self.pieces, layer = [], []
        for group in groups:
            agg, halves = group.aggregator, group.aggregator.sharded
            for bucket, (dp, start, s) in zip(agg.buckets, halves.shard_slices() if self.world
                                              else halves.node_slices_layout()):
                ids = np.repeat([group.indices[p] for p in bucket.positions], bucket.sizes).astype(np.int32)
                ids = np.concatenate([ids, np.full(dp - len(ids), len(var_list), np.int32)])
                layer.append(ids[start:start + s])
                self.pieces.append((agg, bucket, dp, start, s))
        self.size = int(sum(p[4] for p in self.pieces))
        self.runs = _runs(np.concatenate(layer) if layer else np.zeros([0], np.int32))
        slots, self.norms = build(self.var_list)
        keras.optimizers.Optimizer.build(self.inner, self.var_list)   # its iterations, no per-variable state
        decay = self.inner.weight_decay
        self.decays = [float(decay) if decay and internals.uses_weight_decay(self.inner, v) else 0.0 for v in var_list]
        with tf.init_scope():
            self.slots = {name: owner.add_variable(shape=[self.size], initializer="zeros", dtype=self.dtype.name,
                                                   aggregation="none", name=f"shard_{name}") for name in slots}
            # (m, n, rank, slice length, 1 over all ranks / 0 over a node's): checked when a
            # checkpoint is loaded (check_layout)
            self.layout = owner.add_variable(shape=[5], initializer="zeros", dtype="int64", aggregation="none",
                                             name="shard_layout")
            self.layout.assign(self.expected_layout())   # eagerly: build may run inside a trace

    def expected_layout(self):
        return np.array([self.topo.m, self.topo.n, self.topo.rank, self.size, int(self.world)], np.int64)

    def check_layout(self):
        """ValueError unless the state holds this rank's slices on this layout (after a load)."""
        got = np.asarray(self.layout.numpy() if hasattr(self.layout, "numpy") else self.layout)
        want = self.expected_layout()
        if not np.array_equal(got, want):
            over = ["a node's ranks", "all ranks"]
            raise ValueError(
                f"the sharded optimizer state was saved by rank {got[2]} of a {got[0]}x{got[1]} layout "
                f"(slice of {got[3]} entries, sharded over {over[int(got[4]) > 0]}); this is rank {want[2]} "
                f"of {want[0]}x{want[1]} (slice of {want[3]}, over {over[int(want[4])]}): shard_optimizer "
                "state loads only into the same world size, layout and schedule kind, rank by rank")

    def reset(self):
        for var in self.slots.values():
            var.assign(tf.zeros(var.shape, var.dtype))

    def full_state(self):
        """Every slot whole, as an unsharded optimizer keeps it: {name: [numpy array of each variable's
        shape, in var_list order]}, from the slices of the ranks that own them (an all-gather over
        them of the slots and of where each rank's slices start). A collective over those ranks;
        load_full_state gives it to another layout's slices (tf_commlib.elastic keeps it so)."""
        starts = tf.constant([[start for *_, start, _ in self.pieces]], tf.int64)
        every_start = primitives.allgather(starts, self.owners, name="sharded_state_starts").numpy()
        out = {}
        for name, var in sorted(self.slots.items()):
            every = primitives.allgather(tf.reshape(tf.convert_to_tensor(var), [1, -1]), self.owners,
                                         name=f"sharded_state_{name}").numpy()
            flats, offset = {}, 0
            for k, (agg, bucket, dp, _, s) in enumerate(self.pieces):
                flat = flats.setdefault((id(agg), id(bucket)), np.zeros(dp, every.dtype))
                for o in range(every.shape[0]):
                    flat[every_start[o, k]:every_start[o, k] + s] = every[o, offset:offset + s]
                offset += s
            whole = [None] * len(self.var_list)
            for agg, bucket, *_ in self.pieces:
                flat, at = flats[(id(agg), id(bucket))], 0
                for p, size, shape in zip(bucket.positions, bucket.sizes, bucket.shapes):
                    whole[self._index[id(agg)][p]] = flat[at:at + size].reshape(shape)
                    at += size
            out[name] = whole
        return out

    def load_full_state(self, state):
        """This rank's slices of ``state`` (full_state's form, from any layout) into its slots."""
        if sorted(state) != sorted(self.slots):
            raise ValueError(f"the state holds slots {sorted(state)}, this sharded update keeps {sorted(self.slots)}")
        for name, var in self.slots.items():
            whole = state[name]
            if len(whole) != len(self.var_list) or any(tuple(np.shape(a)) != tuple(v.shape)
                                                       for a, v in zip(whole, self.var_list)):
                raise ValueError(f"the state's {name!r} does not hold this optimizer's {len(self.var_list)} "
                                 "variables in their shapes")
            parts = []
            for agg, bucket, dp, start, s in self.pieces:
                flat = np.zeros(dp, var.dtype.name if hasattr(var.dtype, "name") else var.dtype)
                at = 0
                for p, size in zip(bucket.positions, bucket.sizes):
                    flat[at:at + size] = np.ravel(whole[self._index[id(agg)][p]])
                    at += size
                parts.append(flat[start:start + s])
            var.assign(np.concatenate(parts) if parts else np.zeros([0]))
        self.layout.assign(self.expected_layout())   # the slices are this rank's of this layout

    def norm_bytes(self):
        """{"intra": B, "inter": B} per rank of the norm exchange (one allreduce per step)."""
        nbytes = 4 * (len(self.var_list) + 1) * self.norms
        if not self.norms or self.owners.size() == 1:
            return {link: 0.0 for link in link_bytes.LINKS}
        return link_bytes.per_rank("allreduce", nbytes, "world" if self.world else "intra", self.topo.m, self.topo.n)

    def sent_bytes(self, algorithm=None, density=None):
        """Bytes per rank of a step: the halves (world) or the node slices and the intra-node
        all-gather of the weights (node; ``algorithm``, ``density``: the sparse groups' now)."""
        if self.world:
            return link_bytes.add(*(g.aggregator.sharded.sharded_bytes() for g in self.groups), self.norm_bytes())
        out = [self.norm_bytes()]
        for group in self.groups:
            halves = group.aggregator.sharded
            out.append(halves.node_sliced_bytes(algorithm if group.lossy else None, density if group.lossy else None))
            delta_codec = self._codec(group.aggregator)
            for _, _, s in halves.node_slices_layout():   # the weights' all-gather inside the node
                out.append(link_bytes.per_rank("allgather", delta_codec.bytes(s), "intra", self.topo.m, self.topo.n))
        return link_bytes.add(*out)

    def state_bytes(self):
        """Bytes of this rank's optimizer state (the slots)."""
        return sum(self.size * self.dtype.size for _ in self.slots)

    def unsharded_state_bytes(self):
        """Bytes the same state takes unsharded (every slot for every weight)."""
        return len(self.slots) * sum(int(np.prod(v.shape)) for v in self.var_list) * self.dtype.size

    # -- the step --------------------------------------------------------------------------
    def _weights(self, agg, bucket, start, s):
        """This rank's slice [start, start + s) of the bucket's flat weights (zeros on the padding)."""
        parts, offset = [], 0
        for p, size in zip(bucket.positions, bucket.sizes):
            lo, hi = max(start, offset), min(start + s, offset + size)
            if lo < hi:
                var = self.var_list[self._index[id(agg)][p]]
                parts.append(tf.reshape(tf.convert_to_tensor(var), [-1])[lo - offset:hi - offset])
            offset += size
        pad = start + s - max(start, offset)
        if pad > 0:
            parts.append(tf.zeros([pad], self.dtype))
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]

    def reduce_scatter(self, send):
        """(every bucket's averaged slice, in group/bucket order; commit; {variable index: int64
        indices of it sent sparsely} for the sparse groups' momentum masking)."""
        pieces, commits, sent = [], [], {}
        for group in self.groups:
            agg, idx = group.aggregator, group.indices
            if self.world:
                got, commit = agg.sharded.reduce_scatter_deferred([send[i] for i in idx], step=self.inner.iterations)
            else:
                got, where, commit = agg.aggregate_deferred([send[i] for i in idx], step=self.inner.iterations,
                                                            sent="indices", node_slices=True)
                if group.lossy:
                    sent.update((i, w) for i, w in zip(idx, where) if w is not None)
            pieces += got
            commits.append(commit)
        return pieces, lambda: [c() for c in commits], sent

    def step(self, pieces):
        """The slice-wise update of the rank's slices, the all-gather, the weights written."""
        lr = self.inner.learning_rate
        g = tf.cast(tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0], self.dtype)
        w_old = tf.concat([self._weights(agg, b, start, s) for agg, b, _, start, s in self.pieces], 0)
        w = w_old
        view = SliceView(g, w, tf.cast(self.inner.iterations + 1, self.dtype), self.runs, len(self.var_list),
                         self.slots, self.owners)
        if any(self.decays):   # Keras' decoupled weight decay, before the step
            view.w = w = w - w * view.per_layer(self.decays) * tf.cast(lr, self.dtype)
        new = tf.convert_to_tensor(self._update(view, lr))
        sizes = [s for *_, s in self.pieces]
        new_parts = iter(tf.split(new, sizes) if len(sizes) > 1 else [new])
        old_parts = iter(tf.split(w_old, sizes) if len(sizes) > 1 else [w_old])
        for g, group in enumerate(self.groups):
            agg, idx = group.aggregator, group.indices
            delta_codec, send = self._codec(agg), []
            for _ in agg.buckets:   # the weights, or the 16-bit deltas w_old - w_new
                old, piece = next(old_parts), next(new_parts)
                send.append(piece if delta_codec.exact else delta_codec.encode(old - piece))
            # named: a rank's slices hold their own number of runs, so its graph has its own ops
            gathered = (agg.sharded.all_gather if self.world else agg.sharded.node_all_gather)(send, f"sharded_gather_{g}")
            for bucket, flat in zip(agg.buckets, gathered):
                for p, part, shape in zip(bucket.positions, tf.split(flat, bucket.sizes), bucket.shapes):
                    var = self.var_list[idx[p]]
                    value = tf.reshape(part, shape)
                    var.assign(value if delta_codec.exact else
                               tf.convert_to_tensor(var) - delta_codec.decode(value, None, self.dtype))
                    if getattr(var, "constraint", None) is not None:
                        var.assign(var.constraint(var))
        self.inner.iterations.assign_add(1)

    def _codec(self, agg):
        """What the all-gather carries: the weights, or with a 16-bit ``compression`` of the group's
        dense / 2dtar (every candidate) the weight deltas in 16 bits."""
        names = {agg.algorithm_options.get(c, {}).get("compression", "none") if c in ALGORITHMS and
                 ALGORITHMS[c].sharding is not None else "none" for c in agg.candidates}
        return codec.get(names.pop() if len(names) == 1 else "none")
