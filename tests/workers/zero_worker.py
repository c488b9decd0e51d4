"""DistributedOptimizer(shard_optimizer=True) under horovodrun (tests/test_zero.py); argv: one job
(tests/test_zero.py runs several in one launch through tests/workers/sequence_worker.py).

``exact <algorithm> [kinds]``: SGD-momentum, Adam, AdamW, pto.LARS and pto.LAMB, with and without
DGC momentum correction, sharded and unsharded, on pto_reference.ZERO_SHAPES (variables that
straddle the slices; the job's first case in a tf.function, the others eagerly): the weights after
STEPS steps, their sha256, the optimizer-state bytes, the bytes counted against the formula.
``sparse <kinds>``: the same across a hitopk -> 2dtar switch, sharded over a node's ranks.
``compression``: one step of sharded LARS with fp16 / bf16 (16-bit weight deltas) on gradients that
are exact in 16 bits, and three steps for the sha256. ``fit <backup> <schedule>``: model.fit
interrupted and resumed from BackupAndRestore; ``load_elsewhere <backup>``: resuming from another
layout's backups; ``full_state``: the sharded state gathered whole and given to another slicing."""
import hashlib
import sys

import keras
import numpy as np
import tensorflow as tf

import pto
import tf_commlib
from tests import pto_reference as ref
from tests.workers._report import report
from tf_commlib import link_bytes
from tf_commlib.keras import DGC, Selection, DistributedOptimizer

topo = tf_commlib.init()
STEPS = 3
NAMES = ["w0", "bias0", "bias1", "w1", "bias2", "w2"]
DECAYED = [not n.startswith("bias") for n in NAMES]


def digest(values):
    return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest()


def make(kind, correction):
    if kind == "sgd":
        return keras.optimizers.SGD(0.1, momentum=0.9, nesterov=not correction)
    if kind == "adam":
        return keras.optimizers.Adam(0.01)
    if kind == "adamw":
        opt = keras.optimizers.AdamW(0.01, weight_decay=0.05)
        opt.exclude_from_weight_decay(var_names=["bias"])
        return opt
    if kind == "lars":
        return pto.LARS(0.5, momentum=0.9, weight_decay_rate=0.01, eeta=0.01, exclude_from_weight_decay=["bias"],
                        exclude_from_layer_adaptation=["bias"], pto=False)
    # pto=False: the unsharded ratios computed locally (the same bits as with PTO, tests/test_pto_ranks.py;
    # tracing parallel_map for every case would take minutes on 4 ranks)
    return pto.LAMB(0.01, weight_decay=0.01, pto=False)


def state_bytes(opt):
    """Bytes of the wrapped optimizer's per-variable state (sharded: this rank's slices)."""
    if opt._sharded is not None:
        return opt._sharded.state_bytes()
    return sum(int(np.prod(v.shape)) * v.dtype.itemsize if hasattr(v.dtype, "itemsize") else
               int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
               for v in opt.inner_optimizer.variables if len(v.shape))


def train(kind, correction, shard, algorithm, compression="none", grads=None, steps=STEPS, graph=True,
          schedule=None, epoch_steps=None, shapes=ref.ZERO_SHAPES):
    """``epoch_steps``: steps per epoch (set_epoch between them, for a schedule); the bytes are
    counted and the formula taken per epoch."""
    weights, mine = ref.zero_inputs(topo.rank, steps, shapes)
    grads = grads or mine
    vs = [keras.Variable(w, name=n) for w, n in zip(weights, NAMES)]
    momentum = 0.9 if correction and kind in ("adam", "adamw", "lamb") else None
    extra = {} if schedule is None else {"schedule": schedule, "density": 0.05}
    opt = DistributedOptimizer(make(kind, correction), algorithm=algorithm,
                               shard_optimizer=shard, compression=compression, **extra,
                               dgc=DGC(momentum_correction=correction, momentum=momentum))
    step = tf.function(lambda gs: opt.apply(gs, vs)) if graph else (lambda gs: opt.apply(gs, vs))
    per_epoch = epoch_steps or steps
    counted, formula = [], []
    with link_bytes.counting() as counter:   # one counter: a tf.function counts into the one it was traced in
        for epoch in range(-(-steps // per_epoch)):
            opt.set_epoch(epoch)
            for gs in grads[epoch * per_epoch:min(steps, (epoch + 1) * per_epoch)]:
                step([tf.constant(g) for g in gs])
            counted.append(counter.result())
            counter.reset()
            formula.append(opt.sent_bytes_at(epoch))
    return opt, vs, {"weights": [v.numpy().tolist() for v in vs], "digest": digest([v.numpy() for v in vs]),
                     "state_bytes": state_bytes(opt), "counted": counted[0] if epoch_steps is None else counted,
                     "formula": formula[0] if epoch_steps is None else formula,
                     "iterations": int(opt.iterations.numpy())}


def exact(algorithm, kinds="sgd,adam,adamw,lars,lamb"):
    """SGD-momentum, Adam, AdamW, pto.LARS and pto.LAMB, with and without DGC momentum correction,
    sharded and unsharded; the slices of the last sharded optimizer."""
    out = {"cases": {}}
    kinds = kinds.split(",")
    for kind in kinds:
        for correction in (False, True):
            case = {}
            # the job's first case in a tf.function (as model.fit runs it), the others eagerly: the
            # same ops in program order, without a trace per case (minutes on 4 ranks of 2 cores)
            graph = kind == kinds[0] and not correction
            for shard in (True, False):
                opt, _, case["sharded" if shard else "unsharded"] = train(kind, correction, shard, algorithm, graph=graph)
            out["cases"][f"{kind}_{correction}"] = case
            print(f"rank {topo.rank}: {kind} {correction} done", flush=True)
    out["slices"] = [list(map(int, s)) for g in opt._groups for s in g.aggregator.sharded.shard_slices()]
    return out


def sparse(kinds):
    """Sharded over a node's ranks: hitopk for epoch 0, 2dtar from epoch 1 (the DAWNBench switch),
    two steps each; against the same run unsharded."""
    out = {"cases": {}}
    kinds = kinds.split(",")
    # a weight of 10 entries and a bias of 3 over all 4 ranks (2dtar, slices of 4): the ranks' slices hold
    # different numbers of runs (variable, padding), so their graphs differ before the all-gather
    out["uneven_runs"] = train("lars", False, True, "2dtar", shapes=[(10,), (3,)])[2]["digest"]
    for kind in kinds:
        for correction in (False, True):
            case = {}
            graph = kind == kinds[0] and not correction
            for shard in (True, False):
                opt, _, case["sharded" if shard else "unsharded"] = train(
                    kind, correction, shard, "hitopk", graph=graph, steps=4, schedule={0: "hitopk", 1: "2dtar"},
                    epoch_steps=2)
                if shard:
                    sharded = opt
            out["cases"][f"{kind}_{correction}"] = case
            print(f"rank {topo.rank}: {kind} {correction} done", flush=True)
    out["slices"] = [[int(s) for s in p[2:]] for p in sharded._sharded.pieces]
    return out


def compression():
    """Gradients k/16, k in -8..8, the same on every rank: x/4 and the 16-bit sums are exact, so only
    the weight delta is rounded."""
    out = {}
    rng = np.random.default_rng(3)
    grads = [[rng.integers(-8, 9, s).astype(np.float32) / 16 for s in ref.ZERO_SHAPES] for _ in range(STEPS)]
    for compression in ("fp16", "bf16"):
        out[compression] = {"one": train("lars", False, True, "2dtar", compression, grads, 1)[2],
                            "three": train("lars", False, True, "2dtar", compression, grads)[2]}
    out["exact_one"] = train("lars", False, False, "2dtar", "none", grads, 1)[2]
    out["grads"] = [[g.tolist() for g in s] for s in grads]
    return out


def fit(mode, backup, schedule="2dtar"):
    """model.fit with sharded LARS and BackupAndRestore: a run interrupted after epoch STOP and
    resumed ends with the bits of an uninterrupted one; the backups refuse another layout.
    schedule: "2dtar" (sharded over all ranks) or "hitopk,2dtar" (hitopk for epoch 0, then 2dtar:
    over a node's)."""
    from tests.workers import _fit
    from tfc_apps import digits
    from tf_commlib.keras import BackupAndRestore

    schedule = dict(enumerate(schedule.split(",")))
    (x, y), _ = digits.load(topo.rank, topo.size)
    x, y = x[:96], y[:96]

    def build():
        model = digits.small_cnn(seed=1)
        opt = DistributedOptimizer(pto.LARS(1.0, weight_decay_rate=1e-4, exclude_from_weight_decay=["bias"]),
                                   algorithm=schedule[0], schedule=schedule, density=0.05,
                                   shard_optimizer=True, selection=Selection(seed=5),
                                   dgc=DGC(momentum_correction=False))
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        return model

    if mode == "load_elsewhere":
        try:
            _fit.fit(build(), x, y, 3, extra=[BackupAndRestore(backup, delete_checkpoint=False)])
            return {"error": None}
        except ValueError as e:
            return {"error": str(e)}
    stop = 1 if len(schedule) > 1 else 2   # a switch: the resumed run starts at it (hitopk's residuals flushed)
    full = build()
    _fit.fit(full, x, y, 3)
    first = build()
    try:
        _fit.fit(first, x, y, 3, extra=[BackupAndRestore(backup, delete_checkpoint=False), _fit.Interrupt(stop)])
    except RuntimeError:
        pass
    resumed = build()
    _fit.fit(resumed, x, y, 3, extra=[BackupAndRestore(backup, delete_checkpoint=False)])
    dist = full.optimizer
    return dict(full=digest(full.weights), resumed=digest(resumed.weights),
                interrupted=digest(first.weights), state_bytes=dist._sharded.state_bytes(),
                weights_bytes=sum(int(np.prod(v.shape)) * 4 for v in full.trainable_variables),
                iterations=int(dist.iterations.numpy()), loss=full.history.history["loss"])


def full_state():
    """sharded_full_state: Adam's two slots whole after STEPS steps sharded over all ranks (2dtar), against
    the unsharded run's; given to an update sharded over a node's ranks (another slicing: hitopk), whose
    slices gathered back are the same state."""
    sharded = train("adam", False, True, "2dtar")[0]
    plain = train("adam", False, False, "2dtar")[0]
    full = sharded.sharded_full_state()
    node = train("adam", False, True, "hitopk", schedule={0: "hitopk", 1: "2dtar"}, steps=1)[0]
    node.load_sharded_full_state(full)
    again = node.sharded_full_state()
    unsharded = {slot: [v.numpy() for v in plain.inner_optimizer.variables if v.path.endswith("_" + slot)]
                 for slot in ("momentum", "velocity")}
    return {"slots": sorted(full), "shapes": [list(a.shape) for a in full["momentum"]],
            "vs_unsharded": max(float(np.abs(a - b).max()) for slot in unsharded
                                for a, b in zip(full[slot], unsharded[slot])),
            "nonzero": all(float(np.abs(a).max()) > 0 for a in full["velocity"]),
            "gathered_back": max(float(np.abs(a - b).max()) for slot in full for a, b in zip(full[slot], again[slot])),
            "slices": [[int(x) for x in p[2:]] for p in sharded._sharded.pieces],
            "node_slices": [[int(x) for x in p[2:]] for p in node._sharded.pieces]}


JOBS = {"exact": exact, "full_state": full_state, "sparse": sparse, "compression": compression,
        "fit": lambda *a: fit("fit", *a), "load_elsewhere": lambda *a: fit("load_elsewhere", *a)}
print(f"rank {topo.rank}: job {' '.join(sys.argv[1:])}", flush=True)
report(topo.rank, {"rank": topo.rank, **JOBS[sys.argv[1]](*sys.argv[2:])})
