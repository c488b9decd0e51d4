"""DistributedOptimizer against numpy implementations of momentum SGD and DGC (lin2018 eqs. 4, 6)."""
import math

import keras
import numpy as np
import pytest

from tests import hvdrun
from tf_commlib.keras import DistributedOptimizer

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


def test_against_numpy(tmp_path):
    reports = hvdrun.run("dgc_worker.py", 2, tmp_path)
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


@pytest.mark.parametrize("kwargs,message", [
    (dict(algorithm="bogus"), "algorithm must be one of"),
    (dict(density=0), r"density must be in \(0, 1\]"),
    (dict(density=-0.5), r"density must be in \(0, 1\]"),
    (dict(schedule={0: "hitopk", 13: "2dtar", 5: "dense"}), "strictly increasing"),
    (dict(schedule={3: "hitopk", 3.5: "dense"}), "integers"),
    (dict(schedule={0: "nope"}), "schedule algorithm must be one of"),
    (dict(warmup=-1), "warmup must be"),
    (dict(selector="x"), "selector must be one of"),
    # every argument is validated, and the message names it
    (dict(momentum=-5), "momentum must be"),
    (dict(momentum=float("nan")), "momentum must be"),
    (dict(momentum=1.5), "momentum must be"),
    (dict(momentum="0.9"), "momentum must be"),
    (dict(fusion_threshold_bytes="a"), "fusion_threshold_bytes must be"),
    (dict(fusion_threshold_bytes=-1), "fusion_threshold_bytes must be"),
    (dict(seed="x"), "seed must be"),
    (dict(seed=1.5), "seed must be"),
    (dict(local_clip_norm=float("nan")), "local_clip_norm must be"),
    (dict(local_clip_norm="1"), "local_clip_norm must be"),
    (dict(warmup=True), "warmup must be"),
    (dict(nesterov="yes"), "nesterov must be"),
    (dict(momentum_correction=1), "momentum_correction must be"),
    (dict(momentum_masking=None), "momentum_masking must be"),
    (dict(qrgc="no"), "qrgc must be"),
    (dict(dense_layers=3), "dense_layers must be"),
    (dict(dense_warmup_epochs="a"), "dense_warmup_epochs must be"),
    (dict(dense_warmup_epochs=-2), "dense_warmup_epochs must be"),
    (dict(name=7), "name must be"),
    (dict(algorithm_options={"hitopk": 3}), "algorithm_options"),
    (dict(overlap="no"), "overlap must be"),
    (dict(cost_params={"beta_inter": 1e-9}), "cost_params must be"),
    (dict(auto_margin=0), r"auto_margin must be a number in \(0, 1\]"),
    (dict(auto_margin=1.5), "auto_margin must be"),
    (dict(auto_margin="0.5"), "auto_margin must be"),
    (dict(auto_compute_s=-1), "auto_compute_s must be None or a finite number of seconds >= 0"),
    (dict(auto_compute_s=float("nan")), "auto_compute_s must be"),
])
def test_bad_configuration_raises_before_training(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **kwargs)


def test_optimizer_argument_must_be_a_keras_optimizer():
    with pytest.raises(ValueError, match="optimizer must be a Keras 3 optimizer"):
        DistributedOptimizer("sgd")


def test_wrapping_one_sgd_twice_is_refused():
    """The first wrap moves the SGD's momentum into the wrapper (and sets the SGD's to 0); a second
    wrap of the same instance would silently train without momentum."""
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    first = DistributedOptimizer(sgd)
    assert first.m == 0.9 and sgd.momentum == 0.0
    with pytest.raises(ValueError, match="already wrapped"):
        DistributedOptimizer(sgd)
    with pytest.raises(ValueError, match="already wrapped"):
        DistributedOptimizer(sgd, momentum=0.9)
    copy = DistributedOptimizer(keras.optimizers.SGD.from_config(sgd.get_config()), momentum=0.9)
    assert copy.m == 0.9


def test_auto_compute_s_reaches_the_aggregators(monkeypatch):
    """On a slow link auto compresses the large bucket; with a forward+backward far longer than the
    exact collectives it keeps every bucket exact, unless overlap=False. The residual variables are
    the same either way (a checkpoint must not depend on a measured time)."""
    from tf_commlib import alphabeta
    from tf_commlib.collectives import ALGORITHMS
    from tf_commlib.keras import optimizer as module
    from tf_commlib.topology import Topology

    two_by_two = Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2))
    monkeypatch.setattr(module, "current_topology", lambda: two_by_two)
    slow = alphabeta.LinkParams(beta_inter=8 / 10e6)

    def built(**kwargs):
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="auto", cost_params=slow,
                                   **kwargs)
        opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
        (agg,) = opt.sparse_aggregators()
        return agg.bucket_algorithms("auto"), sorted(v.name for v in agg.residual_variables())

    picked, residuals = built()
    assert any(ALGORITHMS[a].lossy for a in picked) and residuals
    kept, kept_residuals = built(auto_compute_s=100.0)
    assert not any(ALGORITHMS[a].lossy for a in kept) and kept_residuals == residuals
    assert built(auto_compute_s=100.0, overlap=False) == (picked, residuals)


def test_overlap_and_cost_params_survive_serialisation():
    from tf_commlib.alphabeta import LinkParams

    params = LinkParams(beta_inter=8 / 25e6, compute_curve=((1024, 1e-9, 2e-9, 3e-10),))
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm="auto", overlap=False,
                               cost_params=params, auto_margin=0.8, auto_compute_s=0.25)
    again = DistributedOptimizer.from_config(opt.get_config())
    assert again.overlap is False and again.cost_params == params and again.auto_margin == 0.8
    assert again.auto_compute_s == 0.25 and DistributedOptimizer(keras.optimizers.SGD(0.1)).auto_compute_s is None
    assert DistributedOptimizer(keras.optimizers.SGD(0.1)).overlap is True
    assert DistributedOptimizer(keras.optimizers.SGD(0.1)).auto_margin == 0.5
    old = {k: v for k, v in opt.get_config().items() if k != "auto_margin"}   # saved before the margin
    assert DistributedOptimizer.from_config(old).auto_margin == 1.0          # "auto" was the plain argmin


def test_momentum_correction_needs_a_momentum_for_other_optimizers():
    with pytest.raises(ValueError, match="needs momentum="):
        DistributedOptimizer(keras.optimizers.Adam(0.01))
    opt = DistributedOptimizer(keras.optimizers.Adam(0.01), momentum=0.9)
    assert opt.m == 0.9


def test_warmup_and_schedule_policy():
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), density=0.001, warmup=4,
                               schedule={0: "hitopk", 13: "2dtar"})
    assert [opt.density_at(e) for e in range(6)] == [0.25, 0.0625, 0.015625, 0.004, 0.001, 0.001]
    assert [opt.algorithm_at(e) for e in (0, 12, 13, 27)] == ["hitopk", "hitopk", "2dtar", "2dtar"]
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), density=0.01, warmup=4,
                               dense_warmup_epochs=2)
    assert [opt.density_at(e) for e in range(5)] == [0.25, 0.0625, 0.015625, 0.01, 0.01]
    assert [opt.algorithm_at(e) for e in range(4)] == ["2dtar", "2dtar", "hitopk", "hitopk"]


def test_epoch_policy_applies_from_the_first_step_of_fit(tmp_path):
    for r in hvdrun.run("epoch_policy_worker.py", 2, tmp_path):
        assert r["0"] == [[0.25, "hitopk"]] * 4          # warm-up density from step 0
        assert r["3"] == [[0.01, "naive_ag"]] * 4        # a resumed epoch's density and algorithm
