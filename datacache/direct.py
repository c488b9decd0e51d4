"""The direct read path: one MGET per batch in C++ (the DatacacheMget op of datacache's own op
library, datacache/_loader.py), which checks every value (length, header, sample index, CRC32) and
receives its payload straight into the batch tensor, with no Python and no GIL per batch. It
reaches a plain Redis over a unix socket or TCP, with password / username / db as the redis-py
client has them; TLS, credential providers and Redis Cluster keep the redis-py path
(``DataCache(direct_read=False)`` forces it, and needs no op library)."""
import numpy as np
import redis
import tensorflow as tf

from datacache._loader import ops as _ops   # None when not built: the redis-py path still works


def direct_attrs(client):
    """The op's attrs (address, username, db) for a redis-py client, or None when it needs the
    redis-py path (TLS, a credential provider, a cluster client, no op library)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or _ops() is None:
        return None
    kw = pool.connection_kwargs
    if kw.get("credential_provider") is not None:
        return None
    if pool.connection_class is redis.UnixDomainSocketConnection:
        address = f"unix:{kw['path']}"
    elif pool.connection_class is redis.Connection:
        address = f"tcp:{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
    else:
        return None
    timeout = kw.get("socket_timeout") or 10
    connect_timeout = kw.get("socket_connect_timeout") or timeout
    return {"address": address, "username": kw.get("username") or "", "db": int(kw.get("db") or 0),
            "timeout_ms": _ms(timeout), "connect_timeout_ms": _ms(connect_timeout)}


def _ms(seconds):
    """An int32 attr of milliseconds (a timeout over 24.8 days is clamped)."""
    return max(1, min(2**31 - 1, int(seconds * 1000)))


def mget(keys, indices, password, enabled, attrs, codec):
    """(values, hit, present, ok, error) of one batch: see ops/datacache/mget_op.cc."""
    return _ops().datacache_mget(keys, indices, password, enabled, prefix=codec.prefix,
                                 dtype=tf.as_dtype(np.dtype(codec.dtype)), shape=list(codec.shape),
                                 **attrs)
