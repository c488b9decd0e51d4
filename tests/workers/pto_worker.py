"""pto under horovodrun: parallel_map / parallel_elementwise against local compute (eager and in a
tf.function, more ranks than tensors, mixed dtypes, inputs that differ by rank); with argv[1] ==
"all" also LARS / LAMB: PTO on and off, DistributedOptimizer in a GradientTape loop (DGC momentum
correction) and in model.fit, model.save / load_model."""
import hashlib
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
import pto
from tests.workers._report import report
from tests import pto_reference as ref

topo = tf_commlib.init()
out = {"rank": topo.rank}
START = time.perf_counter()


def stamp(section):
    print(f"rank {topo.rank}: {section} done at {time.perf_counter() - START:.1f} s", flush=True)


def arrays(results):
    return [np.asarray(t) for t in tf.nest.flatten(results)]


def same_bits(a, b):
    a, b = arrays(a), arrays(b)
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                                    for x, y in zip(a, b))


def digest(results):
    h = hashlib.sha256()
    for x in arrays(results):
        h.update(str((x.dtype, x.shape)).encode() + x.tobytes())
    return h.hexdigest()


def norms(e):
    w, g = e
    return tf.stack([tf.norm(w), tf.norm(g)])


def mixed(e):   # nested, four dtypes, bool included
    w, g = e
    return {"max": tf.reduce_max(tf.concat([w, [-1.0]], 0) if w.shape.rank == 1 else w),
            "size": tf.cast(tf.size(w), tf.int64), "pos": (w > 0, tf.cast(w, tf.float64) * 2)}


def elementwise(x):
    return tf.sqrt(tf.abs(x)) * 3.0 + x * x


inputs = [tuple(tf.constant(a) for a in pair) for pair in ref.map_inputs(0)]
graph_norms = tf.function(lambda xs: pto.parallel_map(norms, xs))
cases = {
    "norms": lambda: pto.parallel_map(norms, inputs),
    "mixed": lambda: pto.parallel_map(mixed, inputs),
    "graph_norms": lambda: graph_norms(inputs),
    "graph_norms_again": lambda: graph_norms(inputs),
    "few": lambda: pto.parallel_map(norms, inputs[:2]),    # more ranks than tensors
    "one": lambda: pto.parallel_map(norms, inputs[5:6]),
    "elementwise": lambda: pto.parallel_elementwise(elementwise, tf.constant(np.linspace(-3, 3, 1001, dtype=np.float32))),
    "elementwise_graph": lambda: tf.function(lambda x: pto.parallel_elementwise(lambda s: s > 0.5, x))(
        tf.constant(np.linspace(-3, 3, 77, dtype=np.float32))),
}
local = {
    "norms": lambda: [norms(e) for e in inputs], "mixed": lambda: [mixed(e) for e in inputs],
    "graph_norms": lambda: [norms(e) for e in inputs], "graph_norms_again": lambda: [norms(e) for e in inputs],
    "few": lambda: [norms(e) for e in inputs[:2]], "one": lambda: [norms(inputs[5])],
    "elementwise": lambda: elementwise(tf.constant(np.linspace(-3, 3, 1001, dtype=np.float32))),
    "elementwise_graph": lambda: tf.constant(np.linspace(-3, 3, 77, dtype=np.float32)) > 0.5,
}
out["map"] = {}
for name, call in cases.items():
    got = call()
    out["map"][name] = {"equal_local": same_bits(got, local[name]()), "digest": digest(got)}
out["norms"] = [r.numpy().tolist() for r in pto.parallel_map(norms, inputs)]
stamp("parallel_map")

# inputs that differ by rank (rank 0's first weight): every rank raises, eagerly and in a graph
bad = [(inputs[0][0] + float(topo.rank == 0), inputs[0][1])] + inputs[1:3]
errors = {}
for name, call in [("eager", lambda: pto.parallel_map(norms, bad)),
                   ("graph", lambda: tf.function(lambda xs: pto.parallel_map(norms, xs))(bad))]:
    try:
        call()
        errors[name] = None
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        errors[name] = f"{type(e).__name__}: {e}"[:400]
out["errors"] = errors
out["after_errors"] = same_bits(pto.parallel_map(norms, inputs[:4]), [norms(e) for e in inputs[:4]])

if sys.argv[1:] == ["all"]:
    from tfc_apps import digits
    from tf_commlib.keras import DGC, Selection, DistributedOptimizer, default_callbacks

    # PTO on and off: the same bits (identical inputs on every rank, as after aggregation)
    ws0 = ref.map_inputs(1)[:5]
    weights = [w for w, _ in ws0]
    steps = [[g * (s + 1) for _, g in ws0] for s in range(3)]

    def train(opt):
        vs = [keras.Variable(w) for w in weights]
        step = tf.function(lambda gs: opt.apply(gs, vs))
        for gs in steps:
            step([tf.constant(g) for g in gs])
        return [v.numpy() for v in vs]

    for name, make in [("lars", lambda p: pto.LARS(0.5, weight_decay_rate=0.01, nesterov=True, pto=p)),
                       ("lamb", lambda p: pto.LAMB(0.01, weight_decay=0.01, pto=p))]:
        on, off = train(make(True)), train(make(False))
        out[f"{name}_on_off_same_bits"] = same_bits(on, off)
        out[f"{name}_on"] = [w.tolist() for w in on]
    stamp("pto on/off")
    out["pto_weights"], out["pto_steps"] = [w.tolist() for w in weights], [[g.tolist() for g in s] for s in steps]

    # DistributedOptimizer(LARS) in a GradientTape loop: DGC momentum correction moves LARS's momentum
    rng = np.random.default_rng(50 + topo.rank)
    tape_grads = [[rng.standard_normal(w.shape).astype(np.float32) for w in weights[:3]] for _ in range(3)]
    for name, correction in (("dgc_lars", True), ("plain_lars", False)):
        vs = [keras.Variable(w) for w in weights[:3]]
        opt = DistributedOptimizer(pto.LARS(0.5, momentum=0.9, weight_decay_rate=0.01, eeta=0.01),
                                   algorithm="dense", dgc=DGC(momentum_correction=correction))
        for gs in tape_grads:
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(vs, gs)])
            opt.apply_gradients(zip(tape.gradient(loss, vs), vs))
        out[name] = {"weights": [v.numpy().tolist() for v in vs],
                     "inner_momentum": opt.inner_optimizer.momentum, "dgc_momentum": opt.m,
                     "inner_velocities": len(opt.inner_optimizer.velocities)}
    out["tape_grads"] = [[g.tolist() for g in s] for s in tape_grads]
    stamp("GradientTape")

    # model.fit on every rank, then model.save / load_model and one more epoch
    (x, y), _ = digits.load(topo.rank, topo.size)
    x, y = x[:64], y[:64]
    work = os.path.join(os.environ["HVD_TEST_OUT"], f"rank{topo.rank}")
    os.makedirs(work, exist_ok=True)

    def build(kind):
        model = digits.small_cnn(seed=topo.rank)   # different on purpose: the broadcast fixes it
        if kind == "lars":
            inner = pto.LARS(2.0, weight_decay_rate=1e-4, exclude_from_weight_decay=["bias"])
            opt = DistributedOptimizer(inner, algorithm="hitopk", density=0.1, selection=Selection(seed=3))
        else:
            opt = DistributedOptimizer(pto.LAMB(0.005, weight_decay=1e-3), algorithm="dense",
                                       dgc=DGC(momentum_correction=False))
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        return model

    def fit(model, epochs, initial_epoch=0):
        model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
                  verbose=0, callbacks=default_callbacks())

    def weights_of(model):
        return [w.numpy() for w in model.weights]

    for kind in ("lars", "lamb"):
        full, part = build(kind), build(kind)
        fit(full, 2)
        fit(part, 1)
        part.save(os.path.join(work, f"{kind}.keras"))
        loaded = keras.models.load_model(os.path.join(work, f"{kind}.keras"))
        fit(loaded, 2, initial_epoch=1)
        out[kind] = {"digest": digest(weights_of(full)), "loaded_type": type(loaded.optimizer.inner_optimizer).__name__,
                     "resumed_diff": max(float(np.abs(a - b).max()) for a, b in zip(weights_of(loaded), weights_of(full))),
                     "moved": max(float(np.abs(a - b).max()) for a, b in zip(weights_of(part), weights_of(full)))}
        stamp(f"fit {kind}")
report(topo.rank, out)
