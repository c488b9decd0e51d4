"""QSGD codec (tf_commlib/collectives/qsgd.py) against a numpy reference: unbiased over seeds,
deterministic for a seed, levels in range, bad bits rejected; its "max" scale (the int<bits> codecs)
rounded to the nearest level and a contraction, where QSGD's error can exceed the value, and what
that does to error feedback."""
import numpy as np
import pytest
import tensorflow as tf

from tf_commlib.collectives import qsgd


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_levels_and_norms_match_numpy(bits):
    x = np.random.default_rng(0).normal(size=2500).astype(np.float32)
    levels, norms = qsgd.encode(tf.constant(x), bits, seed=7)
    levels, norms = levels.numpy(), norms.numpy()
    s = 2 ** (bits - 1) - 1
    rows = np.pad(x, (0, 3072 - 2500)).reshape(3, 1024)
    np.testing.assert_allclose(norms, np.linalg.norm(rows, axis=1), rtol=1e-6)
    scaled = np.abs(rows) / norms[:, None] * s
    # every level is the floor or the ceiling of the scaled magnitude, with x's sign
    assert np.all(np.abs(levels) <= s)
    mag = np.abs(levels.astype(np.float64))
    assert np.all((mag == np.floor(scaled)) | (mag == np.floor(scaled) + 1))
    assert np.all((levels == 0) | (np.sign(levels) == np.sign(rows)))


def test_same_seed_same_result_other_seed_differs():
    x = tf.constant(np.random.default_rng(1).normal(size=3000).astype(np.float32))
    a = qsgd.decode(*qsgd.encode(x, 4, seed=3), 3000, 4).numpy()
    b = qsgd.decode(*qsgd.encode(x, 4, seed=3), 3000, 4).numpy()
    c = qsgd.decode(*qsgd.encode(x, 4, seed=4), 3000, 4).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_unbiased_over_seeds(bits):
    # 400 copies of one bucket in one call: each copy draws its own random numbers
    x = np.random.default_rng(2).normal(size=1024).astype(np.float32)
    copies = 400
    out = qsgd.decode(*qsgd.encode(tf.constant(np.tile(x, copies)), bits, seed=11), 1024 * copies, bits)
    mean = out.numpy().reshape(copies, 1024).mean(axis=0)
    s = 2 ** (bits - 1) - 1
    step = np.linalg.norm(x) / s          # one level; a draw is off by less than a level
    assert np.max(np.abs(mean - x)) < 6 * step / 2 / np.sqrt(copies)
    assert abs(np.mean(mean - x)) < 6 * step / 2 / np.sqrt(copies * 1024)


@pytest.mark.parametrize("bits", [0, 1, 3, 16, "4"])
def test_bad_bits_raise_naming_bits(bits):
    with pytest.raises(ValueError, match="bits"):
        qsgd.encode(tf.zeros([10]), bits, seed=0)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_round_trips_in_wire_bytes(bits):
    """pack stores 8/bits levels per byte (level + s, the first in the low bits): with the norms,
    an encoded vector takes wire_bytes."""
    x = tf.constant(np.random.default_rng(3).normal(size=1500).astype(np.float32))
    levels, norms = qsgd.encode(x, bits, seed=5)
    packed = qsgd.pack(levels, bits).numpy()
    assert packed.dtype == np.uint8 and packed.size + 4 * norms.shape[0] == qsgd.wire_bytes(1500, bits)
    np.testing.assert_array_equal(qsgd.unpack(packed, bits).numpy(), levels.numpy().ravel())
    s = 2 ** (bits - 1) - 1
    first = (packed[0] & ((1 << bits) - 1)) - s
    assert first == levels.numpy().ravel()[0]


@pytest.mark.parametrize("bits,scale", [(2, "l2"), (4, "l2"), (8, "l2"), (4, "max"), (8, "max")])
def test_qsgd_codec_bytes_and_round_trip(bits, scale):
    """The QSGD Codecs (codec.py, "qsgd<bits>", dsar_split_ag's dense slices; "int<bits>"): to_bytes
    sends exactly bytes(n) bytes, from_bytes decodes what qsgd.decode does."""
    from tf_commlib.collectives import codec
    c = codec.get(f"qsgd{bits}" if scale == "l2" else f"int{bits}")
    x = tf.constant(np.random.default_rng(bits).standard_normal(1500).astype(np.float32))
    data = c.to_bytes(x, seed=9)
    assert data.dtype == tf.uint8 and data.shape[0] == c.bytes(1500) == qsgd.wire_bytes(1500, bits)
    np.testing.assert_array_equal(c.from_bytes(data, 1500).numpy(),
                                  qsgd.decode(*qsgd.encode(x, bits, seed=9, scale=scale), 1500, bits).numpy())


def _spiky(rng, s):
    """Buckets of one large entry and the rest at a quarter of a level: what rounding hurts most."""
    x = np.full((4, 1024), 1.0 / (4 * s), np.float32) * rng.choice([-1, 1], (4, 1024))
    x[:, 0] = 1.0
    return x.ravel().astype(np.float32)


@pytest.mark.parametrize("bits", [4, 8])
def test_max_scale_rounds_to_nearest_and_contracts(bits):
    """scale "max": the scale is the bucket's largest magnitude, each level the nearest to x/scale*s
    (numpy), and per bucket ||round(x) - x||^2 <= ||x||^2 - max^2 and <= error_bound ||x||^2, on
    Gaussian and on spiky buckets."""
    rng, s = np.random.default_rng(bits), 2 ** (bits - 1) - 1
    for x in (rng.standard_normal(4096).astype(np.float32), _spiky(rng, s)):
        levels, norms = qsgd.encode(tf.constant(x), bits, seed=0, scale="max")
        rows = x.reshape(4, 1024)
        np.testing.assert_array_equal(norms.numpy(), np.abs(rows).max(axis=1))
        expected = np.sign(rows) * np.round(np.abs(rows) / norms.numpy()[:, None] * s)
        np.testing.assert_array_equal(levels.numpy(), expected)
        error = (qsgd.decode(levels, norms, 4096, bits).numpy() - x).reshape(4, 1024)
        sq, norm2 = (error ** 2).sum(axis=1), (rows.astype(np.float64) ** 2).sum(axis=1)
        assert np.all(sq <= norm2 - np.abs(rows).max(axis=1) ** 2 + 1e-6)
        assert np.all(sq <= qsgd.error_bound(bits, "max") * norm2 + 1e-6)
    assert qsgd.error_bound(8, "max") < 0.02 and qsgd.error_bound(4, "max") < 1 <= qsgd.error_bound(4)


def test_error_feedback_grows_with_qsgd4_and_stays_bounded_with_int4():
    """Error feedback sends x plus what earlier rounds left: with QSGD at 4 bits, whose error on a spiky
    bucket exceeds the value (mean over seeds), the residual grows without bound; with int4 it stays
    within twice the value sent each round. Why DiLoCo refuses qsgd4 and qsgd2 as inter_compression."""
    from tf_commlib.collectives import codec
    x = tf.constant(_spiky(np.random.default_rng(0), 7))
    draws = [qsgd.decode(*qsgd.encode(x, 4, seed=k), 4096, 4) for k in range(20)]
    assert np.mean([np.sum((d.numpy() - x.numpy()) ** 2) for d in draws]) > np.sum(x.numpy() ** 2)
    for name, grows in (("qsgd4", True), ("int4", False)):
        c, residual, ratios = codec.get(name), tf.zeros_like(x), []
        for k in range(60):
            send = x + residual
            residual = send - c.decode(c.encode(send, seed=k), 4096)
            ratios.append(float(tf.norm(residual) / tf.norm(x)))
        assert (ratios[-1] > 1000) if grows else (max(ratios) < 2), (name, ratios)
