"""DistributedOptimizer against numpy implementations of momentum SGD and DGC (lin2018 eqs. 4, 6), and
what it does per epoch and at build: the warm-up and schedule policy from fit's first step, "auto"'s
choice, the bucket sizes, one trace of the first step, the collectives' variable made with the state."""
import math

import keras
import numpy as np
import pytest

from tf_commlib.keras import DGC, Auto, DistributedOptimizer, Schedule

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


def test_auto_chooses_by_time_to_accuracy_at_build(monkeypatch):
    """algorithm="auto": the compressible variables' aggregator holds every candidate; on a slow link
    the first epoch runs a lossy one; with a forward+backward far longer than any collective every
    candidate's step is within the noise of the others' (decide.NOISE), and the first, dense, runs. The
    state (residuals of the lossy candidates) is the same either way."""
    from tf_commlib import alphabeta
    from tf_commlib.aggregator.chooser import AUTO_CANDIDATES
    from tf_commlib.collectives import ALGORITHMS
    from tf_commlib.keras import auto_epoch, optimizer as module
    from tf_commlib.topology import Topology

    rank0_of_2x2 = Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2))
    monkeypatch.setattr(module, "current_topology", lambda: rank0_of_2x2)
    monkeypatch.setattr(auto_epoch, "current_topology", lambda: rank0_of_2x2)
    slow = alphabeta.LinkParams(beta_inter=8 / 10e6)

    def built(**kwargs):
        compute_s, overlap = kwargs.get("compute_s"), kwargs.get("overlap", True)
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="auto", overlap=overlap,
                                   auto=Auto(cost_params=slow, compute_s=compute_s, diloco=False))   # per step
        opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
        (agg,) = opt.lossy_aggregators()
        assert agg.candidates == list(AUTO_CANDIDATES)
        assert agg.candidates[int(agg.active.numpy())] == opt.algorithm_at(0)
        return opt.algorithm_at(0), sorted(v.name for v in agg.residual_variables())

    picked, residuals = built()
    assert ALGORITHMS[picked].lossy and len(residuals) == 2
    exact, kept = built(compute_s=100.0)
    assert exact == "dense" and kept == residuals
    assert built(overlap=False) == (picked, residuals)
    assert built(compute_s=100.0, overlap=False)[0] == "dense"


def test_a_collective_registered_as_an_auto_candidate_is_weighed_and_chosen(rank0_of_2x2):
    """Collective(auto_candidate=True): once registered, DistributedOptimizer(algorithm="auto") with no
    named candidates weighs it after the built-in ones, holds it in the aggregator, and runs it where
    it is predicted fastest (here an exact collective whose formula says it costs nothing)."""
    from tf_commlib import alphabeta
    from tf_commlib.aggregator.chooser import AUTO_CANDIDATES, default_candidates
    from tf_commlib.collectives import ALGORITHMS, Collective, dense, register
    with pytest.raises(TypeError, match="auto_candidate"):
        Collective("free_sum", dense.dense, dense.time, dense.sent_bytes, auto_candidate="yes")
    register(Collective("free_sum", dense.dense, lambda *args: {"free": 0.0}, dense.sent_bytes, auto_candidate=True))
    try:
        assert default_candidates() == AUTO_CANDIDATES + ("free_sum",)
        assert Auto().candidates == AUTO_CANDIDATES + ("free_sum",)
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="auto",
                                   auto=Auto(cost_params=alphabeta.LinkParams(beta_inter=8 / 10e6), compute_s=0.01))
        opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
        (agg,) = opt.lossy_aggregators()
        assert agg.candidates == list(AUTO_CANDIDATES) + ["free_sum"]
        assert opt.algorithm_at(0) == "free_sum" == agg.candidates[int(agg.active.numpy())]
        assert "diloco" in opt.auto_epochs.tta.candidates   # the default candidates keep the DiLoCo rounds
    finally:
        ALGORITHMS.pop("free_sum")
    assert default_candidates() == AUTO_CANDIDATES


def test_powersgd_at_another_rank_joins_auto_by_registration(rank0_of_2x2, monkeypatch, registry):
    """A candidate at another setting is a registered copy (docs/collectives.md): PowerSGD at rank 1
    beside the default rank 4, with its own residual (and Q) and its own bytes and predicted time. Faster
    on a slow link, it runs first; where its measured efficiency falls under the guard, another runs."""
    import dataclasses

    from tf_commlib import alphabeta
    from tf_commlib.collectives import ALGORITHMS, powersgd, register

    register(dataclasses.replace(powersgd.COLLECTIVE, name="powersgd_r1",
                                 options={**powersgd.COLLECTIVE.options, "rank": 1}, auto_candidate=True))
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="auto",
                               auto=Auto(cost_params=alphabeta.LinkParams(beta_inter=8 / 5e6), compute_s=0.01,
                                         diloco=False))   # the per-step candidates' family alone
    opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
    (agg,) = opt.lossy_aggregators()
    state = {name: int(np.prod(var.shape)) for (_, name), var in agg.residuals.items()}
    assert state["powersgd_r1"] == 500 * 400 + 400 * 1 < state["powersgd"] == 500 * 400 + 400 * 4
    inter = {r: ALGORITHMS[name].sent_bytes(500 * 400, 2, 2, 0.01, shapes=[(500, 400)])["inter"]
             for r, name in ((1, "powersgd_r1"), (4, "powersgd"))}
    assert inter[1] < inter[4]
    epochs = opt.auto_epochs
    times = {c: epochs.communication_s(c, 0.01) for c in ("powersgd", "powersgd_r1")}
    assert times["powersgd_r1"] < times["powersgd"]
    assert opt.algorithm_at(0) == "powersgd_r1"
    step = {c: epochs.step_s(c, 0.01) for c in ("powersgd", "powersgd_r1")}
    from tf_commlib import replicas
    monkeypatch.setattr(replicas, "summed", lambda v: 4 * np.asarray(v, np.float64))   # 4 ranks alike
    epochs.end_epoch(0, step["powersgd_r1"], steps=45)
    assert epochs.tta.efficiency == {"powersgd_r1": 1.0}   # nothing entered the collective here
    opt.set_epoch(1)
    assert opt.algorithm_at(1) == "powersgd_r1"
    low = 0.5 * epochs.tta.guard * step["powersgd_r1"] / step["powersgd"]   # under the guard: counts
    epochs.tta.observe("powersgd_r1", step["powersgd_r1"], step["powersgd_r1"], efficiency=low)
    opt.set_epoch(2)
    assert opt.algorithm_at(2) in ("hitopk", "powersgd")   # tied on this link: the earlier, hitopk


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


def test_the_bucket_size_follows_the_collectives_unless_given(monkeypatch):
    """fusion_threshold_bytes=None: the largest bucket size of the collectives the schedule names
    (25 MB where one is lossy: its fixed costs per bucket; 1 MB for exact ones, which overlap
    backprop); "auto" starts at the exact size and takes a lossy candidate's where that one's timed
    aggregation is the fastest by Auto.switch; the dense-layer group stays at the exact size; a
    given size wins everywhere and is what get_config keeps (None for the default)."""
    from tf_commlib import collectives, fusion
    from tf_commlib.keras import optimizer as module
    from tf_commlib.auto.measure import lossy_bucket_bytes
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


def test_build_calls_no_collective_and_measure_does(rank0_of_2x2, monkeypatch):
    """auto measures the link before the first step (DistributedOptimizer.measure, a collective), never
    in build(): Keras builds a fresh copy of the optimizer on one thread of one rank when it clones a
    compiled model (the DAWNBench script's evaluation copy), where a collective would hang or collide."""
    from tf_commlib import costmodel
    from tf_commlib.auto import measure

    monkeypatch.setattr(measure, "current_topology", lambda: rank0_of_2x2)

    def collective(*args, **kwargs):
        raise AssertionError("a collective")

    monkeypatch.setattr(costmodel, "cached_calibration", collective)
    variables = [keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    clone = keras.models.clone_model(model)   # compiles the clone with a fresh copy, which it builds
    assert clone.optimizer is not model.optimizer and clone.optimizer.built
    fresh = DistributedOptimizer(keras.optimizers.SGD(0.1))
    fresh.build(variables)
    assert fresh.calibrated_link is None
    with pytest.raises(AssertionError, match="a collective"):
        DistributedOptimizer(keras.optimizers.SGD(0.1)).measure(variables)

