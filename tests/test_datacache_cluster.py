"""DataCache against a real Redis Cluster (three masters, tests/redis_cluster.py): epoch 2 from the
cluster, a master SIGKILLed mid-epoch (only its keys fall back), resharding during epochs."""
import os
import threading
import time

import pytest
import redis
from redis.crc import key_slot

from datacache import DataCache, DecodeResize, cached_dataset
from tests.datacache_data import digest
from tests.redis_cluster import RedisCluster


def cluster_cache(cluster, **kwargs):
    cache = DataCache(cluster.url(0), progress=False, read_batch=4, retry_interval=0.05,
                      max_retry_interval=0.2, **kwargs)
    assert cache.store.cluster, "INFO cluster of the master did not say cluster_enabled:1"
    assert cache.direct() is None   # a cluster reads through redis-py
    return cache


def indices_on(cluster, i, prefix):
    """The sample indices whose keys master i holds."""
    return {int(k.rsplit(b":", 1)[1]) for k in cluster.keys(i, prefix.decode() + "*")}


def stats_of(record):
    return {k: record[k] for k in ("hits", "misses", "fallbacks")}


def test_cluster_helper_is_private_and_leaves_nothing():
    cluster = RedisCluster()
    with cluster:
        pids, dirs = [p.pid for p in cluster.procs], list(cluster.dirs)
        for i, pid in enumerate(pids):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert cluster.password.encode() not in f.read()
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(port=cluster.ports[i], socket_timeout=5,   # no retries: fails at once
                            retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0)).ping()
            with cluster.client(i) as c:
                assert c.config_get("bind")["bind"] == "127.0.0.1"
                assert c.config_get("save")["save"] == "" and c.config_get("appendonly")["appendonly"] == "no"
        assert sorted(len(cluster.slots(i)) for i in range(3)) == [5461, 5461, 5462]
    for pid, d in zip(pids, dirs):
        assert not os.path.exists(f"/proc/{pid}") and not os.path.exists(d)
    # A failure inside the block stops every server too.
    with pytest.raises(RuntimeError, match="inside"):
        with RedisCluster() as cluster:
            pids = [p.pid for p in cluster.procs]
            raise RuntimeError("inside")
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_cluster_epochs_and_a_master_killed_mid_epoch(redis_cluster, source, ref16):
    """Epoch 2 comes from the cluster; a master SIGKILLed mid-epoch loses and duplicates no sample,
    and from then on exactly its keys fall back to the source while the other masters' are read."""
    n, victim = len(source), 1
    with cluster_cache(redis_cluster) as cache:
        # Sequential maps: lookups happen as samples are consumed, so the kill lands mid-epoch.
        ds = cached_dataset(source, DecodeResize(16), cache, seed=1, num_parallel_calls=None)
        assert sorted(ref16.epoch(ds)) == list(range(n))
        assert sorted(ref16.epoch(ds)) == list(range(n))
        e = cache.stats()["epochs"]
        assert stats_of(e[0]) == dict(hits=0, misses=n, fallbacks=0)
        assert stats_of(e[1]) == dict(hits=n, misses=0, fallbacks=0)
        prefix = e[0]["dataset"].encode()
        on = [indices_on(redis_cluster, i, prefix) for i in range(3)]
        assert sorted(sum(map(list, on), [])) == list(range(n)), "every key on exactly one master"
        assert all(on), f"keys per master: {list(map(len, on))}"
        lost = on[victim]
        lost_bytes = int(sum(source.sizes[i] for i in lost))

        seen = []
        for k, (x, y) in enumerate(ds):   # epoch 3
            if k == 8:
                redis_cluster.kill(victim)
            seen.append(ref16.index[digest(x.numpy())])   # a KeyError is a wrong value
            assert y == ref16.labels[seen[-1]]
        assert sorted(seen) == list(range(n)), "a sample lost or duplicated in the epoch of the kill"
        third = cache.stats()["epochs"][2]
        assert third["hits"] >= n - len(lost) and 0 < third["fallbacks"] <= len(lost), stats_of(third)
        assert third["hits"] + third["fallbacks"] == n

        # Once the cluster has marked the master failed, the others still serve their slots.
        redis_cluster.wait_failed(victim)
        assert sorted(ref16.epoch(ds)) == list(range(n))
        fourth = cache.stats()["epochs"][3]
        assert stats_of(fourth) == dict(hits=n - len(lost), misses=0, fallbacks=len(lost))
        assert fourth["source_bytes"] == lost_bytes   # exactly the dead master's samples were read
        # Several batches in flight at once: the same split.
        par = cached_dataset(source, DecodeResize(16), cache, seed=2)
        assert sorted(ref16.epoch(par)) == list(range(n))
        s = cache.stats()
        assert stats_of(s["epochs"][4]) == dict(hits=n - len(lost), misses=0, fallbacks=len(lost))
        assert s["redis_up"] and s["outages"] == 0 and s["node_outages"] == 1
        assert s["redis_keys"] == n - len(lost)   # the live masters' keys


def test_resharding_during_epochs(redis_cluster, source, ref16):
    """Slots (and their keys) move from one master to another while the cache is filled and read:
    every epoch exact and bit-equal, every sample written during the move readable afterwards."""
    n = len(source)
    with cluster_cache(redis_cluster) as cache:
        ds = cached_dataset(source, DecodeResize(16), cache, seed=1)
        before = [redis_cluster.slots(i) for i in range(3)]
        done = threading.Event()
        errors = []

        def reshard():
            try:
                redis_cluster.reshard(0, 2, 5000, timeout=120)
            except BaseException as e:   # reported by the test thread
                errors.append(e)
            finally:
                done.set()

        thread = threading.Thread(target=reshard, daemon=True)
        thread.start()
        epochs_during, deadline = 0, time.monotonic() + 120
        try:
            while not done.is_set():   # the first epoch fills the cache while slots move
                assert time.monotonic() < deadline, "resharding 5000 slots took over 120 s"
                assert sorted(ref16.epoch(ds)) == list(range(n)), "a sample lost or duplicated"
                epochs_during += not done.is_set()
        finally:
            thread.join(130)
        assert not errors, errors[0]
        assert epochs_during >= 2, "the resharding ended before two epochs ran: it tested nothing"
        redis_cluster.wait_ok()
        after = [redis_cluster.slots(i) for i in range(3)]
        assert len(after[0]) == len(before[0]) - 5000 and len(after[2]) == len(before[2]) + 5000
        assert sorted(ref16.epoch(ds)) == list(range(n))
        e = cache.stats()["epochs"]
        prefix = e[0]["dataset"].encode()
        on = [indices_on(redis_cluster, i, prefix) for i in range(3)]
        assert sorted(sum(map(list, on), [])) == list(range(n)), "a key lost or on two masters"
        moved = [i for i in on[2] if key_slot(prefix + b"%d" % i) in before[0]]
        assert moved, "no key of the data set was in the slots that moved"
        assert stats_of(e[0]) == dict(hits=0, misses=n, fallbacks=0)
        for r in e[1:]:   # every later epoch, during and after the move, read the whole set from Redis
            assert stats_of(r) == dict(hits=n, misses=0, fallbacks=0), (r["epoch"], stats_of(r))
        s = cache.stats()
        assert s["node_outages"] == 0 and s["outages"] == 0
        assert s["redirects"] > 0, "no read or write met a MOVED / ASK reply: the move was not seen"
