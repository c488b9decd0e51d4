"""The value codec of sparse messages (tf_commlib/collectives/value_codec.py): against numpy in one
process, and (under horovodrun, 2x2) every collective that sends sparse messages with each codec."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_commlib.aggregator import GradientAggregator
from tf_commlib.collectives import ALGORITHMS, resolve_algorithm_options
from tf_commlib.collectives import value_codec
from tf_commlib.keras import DistributedOptimizer

CODEC_ALGORITHMS = ("naive_ag", "hitopk")


def test_quantise_against_numpy():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 10 ** rng.uniform(-6, 4, 1000)).astype(np.float32)
    np.testing.assert_array_equal(value_codec.get("none").quantise(tf.constant(x)).numpy(), x)
    np.testing.assert_array_equal(value_codec.get("fp16").quantise(tf.constant(x)).numpy(),
                                  x.astype(np.float16).astype(np.float32))
    mean = value_codec.get("mean").quantise(tf.constant(x)).numpy()
    assert np.all(mean == mean[0]) and mean[0] == pytest.approx(np.mean(x.astype(np.float64)), rel=1e-5)
    for value in (0.1, -3.7e-5, 123.456):   # qRGC's k copies of one mean come back bit-exactly
        same = np.full(7, value, np.float32)
        np.testing.assert_array_equal(value_codec.get("mean").quantise(tf.constant(same)).numpy(), same)
    assert value_codec.get("mean").quantise(tf.zeros([0])).shape == [0]


@pytest.mark.parametrize("counts", [(3, 0, 5), (1,), (0, 0), (4, 4, 1, 2)])
def test_mean_messages_round_trip(counts):
    """Messages of several parts each, concatenated as an allgather does, decode to the parts'
    values and indices in order, with part = sender * parts + own part; bytes = its bytes formula."""
    rng = np.random.default_rng(len(counts))
    parts, senders = len(counts), 2
    messages, want_v, want_i, want_p = [], [], [], []
    for s in range(senders):
        value = rng.standard_normal(parts).astype(np.float32)
        part = np.repeat(np.arange(parts), counts).astype(np.int32)
        perm = rng.permutation(part.size)   # the encoder orders entries by part, stably
        idx = rng.integers(0, 1 << 30, part.size).astype(np.int32)
        rows = value_codec.get("mean").encode(tf.constant(value[part][perm]), tf.constant(idx[perm]),
                                   tf.constant(part[perm]), parts).numpy()
        assert rows.dtype == np.uint8 and rows.size == value_codec.get("mean").bytes(part.size, parts)
        messages.append(rows)
        order = np.argsort(part[perm], kind="stable")
        want_v.append(value[part][perm][order])
        want_i.append(idx[perm][order])
        want_p.append(part[perm][order] + s * parts)
    got_v, got_i, got_p = value_codec.get("mean").decode(tf.constant(np.concatenate(messages)),
                                                 segments=senders * parts)
    np.testing.assert_array_equal(got_v.numpy(), np.concatenate(want_v))
    np.testing.assert_array_equal(got_i.numpy(), np.concatenate(want_i))
    np.testing.assert_array_equal(got_p.numpy(), np.concatenate(want_p))


def test_bytes_per_entry():
    assert [value_codec.get(c).entry_bytes for c in value_codec.CODECS] == [8, 6, 4]
    assert value_codec.get("none").bytes(10) == 80 and value_codec.get("fp16").bytes(10) == 60
    assert value_codec.get("mean").bytes(10) == 48 and value_codec.get("mean").bytes(10, parts=3) == 64
    # naive_ag on 2x2, d = 1M, 1 %: 10k entries to 1 rank in the node and 2 in the other
    for codec, per_entry in (("none", 8), ("fp16", 6)):
        got = ALGORITHMS["naive_ag"].sent_bytes(1_000_000, 2, 2, 0.01, {"value_codec": codec})
        assert got == {"intra": per_entry * 10_000, "inter": 2 * per_entry * 10_000}
    assert ALGORITHMS["naive_ag"].sent_bytes(1_000_000, 2, 2, 0.01, {"value_codec": "mean"}) == \
        {"intra": 40_008, "inter": 80_016}
    # hitopk: steps 3 and 4 shrink with the codec, step 1 and the sent indices do not
    none, fp16, mean = (ALGORITHMS["hitopk"].sent_bytes(1_000_000, 2, 2, 0.01, {"value_codec": c})
                        for c in value_codec.CODECS)
    assert none == {"intra": 2_000_000 + 8 * 2 * 5000 + 4 * 5000, "inter": 8 * 5000}
    assert fp16 == {"intra": 2_000_000 + 6 * 2 * 5000 + 4 * 5000, "inter": 6 * 5000}
    assert mean == {"intra": 2_000_000 + 4 * 2 * 5000 + 16 + 4 * 5000, "inter": 4 * 5000 + 8}
    for name in CODEC_ALGORITHMS:   # and the predicted time with it
        t = [sum(ALGORITHMS[name].breakdown(1 << 22, 2, 2, 0.01, options={"value_codec": c}).values())
             for c in value_codec.CODECS]
        assert t[0] > t[1] > t[2], (name, t)


@pytest.mark.parametrize("name", CODEC_ALGORITHMS)
@pytest.mark.parametrize("codec", ["fp32", "FP16", None, 16, ""])
def test_bad_value_codec_raises_before_training(name, codec):
    options = {name: {"value_codec": codec}}
    with pytest.raises(ValueError, match="value_codec"):
        resolve_algorithm_options(options)
    with pytest.raises(ValueError, match="value_codec"):
        GradientAggregator(name, algorithm_options=options)
    with pytest.raises(ValueError, match="value_codec"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm=name, algorithm_options=options)


def test_mean_refuses_int64_indices():
    """Selectors give int64 indices only for buckets of 2^31 entries or more, which the mean codec's
    int32 words cannot address: a clear error instead of wrapped indices (checked before any send)."""
    with pytest.raises(ValueError, match="value_codec 'mean'.*2\\^31"):
        value_codec.get("mean").allgather(tf.ones([3]), tf.constant([0, 1, 2**31], tf.int64), None)


def test_value_codec_defaults_to_none():
    for name in CODEC_ALGORITHMS:
        assert ALGORITHMS[name].resolve_options()["value_codec"] == "none"


def _decoded(values, codec):
    """numpy reference of what receivers decode (the mean only to float32 rounding)."""
    v = np.asarray(values, np.float32)
    if codec == "fp16":
        return v.astype(np.float16).astype(np.float32)
    if codec == "mean":
        return np.full_like(v, v[0] + np.mean(v.astype(np.float64) - v[0])) if v.size else v
    return v


def _reference(name, selected, codec):
    """The dense sum of the ranks' decoded messages (2x2), in the collective's order: naive_ag in
    rank order; hitopk the ranks of each local index in node order at their shard's place; SparCML
    with every sent stream rounded (ssar_rd: (r0 + r1) + (r2 + r3), each pair's sum rounded before
    round 1; the split variants: each slice summed in rank order, rounded by its owner)."""
    dense = []
    for r, (values, indices) in enumerate(selected):
        x = np.zeros(D, np.float32)
        offset = (r % 2) * (D // 2) if name == "hitopk" else 0
        np.add.at(x, np.asarray(indices, np.int64) + offset, _decoded(values, codec))
        dense.append(x)
    rnd = (lambda v: _decoded(v, codec)) if name in ("ssar_rd", "ssar_split_ag", "dsar_split_ag") else (lambda v: v)
    if name == "ssar_rd":
        return rnd(dense[0] + dense[1]) + rnd(dense[2] + dense[3])
    out = np.zeros(D, np.float32)
    for x in dense:
        out += x
    return rnd(out)


D, STEPS = 1000, 2


def test_codecs_in_every_collective_on_2x2(shared):
    """Every codec in naive_ag, hitopk (both step 4s), ssar_rd, ssar_split_ag and dsar_split_ag's
    sparse phase: the numpy reference bit for bit (the mean to rounding), on every rank; error
    feedback conserves mass; bytes counted in the primitives == declared bytes; qRGC's constant
    values through "mean" == "none" exactly; hitopk's value_codec end to end."""
    reports = shared("2x2", "codec")
    total_input = np.sum([np.sum(np.array(r["inputs"], np.float64)[:STEPS], axis=0) for r in reports], axis=0)
    for key in reports[0]["topk"]:
        variant, codec = key.split(":")
        name = variant.split("_dense4")[0]
        results = []
        for step in range(STEPS):
            got = reports[0]["topk"][key]["rows"][step]["result"]
            for r in reports:   # the same bits on every rank
                assert r["topk"][key]["rows"][step]["result"] == got, (key, step, r["rank"])
            selected = [r["topk"][key]["rows"][step]["selected"] for r in reports]
            want = _reference(name, selected, codec)
            if codec == "mean":   # float32 means of values up to ~300
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=key)
            else:
                np.testing.assert_array_equal(np.array(got, np.float32), want, err_msg=f"{key} step {step}")
            results.append(np.array(got, np.float64))
            # bytes counted in the primitives == the declared bytes (4 ranks; SparCML's from the
            # actual index sets)
            counted = {link: sum(r["topk"][key]["rows"][step]["sent"][link] for r in reports)
                       for link in ("intra", "inter")}
            formula = ALGORITHMS[name].sent_bytes_for([np.array(s[1]) for s in selected], D, 2, 2, 0.05,
                                                      reports[0]["topk"][key]["options"])
            assert counted == pytest.approx({k: 4 * v for k, v in formula.items()}, rel=1e-12), key
        # error feedback: sum of outputs over the steps + residuals = sum of inputs
        flushed = np.sum([np.array(r["topk"][key]["flush"], np.float64) for r in reports], axis=0)
        np.testing.assert_allclose(np.sum(results, axis=0) + flushed, total_input, rtol=1e-5, atol=1e-3,
                                   err_msg=key)
        if codec != "none":   # the codec did change the values sent
            plain = reports[0]["topk"][f"{variant}:none"]["rows"][0]["result"]
            assert not np.array_equal(plain, reports[0]["topk"][key]["rows"][0]["result"]), key
    for variant in ("naive_ag", "hitopk", "hitopk_dense4", "ssar_rd", "ssar_split_ag", "dsar_split_ag"):
        codecs = value_codec.CODECS if variant.startswith(("naive", "hitopk")) else ("none", "fp16")
        sent = [sum(reports[0]["topk"][f"{variant}:{c}"]["rows"][0]["sent"].values()) for c in codecs]
        assert sent == sorted(sent, reverse=True) and len(set(sent)) == len(sent), (variant, sent)
    for codec in value_codec.CODECS:   # both step 4s give the same bits
        assert reports[0]["topk"][f"hitopk:{codec}"]["rows"][-1]["result"] == \
            reports[0]["topk"][f"hitopk_dense4:{codec}"]["rows"][-1]["result"]
    # qRGC's constant values: "mean" sends one value per rank and gives exactly what "none" gives
    for variant in ("naive_ag", "hitopk"):
        for r in reports:
            plain, mean = r["qrgc"][f"{variant}:none"], r["qrgc"][f"{variant}:mean"]
            assert [row["result"] for row in plain["rows"]] == [row["result"] for row in mean["rows"]]
            assert plain["residual"] == mean["residual"], variant
    # end to end: GradientAggregator (tf.function, two buckets) and DistributedOptimizer
    agg = [r["aggregator"] for r in reports]
    for codec in value_codec.CODECS:
        assert all(a[codec]["result"] == agg[0][codec]["result"] for a in agg), codec
        counted = {link: sum(a[codec]["counted"][link] for a in agg) for link in ("intra", "inter")}
        assert counted == pytest.approx({k: 4 * v for k, v in agg[0][codec]["formula"].items()}, rel=1e-12)
    assert agg[0]["fp16"]["formula"]["inter"] < agg[0]["none"]["formula"]["inter"]
    for got, plain in zip(agg[0]["fp16"]["result"], agg[0]["none"]["result"]):
        assert got != plain
        np.testing.assert_allclose(got, plain, rtol=2e-3, atol=1e-3)
    assert all(r["weights"] == reports[0]["weights"] for r in reports)
    assert all(np.any(np.array(w) != 1) for w in reports[0]["weights"])
    # DistributedOptimizer(selection=Selection(qrgc=True)): its qRGC group sends one mean per rank, with the same
    # weights as the same optimizer told value_codec "none", and fewer bytes
    for r in reports:
        q = r["qrgc_optimizer"]
        assert q["options"]["hitopk"] == {"step4": "auto", "value_codec": "mean"}
        assert q["weights"]["mean"] == q["weights"]["none"] and q["weights"]["mean"] != reports[0]["weights"]
        assert sum(q["sent"]["mean"].values()) < sum(q["sent"]["none"].values())


def test_qrgc_group_sends_one_mean_unless_told_otherwise():
    from tf_commlib.keras.optimizer import qrgc_options
    assert qrgc_options(None) == {"naive_ag": {"value_codec": "mean"}, "hitopk": {"value_codec": "mean"}}
    assert qrgc_options({"hitopk": {"value_codec": "fp16", "step4": "dense"}, "ssar_rd": {}}) == \
        {"naive_ag": {"value_codec": "mean"}, "hitopk": {"value_codec": "fp16", "step4": "dense"},
         "ssar_rd": {}}
    # DistributedOptimizer(selection=Selection(qrgc=True)) end to end: tests/workers/codec_worker.py ("qrgc_optimizer")


def test_codecs_share_one_interface_and_registry():
    """codec.py: the option strings name registered Codecs; bytes(n) is what to_bytes sends and
    round is decode(encode) (the dense casts, the sparse codecs' values)."""
    from tf_commlib.collectives import codec
    from tf_commlib.collectives.wire import COMPRESSIONS
    assert set(COMPRESSIONS) | set(value_codec.CODECS) <= set(codec.REGISTRY)
    x = tf.constant(np.random.default_rng(1).standard_normal(100).astype(np.float32))
    for name, dtype in (("none", np.float32), ("fp16", np.float16), ("bf16", None)):
        c = codec.get(name)
        assert codec.get(c) is c and c.bytes(100) == c.to_bytes(x).shape[0]
        np.testing.assert_array_equal(c.from_bytes(c.to_bytes(x), 100).numpy(), c.round(x).numpy())
        if dtype is not None:
            np.testing.assert_array_equal(c.round(x).numpy(), x.numpy().astype(dtype).astype(np.float32))
    assert [codec.get(n).summable for n in COMPRESSIONS] == [True, True, False]
    assert value_codec.get("fp16").values is codec.FP16
    assert value_codec.get(value_codec.get("mean")) is value_codec.get("mean")
    with pytest.raises(ValueError, match="already registered"):
        codec.register(codec.Cast("fp16", tf.float16))
