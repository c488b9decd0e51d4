"""Level 2 client: batched reads, asynchronous batched writes, and Redis outages survived.

A failed command marks Redis down; until the next retry (exponential backoff from
``retry_interval`` to ``max_retry_interval`` seconds) every read returns None at once (the caller
counts fallbacks and reads level 1 / the source) and writes are dropped, so an outage costs one
failed command per retry, not one per sample. A retry pings (restarting the embedded server first
when this process owns it and it died); when Redis answers, reads and writes resume and the cache
refills. A read the server refuses with an error reply (an ACL without MGET or the keys: -NOPERM)
is not an outage that a reconnect ends: the retry interval keeps doubling through the reconnects
until a read succeeds, so a permanent refusal costs one failed batch per ``max_retry_interval``.
Writes go through a queue to one thread that sends them in pipelines; a full Redis
(``maxmemory`` with ``noeviction``: OOM replies) drops the writes and is counted, reads go on.

A Redis Cluster is read and written node by node (one pipeline of GETs / SETs per master that holds
a key of the batch), so a master that fails costs only its own keys: they count as fallbacks (their
writes are dropped) and that node alone is retried with the same backoff, after a refresh of the
slot map, while the other masters' keys keep being read. A key whose slot moved or is moving
(resharding: MOVED / ASK) is read or written again through the cluster client, which follows the
redirection. The whole level is down only when every master is.
"""
import logging
import queue
import threading
import time

import numpy as np
import redis

log = logging.getLogger("datacache")


class RedisStore:
    def __init__(self, connect, server=None, retry_interval=1.0, max_retry_interval=30.0,
                 write_batch=64, queue_size=2048):
        self._connect = connect          # () -> (client, is_cluster)
        self.server = server             # the embedded RedisServer when this process owns it
        self.client = None
        self.cluster = False
        self.up = False
        self.retry_interval = float(retry_interval)
        self.max_retry_interval = float(max_retry_interval)
        self._interval = self.retry_interval
        self._retry_at = 0.0
        self._refused = False            # the last read got an error reply: keep backing off
        self._probing = False
        self._lock = threading.Lock()
        self.write_batch = int(write_batch)
        self.counts = {"writes": 0, "write_errors": 0, "writes_dropped": 0, "full": 0, "outages": 0,
                       "reconnects": 0, "node_outages": 0, "redirects": 0}
        self._nodes = {}                 # cluster node name -> (retry at, next interval) while it is down
        self._queue = queue.Queue(queue_size)
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name="datacache-writer", daemon=True)
        self._writer.start()
        self.available()

    def _count(self, key, n=1):
        with self._lock:
            self.counts[key] += n

    def available(self):
        """True when Redis is up; otherwise, at most once per retry interval, tries to reconnect."""
        if self.up:
            return True
        with self._lock:
            if self._closed or self._probing or time.monotonic() < self._retry_at:
                return False
            self._probing = True
        try:
            if self.server is not None and not self.server.alive():
                log.warning("datacache: the embedded redis-server is not running; restarting it")
                self.server.start()
            if self.client is None:
                self.client, self.cluster = self._connect()
            self.client.ping()
        except Exception as e:   # any failure to reach Redis means: stay down, retry later
            with self._lock:
                self._retry_at = time.monotonic() + self._interval
                log.warning("datacache: Redis unreachable (%s: %s); reading from level 1 / the source, "
                            "next try in %.1f s", type(e).__name__, e, self._interval)
                self._interval = min(self._interval * 2, self.max_retry_interval)
                self._probing = False
            return False
        with self._lock:
            if self.counts["outages"] or self.counts["reconnects"]:
                log.warning("datacache: Redis is back; the cache refills")
            self.counts["reconnects"] += 1
            if not self._refused:
                self._interval = self.retry_interval
            self.up = True
            self._probing = False
        return True

    def _down(self, error, refused=False):
        with self._lock:
            if not self.up:
                return
            self.up = False
            self.counts["outages"] += 1
            self._retry_at = time.monotonic() + self._interval
            wait = self._interval
            if refused:
                self._interval = min(self._interval * 2, self.max_retry_interval)
            self._refused = refused
        log.warning("datacache: Redis %s (%s: %s); reading from level 1 / the source, retrying "
                    "in %.1f s", "refused a read" if refused else "failed", type(error).__name__, error, wait)

    def failed(self, error, refused=False):
        """A read outside this client (the direct path) failed: Redis is down until the next retry.
        refused: the server answered with an error reply (not a lost connection)."""
        self._down(error, refused)

    def succeeded(self):
        """A read worked: the next outage backs off from retry_interval again."""
        if self._refused:
            with self._lock:
                self._refused = False
                self._interval = self.retry_interval

    def mget(self, keys):
        """(values, failed): the values (bytes, or None for an absent key) and a bool array of the keys
        that could not be read (in a cluster: those of a master that is down); (None, None) when
        Redis is not available at all."""
        if not self.available():
            return None, None
        if self.cluster:
            return self._cluster_mget(keys)
        try:
            values = self.client.mget(keys)
        except (redis.RedisError, OSError) as e:
            self._down(e, refused=isinstance(e, redis.ResponseError))
            return None, None
        self.succeeded()
        return values, np.zeros(len(keys), bool)

    # -- Redis Cluster: node by node --------------------------------------------------------------
    def _by_node(self, keys, failed):
        """{node name: (node, positions of its keys)} of the nodes that are not backing off; the keys
        of the others (and of uncovered slots) are marked in ``failed``."""
        groups = {}
        now = time.monotonic()
        for j, key in enumerate(keys):
            try:
                node = self.client.get_node_from_key(key)
            except (redis.RedisError, redis.exceptions.RedisClusterException):   # slot not covered
                failed[j] = True
                continue
            down = self._nodes.get(node.name)
            if down is not None and now < down[0]:
                failed[j] = True
                continue
            groups.setdefault(node.name, (node, []))[1].append(j)
        return groups

    def _node_pipeline(self, node, commands):
        """The replies of [(method, args)] sent in one pipeline to node; raises on a connection failure."""
        pipe = self.client.get_redis_connection(node).pipeline(transaction=False)
        for method, args in commands:
            getattr(pipe, method)(*args)
        return pipe.execute(raise_on_error=False)

    def _node_failed(self, node, error):
        with self._lock:
            retry_at, interval = self._nodes.get(node.name, (0.0, self.retry_interval))
            if time.monotonic() < retry_at:   # another batch in flight saw it fail first
                return
            first = node.name not in self._nodes
            self._nodes[node.name] = (time.monotonic() + interval, min(interval * 2, self.max_retry_interval))
            self.counts["node_outages"] += first
            primaries = {n.name for n in self.client.get_primaries()}
            all_down = primaries <= set(self._nodes)
        log.warning("datacache: Redis Cluster node %s failed (%s: %s); its keys are read from level 1 / "
                    "the source, retrying it in %.1f s", node.name, type(error).__name__, error, interval)
        try:   # a replica may have taken over its slots
            self.client.nodes_manager.initialize()
        except Exception:
            pass
        if all_down:
            self._down(error)

    def _node_ok(self, node):
        if node.name in self._nodes:
            with self._lock:
                if self._nodes.pop(node.name, None) is not None:
                    log.warning("datacache: Redis Cluster node %s is back", node.name)

    def _cluster_mget(self, keys):
        values = [None] * len(keys)
        failed = np.zeros(len(keys), bool)
        redirected, refusals, read = [], [], 0
        for node, js in self._by_node(keys, failed).values():
            try:
                replies = self._node_pipeline(node, [("get", (keys[j],)) for j in js])
            except (redis.RedisError, OSError) as e:
                self._node_failed(node, e)
                failed[js] = True
                continue
            self._node_ok(node)
            for j, r in zip(js, replies):
                if isinstance(r, redis.exceptions.AskError):   # MOVED or ASK: resharding
                    redirected.append(j)
                elif isinstance(r, Exception):                 # CLUSTERDOWN, NOPERM, ...
                    failed[j] = True
                    refusals.append(r)
                else:
                    values[j] = r
                    read += 1
        if redirected:
            self._count("redirects", len(redirected))
        for j in redirected:   # the cluster client follows the redirection and updates its slot map
            try:
                values[j] = self.client.get(keys[j])
                read += 1
            except (redis.RedisError, OSError):
                failed[j] = True
        if refusals and not read:
            self._down(refusals[0], refused=True)
            return None, None
        if read:
            self.succeeded()
        return values, failed

    def put(self, key, value):
        """Queues one write; dropped (and counted) when Redis is down or the queue stays full."""
        if not self.up and not self.available():
            self._count("writes_dropped")
            return
        try:
            self._queue.put((key, value), timeout=1.0)
        except queue.Full:
            self._count("writes_dropped")

    def _write_loop(self):
        while True:
            items = [self._queue.get()]
            if items[0] is None:
                self._queue.task_done()
                return
            while len(items) < self.write_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)   # stop after this batch
                    self._queue.task_done()
                    break
                items.append(item)
            try:
                self._send(items)
            finally:
                for _ in items:
                    self._queue.task_done()

    def _send(self, items):
        if not self.available():
            self._count("writes_dropped", len(items))
            return
        if self.cluster:
            results = self._cluster_set(items)
        else:
            try:
                pipe = self.client.pipeline(transaction=False)
                for key, value in items:
                    pipe.set(key, value)
                results = pipe.execute(raise_on_error=False)
            except (redis.RedisError, OSError) as e:
                if isinstance(e, (redis.ConnectionError, redis.TimeoutError, OSError)):
                    self._down(e)
                self._count("write_errors", len(items))
                return
        dropped = sum(r is None for r in results)
        self._count("writes_dropped", dropped)
        errors = [r for r in results if isinstance(r, Exception)]
        full = sum(isinstance(r, redis.exceptions.OutOfMemoryError) for r in errors)
        if errors:
            if not self.counts["full"] and not self.counts["write_errors"]:
                log.warning("datacache: Redis refused %d of %d writes (%s)%s", len(errors), len(items),
                            errors[0], "; it is full (maxmemory): raise maxmemory" if full else "")
            self._count("full", full)
            self._count("write_errors", len(errors) - full)
        self._count("writes", len(items) - len(errors) - dropped)

    def _cluster_set(self, items):
        """One result per item: True, an error reply, or None (dropped: its node is down)."""
        results = [None] * len(items)
        keys = [key for key, _ in items]
        for node, js in self._by_node(keys, np.zeros(len(items), bool)).values():
            try:
                replies = self._node_pipeline(node, [("set", items[j]) for j in js])
            except (redis.RedisError, OSError) as e:
                self._node_failed(node, e)
                continue
            self._node_ok(node)
            for j, r in zip(js, replies):
                if isinstance(r, redis.exceptions.AskError):   # MOVED or ASK: resharding
                    self._count("redirects")
                    try:
                        r = self.client.set(*items[j])
                    except (redis.ConnectionError, redis.TimeoutError, OSError):
                        r = None
                    except redis.RedisError as e:
                        r = e
                results[j] = r
        return results

    def flush(self, timeout=60.0):
        """Waits until the queued writes are sent (or dropped)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline and self._writer.is_alive():
            time.sleep(0.005)

    def info(self):
        """(used_memory bytes, number of keys) of the server (of the cluster's masters that answer),
        or (None, None) when down."""
        if not self.up:
            return None, None
        if self.cluster:
            used = keys = None
            for node in self.client.get_primaries():
                if node.name in self._nodes:
                    continue
                try:
                    r = self.client.get_redis_connection(node)
                    used, keys = (used or 0) + r.info("memory")["used_memory"], (keys or 0) + r.dbsize()
                except (redis.RedisError, OSError) as e:
                    self._node_failed(node, e)
            return used, keys
        try:
            memory = self.client.info("memory")
            keys = self.client.dbsize()
        except (redis.RedisError, OSError) as e:
            self._down(e)
            return None, None
        return memory["used_memory"], keys

    def close(self):
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
        self._queue.put(None)
        self._writer.join(5)
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
        self.up = False
