"""DistributedOptimizer against numpy implementations of momentum SGD and DGC (lin2018 eqs. 4, 6)."""
import math

import keras
import numpy as np
import pytest

from tf_commlib.keras import DGC, Auto, DistributedOptimizer, Schedule, Selection

LR, M, STEPS = 0.1, 0.9, 5


def momentum_sgd(grads_by_rank):
    """Keras SGD momentum on the averaged gradient: v = m v - lr g; w += v."""
    w = np.ones(len(grads_by_rank[0][0]))
    v = np.zeros_like(w)
    for step in range(STEPS):
        g = np.mean([gr[step] for gr in grads_by_rank], axis=0)
        v = M * v - LR * g
        w = w + v
    return w


def dgc(grads_by_rank, density, correction, masking, nesterov=False):
    """lin2018 eqs. 4/6 with naive allgather: u = m u + g; v += u (or m u + g); send top-k of v;
    plain step. Without correction: v += g, and the wrapped SGD applies momentum after it."""
    p, d = len(grads_by_rank), len(grads_by_rank[0][0])
    k = max(1, math.ceil(density * d))
    w, u, v = np.ones(d), np.zeros((p, d)), np.zeros((p, d))
    velocity = np.zeros(d)
    for step in range(STEPS):
        agg = np.zeros(d)
        for r in range(p):
            g = np.asarray(grads_by_rank[r][step], np.float64)
            if correction:
                u[r] = M * u[r] + g
                v[r] += M * u[r] + g if nesterov else u[r]
            else:
                v[r] += g
            idx = np.argsort(-np.abs(v[r]))[:k]
            agg[idx] += v[r][idx]
            v[r][idx] = 0
            if masking:
                u[r][idx] = 0
        if correction:
            w = w - LR * agg / p
        else:
            velocity = M * velocity - LR * agg / p
            w = w + velocity
    return w


def test_against_numpy(shared):
    reports = shared("1x2", "dgc")
    grads = [r["grads"] for r in reports]
    expect = {
        "plain_momentum": momentum_sgd(grads),
        "corrected_dense": momentum_sgd(grads),
        "dgc": dgc(grads, 0.2, True, True),
        "dgc_nesterov": dgc(grads, 0.2, True, True, nesterov=True),
        "dgc_no_mask": dgc(grads, 0.2, True, False),
        "ef_only": dgc(grads, 0.2, False, False),
    }
    # the variants differ from each other, so the comparisons below can tell them apart
    assert np.abs(expect["dgc"] - expect["dgc_no_mask"]).max() > 1e-3
    assert np.abs(expect["dgc"] - expect["corrected_dense"]).max() > 1e-3
    for r in reports:
        for name, want in expect.items():
            np.testing.assert_allclose(r[name]["weights"], want, rtol=0, atol=1e-6, err_msg=name)
        # momentum moved out of the wrapped SGD: it is never applied twice
        assert r["corrected_dense"]["inner_momentum"] == 0.0
        assert r["plain_momentum"]["inner_momentum"] == M
        # qRGC: the first layer moved by at most 4 distinct amounts (0, one mean per rank, both);
        # the output layer is never quantized
        assert len(r["qrgc_first_changes"]) <= 4
        assert r["qrgc_last_changes"] > 10


@pytest.mark.parametrize("make,message", [
    (lambda: dict(algorithm="bogus"), "algorithm must be one of"),
    (lambda: dict(density=0), r"density must be in \(0, 1\]"),
    (lambda: dict(density=-0.5), r"density must be in \(0, 1\]"),
    (lambda: dict(schedule={0: "hitopk", 13: "2dtar", 5: "dense"}), "strictly increasing"),
    (lambda: dict(schedule={3: "hitopk", 3.5: "dense"}), "integers"),
    (lambda: dict(schedule={0: "nope"}), "schedule algorithm must be one of"),
    (lambda: dict(dgc=DGC(warmup=-1)), "DGC.warmup must be"),
    (lambda: dict(selection=Selection(selector="x")), "Selection.selector must be one of"),
    # every argument is validated, and the message names it
    (lambda: dict(dgc=DGC(momentum=-5)), "DGC.momentum must be"),
    (lambda: dict(dgc=DGC(momentum=float("nan"))), "DGC.momentum must be"),
    (lambda: dict(dgc=DGC(momentum=1.5)), "DGC.momentum must be"),
    (lambda: dict(dgc=DGC(momentum="0.9")), "DGC.momentum must be"),
    (lambda: dict(fusion_threshold_bytes="a"), "fusion_threshold_bytes must be"),
    (lambda: dict(fusion_threshold_bytes=-1), "fusion_threshold_bytes must be"),
    (lambda: dict(selection=Selection(seed="x")), "Selection.seed must be"),
    (lambda: dict(selection=Selection(seed=1.5)), "Selection.seed must be"),
    (lambda: dict(dgc=DGC(local_clip_norm=float("nan"))), "DGC.local_clip_norm must be"),
    (lambda: dict(dgc=DGC(local_clip_norm="1")), "DGC.local_clip_norm must be"),
    (lambda: dict(dgc=DGC(warmup=True)), "DGC.warmup must be"),
    (lambda: dict(dgc=DGC(nesterov="yes")), "DGC.nesterov must be"),
    (lambda: dict(dgc=DGC(momentum_correction=1)), "DGC.momentum_correction must be"),
    (lambda: dict(dgc=DGC(momentum_masking=None)), "DGC.momentum_masking must be"),
    (lambda: dict(selection=Selection(qrgc="no")), "Selection.qrgc must be"),
    (lambda: dict(selection=Selection(dense_layers=3)), "Selection.dense_layers must be"),
    (lambda: dict(schedule=Schedule(dense_warmup_epochs="a")), "Schedule.dense_warmup_epochs must be"),
    (lambda: dict(schedule=Schedule(dense_warmup_epochs=-2)), "Schedule.dense_warmup_epochs must be"),
    (lambda: dict(name=7), "name must be"),
    (lambda: dict(algorithm_options={"hitopk": 3}), "algorithm_options"),
    (lambda: dict(overlap="no"), "overlap must be"),
    (lambda: dict(auto=Auto(cost_params={"beta_inter": 1e-9})), "Auto.cost_params must be"),
    (lambda: dict(auto=Auto(margin=0)), r"Auto.margin must be a number in \(0, 1\]"),
    (lambda: dict(auto=Auto(margin=1.5)), "Auto.margin must be"),
    (lambda: dict(auto=Auto(margin="0.5")), "Auto.margin must be"),
    (lambda: dict(auto=Auto(compute_s=-1)), "Auto.compute_s must be None or a finite number of seconds >= 0"),
    (lambda: dict(auto=Auto(compute_s=float("nan"))), "Auto.compute_s must be"),
])
def test_bad_configuration_raises_before_training(make, message):
    """Each option group checks its fields where it is built, DistributedOptimizer the rest."""
    with pytest.raises(ValueError, match=message):
        DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **make())


def test_optimizer_argument_must_be_a_keras_optimizer():
    with pytest.raises(ValueError, match="optimizer must be a Keras 3 optimizer"):
        DistributedOptimizer("sgd")


def test_the_wrapped_optimizer_is_left_unchanged_and_wrapped_once():
    """DGC's momentum is taken from the SGD, which is left as it is: the wrapper steps with a copy
    without momentum (never applied twice) and serialises the SGD as given. One optimizer serves one
    wrapper; a built one is refused too (its state would be stepped by two)."""
    sgd = keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)
    first = DistributedOptimizer(sgd)
    assert first.m == 0.9 and first.nesterov and sgd.momentum == 0.9 and sgd.nesterov
    assert first.inner_optimizer is not sgd and first.inner_optimizer.momentum == 0.0
    assert not first.inner_optimizer.nesterov
    again = DistributedOptimizer.from_config(first.get_config())
    assert again.m == 0.9 and again.nesterov and again.get_config()["optimizer"] == first.get_config()["optimizer"]
    with pytest.raises(ValueError, match="already steps"):
        DistributedOptimizer(sgd)
    with pytest.raises(ValueError, match="already steps"):
        DistributedOptimizer(sgd, dgc=DGC(momentum=0.9))
    adam = keras.optimizers.Adam(0.01)
    assert DistributedOptimizer(adam, dgc=DGC(momentum=0.9)).inner_optimizer is adam
    built = keras.optimizers.Adam(0.01)
    built.build([keras.Variable(np.zeros(3, np.float32))])
    with pytest.raises(ValueError, match="already steps"):
        DistributedOptimizer(built, dgc=DGC(momentum_correction=False))
    copy = DistributedOptimizer(keras.optimizers.SGD.from_config(sgd.get_config()), dgc=DGC(momentum=0.8))
    assert copy.m == 0.8


@pytest.mark.parametrize("keyword, place", [
    ("momentum_correction", r"dgc=DGC\(momentum_correction="), ("warmup", r"dgc=DGC\(warmup="),
    ("momentum_masking", r"dgc=DGC\(momentum_masking="), ("selector", r"selection=Selection\(selector="),
    ("seed", r"selection=Selection\(seed="), ("dense_layers", r"selection=Selection\(dense_layers="),
    ("qrgc", r"selection=Selection\(qrgc="), ("dense_warmup_epochs", r"schedule=Schedule\(dense_warmup_epochs="),
    ("cost_params", r"auto=Auto\(cost_params="), ("auto_margin", r"auto=Auto\(margin="),
    ("auto_compute_s", r"auto=Auto\(compute_s="), ("candidates", r"density=\(0.1, 0.01, 0.001\)"),
])
def test_old_keywords_name_their_new_place(keyword, place):
    with pytest.raises(TypeError, match=place):
        DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **{keyword: 1})


def test_the_api_is_keyword_only_and_small():
    import inspect

    params = inspect.signature(DistributedOptimizer.__init__).parameters
    named = [p for p in params.values() if p.name != "self" and p.kind is not p.VAR_KEYWORD]
    assert len(named) <= 12 and [p.name for p in named if p.kind is not p.KEYWORD_ONLY] == ["optimizer"]
    with pytest.raises(TypeError):
        DistributedOptimizer(keras.optimizers.SGD(0.1), "hitopk")
    with pytest.raises(TypeError, match="unexpected keyword argument 'algoritm'"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), algoritm="hitopk")
    with pytest.raises(ValueError, match="dgc must be None or a tf_commlib.keras.DGC"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), dgc={"warmup": 2})
    with pytest.raises(ValueError, match="schedule must be None, a dict"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), schedule=[(0, "hitopk")])
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    assert isinstance(opt, DistributedOptimizer) and opt.name.startswith("distributed_sgd")
    assert DistributedOptimizer(keras.optimizers.SGD(0.1), name="d").name == "d"


def test_auto_chooses_by_time_to_accuracy_at_build(monkeypatch):
    """algorithm="auto": the compressible variables' aggregator holds every candidate; on a slow link
    the first epoch runs a lossy one; with a forward+backward far longer than any collective an exact
    one runs (on a GPU every candidate's overlapped step is the compute, and the first, dense, runs;
    on CPU cores nothing is taken as hidden before an epoch is measured, and compression saves less
    than Auto.margin asks). The state (residuals of the lossy candidates) is the same either way."""
    from tf_commlib import alphabeta
    from tf_commlib.aggregator.chooser import AUTO_CANDIDATES
    from tf_commlib.collectives import ALGORITHMS
    from tf_commlib.keras import auto_epoch, optimizer as module
    from tf_commlib.topology import Topology

    two_by_two = Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2))
    monkeypatch.setattr(module, "current_topology", lambda: two_by_two)
    monkeypatch.setattr(auto_epoch, "current_topology", lambda: two_by_two)
    slow = alphabeta.LinkParams(beta_inter=8 / 10e6)

    def built(**kwargs):
        compute_s, overlap = kwargs.get("compute_s"), kwargs.get("overlap", True)
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="auto", overlap=overlap,
                                   auto=Auto(cost_params=slow, compute_s=compute_s))
        opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
        (agg,) = opt.lossy_aggregators()
        assert agg.candidates == list(AUTO_CANDIDATES)
        assert agg.candidates[int(agg.active.numpy())] == opt.algorithm_at(0)
        return opt.algorithm_at(0), sorted(v.name for v in agg.residual_variables())

    picked, residuals = built()
    assert ALGORITHMS[picked].lossy and len(residuals) == 2
    exact, kept = built(compute_s=100.0)
    assert exact in ("dense", "2dtar") and kept == residuals
    assert built(overlap=False) == (picked, residuals)
    # without overlap the compute adds to every candidate's step: 1 % saved is under the margin
    assert built(compute_s=100.0, overlap=False)[0] in ("dense", "2dtar")


def test_overlap_and_cost_params_survive_serialisation():
    from tf_commlib.alphabeta import LinkParams

    params = LinkParams(beta_inter=8 / 25e6, compute_curve=((1024, 1e-9, 2e-9, 3e-10),))
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="auto", overlap=False,
                               auto=Auto(cost_params=params, margin=0.8, compute_s=0.25))
    again = DistributedOptimizer.from_config(opt.get_config())
    assert again.overlap is False and again.auto == Auto(params, 0.8, 0.25)
    assert DistributedOptimizer(keras.optimizers.SGD(0.1)).auto == Auto(None, 0.5, None)
    assert DistributedOptimizer(keras.optimizers.SGD(0.1)).overlap is True
    # through Keras' own (de)serialisation, as keras.models.clone_model and saving a compiled model use it
    saved = keras.saving.serialize_keras_object(opt)
    assert saved["registered_name"] == "tf_commlib>DistributedOptimizer"
    assert keras.saving.deserialize_keras_object(saved).get_config() == opt.get_config()


def test_configs_saved_with_flat_keywords_load():
    """A config saved with every option at the top level (before the option groups) loads into the
    groups; one saved before auto_margin existed keeps "auto" the plain argmin (margin 1.0)."""
    flat = {"name": "d", "optimizer": keras.optimizers.serialize(keras.optimizers.SGD(0.1, momentum=0.9)),
            "algorithm": "hitopk", "density": "adaptive", "candidates": [0.2, 0.02], "selector": "mstopk",
            "momentum_correction": True, "momentum": 0.9, "nesterov": False, "local_clip_norm": None,
            "momentum_masking": False, "warmup": 2, "schedule": {"0": "hitopk", "3": "2dtar"}, "qrgc": False,
            "fusion_threshold_bytes": 1 << 20, "seed": 4, "algorithm_options": None, "compression": "none",
            "overlap": True, "shard_optimizer": False, "auto_compute_s": None, "cost_params": None}
    opt = DistributedOptimizer.from_config(flat)
    assert opt.dgc == DGC(momentum=0.9, momentum_masking=False, warmup=2) and opt.m == 0.9
    assert opt.selection == Selection(seed=4) and opt.candidates == (0.2, 0.02) and opt.auto.margin == 1.0
    assert opt.schedule == {0: "hitopk", 3: "2dtar"}
    assert DistributedOptimizer.from_config({**flat, "auto_margin": 0.5}).auto.margin == 0.5


def test_momentum_correction_needs_a_momentum_for_other_optimizers():
    with pytest.raises(ValueError, match=r"needs DGC\(momentum=...\)"):
        DistributedOptimizer(keras.optimizers.Adam(0.01))
    opt = DistributedOptimizer(keras.optimizers.Adam(0.01), dgc=DGC(momentum=0.9))
    assert opt.m == 0.9


def test_warmup_and_schedule_policy():
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), density=0.001,
                               schedule={0: "hitopk", 13: "2dtar"}, dgc=DGC(warmup=4))
    assert [opt.density_at(e) for e in range(6)] == [0.25, 0.0625, 0.015625, 0.004, 0.001, 0.001]
    assert [opt.algorithm_at(e) for e in (0, 12, 13, 27)] == ["hitopk", "hitopk", "2dtar", "2dtar"]
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="hitopk", density=0.01,
                               schedule=Schedule(dense_warmup_epochs=2), dgc=DGC(warmup=4))
    assert [opt.density_at(e) for e in range(5)] == [0.25, 0.0625, 0.015625, 0.01, 0.01]
    assert [opt.algorithm_at(e) for e in range(4)] == ["2dtar", "2dtar", "hitopk", "hitopk"]
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), schedule=Schedule(dense_warmup_epochs=2))
    assert [opt.algorithm_at(e) for e in range(4)] == ["2dtar", "2dtar", "auto", "auto"]   # the default after it


def test_epoch_policy_applies_from_the_first_step_of_fit(shared):
    for r in shared("1x2", "epoch_policy"):
        assert r["0"] == [[0.25, "hitopk"]] * 4          # warm-up density from step 0
        assert r["3"] == [[0.01, "naive_ag"]] * 4        # a resumed epoch's density and algorithm


def test_the_stepping_copy_keeps_the_learning_rate_and_weight_decay_exclusions():
    """The copy without momentum shares a schedule or callable learning rate (whatever its
    serialisability) and keeps exclude_from_weight_decay's exclusions, which get_config drops."""
    import json

    from tf_commlib import internals

    sgd = keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.1)
    sgd.exclude_from_weight_decay(var_names=["bias"])
    dist = DistributedOptimizer(sgd, algorithm="dense")
    bias, kernel = keras.Variable(np.ones(3, np.float32), name="bias"), keras.Variable(np.ones(3, np.float32), name="k")
    copy = dist.inner_optimizer
    assert not internals.uses_weight_decay(copy, bias) and internals.uses_weight_decay(copy, kernel)
    assert float(copy.learning_rate) == pytest.approx(0.1) and copy.weight_decay == 0.1

    def lr():
        return 0.25

    dist = DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9), algorithm="dense")
    assert float(dist.learning_rate) == 0.25 and dist.m == 0.9
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, 10, 0.5)
    dist = DistributedOptimizer(keras.optimizers.SGD(schedule, momentum=0.9), algorithm="dense")
    assert internals.momentum_free_copy(keras.optimizers.SGD(schedule, momentum=0.9), momentum=0.0)._learning_rate \
        is schedule
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), dgc=DGC(warmup=np.int64(2)),
                               selection=Selection(seed=np.int64(3)), schedule=Schedule({np.int64(0): "hitopk"}))
    json.dumps(opt.get_config())   # plain Python numbers
    with pytest.raises(ValueError, match="algorithm must be the name of a collective"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm=["hitopk", "dense"])
    with pytest.raises(ValueError, match="density must be"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), density={0.1: 1})


def test_the_bucket_size_follows_the_collectives_unless_given(monkeypatch):
    """fusion_threshold_bytes=None: the largest bucket size of the collectives the schedule names
    (25 MB where one is lossy: its fixed costs per bucket; 1 MB for exact ones, which overlap
    backprop); "auto" starts at the exact size and takes a lossy candidate's where that one's timed
    aggregation is the fastest by Auto.switch; the dense-layer group stays at the exact size; a
    given size wins everywhere and is what get_config keeps (None for the default)."""
    from tf_commlib import collectives, fusion
    from tf_commlib.keras import optimizer as module
    from tf_commlib.keras.auto_probe import lossy_bucket_bytes
    from tf_commlib.keras.optimizer import default_fusion_threshold
    from tf_commlib.topology import Topology

    monkeypatch.setattr(module, "current_topology", lambda: Topology(m=2, n=2, rank=0, node=0, local=0,
                                                                     intra_ranks=(0, 1), inter_ranks=(0, 2)))

    small, large = fusion.DEFAULT_THRESHOLD_BYTES, fusion.LOSSY_THRESHOLD_BYTES
    assert small < large
    assert [collectives.bucket_bytes([n]) for n in ("dense", "2dtar", "hitopk", "powersgd")] == [small, small,
                                                                                                   large, large]
    assert default_fusion_threshold(["auto"]) == default_fusion_threshold(["dense", "auto"]) == small
    assert default_fusion_threshold(["auto", "hitopk"]) == large
    auto = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    timed = {"dense": 0.10, "2dtar": 0.08, "hitopk": 0.05, "powersgd": 0.06}
    assert lossy_bucket_bytes(auto, timed) == large
    assert lossy_bucket_bytes(auto, {**timed, "hitopk": 0.075, "powersgd": 0.08}) is None   # not 0.9 x 0.08
    assert lossy_bucket_bytes(auto, {"dense": 0.1, "2dtar": 0.08}) is None
    given = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), fusion_threshold_bytes=small)
    assert lossy_bucket_bytes(given, timed) is None

    def made(**kwargs):
        return DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **kwargs)

    for kwargs, want in (({}, small), ({"algorithm": "hitopk"}, large), ({"algorithm": "dense"}, small),
                         ({"algorithm": "2dtar", "schedule": {0: "2dtar", 3: "powersgd"}}, large),
                         ({"algorithm": "hitopk", "fusion_threshold_bytes": 4096}, 4096)):
        opt = made(**kwargs)
        assert opt.fusion_threshold_bytes == want, kwargs
        saved = opt.get_config()["fusion_threshold_bytes"]
        assert saved == kwargs.get("fusion_threshold_bytes"), kwargs
        assert DistributedOptimizer.from_config(opt.get_config()).fusion_threshold_bytes == want
    # built, the lossy size is fitted to the model: at most a quarter of its compressible bytes, not
    # under the exact size (the small model keeps 1 MB buckets, ResNet-50 gets about 24 MB ones)
    for shape, want in (((3, 3, 64, 64), small), ((3, 3, 512, 512), 9 * 512 * 512), ((3, 3, 2048, 2048), large)):
        opt = made(algorithm="hitopk")
        opt.build([keras.Variable(np.zeros(shape, np.float32)), keras.Variable(np.zeros(8, np.float32))])
        sparse, dense = (g.aggregator for g in opt._groups)
        assert (sparse.fusion_threshold_bytes, dense.fusion_threshold_bytes) == (want, small), shape
        assert opt.fusion_threshold_bytes == want and opt.bucket_cap == large
    opt = made(algorithm="hitopk", fusion_threshold_bytes=4096)
    opt.build([keras.Variable(np.zeros((3, 3, 64, 64), np.float32)), keras.Variable(np.zeros(8, np.float32))])
    assert [g.aggregator.fusion_threshold_bytes for g in opt._groups] == [4096, 4096]
    with pytest.raises(TypeError, match="bucket_bytes must be None or an int >= 0"):
        collectives.Collective("x", lambda x, topo, ctx=None: x, lambda *a: {}, lambda *a: {}, bucket_bytes=-1)


@pytest.mark.parametrize("loss_scale", [False, True])
def test_fit_traces_the_first_step_once(loss_scale):
    """default_callbacks() builds the optimizer before the first step: tf.function traces a first call
    that creates variables twice (once to create them, once to run)."""
    import tf_commlib
    from tf_commlib.keras import default_callbacks, with_loss_scale

    tf_commlib.init()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    keywords = {"algorithm": "hitopk", "density": 0.5}
    opt = (with_loss_scale(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), **keywords)
           if loss_scale else DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **keywords))
    model.compile(opt, "mse", jit_compile=False)
    traced, step = [], model.train_step

    def counted(data):
        traced.append(1)
        return step(data)

    model.train_step = counted
    model.fit(np.ones((16, 4), np.float32), np.ones((16, 2), np.float32), batch_size=8, epochs=2, verbose=0,
              callbacks=default_callbacks())
    assert opt.built and len(traced) == 1


def test_the_collectives_variable_is_made_with_the_aggregators_state(monkeypatch):
    """The variable a collective reads inside a step (primitives._unfoldable) exists once an
    aggregator is built, so tracing the step creates none."""
    import tensorflow as tf

    from tf_commlib import primitives
    from tf_commlib.aggregator import GradientAggregator

    monkeypatch.setattr(primitives, "_false", [])
    GradientAggregator("dense").build([((4,), tf.float32)])
    created = []

    def creator(next_creator, **kwargs):
        created.append(kwargs.get("name"))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        tf.function(lambda x: primitives._unfoldable(x, "Allreduce", None)[0])(tf.ones(4))
    assert created == []
