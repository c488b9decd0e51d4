"""DataCache against a real redis-server: exact epochs, bit-equal values, sharding, faults, security."""
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
import pytest
import redis
import tensorflow as tf

import datacache
from datacache import DataCache, DecodeResize, ImageFolderSource, RedisServer, cached_dataset
from datacache.codec import Codec
from datacache.server import remove_stale_dirs
from tests import hvdrun
from tests.datacache_data import N_CLASSES, Reference, digest, write_folder


def bare(**kwargs):
    """A client that does not retry (a refused login would be retried for seconds)."""
    return redis.Redis(retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0), **kwargs)


def keys_of(client):
    return sorted(client.scan_iter(match=b"dc:*"))


def test_epochs_exact_bit_equal_and_level1(source, ref16, tmp_path):
    n = len(source)
    local = str(tmp_path / "local")
    with DataCache(local_dir=local, progress=False, read_batch=8) as cache:
        ds = cached_dataset(source, DecodeResize(16), cache, seed=3)
        x_spec, y_spec = ds.element_spec   # static shapes: what a Keras model needs
        assert x_spec.shape == (16, 16, 3) and y_spec.shape == () and y_spec.dtype == tf.int32
        epochs = [ref16.epoch(ds) for _ in range(3)]
        for e in epochs:
            assert sorted(e) == list(range(n))
        assert epochs[0] != epochs[1] != epochs[2]   # reshuffled every epoch
        assert ref16.epoch(cached_dataset(source, DecodeResize(16), cache, seed=3)) == epochs[0]  # seeded
        s = cache.stats()
        first, second, third = s["epochs"][:3]
        assert (first["misses"], first["hits"], second["hits"], third["hits"]) == (n, 0, n, n)
        assert first["source_bytes"] == int(source.sizes.sum()) - int(source.sizes[0])  # the probe copied #0
        assert second["source_bytes"] == third["source_bytes"] == 0
        assert s["redis_keys"] == n and s["redis_bytes"] > 0 and s["fallbacks"] == 0
        # Shards cover the data set exactly once, each the shard_indices sample of the data set.
        shards = [ref16.epoch(cached_dataset(source, DecodeResize(16), cache, shard=(i, 3))) for i in range(3)]
        assert sorted(sum(shards, [])) == list(range(n))
        assert [sorted(s) for s in shards] == [datacache.shard_indices(n, i, 3, 0, source.labels).tolist() for i in range(3)]
    # A second run (new cache, no Redis): level 1 serves every file, 0 bytes from the source.
    with DataCache(redis_url=False, local_dir=local, progress=False) as cache:
        assert sorted(ref16.epoch(cached_dataset(source, DecodeResize(16), cache))) == list(range(n))
        first = cache.stats()["epochs"][0]
        assert first["source_bytes"] == 0 and first["local_bytes"] == int(source.sizes.sum())


def test_resolutions_do_not_collide_and_augment_is_random(source, ref16):
    n = len(source)
    ref24 = Reference(source, DecodeResize(24))

    def scaled(data, scale=1.0):   # same shape and dtype: only the preprocess key tells them apart
        return tf.cast(DecodeResize(16)(data), tf.float32) * scale

    with DataCache(progress=False) as cache:
        for ref, prep in ((ref16, DecodeResize(16)), (ref24, DecodeResize(24))):
            for _ in range(2):
                assert sorted(ref.epoch(cached_dataset(source, prep, cache))) == list(range(n))
        a = cached_dataset(source, lambda d: scaled(d, 1.0), cache, shuffle=False)
        b = cached_dataset(source, lambda d: scaled(d, 2.0), cache, shuffle=False)
        for _ in range(2):
            xa = np.concatenate([x.numpy() for x, _ in a.batch(64)])
            xb = np.concatenate([x.numpy() for x, _ in b.batch(64)])
            np.testing.assert_array_equal(xb, 2 * xa)
        np.testing.assert_array_equal(xa, np.stack(ref16.values).astype(np.float32))
        prefixes = {k.rsplit(b":", 1)[0] for k in keys_of(cache.redis)}
        assert len(prefixes) == 4 and cache.stats()["redis_keys"] == 4 * n
        hits = {}
        for e in cache.stats()["epochs"]:
            hits.setdefault(e["dataset"], []).append(e["hits"])
        assert list(hits.values()) == [[0, n]] * 4   # no dataset read another's entries

        def noise(x):
            return tf.cast(x, tf.float32) + tf.random.uniform(tf.shape(x), 0, 0.5)
        aug = cached_dataset(source, DecodeResize(16), cache, shuffle=False, augment=noise)
        e1, e2 = (np.concatenate([x.numpy() for x, _ in aug.batch(64)]) for _ in range(2))
        assert e1.shape == (n, 16, 16, 3) and not np.array_equal(e1, e2)
        base = np.stack(ref16.values).astype(np.float32)
        np.testing.assert_array_equal(np.floor(e1), base)   # noise on top of the cached value
        np.testing.assert_array_equal(np.floor(e2), base)


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


def test_embedded_server_is_private(source):
    with DataCache(progress=False) as cache:
        cached_dataset(source, DecodeResize(16), cache)
        server = cache.server
        assert stat.S_IMODE(os.stat(server.dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(server.conf).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(server.socket).st_mode) & 0o077 == 0
        with open(f"/proc/{server.proc.pid}/cmdline", "rb") as f:
            assert server.password.encode() not in f.read()
        with pytest.raises(redis.AuthenticationError):
            bare(unix_socket_path=server.socket).ping()
        with pytest.raises(redis.AuthenticationError):
            bare(unix_socket_path=server.socket, password="guess").ping()
        cfg = cache.redis.config_get("*")
        assert cfg["port"] == "0" and cfg["save"] == "" and cfg["appendonly"] == "no"
        assert cfg["maxmemory-policy"] == "allkeys-lru" and int(cfg["maxmemory"]) == server.maxmemory > 0
        pid, where = server.proc.pid, server.dir
    assert not os.path.exists(where)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    import psutil
    with DataCache(unix_socket=False, progress=False) as cache:
        listening = [c.laddr for c in psutil.Process(cache.server.proc.pid).net_connections()
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(a.ip == "127.0.0.1" for a in listening)
        assert bare(port=cache.server.port, password=cache.server.password).ping()
        with pytest.raises(redis.AuthenticationError):
            bare(port=cache.server.port).ping()


def test_directory_of_a_killed_owner_is_removed_by_the_next_server():
    """A process killed with SIGKILL cannot remove its server's directory (its redis-server dies
    with it); the next RedisServer of this user removes it, and leaves the directories of live
    owners, those without an owner file and those of another host (a shared temp dir) alone."""
    parent = tempfile.mkdtemp(prefix="dc-stale-")   # short: unix socket paths are <= 107 bytes
    try:
        code = ("import datacache, sys; s = datacache.RedisServer(maxmemory='16mb'); "
                "print(s.dir, s.proc.pid, flush=True); sys.stdin.read()")
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, TMPDIR=parent))
        dead_dir, redis_pid = child.stdout.readline().split()
        live = RedisServer(maxmemory="16mb")   # in the default temp dir: must not be touched
        other = os.path.join(parent, "datacache-redis-noowner")
        os.mkdir(other, 0o700)
        elsewhere = os.path.join(parent, "datacache-redis-elsewhere")   # a dead pid, on another host
        os.mkdir(elsewhere, 0o700)
        with open(os.path.join(elsewhere, "owner"), "w") as f:
            f.write(f"{2**22 + 1} 1 other-host {uuid.uuid4()} pid:[1]\n")
        try:
            assert remove_stale_dirs(parent) == []   # the owner is alive
            child.kill()
            child.wait()
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{redis_pid}") and time.monotonic() < deadline:
                time.sleep(0.05)   # the server got SIGTERM when its parent died
            assert os.path.isdir(dead_dir)
            assert remove_stale_dirs(parent) == [dead_dir]
            assert not os.path.exists(dead_dir) and os.path.isdir(other) and os.path.isdir(elsewhere)
            assert live.alive() and os.path.isdir(live.dir)
            assert live.dir not in remove_stale_dirs()
        finally:
            live.stop()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_bad_arguments(tmp_path, source):
    with pytest.raises(ValueError, match="root"):
        ImageFolderSource(tmp_path / "missing")
    (tmp_path / "empty" / "class_a").mkdir(parents=True)
    with pytest.raises(ValueError, match="root .* holds no images"):
        ImageFolderSource(tmp_path / "empty")
    bmp = tmp_path / "bmp" / "class_a"
    bmp.mkdir(parents=True)
    (bmp / "a.bmp").write_bytes(b"BM")
    with pytest.raises(ValueError, match="unsupported image format .*a.bmp"):
        ImageFolderSource(tmp_path / "bmp")
    fake = tmp_path / "fake" / "class_a"
    fake.mkdir(parents=True)
    (fake / "a.jpg").write_bytes(b"GIF89a not really")
    with pytest.raises(ValueError, match="not a JPEG or PNG"):
        cached_dataset(ImageFolderSource(tmp_path / "fake"), DecodeResize(8), DataCache(redis_url=False))
    for shard in [(3, 3), (0, 10_000), "0/2", (-1, 2)]:
        with pytest.raises(ValueError, match="shard"):
            cached_dataset(source, DecodeResize(8), False, shard=shard)
    with pytest.raises(TypeError, match="preprocess"):
        cached_dataset(source, "resize", False)
    with pytest.raises(TypeError, match="cache"):
        cached_dataset(source, DecodeResize(8), "redis://")
    with pytest.raises(ValueError, match="maxmemory"):
        DataCache(maxmemory="lots")
    with pytest.raises(ValueError, match="eviction"):
        DataCache(eviction="sometimes")
    with pytest.raises(ValueError, match="redis_url"):
        DataCache(redis_url="http://localhost")
    # Varying shapes: decode without resize over images of two sizes.
    mixed = write_folder(str(tmp_path / "mixed"), n_classes=1, per_class=4)
    write_folder(str(tmp_path / "mixed2"), n_classes=1, per_class=4, size=40)
    os.rename(tmp_path / "mixed2" / "class_0", tmp_path / "mixed" / "class_1")
    with DataCache(redis_url=False) as cache:
        ds = cached_dataset(mixed, lambda d: tf.io.decode_image(d, 3, expand_animations=False), cache,
                            shuffle=False)
        with pytest.raises(tf.errors.OpError, match="preprocess returned shape"):
            list(ds)


def test_tfds_image_folder(tmp_path):
    import tensorflow_datasets as tfds

    write_folder(str(tmp_path / "train"), n_classes=3, per_class=4)
    write_folder(str(tmp_path / "test"), n_classes=2, per_class=2)
    builder = tfds.folder_dataset.ImageFolder(str(tmp_path))
    want = {os.path.basename(ex["image/filename"].numpy().decode()): int(ex["label"])
            for ex in builder.as_dataset(split="train", decoders={"image": tfds.decode.SkipDecoding()})}
    src = datacache.TfdsSource(builder, "train")
    ref = Reference(src, DecodeResize(16))
    assert {os.path.basename(f): int(lab) for f, lab in zip(src.files, src.labels)} == want
    with DataCache(progress=False) as cache:
        ds = cached_dataset(builder, DecodeResize(16), cache)   # the builder itself is a source
        assert sorted(ref.epoch(ds)) == list(range(12)) == sorted(ref.epoch(ds))
        assert cache.stats()["epochs"][1]["hits"] == 12
    with pytest.raises(ValueError, match="split"):
        datacache.TfdsSource(builder, "validation")


def test_warm_command_fills_a_server(source, ref16, tmp_path, monkeypatch):
    from datacache.cli import main

    n = len(source)
    server = RedisServer(maxmemory="64mb")
    try:
        monkeypatch.setenv("DATACACHE_REDIS_URL", server.url(with_password=True))
        assert main(["warm", source.root, "--size", "16", "--local-dir", str(tmp_path), "--shard", "0/2"]) == 0
        assert main(["warm", source.root, "--size", "16", "--local-dir", str(tmp_path), "--shard", "1/2"]) == 0
        with DataCache(server.url(with_password=True), str(tmp_path), progress=False) as cache:
            assert sorted(ref16.epoch(cached_dataset(source, DecodeResize(16), cache))) == list(range(n))
            first = cache.stats()["epochs"][0]
            assert (first["hits"], first["source_bytes"]) == (n, 0)
    finally:
        server.stop()


@pytest.mark.parametrize("nodes, per_node, seed", [(2, 4, 3), (3, 2, 0)], ids=["2x4", "3x2"])
def test_warm_fills_exactly_what_the_ranks_of_a_node_read(source, tmp_path, nodes, per_node, seed):
    """warm --node I/M --ranks-per-node n --seed S stores the union of the shards that the node's
    ranks (node-major) read in training (cached_dataset's own _Shard, with the source's labels and
    shard_seed S), no key more; those ranks' first epoch then misses nothing."""
    from datacache.cli import main
    from datacache.shards import _Shard

    n, size = len(source), nodes * per_node
    server = RedisServer(maxmemory="64mb")
    try:
        url = server.url(with_password=True)
        with DataCache(url, progress=False) as cache:
            covered = []
            for node in range(nodes):
                cache.redis.flushdb()
                assert main(["warm", source.root, "--size", "16", "--redis-url", url, "--node", f"{node}/{nodes}",
                             "--ranks-per-node", str(per_node), "--seed", str(seed)]) == 0
                keys = {int(k.rsplit(b":", 1)[1]) for k in keys_of(cache.redis)}
                ranks = range(node * per_node, (node + 1) * per_node)
                reads = [_Shard(n, r, size, seed, False, True, 0, source.labels).indices(1) for r in ranks]
                assert sorted(keys) == sorted(np.concatenate(reads).tolist())
                assert sorted(keys) == datacache.node_indices(n, node, nodes, per_node, seed, source.labels).tolist()
                covered += sorted(keys)
            assert sorted(covered) == list(range(n))   # the nodes' parts: the data set, once
            for rank in ranks:   # the last node's: every sample a hit
                ds = cached_dataset(source, DecodeResize(16), cache, shard=(rank, size), shard_seed=seed, seed=1)
                got = [int(y) for _, y in ds]
                assert len(got) == len(reads[rank - ranks[0]])
            hits = [(e["hits"], e["misses"], e["size"]) for e in cache.stats()["epochs"]]
            assert hits == [(len(r), 0, len(r)) for r in reads], hits
    finally:
        server.stop()


def test_warm_seed_and_layout_matter(source, tmp_path, capsys):
    """--shard I/N is --node I/N with one rank per node; a node of 4 ranks warmed as --shard 0/2
    (one rank's shard of 2) holds other samples, and so does another seed; bad layouts are named."""
    from datacache.cli import main

    n = len(source)
    server = RedisServer(maxmemory="64mb")
    try:
        url = server.url(with_password=True)
        with DataCache(url, progress=False) as cache:
            got = {}
            for name, args in (("shard", ["--shard", "1/2"]), ("node", ["--node", "1/2"]),
                               ("node4", ["--node", "1/2", "--ranks-per-node", "4"]),
                               ("seed", ["--node", "1/2", "--seed", "5"])):
                cache.redis.flushdb()
                assert main(["warm", source.root, "--size", "16", "--redis-url", url, *args]) == 0
                got[name] = sorted(int(k.rsplit(b":", 1)[1]) for k in keys_of(cache.redis))
            assert got["shard"] == got["node"] == datacache.shard_indices(n, 1, 2, 0, source.labels).tolist()
            assert got["node4"] == datacache.node_indices(n, 1, 2, 4, 0, source.labels).tolist() != got["node"]
            assert got["seed"] != got["node"] and len(got["seed"]) == len(got["node"])
    finally:
        server.stop()
    for args, message in [
        (["--node", "2/2"], "--node 2/2: need 0 <= I < N"),
        (["--node", "x"], "--node must look like I/N"),
        (["--ranks-per-node", "0"], "--ranks-per-node must be an integer >= 1"),
        (["--seed", "-1"], "--seed must be an integer >= 0 or 'none'"),
        (["--node", "0/2", "--shard", "0/2"], "give --node or --shard, not both"),
        (["--node", "0/11", "--ranks-per-node", "4"], "44 ranks in all, more than the 42 samples"),
        (["--labels", str(tmp_path / "none.txt")], "--labels '"),
        (["--classes", str(tmp_path / "none")], "--classes"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["warm", source.root, "--local-dir", str(tmp_path), *args])
        assert message in (str(e.value.code) + capsys.readouterr().err), args


def test_two_nodes_two_ranks_each(source, ref16, tmp_path):
    """2x2 under horovodrun: one server per node, each holding exactly its node's part."""
    n = len(source)
    reports = hvdrun.run("datacache_worker.py", 4, tmp_path, args=[source.root], topology="2x2", timeout=180)
    per_rank = []
    for rank, r in enumerate(reports):
        epochs = [[ref16.index[h] for h in e] for e in r["epochs"]]
        assert all(sorted(e) == sorted(epochs[0]) for e in epochs) and len(set(epochs[0])) == len(epochs[0])
        per_rank.append(sorted(epochs[0]))
        assert r["owns_server"] == (rank % 2 == 0) and r["hits"] == [0, len(epochs[0])]
    assert sorted(sum(per_rank, [])) == list(range(n))
    for node in range(2):
        part = sorted(per_rank[2 * node] + per_rank[2 * node + 1])
        assert part == sorted(sum((datacache.shard_indices(n, r, 4, 0, source.labels).tolist()
                                   for r in (2 * node, 2 * node + 1)), []))
        assert reports[2 * node]["keys"] == reports[2 * node + 1]["keys"] == part


def test_shards_are_random_samples_of_a_class_sorted_source():
    """A source listed class by class (ImageFolderSource's order) cut into shards: every shard holds
    every class in proportion, not the two or three classes of a contiguous range."""
    sizes = np.array([130, 90, 101, 99, 100, 100, 100, 97, 103, 80])
    labels = np.repeat(np.arange(10), sizes)   # 1000 samples, class-sorted, unequal classes
    for count in (2, 3, 4, 8):
        for seed in (0, 1):
            shards = [datacache.shard_indices(len(labels), i, count, seed, labels) for i in range(count)]
            assert sorted(np.concatenate(shards).tolist()) == list(range(len(labels)))
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
            per_class = np.array([np.bincount(labels[s], minlength=10) for s in shards])
            assert np.all(np.abs(per_class - sizes / count) <= 1), (count, per_class)
            # without labels: a random sample (every class present), not a contiguous range
            plain = datacache.shard_indices(len(labels), 0, count, seed)
            assert set(labels[plain].tolist()) == set(range(10))
    assert datacache.shard_indices(1000, 1, 4, 7).tolist() != datacache.shard_indices(1000, 1, 4, 0).tolist()
    contiguous = datacache.shard_indices(len(labels), 0, 4, seed=None)
    assert contiguous.tolist() == list(range(250))   # seed=None: the source's own order


def test_pipeline_shards_fixed_or_drawn_every_epoch(source, ref16):
    """Through cached_dataset (cached without Redis, and uncached): a shard holds every class, is the
    same every epoch (global_shuffle=False) or drawn anew (True); the shards of one epoch cover the
    data set exactly once either way; both paths yield the same order."""
    n, count = len(source), 3
    with DataCache(redis_url=False, progress=False, read_batch=8) as cache:
        fixed = [cached_dataset(source, DecodeResize(16), cache, shard=(i, count), seed=i) for i in range(count)]
        drawn = [cached_dataset(source, DecodeResize(16), cache, shard=(i, count), seed=i, global_shuffle=True)
                 for i in range(count)]
        epochs_fixed = [[ref16.epoch(ds) for ds in fixed] for _ in range(2)]
        epochs_drawn = [[ref16.epoch(ds) for ds in drawn] for _ in range(2)]
        uncached = cached_dataset(source, DecodeResize(16), False, shard=(1, count), seed=1)
        assert ref16.epoch(uncached) == epochs_fixed[0][1]   # same order, cached or not
    for shards in epochs_fixed + epochs_drawn:
        assert sorted(sum(shards, [])) == list(range(n))
        for s in shards:
            assert set(source.labels[s].tolist()) == set(range(N_CLASSES))
    assert [sorted(s) for s in epochs_fixed[0]] == [sorted(s) for s in epochs_fixed[1]]
    assert epochs_fixed[0] != epochs_fixed[1]   # reshuffled inside the shard
    assert [sorted(s) for s in epochs_drawn[0]] != [sorted(s) for s in epochs_drawn[1]]
    with pytest.raises(ValueError, match="shard_seed"):
        cached_dataset(source, DecodeResize(8), False, shard_seed=-1)
    with pytest.raises(ValueError, match="shard_seed"):
        cached_dataset(source, DecodeResize(8), False, shard_seed=None, global_shuffle=True)
    with pytest.raises(ValueError, match="global_shuffle"):
        cached_dataset(source, DecodeResize(8), False, global_shuffle="yes")
    # first_epoch: a data set built to start at epoch 2 (a resumed run's) yields what one built at
    # epoch 1 yielded second, cached or not, fixed or drawn shards
    with DataCache(redis_url=False, progress=False, read_batch=8) as cache:
        assert ref16.epoch(cached_dataset(source, DecodeResize(16), cache, shard=(0, count), seed=0,
                                          first_epoch=2)) == epochs_fixed[1][0]
        assert ref16.epoch(cached_dataset(source, DecodeResize(16), cache, shard=(2, count), seed=2,
                                          global_shuffle=True, first_epoch=2)) == epochs_drawn[1][2]
    assert ref16.epoch(cached_dataset(source, DecodeResize(16), False, shard=(1, count), seed=1,
                                      first_epoch=2)) == epochs_fixed[1][1]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="first_epoch"):
            cached_dataset(source, DecodeResize(8), False, first_epoch=bad)
    # samples_per_epoch: the first of each epoch's order, from the shard, other ones every epoch
    part = set(sorted(epochs_fixed[0][0]))
    with DataCache(redis_url=False, progress=False, read_batch=4) as cache:
        ds = cached_dataset(source, DecodeResize(16), cache, shard=(0, count), seed=0, samples_per_epoch=5)
        assert ds.cardinality() == 5
        firsts = [ref16.epoch(ds) for _ in range(3)]
    assert all(len(e) == len(set(e)) == 5 and set(e) <= part for e in firsts) and firsts[0] != firsts[1]
    for bad in (0, len(part) + 1, 2.5):
        with pytest.raises(ValueError, match="samples_per_epoch"):
            cached_dataset(source, DecodeResize(8), False, shard=(0, count), samples_per_epoch=bad)


def test_shard_of_any_dataset():
    n, count = 50, 4
    for seed in (0, 3):
        parts = [[int(v) for v in datacache.shard_of(tf.data.Dataset.range(n), n, (i, count), seed)]
                 for i in range(count)]
        assert parts == [datacache.shard_indices(n, i, count, seed).tolist() for i in range(count)]
        assert sorted(sum(parts, [])) == list(range(n))
    pairs = tf.data.Dataset.from_tensor_slices((np.arange(10), np.arange(10) * 2))
    assert [(int(a), int(b)) for a, b in datacache.shard_of(pairs, 10, (1, 2))] == \
        [(int(i), 2 * int(i)) for i in datacache.shard_indices(10, 1, 2)]


class ListSource:
    """A source of our own, not derived from ImageFolderSource: files listed in reverse order of
    the folder's, with the folder's labels (the datacache.Source protocol, nothing else)."""

    def __init__(self, folder_source):
        order = list(range(len(folder_source)))[::-1]
        self.root, self.class_names = folder_source.root, folder_source.class_names
        self.files = [folder_source.files[i] for i in order]
        self.labels, self.sizes, self.mtimes = (a[order] for a in (folder_source.labels, folder_source.sizes,
                                                                      folder_source.mtimes))
        self.order = order

    def __len__(self):
        return len(self.files)

    def path(self, i):
        return os.path.join(self.root, self.files[i])

    def fingerprint(self):
        return "list-source-" + ",".join(self.files)

    def check(self, i, data):
        if not data.startswith((b"\xff\xd8\xff", b"\x89PNG")):
            raise ValueError("not a JPEG or PNG")


def test_any_object_with_the_source_protocol_is_a_source(source, ref16, tmp_path):
    mine = ListSource(source)
    assert isinstance(mine, datacache.Source) and not isinstance(mine, ImageFolderSource)
    with DataCache(redis_url=False, local_dir=str(tmp_path / "local"), progress=False) as cache:
        got = ref16.epoch(cached_dataset(mine, DecodeResize(16), cache, shuffle=False, shard_seed=None))
    assert got == mine.order   # sample i of ListSource is file order[i] of the folder, bit for bit

    class NoFingerprint(ListSource):
        fingerprint = None

    broken = ListSource(source)
    del broken.mtimes
    for bad, lacks in ((broken, "mtimes"), (NoFingerprint(source), "fingerprint")):
        with pytest.raises(TypeError, match=f"source: .* lacks {lacks} of the datacache.sources.Source protocol"):
            cached_dataset(bad, DecodeResize(16), None)
