"""DataCache when Redis fails it, over both read paths: a server killed mid-epoch (restarted and
refilled) or unreachable at start, a full server, corrupt values and pickles (misses, never
unpickled), and the codec that rejects every value but its own."""
import os
import pickle
import signal
import time

import numpy as np
import pytest

from datacache import DataCache, DecodeResize, RedisServer, cached_dataset
from datacache.codec import Codec
from tests.datacache_data import Reference, digest, keys_of


BOTH_PATHS = pytest.mark.parametrize("direct_read", [True, False], ids=["direct", "redis-py"])


def uses(cache, direct_read):
    assert (cache.direct() is not None) == direct_read
    return cache


@BOTH_PATHS
def test_redis_killed_mid_epoch_is_restarted_and_refilled(source, ref16, direct_read):
    n = len(source)
    with DataCache(progress=False, retry_interval=0.05, read_batch=4, direct_read=direct_read) as cache:
        uses(cache, direct_read)
        # Sequential maps: lookups happen as samples are consumed, so the kill lands mid-epoch.
        ds = cached_dataset(source, DecodeResize(16), cache, seed=1, num_parallel_calls=None)
        ref16.epoch(ds)
        seen = []
        for k, (x, y) in enumerate(ds):
            if k == 6:
                os.kill(cache.server.proc.pid, signal.SIGKILL)
            seen.append(ref16.index[digest(x.numpy())])
            assert y == ref16.labels[seen[-1]]
        assert sorted(seen) == list(range(n))
        time.sleep(0.1)
        assert sorted(ref16.epoch(ds)) == list(range(n))   # the server is back, empty: refills
        assert sorted(ref16.epoch(ds)) == list(range(n))
        s = cache.stats()
        assert s["outages"] >= 1 and s["fallbacks"] > 0 and cache.server.alive()
        assert s["epochs"][1]["fallbacks"] > 0 and s["epochs"][1]["hits"] > 0
        assert s["epochs"][3]["hits"] == n


def test_redis_unreachable_at_start_then_back(source, ref16, caplog):
    n = len(source)
    server = RedisServer(maxmemory="64mb")
    server.stop(remove=False)
    try:
        with DataCache(server.url(with_password=True), progress=False, retry_interval=0.05,
                       max_retry_interval=0.1) as cache:
            ds = cached_dataset(source, DecodeResize(16), cache)
            assert sorted(ref16.epoch(ds)) == list(range(n))
            assert "Redis unreachable" in caplog.text
            server.start()
            time.sleep(0.2)
            for _ in range(2):
                assert sorted(ref16.epoch(ds)) == list(range(n))
            e = cache.stats()["epochs"]
            assert (e[0]["fallbacks"], e[0]["hits"]) == (n, 0)
            assert (e[1]["misses"], e[2]["hits"]) == (n, n)
    finally:
        server.stop()


@BOTH_PATHS
@pytest.mark.parametrize("eviction", ["noeviction", "allkeys-lru"])
def test_full_redis(source, eviction, direct_read):
    n = len(source)
    big = DecodeResize(64)   # 12 KiB per sample, 0.5 MiB in all
    ref = Reference(source, big)
    server = RedisServer(maxmemory="64mb", eviction=eviction)
    try:
        with DataCache(server.url(with_password=True), progress=False, read_batch=4, write_batch=4,
                       direct_read=direct_read) as cache:
            uses(cache, direct_read)
            # room for about half of the samples
            cache.redis.config_set("maxmemory", cache.redis.info("memory")["used_memory"] + 250_000)
            ds = cached_dataset(source, big, cache)
            for _ in range(3):
                assert sorted(ref.epoch(ds)) == list(range(n))
            s = cache.stats()
            assert s["epochs"][2]["hits"] < n and s["epochs"][2]["misses"] > 0
            if eviction == "noeviction":   # writes refused: the first half stays cached
                assert s["full"] > 0 and s["epochs"][2]["hits"] > 0
            else:
                assert cache.redis.info("stats")["evicted_keys"] > 0
    finally:
        server.stop()


@BOTH_PATHS
def test_corrupt_values_and_pickles_are_misses(source, ref16, tmp_path, direct_read):
    n = len(source)
    marker = tmp_path / "unpickled"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with DataCache(progress=False, direct_read=direct_read) as cache:
        uses(cache, direct_read)
        ds = cached_dataset(source, DecodeResize(16), cache, shuffle=False)
        ref16.epoch(ds)
        keys = keys_of(cache.redis)
        prefix = keys[0].rsplit(b":", 1)[0] + b":"
        r, good = cache.redis, cache.redis.get(prefix + b"5")
        flipped = bytearray(r.get(prefix + b"0"))
        flipped[-1] ^= 1
        r.set(prefix + b"0", bytes(flipped))                                   # bad CRC
        r.set(prefix + b"1", r.get(prefix + b"1")[:-10])                       # truncated
        r.set(prefix + b"2", Codec(np.uint8, (16, 48)).encode(2, ref16.values[2].reshape(16, 48)))  # shape
        r.set(prefix + b"3", good)                                             # sample 5's value
        r.set(prefix + b"4", pickle.dumps(Evil()))                             # a pickle
        assert ref16.epoch(ds) == list(range(n))
        assert not marker.exists()
        assert ref16.epoch(ds) == list(range(n))
        e = cache.stats()["epochs"]
        assert (e[1]["corrupt"], e[1]["misses"], e[1]["hits"], e[2]["hits"]) == (5, 5, n - 5, n)


def test_codec_rejects_everything_but_its_own_values():
    codec = Codec(np.float32, (2, 3))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    value, out = codec.encode(7, x), np.zeros((2, 3), np.float32)
    assert codec.decode_into(value, 7, out) and np.array_equal(out, x)
    for bad in (None, b"", value[:-1], value + b"\0", b"XXXX" + value[4:], value[:-1] + b"\1",
                Codec(np.int32, (2, 3)).encode(7, x.astype(np.int32)), pickle.dumps(x)):
        assert not codec.decode_into(bad, 7, out)
    assert not codec.decode_into(value, 8, out)


@pytest.mark.parametrize("dtype, shape", [(np.uint8, (4, 5, 3)), (np.float32, (2, 3)), (np.float64, ())])
def test_codec_decode_batch_checks_every_value(dtype, shape):
    """The hit path's batch decoder accepts exactly what decode_into accepts, value by value, and
    leaves zeros (never another sample's bytes) in the rows of the rejected values."""
    codec = Codec(dtype, shape)
    rng = np.random.default_rng(0)
    xs = [np.asarray(rng.integers(1, 200, size=shape)).astype(dtype) for _ in range(8)]
    values = [codec.encode(10 + k, x) for k, x in enumerate(xs)]
    crc = bytearray(values[1])
    crc[-1] ^= 1
    values[1] = bytes(crc)                                     # bad CRC, right length
    values[2] = codec.encode(99, xs[2])                        # another sample's value
    values[3] = b"XXXX" + values[3][4:]                        # bad magic
    values[5] = pickle.dumps(xs[5])
    indices = np.arange(10, 18)
    for batch in (values, [values[k] for k in (0, 1, 2, 3, 6, 7)], values[:1] + [None] + values[2:]):
        idx = indices[[values.index(v) if v is not None else 1 for v in batch]]
        out = np.full((len(batch),) + shape, 7, dtype)
        valid = codec.decode_batch(batch, idx, out)
        one = np.zeros(shape, dtype)
        assert valid.tolist() == [codec.decode_into(v, i, one) for v, i in zip(batch, idx)]
        for k, (v, i) in enumerate(zip(batch, idx)):
            want = xs[i - 10] if valid[k] else np.zeros(shape, dtype)
            assert np.array_equal(out[k], want)
    assert valid.tolist() == [True, False, False, False, True, False, True, True]
