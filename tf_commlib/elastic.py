"""Elastic training on Horovod's elastic driver (``horovodrun --min-np --max-np --host-discovery-script``,
Gloo): where a node is lost, the surviving ranks roll back to their last commit and go on as a smaller
job; where the discovery script lists a node again, its ranks join at the next commit.

``State`` holds what a rank needs to go on, in this process's memory: the values of a model's weights and
of every optimizer variable (residuals, DGC momentum, DiLoCo's start weights and outer state, the wrapped
optimizer's slots) as of the last ``commit()``, and JSON values the training loop keeps in it (the epoch,
the position in it). ``run(train)`` calls ``train(state)``; where a collective fails because a rank is
gone (Horovod's HorovodInternalError) the state returns to its last commit; where the hosts change
(HostsUpdatedInterrupt at a commit) it stays. Either way Horovod is started again on the ranks now alive,
tf_commlib.init() makes the layout and its process sets anew from the live hosts (tf_commlib.topology), every
rank takes the state of the rank that committed last, and ``train(state)`` is called again: it builds its
model and optimizer for the new layout (the buckets, residuals and collectives depend on it) and
``state.bind`` loads the committed values into them.

A reset keeps the values every rank holds alike (weights, the wrapped optimizer's state, the step count)
and a sharded update's state, which a commit gathers whole from the ranks' slices and a rank of any layout
takes its slices of. Per-rank state stays with its rank: a commit also keeps, in this process only, what
the rank owes the sum (its error-feedback residuals in input space, per variable: the same on any layout)
and DGC's momentum (DistributedOptimizer.rank_state); a rank that lived through the reset loads its own
into the new layout's residuals (load_rank_state: hitopk's are shards of the node's sum, so the node's
ranks reduce-scatter what they owe), a rank that joined owes nothing. What a lost rank owed is lost with
it, as are the steps since the commit. ``auto`` measures its link and makes its choice again on the new
layout, from what it measured that holds there (DistributedOptimizer.auto_measurements: the compute per
step, a trace's cost, each lossy candidate's efficiency, an epoch's steps). Objects between ranks go as
JSON, never pickled.
"""
import json
import time

import numpy as np
import tensorflow as tf

from horovod.common.elastic import State as HorovodState

from tf_commlib import costmodel, replicas, shm
from tf_commlib.topology import elastic_job, init as init_topology, topology as current_topology

is_elastic = elastic_job   # whether this process is a rank of an elastic horovodrun job


def broadcast_json(obj, root_rank=0, name="tf_commlib_elastic_json"):
    """``obj`` (JSON values) of root_rank, on every rank: its length, then its UTF-8 bytes, as tensors. A
    collective on every rank of the job."""
    import horovod.tensorflow as hvd

    data = np.frombuffer(json.dumps(obj).encode(), np.uint8) if hvd.rank() == root_rank else np.zeros(0, np.uint8)
    length = int(hvd.broadcast(tf.constant([data.size], tf.int64), root_rank, name=name + "_len").numpy()[0])
    buffer = data if data.size == length else np.zeros(length, np.uint8)
    sent = hvd.broadcast(tf.constant(buffer), root_rank, name=name).numpy()
    return json.loads(sent.tobytes().decode())


def _broadcast_host_update(update):
    """Horovod's State broadcasts (previous timestamp, last timestamp, HostUpdateResult) at each commit:
    sent as JSON numbers."""
    from horovod.runner.elastic.worker import HostUpdateResult

    prev, last, result = broadcast_json([update[0], update[1], int(update[2])], name="tf_commlib_elastic_hosts")
    return prev, last, HostUpdateResult(result)


class State(HorovodState):
    """What a rank needs to go on after a reset: ``state[key]`` JSON values (given as keywords, e.g.
    epoch=0, offset=0) and, once ``bind`` was called, the committed values of a model's weights and of its
    optimizer's variables. ``commit()`` keeps them in memory (a copy of every variable: commit every few
    steps, not every step, where they are large) and raises HostsUpdatedInterrupt on every rank alike
    where the discovery script changed the hosts."""

    def __init__(self, **values):
        json.dumps(values)   # TypeError naming what is not JSON
        super().__init__(bcast_object=_broadcast_host_update, get_rank=lambda: current_topology().rank)
        self.values, self.commits = dict(values), 0
        self._saved_values, self._saved_arrays = dict(values), None   # the last commit
        self._saved_sharded = None   # a sharded update's state whole ({slot: arrays}), of the last commit
        self._saved_rank = None   # this rank's own per-rank state of the last commit (never sent)
        self._saved_auto = None   # what "auto" measured that holds on any layout (JSON), of the last commit
        self._shared_at = []   # where in its optimizer arrays the wrapped plain optimizer's variables are
        self.model = self.optimizer = None

    def __getitem__(self, key):
        return self.values[key]

    def __setitem__(self, key, value):
        json.dumps(value)
        self.values[key] = value

    def _bound_variables(self):
        model = list(self.model.weights) if self.model is not None else []
        optimizer = list(self.optimizer.variables) if self.optimizer is not None else []
        return model, optimizer

    def bind(self, model, optimizer=None):
        """Takes ``model`` (its weights) and ``optimizer`` (default model.optimizer; built on the model's
        trainable variables where it is not, as its first step would) into the state: where a commit exists
        (after a reset, or one synced from a live rank), their variables get its values, else every rank
        takes rank 0's and commits them. A collective."""
        import keras

        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built:   # as its first apply builds it
            if hasattr(optimizer, "measure"):   # a DistributedOptimizer's "auto": the link (a collective)
                optimizer.measure(model.trainable_variables)
            with keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(model.trainable_variables)
        self.model, self.optimizer = model, optimizer
        if self._saved_arrays is None:   # the first start: every rank from rank 0's weights and state
            model_vars, optimizer_vars = self._bound_variables()
            replicas.broadcast_variables(model_vars + optimizer_vars)
            self.save()
        else:
            self._load()

    def _load(self):
        model_arrays, optimizer_arrays = self._saved_arrays
        model_vars, optimizer_vars = self._bound_variables()
        _assign(model_vars, model_arrays, "the model's weights")
        if optimizer_vars and len(optimizer_vars) == len(optimizer_arrays):
            # the same variables, those of a layout's shapes (residuals, a sharded update's slices) aside:
            # per-rank state and the slices come next, from this rank's own and the whole state
            alike = [(v, a) for v, a in zip(optimizer_vars, optimizer_arrays) if tuple(v.shape) == a.shape]
            _assign([v for v, _ in alike], [a for _, a in alike], "the optimizer's variables")
        elif optimizer_vars:   # other buckets: the wrapped optimizer's variables, found where the commit listed them
            _assign(list(optimizer_chain(self.optimizer)[-1].variables), [optimizer_arrays[i] for i in self._shared_at],
                    "the wrapped optimizer's variables")
        owner = self._distributed()
        if owner is not None:   # a DistributedOptimizer (also inside a LossScaleOptimizer) or DiLoCo
            dropped = owner.load_rank_state(self._saved_rank)   # every rank: a collective over each node
            if dropped and current_topology().rank == 0:
                print(f"tf_commlib elastic: rank 0 dropped what {dropped} of its variables (or DiLoCo slices) owed: "
                      "no lossy collective runs them on this layout (or the slice moved)", flush=True)
            if self._saved_sharded is not None:   # this rank's slices on this layout
                owner.load_sharded_full_state(self._saved_sharded)
            if self._saved_auto is not None:   # a DistributedOptimizer's "auto"
                owner.load_auto_measurements(self._saved_auto)

    def _distributed(self):
        return next((o for o in optimizer_chain(self.optimizer) if hasattr(o, "load_rank_state")), None)

    def save(self):
        """Keeps the bound variables' values and the JSON values as the last commit: all of it or, where
        its collective fails (a rank lost), none (the commit before stays whole)."""
        owner = self._distributed()
        sharded = _sharded_state(owner)   # a sharded update's slices, gathered whole (a collective)
        rank = owner.rank_state() if owner is not None else None
        model_vars, optimizer_vars = self._bound_variables()
        arrays = ([np.asarray(v.numpy()) for v in model_vars], [np.asarray(v.numpy()) for v in optimizer_vars])
        chain = optimizer_chain(self.optimizer)
        shared = {id(v) for v in chain[-1].variables} if len(chain) > 1 else set()
        self._saved_arrays, self._saved_sharded, self._saved_rank = arrays, sharded, rank
        self._shared_at = [i for i, v in enumerate(optimizer_vars) if id(v) in shared]
        self._saved_auto = owner.auto_measurements() if hasattr(owner, "auto_measurements") else None
        self._saved_values = json.loads(json.dumps(self.values))
        self.commits += 1

    def restore(self):
        """Back to the last commit's JSON values (train() binds its variables to it again after the reset)."""
        self.values = json.loads(json.dumps(self._saved_values))

    def sync(self):
        """Every rank takes the last commit of the rank that committed most (the lowest such rank): the
        JSON values, then the variables' values, one broadcast per dtype. A rank keeps its own per-rank
        state where that commit is also its own."""
        import horovod.tensorflow as hvd

        commits = hvd.allgather(tf.constant([self.commits], tf.int64), name="tf_commlib_elastic_commits").numpy()
        root = int(np.argmax(commits))
        if self.commits != commits[root]:   # joined, or missed the last commit: it owes nothing
            self._saved_rank = None
        header = None
        sharded = [a for _, whole in sorted((self._saved_sharded or {}).items()) for a in whole]
        if hvd.rank() == root:
            arrays = (self._saved_arrays or ([], [])) + (sharded,)
            header = {"values": self._saved_values, "commits": self.commits, "shared_at": self._shared_at,
                      "arrays": [[[list(a.shape), a.dtype.name] for a in part] for part in arrays],
                      "bound": self._saved_arrays is not None, "auto": self._saved_auto,
                      "sharded": None if self._saved_sharded is None else [
                          [k, len(w)] for k, w in sorted(self._saved_sharded.items())]}
        header = broadcast_json(header, root, name="tf_commlib_elastic_header")
        specs = [spec for part in header["arrays"] for spec in part]
        mine = None
        if hvd.rank() == root:
            mine = [a for part in (self._saved_arrays or ([], [])) for a in part] + sharded
        got = iter(_broadcast_arrays(mine, specs, root))
        model, optimizer = ([next(got) for _ in part] for part in header["arrays"][:2])
        self._saved_arrays = (model, optimizer) if header["bound"] else None
        self._saved_sharded = None if header["sharded"] is None else {
            name: [next(got) for _ in range(count)] for name, count in header["sharded"]}
        self._saved_values, self.commits, self._shared_at = header["values"], header["commits"], header["shared_at"]
        self._saved_auto = header["auto"]
        self.values = json.loads(json.dumps(self._saved_values))

    def reset(self):
        """The ranks changed: the bound model and optimizer belong to the old layout (train() binds new ones)."""
        self.model = self.optimizer = None


def _sharded_state(owner):
    """A DistributedOptimizer's sharded update's state whole (a collective), or None (none, or no
    sharded update)."""
    gather = getattr(owner, "sharded_full_state", None)
    return gather() if gather is not None else None


def optimizer_chain(optimizer):
    """optimizer and the optimizers it wraps (inner_optimizer), outermost first; [] for None. The last
    is the user's optimizer: its learning-rate schedule counts its steps."""
    chain = []
    while optimizer is not None:
        chain.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return chain


def _broadcast_arrays(arrays, specs, root):
    """``arrays`` of root_rank (None on the others) of the given [shape, dtype name] each, on every rank:
    one broadcast per dtype (a ResNet-50's thousand variables one by one would cost seconds)."""
    import horovod.tensorflow as hvd

    out, by_dtype = [None] * len(specs), {}
    for i, (_, dtype) in enumerate(specs):
        by_dtype.setdefault(dtype, []).append(i)
    for dtype, idx in sorted(by_dtype.items()):
        sizes = [int(np.prod(specs[i][0], dtype=np.int64)) for i in idx]
        wire = np.uint8 if dtype == "bool" else dtype   # Horovod sends no bool
        flat = (np.concatenate([np.asarray(arrays[i]).astype(wire).ravel() for i in idx]) if arrays is not None
                else np.zeros(sum(sizes), wire))
        got = hvd.broadcast(tf.constant(flat), root, name=f"tf_commlib_elastic_{dtype}").numpy().astype(dtype)
        for i, part in zip(idx, np.split(got, np.cumsum(sizes)[:-1])):
            out[i] = part.reshape(specs[i][0])
    return out


def _assign(variables, arrays, what):
    if len(variables) != len(arrays) or any(tuple(v.shape) != a.shape for v, a in zip(variables, arrays)):
        raise ValueError(f"{what} do not match the state's commit: {len(variables)} variables of shapes "
                         f"{[tuple(v.shape) for v in variables][:8]}... against {len(arrays)} of "
                         f"{[a.shape for a in arrays][:8]}...: bind a model and optimizer built as before")
    for v, a in zip(variables, arrays):
        v.assign(a)


def _failed_collective(error):
    """Whether a TensorFlow error is a Horovod collective that failed because a rank is gone."""
    text = str(error)
    return any(word in text for word in ("Horovod", "horovod", "Gloo", "gloo"))


def reinit():
    """Horovod started again on the ranks now alive and tf_commlib's layout made anew (its process sets,
    and the shared-memory links and host hashes of the old ones forgotten)."""
    import horovod.tensorflow as hvd

    start = time.monotonic()
    hvd.shutdown()
    shm.forget()
    costmodel.forget_hosts()
    topo = init_topology(pin_gpu=False)
    if topo.rank == 0:
        print(f"tf_commlib elastic: {topo.size} ranks as {topo.m}x{topo.n} after a reset (Horovod started again "
              f"in {time.monotonic() - start:.1f} s)", flush=True)


def run(train):
    """``train(state, ...)`` run elastically (Horovod's elastic run loop, with reinit as its reset): it
    returns what train returns once train ends on every live rank. Outside an elastic horovodrun job it
    is train itself (a lost rank then ends the job, as without it). train must build its model and
    optimizer and call state.bind before its first collective."""
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    def wrapper(state, *args, **kwargs):
        try:
            return train(state, *args, **kwargs)
        except (HorovodInternalError, HostsUpdatedInterrupt):   # Horovod's own (RuntimeErrors too)
            raise
        except (tf.errors.OpError, RuntimeError) as e:   # RuntimeError: DiLoCo's exchange on its thread
            if _failed_collective(e):
                raise HorovodInternalError(e) from e
            raise

    elastic = run_fn(wrapper, reinit)

    def chosen(state, *args, **kwargs):
        if not isinstance(state, State):
            raise ValueError(f"state must be a tf_commlib.elastic.State, got {state!r}")
        return (elastic if is_elastic() else train)(state, *args, **kwargs)

    return chosen
