"""The value codec of sparse messages (tf_commlib/collectives/value_codec.py): against numpy in one
process, and (under horovodrun, 2x2) every collective that sends sparse messages with each codec."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import hvdrun
from tf_commlib.aggregator import GradientAggregator
from tf_commlib.collectives import ALGORITHMS, resolve_algorithm_options
from tf_commlib.collectives import value_codec as V
from tf_commlib.keras import DistributedOptimizer

CODEC_ALGORITHMS = ("naive_ag", "hitopk")


def test_quantise_against_numpy():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 10 ** rng.uniform(-6, 4, 1000)).astype(np.float32)
    np.testing.assert_array_equal(V.quantise(tf.constant(x), "none").numpy(), x)
    np.testing.assert_array_equal(V.quantise(tf.constant(x), "fp16").numpy(),
                                  x.astype(np.float16).astype(np.float32))
    mean = V.quantise(tf.constant(x), "mean").numpy()
    assert np.all(mean == mean[0]) and mean[0] == pytest.approx(np.mean(x.astype(np.float64)), rel=1e-5)
    for value in (0.1, -3.7e-5, 123.456):   # qRGC's k copies of one mean come back bit-exactly
        same = np.full(7, value, np.float32)
        np.testing.assert_array_equal(V.quantise(tf.constant(same), "mean").numpy(), same)
    assert V.quantise(tf.zeros([0]), "mean").shape == [0]


@pytest.mark.parametrize("counts", [(3, 0, 5), (1,), (0, 0), (4, 4, 1, 2)])
def test_mean_messages_round_trip(counts):
    """Messages of several parts each, concatenated as an allgather does, decode to the parts'
    values and indices in order, with part = sender * parts + own part; bytes = message_bytes."""
    rng = np.random.default_rng(len(counts))
    parts, senders = len(counts), 2
    messages, want_v, want_i, want_p = [], [], [], []
    for s in range(senders):
        value = rng.standard_normal(parts).astype(np.float32)
        part = np.repeat(np.arange(parts), counts).astype(np.int32)
        perm = rng.permutation(part.size)   # the encoder orders entries by part, stably
        idx = rng.integers(0, 1 << 30, part.size).astype(np.int32)
        rows = V._encode_mean(tf.constant(value[part][perm]), tf.constant(idx[perm]),
                              tf.constant(part[perm]), parts).numpy()
        assert rows.dtype == np.uint8 and rows.size == V.message_bytes("mean", part.size, parts)
        messages.append(rows)
        order = np.argsort(part[perm], kind="stable")
        want_v.append(value[part][perm][order])
        want_i.append(idx[perm][order])
        want_p.append(part[perm][order] + s * parts)
    got_v, got_i, got_p = V._decode_mean(tf.constant(np.concatenate(messages)), senders * parts)
    np.testing.assert_array_equal(got_v.numpy(), np.concatenate(want_v))
    np.testing.assert_array_equal(got_i.numpy(), np.concatenate(want_i))
    np.testing.assert_array_equal(got_p.numpy(), np.concatenate(want_p))


def test_bytes_per_entry():
    assert [V.entry_bytes(c) for c in V.CODECS] == [8, 6, 4]
    assert V.message_bytes("none", 10) == 80 and V.message_bytes("fp16", 10) == 60
    assert V.message_bytes("mean", 10) == 48 and V.message_bytes("mean", 10, parts=3) == 64
    # naive_ag on 2x2, d = 1M, 1 %: 10k entries to 1 rank in the node and 2 in the other
    for codec, per_entry in (("none", 8), ("fp16", 6)):
        got = ALGORITHMS["naive_ag"].sent_bytes(1_000_000, 2, 2, 0.01, {"value_codec": codec})
        assert got == {"intra": per_entry * 10_000, "inter": 2 * per_entry * 10_000}
    assert ALGORITHMS["naive_ag"].sent_bytes(1_000_000, 2, 2, 0.01, {"value_codec": "mean"}) == \
        {"intra": 40_008, "inter": 80_016}
    # hitopk: steps 3 and 4 shrink with the codec, step 1 and the sent indices do not
    none, fp16, mean = (ALGORITHMS["hitopk"].sent_bytes(1_000_000, 2, 2, 0.01, {"value_codec": c})
                        for c in V.CODECS)
    assert none == {"intra": 2_000_000 + 8 * 2 * 5000 + 4 * 5000, "inter": 8 * 5000}
    assert fp16 == {"intra": 2_000_000 + 6 * 2 * 5000 + 4 * 5000, "inter": 6 * 5000}
    assert mean == {"intra": 2_000_000 + 4 * 2 * 5000 + 16 + 4 * 5000, "inter": 4 * 5000 + 8}
    for name in CODEC_ALGORITHMS:   # and the predicted time with it
        t = [sum(ALGORITHMS[name].breakdown(1 << 22, 2, 2, 0.01, options={"value_codec": c}).values())
             for c in V.CODECS]
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


def test_value_codec_defaults_to_none():
    for name in CODEC_ALGORITHMS:
        assert ALGORITHMS[name].resolve_options()["value_codec"] == "none"
