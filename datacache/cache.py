"""DataCache: level 1 (local copies of the source files) and level 2 (Redis), with counters.

``DataCache()`` starts the embedded server: before Horovod is initialised this process starts it;
after ``hvd.init()`` the local rank 0 of every node starts one and hands its socket path and password
to the node's other ranks with one allgather over all ranks, so every rank must create its DataCache
at the same point. The nodes are those of Horovod's local/cross ranks, or of the emulated layout
``TF_COMMLIB_TOPOLOGY=MxN`` (node-major ranks) when it is set. ``redis_url=`` uses a running server
or a Redis Cluster instead (detected with INFO cluster); ``redis_kwargs`` go to redis-py (TLS
certificates, password, ...). ``redis_url=False`` keeps level 1 only.
"""
import atexit
import json
import logging
import os
import re
import sys
import threading
from typing import NamedTuple

import numpy as np
import redis

from datacache.direct import direct_attrs
from datacache.local import LocalCopy, read_source
from datacache.server import EVICTIONS, RedisServer, parse_maxmemory
from datacache.store import RedisStore

log = logging.getLogger("datacache")
COUNTERS = ("samples", "hits", "misses", "fallbacks", "corrupt", "source_bytes", "local_bytes")
_INFO_BYTES = 1024
LAYOUT_ENV = "TF_COMMLIB_TOPOLOGY"   # 'MxN': an emulated node layout, read as the training library does


class Node(NamedTuple):
    """This rank's place: rank and size of the world, its node and its index in it (of n)."""
    rank: int
    size: int
    node: int
    local: int
    n: int


def _topology():
    """This rank's Node once Horovod is initialised (else None). Its node: ``$TF_COMMLIB_TOPOLOGY``
    ('MxN', node-major ranks: one machine may emulate several nodes) when set, else Horovod's
    local/cross ranks; the same grouping as the training library's topology."""
    hvd = sys.modules.get("horovod.tensorflow")   # not imported: nobody initialised it
    if hvd is None or not hvd.is_initialized():
        return None
    rank, size = hvd.rank(), hvd.size()
    spec = os.environ.get(LAYOUT_ENV)
    if spec:
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", spec)
        if not match or int(match[1]) < 1 or int(match[2]) < 1 or int(match[1]) * int(match[2]) != size:
            raise ValueError(f"{LAYOUT_ENV}={spec!r} is not an MxN layout of the {size} ranks")
        n = int(match[2])
        return Node(rank, size, rank // n, rank % n, n)
    return Node(rank, size, hvd.cross_rank(), hvd.local_rank(), hvd.local_size())


def _share_with_node(info, topo):
    """The dict of the node's local rank 0, on every rank of the node: one allgather over all ranks
    (no process set to register), where each local rank 0 gives [its node, its dict]."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    data = json.dumps([topo.node, info]).encode() if topo.local == 0 else b""
    if len(data) > _INFO_BYTES:
        raise ValueError("the embedded server's address is too long to share")
    buf = np.zeros((1, _INFO_BYTES), np.uint8)
    buf[0, :len(data)] = np.frombuffer(data, np.uint8)
    rows = hvd.allgather(tf.constant(buf), name="datacache_info").numpy()
    for row in rows:
        text = row.tobytes().rstrip(b"\0")
        if text:
            node, got = json.loads(text)
            if node == topo.node:
                return got
    raise RuntimeError(f"datacache: no rank of node {topo.node} has local index 0")


class DataCache:
    """Two-level cache of pre-processed samples; pass it to ``cached_dataset(..., cache=)``.

    redis_url: None (embedded server per node), a URL (``redis://``, ``rediss://``, ``unix://``;
        a Redis Cluster is detected), or False (no level 2).
    local_dir: directory for the level-1 copies of the source files; None: read the source.
    maxmemory: embedded server's memory: a fraction of the free memory (default 0.25), bytes or '4gb'.
    eviction: embedded server's maxmemory-policy (allkeys-lru; noeviction keeps a fixed subset
        cached when the data set is larger than maxmemory).
    unix_socket: embedded server on a unix socket (default) or on 127.0.0.1 TCP.
    retry_interval, max_retry_interval: backoff between reconnection tries while Redis is down.
    read_batch: samples per MGET; write_batch: writes per pipeline.
    progress: show a progress bar while an epoch fills the cache (rank 0 only).
    direct_read: read batches with the C++ op (datacache.direct) where the server allows it;
        False: through redis-py in Python.
    """

    def __init__(self, redis_url=None, local_dir=None, *, maxmemory=None, eviction="allkeys-lru",
                 unix_socket=True, redis_kwargs=None, retry_interval=1.0, max_retry_interval=30.0,
                 read_batch=128, write_batch=64, progress=True, direct_read=True):
        if not isinstance(read_batch, int) or read_batch < 1:
            raise ValueError(f"read_batch must be a positive int, got {read_batch!r}")
        if not isinstance(write_batch, int) or write_batch < 1:
            raise ValueError(f"write_batch must be a positive int, got {write_batch!r}")
        if retry_interval <= 0 or max_retry_interval < retry_interval:
            raise ValueError("retry_interval must be > 0 and <= max_retry_interval, got "
                             f"{retry_interval!r}, {max_retry_interval!r}")
        self.local = LocalCopy(local_dir) if local_dir is not None else None
        self.read_batch = read_batch
        self.direct_read = bool(direct_read)
        topo = _topology()
        self.progress = bool(progress) and (topo is None or topo.rank == 0)
        self.server = None
        self.store = None
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._epochs = []
        common = dict(socket_timeout=10, socket_connect_timeout=2, socket_read_size=1 << 20,
                      retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
        common.update(redis_kwargs or {})
        if redis_url is None:
            parse_maxmemory(maxmemory)   # bad arguments fail on every rank, before any collective
            if eviction not in EVICTIONS:
                raise ValueError(f"eviction must be one of {', '.join(EVICTIONS)}, got {eviction!r}")
            info = {}
            if topo is None or topo.local == 0:
                try:
                    self.server = RedisServer(maxmemory, eviction, unix_socket)
                    info = self.server.client_kwargs()
                except (RuntimeError, OSError) as e:
                    log.warning("datacache: the embedded redis-server did not start (%s); "
                                "reading from level 1 / the source", e)
                    info = {"error": str(e)}
            if topo is not None and topo.size > 1:   # on every rank: node sizes may differ
                info = _share_with_node(info, topo)

            def connect():
                if "error" in info:
                    raise RuntimeError(f"the embedded redis-server did not start: {info['error']}")
                return redis.Redis(**info, **common), False
            self.store = RedisStore(connect, self.server, retry_interval, max_retry_interval, write_batch)
        elif redis_url is not False:
            if not isinstance(redis_url, str):
                raise TypeError(f"redis_url must be a URL string, None or False, got {type(redis_url).__name__}")
            try:
                redis.Redis.from_url(redis_url).close()   # parses only; connects on first use
            except ValueError as e:
                raise ValueError(f"redis_url {redis_url!r}: {e}") from None

            def connect():
                client = redis.Redis.from_url(redis_url, **common)
                try:
                    cluster = client.info("cluster").get("cluster_enabled") == 1
                except redis.ResponseError:   # INFO may be renamed away: assume a plain server
                    cluster = False
                if not cluster:
                    return client, False
                client.close()
                from redis.cluster import RedisCluster
                kwargs = {k: v for k, v in common.items() if k != "retry"}
                return RedisCluster.from_url(redis_url, **kwargs), True
            self.store = RedisStore(connect, None, retry_interval, max_retry_interval, write_batch)
        atexit.register(self.close)

    @property
    def redis(self):
        """The redis-py client (None without level 2 or before the first connection)."""
        return self.store.client if self.store is not None else None

    def direct(self):
        """(op attrs, password as bytes) for the direct read path, or None for the redis-py path."""
        store = self.store
        if self.direct_read and store is not None and store.client is None:
            log.warning("datacache: Redis was unreachable when this dataset was built; it reads "
                        "through redis-py (the direct path needs to know whether the server is a "
                        "cluster)")
        if not self.direct_read or store is None or store.client is None or store.cluster:
            return None
        attrs = direct_attrs(store.client)
        if attrs is None:
            return None
        password = store.client.connection_pool.connection_kwargs.get("password") or b""
        return attrs, password if isinstance(password, bytes) else str(password).encode()

    # -- level 1 ---------------------------------------------------------------------------------
    def read(self, source, i, record=None):
        """The encoded bytes of sample i, through level 1; counts the bytes read from the source."""
        data, from_source = self.local.read(source, i) if self.local else read_source(source, i)
        self.count(record, source_bytes=from_source, local_bytes=len(data) - from_source)
        return data

    # -- counters --------------------------------------------------------------------------------
    def new_epoch(self, dataset, epoch, size):
        record = dict(dataset=dataset, epoch=epoch, size=size, **dict.fromkeys(COUNTERS, 0))
        with self._lock:
            self._epochs.append(record)
        return record

    def count(self, record=None, **counts):
        with self._lock:
            for k, v in counts.items():
                self._counts[k] += v
                if record is not None:
                    record[k] += v

    def stats(self):
        """hits, misses (absent or invalid), fallbacks (Redis down, or the cluster node holding the
        key), corrupt (invalid values),
        source_bytes / local_bytes (read from the source / from level 1), the store's counters
        (writes, outages, a cluster's node_outages and redirects, ...),
        redis_bytes / redis_keys (the server's used_memory and key count), redis_up, and one
        record per epoch of every dataset (``epochs``)."""
        with self._lock:
            out = dict(self._counts)
            out["epochs"] = [dict(e) for e in self._epochs]
        store = self.store
        out.update(store.counts if store else {})
        out["redis_bytes"], out["redis_keys"] = store.info() if store else (None, None)
        out["redis_up"] = bool(store and store.up)
        out["embedded_server"] = self.server.url() if self.server else None
        return out

    def flush(self):
        """Waits until the queued writes have reached Redis (or were dropped)."""
        if self.store is not None:
            self.store.flush()

    def close(self):
        """Sends the queued writes, closes the connection and stops the embedded server."""
        atexit.unregister(self.close)
        if self.store is not None:
            self.store.close()
        if self.server is not None:
            self.server.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
