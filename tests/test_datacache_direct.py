"""The direct read path (datacache.direct, op DatacacheMget) against a real redis-server: it accepts
exactly the values Codec.decode_batch accepts, over TCP and a unix socket, with username and db;
failures are reported, never raised or returned as samples."""
import pickle

import numpy as np
import pytest
import redis
import tensorflow as tf

from datacache import DataCache, RedisServer
from datacache.codec import Codec
from datacache.direct import direct_attrs, mget

SHAPE = (5, 7)


@pytest.fixture(scope="module")
def server():
    s = RedisServer(maxmemory="64mb", unix_socket=False)
    yield s
    s.stop()


def call(keys, indices, password, attrs, codec, enabled=True):
    keys = tf.constant(keys, tf.string)
    out = mget(keys, tf.constant(indices, tf.int64), password, enabled, attrs, codec)
    return [o.numpy() for o in out]


def fill(client, codec, rng):
    """Eight keys: good values, and one of every way a value can be wrong; the reference."""
    xs = rng.standard_normal((8,) + SHAPE).astype(np.float32)
    values = [codec.encode(i, xs[i]) for i in range(8)]
    bad_crc = bytearray(values[1])
    bad_crc[-3] ^= 0x10
    values[1] = bytes(bad_crc)
    values[2] = values[2][:-4]                                           # truncated
    values[3] = codec.encode(30, xs[3])                                  # another sample's index
    values[4] = Codec(np.float32, SHAPE[::-1]).encode(4, xs[4].T)        # another shape
    values[5] = pickle.dumps(xs[5])                                      # a pickle
    values[6] = Codec(np.float64, SHAPE).encode(6, xs[6])                # another dtype, same key
    keys = [b"t:%d" % i for i in range(9)]                               # t:8 is absent
    client.delete(*keys)
    client.mset(dict(zip(keys[:7] + keys[7:8], values[:8])))
    return keys, xs


def test_direct_read_accepts_exactly_what_the_codec_accepts(server):
    codec = Codec(np.float32, SHAPE)
    # A user with only the commands the read path needs.
    admin = redis.Redis(**server.client_kwargs())
    admin.acl_setuser("reader", enabled=True, passwords=["+reader-secret"], keys=["t:*"],
                      commands=["+mget", "+ping", "+select", "+info", "+dbsize"])
    writer = redis.Redis(**server.client_kwargs())
    keys, xs = fill(writer, codec, np.random.default_rng(0))
    order = [7, 0, 1, 2, 3, 4, 5, 6, 8, 0]   # a repeated key, an absent key
    client = redis.Redis.from_url(f"redis://reader:reader-secret@127.0.0.1:{server.port}/0")
    attrs = direct_attrs(client)
    assert attrs["address"] == f"tcp:127.0.0.1:{server.port}" and attrs["username"] == "reader"
    assert attrs["db"] == 0
    values, hit, present, ok, error = call([keys[i] for i in order], order, "reader-secret", attrs, codec)
    assert ok and error == b""
    expect = np.zeros((len(order),) + SHAPE, np.float32)
    ref = codec.decode_batch(client.mget([keys[i] for i in order]), order, expect)
    np.testing.assert_array_equal(hit, ref)
    np.testing.assert_array_equal(hit, [i in (0, 7) for i in order])
    np.testing.assert_array_equal(present, [i != 8 for i in order])
    assert values.tobytes() == expect.tobytes()   # hits bit-equal, misses zero
    np.testing.assert_array_equal(values[0], xs[7])
    # Twice in a row on the pooled connection, and an empty batch.
    again = call([keys[i] for i in order], order, "reader-secret", attrs, codec)
    assert again[0].tobytes() == values.tobytes()
    assert call([], [], "reader-secret", attrs, codec)[3]


def test_direct_read_failures_are_reported(server):
    codec = Codec(np.float32, SHAPE)
    attrs = direct_attrs(redis.Redis(**server.client_kwargs()))
    keys = [b"t:0", b"t:1"]
    _, hit, present, ok, error = call(keys, [0, 1], "guess", attrs, codec)
    assert not ok and not hit.any() and not present.any() and b"AUTH" in error
    _, _, _, ok, error = call(keys, [0, 1], server.password, attrs, codec, enabled=False)
    assert not ok and error == b"disabled"
    refused = dict(attrs, address="tcp:127.0.0.1:1")
    _, _, _, ok, error = call(keys, [0, 1], server.password, refused, codec)
    assert not ok and b"connect" in error
    _, _, _, ok, error = call(keys, [0, 1], "", dict(attrs, address="unix:/nonexistent/redis.sock"), codec)
    assert not ok and b"No such file" in error
    # The embedded server has one database: SELECT 1 is refused, and the refusal reported.
    _, _, _, ok, error = call(keys, [0, 1], server.password, dict(attrs, db=1), codec)
    assert not ok and b"SELECT failed" in error and b"out of range" in error
    with pytest.raises(tf.errors.InvalidArgumentError, match="indices has 1 entries but keys has 2"):
        call(keys, [0], server.password, attrs, codec)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="keys must be a vector"):
        call([keys], [[0, 1]], server.password, attrs, codec)


def test_which_clients_take_the_direct_path(server, tmp_path):
    assert direct_attrs(redis.Redis(unix_socket_path=str(tmp_path / "s.sock")))["address"].startswith("unix:")
    assert direct_attrs(redis.Redis.from_url("rediss://127.0.0.1:6380")) is None   # TLS: redis-py
    with DataCache(server.url(with_password=True), progress=False) as cache:
        assert cache.direct()[0]["address"] == f"tcp:127.0.0.1:{server.port}"
        assert cache.direct()[1] == server.password
    with DataCache(server.url(with_password=True), progress=False, direct_read=False) as cache:
        assert cache.direct() is None
    with DataCache(progress=False) as cache:   # embedded: a unix socket
        assert cache.direct()[0]["address"] == f"unix:{cache.server.socket}"
