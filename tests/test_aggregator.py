"""GradientAggregator: round trip of shapes/dtypes/None, sums, tf.function, errors."""
import numpy as np
import pytest

from tf_commlib.aggregator import Auto, ExecutionSettings, GradientAggregator


def test_aggregator_under_horovod(shared):
    reports = shared("2x2", "aggregator")
    from tf_commlib.collectives import ALGORITHMS

    bucketed = {n.removeprefix("bucketed_") for n in reports[0]["cases"] if n.startswith("bucketed_")}
    assert bucketed == set(ALGORITHMS) - {"powersgd"}   # every collective, in several buckets
    for name in reports[0]["cases"]:
        ins = [r["cases"][name]["inputs"] for r in reports]
        divisor = 1 if name.endswith("_sum") else 4
        for r in reports:
            case = r["cases"][name]
            assert case["dtypes"] == [None if i is None else d for i, d in
                                      zip(case["inputs"], ["float32", None, "float32", "float16", "float32"])]
            for pos, out in enumerate(case["outputs"]):
                if ins[0][pos] is None:
                    assert out is None
                    continue
                want = np.sum([np.array(x[pos]) for x in ins], axis=0) / divisor
                assert case["shapes"][pos] == list(np.shape(want))
                np.testing.assert_array_equal(np.array(out), want, err_msg=f"{name} tensor {pos}")
            assert case["outputs"] == reports[0]["cases"][name]["outputs"]
    for r in reports:
        assert r["eager_equals_graph"]
        assert r["sent_forms_agree"]
        assert r["mismatch"] is not None and "gradient shapes differ" in r["mismatch"]
        assert r["auto_mismatch"] is not None and "algorithm candidates" in r["auto_mismatch"], r["auto_mismatch"]
    # a switch under a step traced for one candidate: hitopk's residual enters the first step of the
    # dense trace (the mean over the ranks of each rank's input plus its residual), once
    sw = [r["switched"] for r in reports]
    for pos in range(2):
        want3 = np.sum([np.float32(s["g3"][pos]) + np.float32(s["left"][pos]) for s in sw], axis=0) / 4
        want4 = np.sum([np.float32(s["g4"][pos]) for s in sw], axis=0) / 4
        assert any(np.any(np.float32(s["left"][pos])) for s in sw)   # hitopk at 0.1 left some to flush
        for s in sw:
            np.testing.assert_allclose(s["o3"][pos], want3, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(s["o4"][pos], want4, rtol=1e-6, atol=1e-6)
    assert all(s["zeroed"] and s["planted_kept"] for s in sw)
    # float32 bucket of 12 + 7 + 5000 entries split in shards of 2: residual of 2510; float16 bucket 6 -> 3
    assert reports[0]["state_sizes"] == [2510, 3]


@pytest.mark.parametrize("kwargs,message", [
    (dict(algorithm="bogus"), "algorithm must be one of"),
    (dict(selector="nope"), "selector must be one of"),
    (dict(density=0.0), r"density must be in \(0, 1\], got 0.0"),
    (dict(density=1.5), r"density must be in \(0, 1\], got 1.5"),
    (dict(op="max"), "op must be one of"),
    (dict(auto=dict(margin=0.0)), r"Auto.margin must be a number in \(0, 1\], got 0.0"),
    (dict(auto=dict(margin=True)), "Auto.margin must be"),
    (dict(auto=dict(compute_s=-0.1)), "Auto.compute_s must be None or a finite number of seconds >= 0, got -0.1"),
    (dict(auto=dict(compute_s="1")), "Auto.compute_s must be"),
    (dict(auto=dict(cost_params=1.0)), "Auto.cost_params must be None or a tf_commlib.alphabeta.LinkParams"),
    (dict(execution=dict(overlap=1)), "overlap must be True or False, got 1"),
    (dict(execution=dict(check_consistency=None)), "check_consistency must be True or False"),
    (dict(auto=0.5), "auto must be None or a tf_commlib.aggregator.Auto"),
])
def test_bad_configuration_raises_before_anything_runs(kwargs, message):
    settings = {"auto": Auto, "execution": ExecutionSettings}
    with pytest.raises(ValueError, match=message):
        GradientAggregator(**{k: settings[k](**v) if isinstance(v, dict) else v for k, v in kwargs.items()})


@pytest.mark.parametrize("old,new", [
    ("cost_params", r"auto=Auto\(cost_params=...\)"),
    ("auto_margin", r"auto=Auto\(margin=...\)"),
    ("auto_compute_s", r"auto=Auto\(compute_s=...\)"),
    ("compression", r"algorithm_options=tf_commlib.collectives.with_compression"),
    ("check_consistency", r"execution=ExecutionSettings\(check_consistency=...\)"),
    ("overlap", r"execution=ExecutionSettings\(overlap=...\)"),
    ("track_gain", r"execution=ExecutionSettings\(track_gain=...\)"),
    ("timeline", r"execution=ExecutionSettings\(timeline=...\)"),
    ("timeline_tag", r"execution=ExecutionSettings\(timeline_tag=...\)"),
    ("variable_factory", r"execution=ExecutionSettings\(variable_factory=...\)"),
])
def test_moved_keywords_name_their_new_place(old, new):
    with pytest.raises(TypeError, match=f"{old} is no longer an argument, give {new}"):
        GradientAggregator(**{old: None})


def test_constructor_takes_at_most_ten_arguments():
    import inspect

    assert len(inspect.signature(GradientAggregator.__init__).parameters) - 1 <= 10


def test_bad_sent_form_raises():
    from tf_commlib.topology import Topology

    alone = Topology(m=1, n=1, rank=0, node=0, local=0, intra_ranks=(0,), inter_ranks=(0,))
    with pytest.raises(ValueError, match="sent must be one of"):
        GradientAggregator(topology=alone).aggregate([np.zeros(3, np.float32)], sent="dense")


def test_auto_picks_the_cost_models_minimum():
    from tf_commlib import alphabeta, collectives
    from tf_commlib.collectives import ALGORITHMS
    from tf_commlib.topology import Topology

    topo = Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2))
    slow_inter = alphabeta.LinkParams(beta_inter=8 / 0.1e9)   # 100 Mbit/s between nodes
    agg = GradientAggregator(algorithm="auto", density=0.01, topology=topo,
                             auto=Auto(cost_params=slow_inter, margin=1.0))
    margin = GradientAggregator(algorithm="auto", density=0.01, topology=topo, auto=Auto(slow_inter))
    assert margin.auto.margin == collectives.AUTO_MARGIN == 0.5 and margin.twin().auto.margin == 0.5
    for d in (1_000, 100_000, 1_000_000, 25_000_000):
        predicted = {a: collectives.predict(a, d, 2, 2, 0.01, slow_inter) for a in ALGORITHMS}
        assert agg.chooser.resolve("auto", d) == min(predicted, key=predicted.get)
        # the default: a lossy collective only where it takes at most half the fastest exact one's time
        exact = min(("dense", "2dtar"), key=predicted.get)
        best = min(predicted, key=predicted.get)
        lossy_wins = ALGORITHMS[best].lossy and predicted[best] <= 0.5 * predicted[exact]
        assert margin.chooser.resolve("auto", d) == (best if lossy_wins else exact)
    assert agg.chooser.resolve("hitopk", 10) == "hitopk"


def test_auto_keeps_buckets_exact_unless_compression_halves_the_overlapped_step():
    """A slow link on which the margin picks a lossy collective per bucket: with auto_compute_s, a
    step takes about max(compute, communication), and auto keeps every bucket exact unless its
    choice makes that at most Auto.margin x the all-exact step; without overlap it chooses per
    bucket as before."""
    import tensorflow as tf

    from tf_commlib import alphabeta, collectives
    from tf_commlib.collectives import ALGORITHMS
    from tf_commlib.topology import Topology

    topo = Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2))
    slow = alphabeta.LinkParams(beta_inter=8 / 10e6)   # 10 Mbit/s between nodes
    shapes = [((500, 400), tf.float32), ((300, 300), tf.float32), ((64,), tf.float32)]

    def built(auto_compute_s=None, overlap=True):
        agg = GradientAggregator(algorithm="auto", density=0.01, topology=topo, fusion_threshold_bytes=1 << 20,
                                 auto=Auto(cost_params=slow, compute_s=auto_compute_s),
                                 execution=ExecutionSettings(overlap=overlap))
        agg.build(shapes)
        return agg

    plain = built()
    picked = plain.bucket_algorithms("auto")
    assert any(ALGORITHMS[a].lossy for a in picked), picked   # the margin alone compresses here
    exact_s = sum(min(collectives.predict(a, sum(b.sizes), 2, 2, 0.01, slow, None, b.shapes)
                      for a in ("dense", "2dtar")) for b in plain.buckets)
    assert built(auto_compute_s=0.0).bucket_algorithms("auto") == picked
    assert built(auto_compute_s=exact_s * 0.45).bucket_algorithms("auto") == picked   # the step halves
    for compute_s in (exact_s * 0.55, exact_s * 2):   # less than halved; communication hidden
        kept = built(auto_compute_s=compute_s)
        assert all(not ALGORITHMS[a].lossy for a in kept.bucket_algorithms("auto")), compute_s
        assert kept.twin().auto.compute_s == compute_s
        assert kept.bucket_algorithms("hitopk") == ["hitopk"] * len(kept.buckets)   # only "auto" is affected
    assert built(auto_compute_s=exact_s * 2, overlap=False).bucket_algorithms("auto") == picked
