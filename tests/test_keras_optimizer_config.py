"""DistributedOptimizer's arguments: each validated before training, the keyword-only API and the new
place of old keywords, the wrapped optimizer left unchanged and wrapped once, the stepping copy's
learning rate and weight decay, and configs (de)serialised, old flat ones included."""
import keras
import numpy as np
import pytest

from tf_commlib.keras import DGC, Auto, DistributedOptimizer, Schedule, Selection


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
