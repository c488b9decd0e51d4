"""The collective interface: the link-byte convention by hand, the registry, algorithm_options
validation, and (under horovodrun) what the aggregator and the optimizer pass to a collective."""
import dataclasses

import keras
import numpy as np
import pytest

from tf_commlib import link_bytes
from tf_commlib.aggregator import GradientAggregator
from tf_commlib.collectives import ALGORITHMS, Collective, dense, register, resolve_algorithm_options
from tf_commlib.keras import DistributedOptimizer


def test_per_rank_by_hand():
    # 2x2 world ring: ranks 1 -> 2 and 3 -> 0 cross nodes, so half of 2*3/4*400 B per rank
    assert link_bytes.per_rank("allreduce", 400, "world", 2, 2) == {"intra": 300, "inter": 300}
    assert link_bytes.per_rank("allreduce", 400, "world", 1, 4) == {"intra": 600, "inter": 0}
    assert link_bytes.per_rank("allreduce", 400, "world", 3, 1) == pytest.approx({"intra": 0, "inter": 2 * 2 / 3 * 400})
    assert link_bytes.per_rank("reducescatter", 400, "world", 2, 4) == pytest.approx({"intra": 7 / 8 * 400 * 3 / 4,
                                                                            "inter": 7 / 8 * 400 / 4})
    # allgather on 2x4: 3 copies to the own node, 4 to the other; the intra/inter sets
    assert link_bytes.per_rank("allgather", 10, "world", 2, 4) == {"intra": 30, "inter": 40}
    assert link_bytes.per_rank("allgather", 10, "intra", 2, 4) == {"intra": 30, "inter": 0}
    assert link_bytes.per_rank("allgather", 10, "inter", 2, 4) == {"intra": 0, "inter": 10}
    assert link_bytes.per_rank("alltoall", 10, "world", 2, 4) == {"intra": 30, "inter": 40}
    # broadcast: one root in 8 sends 7 copies
    assert link_bytes.per_rank("broadcast", 8, "world", 2, 4) == {"intra": 3, "inter": 4}
    assert link_bytes.add({"intra": 1, "inter": 2}, {"intra": 3, "inter": 4}) == {"intra": 4, "inter": 6}
    for bad in (("gather", 1, "world", 2, 2), ("allgather", 1, "node", 2, 2)):
        with pytest.raises(ValueError):
            link_bytes.per_rank(*bad)


def test_hitopk_and_dense_bytes_by_hand():
    # 2x2, d = 1M, 1 %: s = 500k, k~ = 5000. Step 1 sends (n-1)/n of 4*n*s, step 3 one 8-byte
    # entry per selected element to the other node, step 4 the m*k~ sparse entries (2*m*rho < 1)
    # and the k~ sent indices to the node's other rank.
    got = ALGORITHMS["hitopk"].sent_bytes(1_000_000, 2, 2, 0.01)
    assert got == {"intra": 2_000_000 + 8 * 2 * 5000 + 4 * 5000, "inter": 8 * 5000}
    dense4 = ALGORITHMS["hitopk"].sent_bytes(1_000_000, 2, 2, 0.01, {"step4": "dense"})
    assert dense4 == {"intra": 2_000_000 + 4 * 500_000 + 4 * 5000, "inter": 8 * 5000}
    assert ALGORITHMS["dense"].sent_bytes(1_000_000, 2, 2, 0.01) == {"intra": 3e6, "inter": 3e6}
    assert ALGORITHMS["2dtar"].sent_bytes(1_000_000, 2, 2, 0.01) == {"intra": 4e6, "inter": 2e6}
    assert ALGORITHMS["naive_ag"].sent_bytes(1_000_000, 2, 2, 0.01) == {"intra": 80_000, "inter": 160_000}
    # a one-rank job sends nothing
    assert all(ALGORITHMS[a].sent_bytes(1000, 1, 1, 0.1) == {"intra": 0, "inter": 0} for a in ALGORITHMS)


def test_sparcml_bytes_by_hand():
    """The bytes from the ranks' actual index sets (2x2, d = 16, P' = 4, slices of 4 entries; 8 bytes
    per entry), for identical and for disjoint index sets, where the fill-in is known exactly."""
    same, disjoint = [np.array([1, 5, 9, 13])] * 4, [np.array([r, 4 + r, 8 + r, 12 + r]) for r in range(4)]
    rd, split, dsar = (ALGORITHMS[a] for a in ("ssar_rd", "ssar_split_ag", "dsar_split_ag"))
    # rd: round 0 inside the node (4 ranks x 4 entries), round 1 across (4 x 4 same, 4 x 8 disjoint)
    assert rd.sent_bytes_for(same, 16, 2, 2, 0.25) == {"intra": 32, "inter": 32}
    assert rd.sent_bytes_for(disjoint, 16, 2, 2, 0.25) == {"intra": 32, "inter": 64}
    # split: each rank sends its 3 entries of the other slices (1 in the own node), then each owner
    # gathers its slice (1 entry same, 4 disjoint) to 1 rank in its node and 2 in the other
    assert split.sent_bytes_for(same, 16, 2, 2, 0.25) == {"intra": 8 + 8 * 1 / 1, "inter": 16 + 16}
    assert split.sent_bytes_for(disjoint, 16, 2, 2, 0.25) == {"intra": 8 + 32, "inter": 16 + 64}
    # dsar: a 4-byte header per slice; 4 entries > delta = 2 go dense (16 bytes, the same as 4 x 4)
    assert dsar.sent_bytes_for(same, 16, 2, 2, 0.25) == {"intra": 8 + 12, "inter": 16 + 24}
    assert dsar.sent_bytes_for(disjoint, 16, 2, 2, 0.25) == {"intra": 8 + 20, "inter": 16 + 40}
    assert dsar.sent_bytes_for(disjoint, 16, 2, 2, 0.25, {"delta": 4}) == {"intra": 8 + 36, "inter": 16 + 72}


def test_sparcml_expected_bytes_are_the_mean_over_random_index_sets():
    """sent_bytes (the fill-in E[K] = L(1 - (1 - k/d)^j)) is the mean of the actual bytes over
    independent uniformly random index sets (3x1 folds onto 2 ranks)."""
    rng = np.random.default_rng(0)
    d, k = 400, 40
    for name in ("ssar_rd", "ssar_split_ag"):
        for m, n in ((2, 2), (3, 1), (1, 5)):
            coll = ALGORITHMS[name]
            samples = [coll.sent_bytes_for([rng.choice(d, k, replace=False) for _ in range(m * n)], d, m, n, 0.1)
                       for _ in range(300)]
            mean = {link: np.mean([s[link] for s in samples]) for link in link_bytes.LINKS}
            assert mean == pytest.approx(coll.sent_bytes(d, m, n, 0.1), rel=0.02), (name, m, n)


def test_registry_rejects_bad_collectives():
    with pytest.raises(ValueError, match="already registered"):
        register(dense.COLLECTIVE)
    with pytest.raises(ValueError, match="already registered"):
        register(Collective("auto", dense.dense, dense.time, dense.sent_bytes))
    with pytest.raises(TypeError, match="state_size"):
        Collective("half", dense.dense, dense.time, dense.sent_bytes, lossy=True)
    with pytest.raises(TypeError):
        register(dense)
    for scale, lossy in ((0, True), (1.5, True), (True, True), ("0.1", True), (0.5, False)):
        with pytest.raises(TypeError, match="density_scale must be a number in"):
            coll = ALGORITHMS["hitopk"] if lossy else dense.COLLECTIVE
            dataclasses.replace(coll, name="x", density_scale=scale)


def test_a_setting_is_a_registered_copy_named_by_its_changes(registry):
    from tf_commlib.collectives import setting

    assert setting("hitopk") == "hitopk"
    assert setting("powersgd:rank=1") == setting("powersgd:rank=1") == "powersgd_rank_1"
    assert registry["powersgd_rank_1"].options == {**registry["powersgd"].options, "rank": 1}
    assert setting("hitopk:value_codec=fp16,density_scale=0.1") == "hitopk_density_scale_0.1_value_codec_fp16"
    copy = registry["hitopk_density_scale_0.1_value_codec_fp16"]
    assert copy.density_scale == 0.1 and copy.options["value_codec"] == "fp16"
    assert copy.fn is registry["hitopk"].fn
    for spec, match in (("nope:rank=1", "unknown collective 'nope'"), ("powersgd:rank", "expected BASE:KEY=VALUE"),
                        ("powersgd:bogus=1", r"unknown option\(s\) \['bogus'\]"), ("powersgd:rank=0", "rank"),
                        ("dense:density_scale=0.5", "density_scale must be"), ("", "a name or BASE:KEY=VALUE")):
        with pytest.raises(ValueError, match=match):
            setting(spec)
    register(dataclasses.replace(registry["hitopk"], name="powersgd_rank_2"))
    with pytest.raises(ValueError, match="another collective is registered as 'powersgd_rank_2'"):
        setting("powersgd:rank=2")


def test_a_copy_at_a_density_scale_is_predicted_and_counted_at_the_scaled_density():
    half = dataclasses.replace(ALGORITHMS["hitopk"], name="hitopk_half", density_scale=0.5)
    assert half.scaled(0.02) == 0.01 and ALGORITHMS["hitopk"].scaled(0.02) == 0.02
    assert half.sent_bytes(10_000, 2, 2, 0.02) == ALGORITHMS["hitopk"].sent_bytes(10_000, 2, 2, 0.01)
    assert half.breakdown(10_000, 2, 2, 0.02) == ALGORITHMS["hitopk"].breakdown(10_000, 2, 2, 0.01)
    assert half.sent_bytes(10_000, 2, 2, 0.02) != ALGORITHMS["hitopk"].sent_bytes(10_000, 2, 2, 0.02)


@pytest.mark.parametrize("options,message", [
    ({"bogus": {}}, r"unknown algorithm\(s\) \['bogus'\]"),
    ({"hitopk": {"step4": "x"}}, "step4"),
    ({"dense": {"delta": 1}}, r"dense takes \['compression'\]"),
    ({"dense": {"compression": "int3"}}, r"\['dense'\]\['compression'\] must be one of"),
    ({"2dtar": {"compression": None}}, r"\['2dtar'\]\['compression'\] must be one of"),
    ({"powersgd": {"rank": 0}}, r"\['powersgd'\]\['rank'\] must be an int >= 1"),
    ({"powersgd": {"rank": 2.0}}, r"\['powersgd'\]\['rank'\]"),
    ({"powersgd": {"min_compression_size": True}}, r"\['powersgd'\]\['min_compression_size'\]"),
    ([("hitopk", {})], "algorithm_options must be a dict"),
    ({"dsar_split_ag": {"qsgd_bits": 3}}, "qsgd_bits"),
    ({"dsar_split_ag": {"qsgd_bits": 4.0}}, "qsgd_bits"),
    ({"dsar_split_ag": {"delta": 0}}, "delta"),
    ({"dsar_split_ag": {"delta": -2.5}}, "delta"),
    ({"dsar_split_ag": {"bits": 4}}, r"unknown option\(s\) \['bits'\]"),
    ({"ssar_rd": {"delta": 1}}, r"ssar_rd takes \['value_codec'\]"),
    ({"ssar_split_ag": {"value_codec": "mean"}}, "value_codec"),
    ({"dsar_split_ag": {"value_codec": "int3"}}, "value_codec"),
])
def test_bad_algorithm_options_raise_before_anything_runs(options, message):
    with pytest.raises(ValueError, match=message):
        resolve_algorithm_options(options)
    with pytest.raises(ValueError, match=message):
        GradientAggregator("hitopk", algorithm_options=options)
    with pytest.raises(ValueError, match=message):
        DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm_options=options)


def test_options_are_filled_in_and_serialised():
    assert resolve_algorithm_options({"hitopk": {}}) == {"hitopk": {"step4": "auto", "value_codec": "none"}}
    assert resolve_algorithm_options({"dsar_split_ag": {"qsgd_bits": 8}}) == \
        {"dsar_split_ag": {"delta": None, "qsgd_bits": 8, "value_codec": "none"}}
    sparcml = DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="dsar_split_ag",
                                   algorithm_options={"dsar_split_ag": {"delta": 100, "qsgd_bits": 2}})
    assert DistributedOptimizer.from_config(sparcml.get_config()).algorithm_options == \
        {"dsar_split_ag": {"delta": 100, "qsgd_bits": 2}}
    for name in ("ssar_rd", "ssar_split_ag", "dsar_split_ag"):
        assert DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm=name).algorithm == name
    assert dict(ALGORITHMS["hitopk"].context(options={"step4": "dense"}).options) == \
        {"step4": "dense", "value_codec": "none"}
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                               algorithm_options={"hitopk": {"step4": "sparse"}})
    again = DistributedOptimizer.from_config(opt.get_config())
    assert again.algorithm_options == {"hitopk": {"step4": "sparse"}}


def test_context_reaches_the_collective_and_bytes_match(shared):
    reports = shared("2x2", "interface")
    for mode in ("eager", "graph"):
        for r in reports:
            case = r[mode]
            assert case["buckets"] == 2 and case["options"] == {"tag": mode}
            for step, row in enumerate(case["rows"]):
                assert row["steps"] == [step, step]   # the step at run time, in both buckets
                assert row["seeds"] == [5 + step * 1_000_003 + b * 7919 for b in (0, 1)]   # same on all ranks
                want = [np.sum([np.array(q[mode]["rows"][step]["inputs"][t]) for q in reports], axis=0)
                        for t in range(2)]
                for got, w in zip(row["results"], want):
                    np.testing.assert_array_equal(got, w)
    for r in reports:
        assert r["optimizer_options"] == {"tag": "opt"}
        # one bucket of 40 + 30 floats through probe, whose byte formula is dense's
        assert r["optimizer_sent"] == ALGORITHMS["dense"].sent_bytes(70, 2, 2, 0.01)
    for name in reports[0]["sent"]:
        formula = reports[0]["sent"][name]["formula"]
        assert all(r["sent"][name]["formula"] == formula for r in reports)
        counted = {link: sum(r["sent"][name]["counted"][link] for r in reports) for link in link_bytes.LINKS}
        assert counted == pytest.approx({link: 4 * formula[link] for link in link_bytes.LINKS}, rel=1e-12), name
    assert reports[0]["sent"]["hitopk"]["formula"]["intra"] < reports[0]["sent"]["hitopk_dense4"]["formula"]["intra"]
    for r in reports:   # a copy at density_scale 0.5 runs at half the density it is given: the same bits and bytes
        assert r["sent"]["hitopk_half"]["result"] == r["sent"]["hitopk_0.1"]["result"]
        half, tenth = r["sent"]["hitopk_half"]["formula"], r["sent"]["hitopk_0.1"]["formula"]
        assert half == tenth != r["sent"]["hitopk"]["formula"]
    for name, steps in reports[0]["sparcml"].items():   # SparCML through the aggregator, density 1
        for step, result in enumerate(steps):
            want = [np.sum([np.array(q["graph"]["rows"][step]["inputs"][t]) for q in reports], axis=0)
                    for t in range(2)]
            for r in reports:
                assert r["sparcml"][name][step] == result, name   # the same bits on every rank
            for got, w in zip(result, want):
                if name == "dsar_qsgd":   # 2-bit QSGD: levels -1, 0, 1 times the bucket's norm
                    assert not np.array_equal(got, w) and np.all(np.abs(got) <= np.linalg.norm(w) * (1 + 1e-6))
                else:
                    np.testing.assert_array_equal(got, w, err_msg=name)


def test_library_code_runs_without_autograph_inside_a_users_tf_function():
    """A tf.function that calls the aggregator must not have AutoGraph convert the library (it took
    ~20 s per process): inside it, a collective's fn and the aggregator frame that calls it are the
    original Python functions, not AutoGraph's generated copies (which live in other files)."""
    import os
    import sys

    import tensorflow as tf

    from tf_commlib.aggregator import gradient_aggregator as aggregator_module
    from tf_commlib.topology import Topology

    frames, tf_dir = [], os.path.dirname(tf.__file__)

    def probe(x, topo, ctx=None):
        caller = sys._getframe(1)
        while caller.f_code.co_filename.startswith(tf_dir):   # do_not_convert's wrapper
            caller = caller.f_back
        frames.append((sys._getframe(0).f_code.co_filename, caller.f_code.co_filename))
        if x.shape[0] > 0:   # Python control flow on static values only, as in the library
            x = x * 1.0
        return tf.identity(x)   # the sum over this one rank

    coll = register(Collective("plain_probe", probe, dense.time, dense.sent_bytes, options=dense.COLLECTIVE.options,
                               check_options=dense.COLLECTIVE.check_options))
    try:
        one = Topology(m=1, n=1, rank=0, node=0, local=0, intra_ranks=(0,), inter_ranks=(0,))
        agg = GradientAggregator("plain_probe", density=1.0, op="sum", topology=one)
        out = tf.function(lambda gs: agg(gs))([tf.constant([1.0, 2.0]), tf.constant([[3.0]])])
        np.testing.assert_array_equal(out[0].numpy(), [1.0, 2.0])
        assert frames and all(f == (__file__, aggregator_module.__file__) for f in frames), frames
        # wrapping is idempotent, and fn must be callable
        from tf_commlib.collectives.interface import plain_python
        assert plain_python(coll.fn) is coll.fn
        with pytest.raises(TypeError, match="fn must be callable"):
            Collective("nofn", None, dense.time, dense.sent_bytes)
    finally:
        del ALGORITHMS["plain_probe"]
