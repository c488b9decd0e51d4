"""The direct read path (datacache.direct, op DatacacheMget) against a real redis-server: it accepts
exactly the values Codec.decode_batch accepts, over TCP and a unix socket, with username and db;
failures are reported, never raised or returned as samples."""
import os
import pickle
import signal
import socket
import threading
import time

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
        assert cache.direct()[1] == server.password.encode()
    with DataCache(server.url(with_password=True), progress=False, direct_read=False) as cache:
        assert cache.direct() is None
    with DataCache(progress=False) as cache:   # embedded: a unix socket
        assert cache.direct()[0]["address"] == f"unix:{cache.server.socket}"


def test_large_values_and_many_small_ones(server):
    """Payloads of 100 KiB and more (received straight into the rows) and batches of many small
    values (a reply that spans many buffer refills) equal Codec.decode_batch, hits bit-equal."""
    writer = redis.Redis(**server.client_kwargs())
    attrs = direct_attrs(writer)
    rng = np.random.default_rng(1)
    for shape, n in (((160, 163), 20), ((9_000,), 24), ((3, 5), 700)):   # 104 KB, 36 KB, 60 B
        codec = Codec(np.float32, shape)
        xs = rng.standard_normal((n,) + shape).astype(np.float32)
        values = [codec.encode(i, xs[i]) for i in range(n)]
        bad = bytearray(values[n // 2])
        bad[len(bad) // 2] ^= 4                                          # bad CRC mid-payload
        values[n // 2] = bytes(bad)
        values[n - 2] = values[n - 2][:-1]                               # one byte short
        keys = [b"big:%d:%d" % (len(shape), i) for i in range(n)]
        writer.delete(*keys)
        writer.mset({k: v for k, v in zip(keys, values)})
        order = list(rng.permutation(n))
        values_, hit, present, ok, error = call([keys[i] for i in order], order, server.password,
                                                attrs, codec)
        assert ok and error == b""
        expect = np.zeros((n,) + shape, np.float32)
        ref = codec.decode_batch(writer.mget([keys[i] for i in order]), order, expect)
        np.testing.assert_array_equal(hit, ref)
        assert hit.sum() == n - 2 and present.all()
        assert values_.tobytes() == expect.tobytes()
        np.testing.assert_array_equal(values_[hit], xs[np.array(order)[hit]])


class CuttingProxy:
    """A TCP proxy to a real Redis that closes every connection once `limit` bytes of replies
    have passed: a server that dies in the middle of a reply. With ``trickle=(n, seconds)`` it
    passes the replies on n bytes at a time, one piece every `seconds`: a server that never
    stalls long enough for one receive to time out, yet never finishes a large reply."""

    def __init__(self, port, limit=None, trickle=None):
        self.port, self.limit, self.trickle = port, limit, trickle
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.limit, self.trickle),
                             daemon=True).start()

    @staticmethod
    def _pipe(src, dst, limit, trickle=None):
        passed = 0
        try:
            while limit is None or passed < limit:
                data = src.recv(65536 if limit is None else min(65536, limit - passed))
                if not data:
                    break
                step = trickle[0] if trickle else len(data)
                for k in range(0, len(data), step):
                    if trickle and passed:
                        time.sleep(trickle[1])
                    dst.sendall(data[k:k + step])
                    passed += len(data[k:k + step])
        except OSError:
            pass
        for s in (src, dst):   # shutdown: the other direction's thread may block on the socket
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self):
        self.listener.close()


def test_a_reply_cut_partway_reads_no_row(server, tmp_path):
    """The op reports no row of a batch whose reply broke off; the dataset counts the whole
    batch as a fallback (never a negative miss count) and serves every sample from the source."""
    import datacache
    from tests.datacache_data import Reference, write_folder

    codec = Codec(np.float32, SHAPE)
    writer = redis.Redis(**server.client_kwargs())
    xs = np.random.default_rng(2).standard_normal((16,) + SHAPE).astype(np.float32)
    keys = [b"cut:%d" % i for i in range(16)]
    writer.mset({k: codec.encode(i, x) for i, (k, x) in enumerate(zip(keys, xs))})
    proxy = CuttingProxy(server.port, limit=5 + 4 * 200)   # +OK, then a third of the reply
    try:
        attrs = dict(direct_attrs(writer), address=f"tcp:127.0.0.1:{proxy.address[1]}")
        _, hit, present, ok, error = call(keys, range(16), server.password, attrs, codec)
        assert not ok and b"closed" in error and not hit.any() and not present.any()

        source = datacache.ImageFolderSource(write_folder(str(tmp_path / "img"), 2, 6))
        ref = Reference(source, datacache.DecodeResize(16))
        url = f"redis://:{server.password}@127.0.0.1:{proxy.address[1]}"
        with DataCache(url, progress=False, read_batch=4, retry_interval=0.01,
                       max_retry_interval=0.01) as cache:
            assert cache.direct() is not None
            ds = datacache.cached_dataset(source, datacache.DecodeResize(16), cache, seed=0,
                                          num_parallel_calls=None)
            for _ in range(3):
                assert sorted(ref.epoch(ds)) == list(range(len(source)))
                time.sleep(0.05)
            epochs = cache.stats()["epochs"]
        assert all(e["misses"] >= 0 and e["hits"] + e["misses"] + e["fallbacks"] == e["samples"]
                   for e in epochs), epochs
        assert sum(e["fallbacks"] for e in epochs[1:]) > 0
    finally:
        proxy.close()


@pytest.mark.parametrize("trickle, most", [((1024, 0.1), 3.0), ((1024, 1.6), 2.8)],
                         ids=["trickling", "stalling-near-the-deadline"])
def test_a_trickling_reply_fails_after_the_timeout(server, trickle, most):
    """A server that sends a large reply a few bytes at a time (each receive gets data well within
    the timeout) fails the batch once the reply has taken timeout_ms: the timeout bounds a whole
    reply, not each receive. A receive that starts just before the deadline waits only for the
    time left: a server that stalls after 1.6 s of a 2 s timeout fails it at ~2 s, not 3.2 s."""
    codec = Codec(np.float32, (64, 64))   # 16 KiB values: 20 of them take 33 s at 1 KiB per 0.1 s
    writer = redis.Redis(**server.client_kwargs())
    xs = np.random.default_rng(3).standard_normal((20, 64, 64)).astype(np.float32)
    keys = [b"slow:%d" % i for i in range(20)]
    writer.mset({k: codec.encode(i, x) for i, (k, x) in enumerate(zip(keys, xs))})
    proxy = CuttingProxy(server.port, trickle=trickle)
    timeout = 1.0 if trickle[1] < 1 else 2.0
    try:
        attrs = dict(direct_attrs(writer), address=f"tcp:127.0.0.1:{proxy.address[1]}",
                     timeout_ms=int(timeout * 1000))
        t = time.monotonic()
        _, hit, present, ok, error = call(keys, range(20), server.password, attrs, codec)
        waited = time.monotonic() - t
        assert not ok and not hit.any() and b"timed out" in error, error
        assert 0.9 * timeout < waited < most, waited   # the AUTH reply, then about one timeout for the MGET
        direct = dict(direct_attrs(writer), timeout_ms=1000)   # the same batch straight from the server
        assert call(keys, range(20), server.password, direct, codec)[1].all()
    finally:
        proxy.close()


def test_restarted_server_with_several_pooled_connections(tmp_path):
    """Connections pooled by a long-lived iterator (a parallel map over a repeated dataset, as
    model.fit with steps_per_epoch keeps one) are not reused after the server restarts: the next
    epoch reads on fresh connections, with no failed batch."""
    import datacache
    from tests.datacache_data import Reference, digest, write_folder

    source = datacache.ImageFolderSource(write_folder(str(tmp_path / "img"), 2, 16))
    n = len(source)
    ref = Reference(source, datacache.DecodeResize(16))
    server = RedisServer(maxmemory="64mb", unix_socket=False)
    try:
        with DataCache(server.url(with_password=True), progress=False, read_batch=2) as cache:
            ds = datacache.cached_dataset(source, datacache.DecodeResize(16), cache, seed=0,
                                          num_parallel_calls=4)
            opts = tf.data.Options()   # four threads run the map, however few cores there are
            opts.threading.private_threadpool_size = 4
            it = iter(ds.repeat().with_options(opts))
            admin = redis.Redis(**server.client_kwargs())

            def epoch():
                seen = [ref.index[digest(next(it)[0].numpy())] for _ in range(n)]
                assert sorted(seen) == list(range(n))

            epoch()
            # Paused, the server holds every read the map issues, so those in flight overlap and
            # each takes a connection of its own: the pool then holds several, on any machine.
            admin.client_pause(500)
            epoch()
            readers = [c for c in admin.client_list() if c["cmd"] == "mget"]
            assert len(readers) >= 2, readers   # the parallel map pooled several connections
            time.sleep(0.5)   # the map's read-ahead stalls (a read while the server is down is an outage)
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
            server.start()
            epoch()
            epoch()
            s = cache.stats()
        assert s["outages"] == 0 and s["fallbacks"] == 0, s
        e = s["epochs"]
        # the restarted server was empty (batches read ahead before the kill may be hits)
        assert e[1]["hits"] == n and e[2]["misses"] + e[3]["misses"] > 0, e
    finally:
        server.stop()


def test_a_bytes_password_reads_through_the_direct_path(server, tmp_path):
    """redis-py takes the password as bytes too; the direct path then reads with it."""
    import datacache
    from tests.datacache_data import Reference, write_folder

    source = datacache.ImageFolderSource(write_folder(str(tmp_path / "img"), 2, 4))
    ref = Reference(source, datacache.DecodeResize(16))
    with DataCache(f"redis://127.0.0.1:{server.port}", progress=False,
                   redis_kwargs={"password": server.password.encode()}) as cache:
        assert cache.direct()[1] == server.password.encode()
        ds = datacache.cached_dataset(source, datacache.DecodeResize(16), cache, seed=0)
        for _ in range(2):
            assert sorted(ref.epoch(ds)) == list(range(len(source)))
        e = cache.stats()["epochs"]
    assert e[1]["hits"] == len(source) and e[1]["fallbacks"] == 0, e


def test_a_stalled_server_fails_the_batch_after_one_timeout(tmp_path):
    """A server that stops answering (SIGSTOP) fails a batch on a pooled connection after one
    timeout, reported as such; it is not retried on a new connection (that would wait twice)."""
    codec = Codec(np.float32, SHAPE)
    server = RedisServer(maxmemory="16mb", unix_socket=False)
    try:
        attrs = dict(direct_attrs(redis.Redis(**server.client_kwargs())), timeout_ms=2000)
        assert call([b"s:0"], [0], server.password, attrs, codec)[3]   # a pooled connection
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            t = time.monotonic()
            _, hit, _, ok, error = call([b"s:0"], [0], server.password, attrs, codec)
            waited = time.monotonic() - t
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert not ok and not hit.any() and b"timed out" in error, error
        assert 1.9 < waited < 3.9, waited   # one timeout of 2 s, not two
        assert call([b"s:0"], [0], server.password, attrs, codec)[3]   # answers again
    finally:
        server.stop()


@pytest.mark.parametrize("direct_read", [True, False])
def test_a_refused_read_backs_off_until_it_is_allowed(tmp_path, direct_read):
    """A user whose ACL refuses the dataset's keys (-NOPERM on MGET) trains from the source; the
    reconnects (PING works) do not reset the backoff, so the refusal costs a few failed batches,
    not one per retry_interval; once the ACL allows the keys, the cache fills and is read."""
    import datacache
    from tests.datacache_data import Reference, write_folder

    source = datacache.ImageFolderSource(write_folder(str(tmp_path / "img"), 2, 8))
    n = len(source)
    ref = Reference(source, datacache.DecodeResize(16))
    server = RedisServer(maxmemory="64mb", unix_socket=False)
    try:
        admin = redis.Redis(**server.client_kwargs())
        allowed = ["+mget", "+set", "+ping", "+info", "+dbsize", "+select"]
        admin.acl_setuser("trainer", enabled=True, passwords=["+trainer-secret"], keys=["other:*"],
                          commands=allowed)
        url = f"redis://trainer:trainer-secret@127.0.0.1:{server.port}/0"
        with DataCache(url, progress=False, read_batch=1, retry_interval=0.02, max_retry_interval=0.3,
                       direct_read=direct_read) as cache:
            assert (cache.direct() is not None) == direct_read
            ds = datacache.cached_dataset(source, datacache.DecodeResize(16), cache, seed=0,
                                          num_parallel_calls=None)
            t = time.monotonic()
            while time.monotonic() - t < 1.5:   # ~100 batches of one sample
                assert sorted(ref.epoch(ds)) == list(range(n))
            s = cache.stats()
            assert s["hits"] == 0 and s["fallbacks"] > 0, s
            # 0.02 .. 0.3 s doubling: ~9 refusals in 1.5 s (one per batch without the backoff)
            assert 1 <= s["outages"] <= 14, s
            admin.acl_setuser("trainer", enabled=True, keys=["*"], reset_keys=True)
            for _ in range(4):   # the backoff is at most 0.3 s: epochs fill the cache, then read it
                assert sorted(ref.epoch(ds)) == list(range(n))
                time.sleep(0.1)
            e = cache.stats()["epochs"]
        assert e[-1]["hits"] == n and e[-1]["fallbacks"] == 0, e
    finally:
        server.stop()
