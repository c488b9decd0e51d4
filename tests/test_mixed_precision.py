"""Mixed precision: DistributedOptimizer inside a LossScaleOptimizer whose finite check is global."""
import keras
import numpy as np
import pytest

import tf_commlib.keras as tk
from tests import hvdrun

# one thread per op: the ranks share 2 cores here (tracing the 10 collectives took 1.5x as long without)
THREADS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}
ALGORITHMS = ["dense", "2dtar", "hitopk", "ssar_rd", "ssar_split_ag", "dsar_split_ag",
              "star", "var", "star_hier", "var_hier"]


@pytest.fixture
def float16_policy():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_distributed_optimizer_is_found_through_wrappers(float16_policy):
    opt = tk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(opt, "mse")
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer   # Keras' own wrap
    assert tk.distributed_optimizer(model) is opt and tk.distributed_optimizer(model.optimizer) is opt
    assert tk.distributed_optimizer(opt) is opt
    wrapped = model.optimizer
    tk.global_loss_scale(model)   # a tf_commlib one around the same optimizer: its finite check is global
    assert type(model.optimizer) is tk.LossScaleOptimizer and model.optimizer.inner_optimizer is opt
    assert (model.optimizer.initial_scale, model.optimizer.name) == (wrapped.initial_scale, wrapped.name)
    again = model.optimizer
    tk.global_loss_scale(model)
    assert model.optimizer is again
    with pytest.raises(ValueError, match="model_or_optimizer has no DistributedOptimizer"):
        tk.distributed_optimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(ValueError, match="model_or_optimizer has no DistributedOptimizer"):
        tk.distributed_optimizer("sgd")


def test_with_loss_scale_puts_the_loss_scaling_outside():
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    keras_lso = keras.optimizers.LossScaleOptimizer(sgd, initial_scale=512.0, dynamic_growth_steps=7)
    with pytest.raises(ValueError, match="use tf_commlib.keras.with_loss_scale"):
        tk.DistributedOptimizer(keras_lso)
    opt = tk.with_loss_scale(keras_lso, algorithm="hitopk", density=0.05)
    assert type(opt) is tk.LossScaleOptimizer
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (512.0, 7)
    dist = opt.inner_optimizer
    assert type(dist) is tk.DistributedOptimizer and dist.inner_optimizer.momentum == 0.0
    assert (dist.algorithm, dist.target_density, dist.m, sgd.momentum) == ("hitopk", 0.05, 0.9, 0.9)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(again) is tk.LossScaleOptimizer and type(again.inner_optimizer) is tk.DistributedOptimizer
    assert again.initial_scale == 512.0 and again.inner_optimizer.algorithm == "hitopk"


def test_bad_loss_scale_arguments_are_refused():
    built = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    built.build([keras.Variable(np.ones(3, np.float32))])
    with pytest.raises(ValueError, match="optimizer is a LossScaleOptimizer that has already been built"):
        tk.with_loss_scale(built)
    with pytest.raises(ValueError, match="optimizer must be a keras.optimizers.LossScaleOptimizer"):
        tk.with_loss_scale(keras.optimizers.SGD(0.1))
    opt = tk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="loss_scale_factor"):
        opt.loss_scale_factor = 128.0
    keras.optimizers.LossScaleOptimizer(opt)   # Keras' per-rank wrapper: seen, its apply() is refused
    assert opt._wrapped_by_loss_scale and not tk.DistributedOptimizer(keras.optimizers.SGD(0.1))._wrapped_by_loss_scale


def test_one_rank_overflowing_skips_the_step_on_every_rank(tmp_path):
    """4 ranks as 2 nodes x 2, mixed_float16 with Keras' own wrap; one epoch per collective, and at
    step 1 of each rank 0 alone overflows: no hang, every rank skips that step (iterations, weights,
    DGC momentum and residuals unchanged; loss scale halved everywhere), replicas stay identical.
    Then the same for the sharded update (shard_optimizer=True)."""
    reports = hvdrun.run("mixed_precision_worker.py", 4, tmp_path, args=["collectives"], topology="2x2",
                         timeout=300, env=THREADS)
    for r in reports:
        assert r["optimizer_type"] == "tf_commlib.keras.loss_scale.LossScaleOptimizer"
        assert [e["algorithm"] for e in r["epochs"]] == ALGORITHMS
        for e in r["epochs"]:
            assert e["iterations"][0] == e["iterations"][1], e
            assert e["scale"][1] == e["scale"][0] / 2, e
            assert e["weights_unchanged"] and e["state_unchanged"] and e["state_finite"], e
        assert r["iterations"] == len(ALGORITHMS) * 3   # the other 3 steps of each epoch applied
        assert r["scale"] == 2.0 ** 15 / 2 ** len(ALGORITHMS)
        assert r["state_finite"]
    assert len({r["weights"] for r in reports}) == 1
    assert reports[0]["epochs"] == reports[1]["epochs"] == reports[3]["epochs"]
    # the sharded update (ZeRO-1) under the same wrap: skipped together, its state slices untouched
    # and over a node's ranks (hitopk, then 2dtar)
    for key, algorithms, share in (("sharded", ["2dtar", "2dtar"], 0.25), ("sharded_node", ["hitopk", "2dtar"], 0.5)):
        for r in reports:
            s = r[key]
            assert s["optimizer_type"] == "tf_commlib.keras.loss_scale.LossScaleOptimizer"
            assert [e["algorithm"] for e in s["epochs"]] == algorithms
            for e in s["epochs"]:
                assert e["iterations"][0] == e["iterations"][1] and e["scale"][1] == e["scale"][0] / 2, e
                assert e["weights_unchanged"] and e["state_unchanged"] and e["state_finite"], e
            assert s["iterations"] == 2 * 3 and s["scale"] == 2.0 ** 15 / 4
            assert share <= s["state_bytes"] / s["unsharded_state_bytes"] <= share + 0.02, key
        assert len({r[key]["weights"] for r in reports}) == 1, key


def test_loss_scale_forms_and_bfloat16_train(tmp_path):
    r0, r1 = hvdrun.run("mixed_precision_worker.py", 2, tmp_path, args=["forms"], timeout=240, env=THREADS)
    for r in (r0, r1):
        w = r["wrapped"]
        assert w["type"] == "tf_commlib.keras.loss_scale.LossScaleOptimizer"
        assert w["compiled_is_it"] and w["inner_type"] == "SGD"
        assert w["iterations"] == 12 and w["scale"] == 256.0 * 2 ** 4   # grown every 3 finite steps
        assert np.isfinite(w["loss"]).all() and w["loss"][-1] < 0.9 * w["loss"][0]
        assert w["profiled"] == [0.1, 0.02] and len(w["adaptive"]) == 3   # (its snapshot restores the scale)
        refused = r["plain_loss_scale"]   # (Keras wraps the message: raised inside its cond)
        assert refused.startswith("ValueError") and "optimizer: this DistributedOptimizer is wrapped" in refused
        assert "per rank" in refused
        # a finite gradient on every rank whose fp16 sum overflows: skipped everywhere (scale halved)
        assert r["fp16_sum_overflow"] == [{"var": [1.0] * 4, "scale": 1.0, "iterations": 0},
                                          {"var": [1.0] * 4, "scale": 0.5, "iterations": 0},
                                          {"var": [0.0] * 4, "scale": 0.5, "iterations": 1}]
        b = r["bf16"]
        assert b["optimizer_is_it"] and b["compute_dtype"] == "bfloat16" and b["iterations"] == 12
        assert np.isfinite(b["loss"]).all() and b["loss"][-1] < 0.9 * b["loss"][0]
    assert r0["wrapped"]["weights"] == r1["wrapped"]["weights"]
    assert r0["bf16"]["weights"] == r1["bf16"]["weights"]
