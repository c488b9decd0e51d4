"""The exchanges of tf_commlib.keras.DiLoCo: the mean of a flat float32 vector over a node's ranks, and over
the nodes (each local rank its slice, on its inter-node set) in a codec of tf_commlib.collectives.codec, with
the bytes each sends; and the one background thread that runs the exchanges between nodes in order."""
import queue
import threading

import tensorflow as tf

from tf_commlib import link_bytes, primitives
from tf_commlib.collectives import codec as codecs

CHUNK = 1 << 18   # entries per inter-node message of one exchange (Horovod runs its ops one at a time)


def shard_len(d, n):
    return -(-d // n)


def node_mean(flat, process_set, n):
    """The mean over the node's n ranks of flat (length a multiple of n), this rank's slice of it."""
    return primitives.reducescatter(flat, process_set) / float(n)


def by_allreduce(wire):
    """Horovod's allreduce can sum the wire type (a float cast; not QSGD's bytes, nor bfloat16)."""
    return wire.summable and wire.wire_dtype.is_floating


def _pieces(s, coded):
    """(start, end, coded?) messages of at most CHUNK entries: the first `coded` entries in the codec."""
    bounds = [(0, coded, True), (coded, s, False)]
    return [(a, min(a + CHUNK, end), lossy) for begin, end, lossy in bounds for a in range(begin, end, CHUNK)]


def inter_mean(shard, topo, wire, seed, coded=None, name="diloco"):
    """Mean over the nodes (this rank's inter-node set) of the flat float32 shard: its first ``coded``
    entries (all by default) on the wire of ``wire`` (a Codec), the rest (statistics) in float32. A
    summable codec by allreduce of shard/m, another by allgather of every node's encoding, in messages
    of at most CHUNK entries. Returns (mean, what this rank's message decodes to)."""
    m, s = topo.m, int(shard.shape[0])
    if m == 1:
        return shard, shard
    means, own = [], []
    for k, (a, b, lossy) in enumerate(_pieces(s, s if coded is None else coded)):
        part, codec = shard[a:b], wire if lossy else codecs.NONE
        if by_allreduce(codec):
            sent = codec.encode(part / float(m))
            total = primitives.allreduce(sent, topo.inter, name=f"{name}_{k}")
            means.append(codec.decode(total, None, tf.float32))
            own.append(codec.decode(sent, None, tf.float32) * float(m))
        else:
            data = _traced(codec, "encode")(part, tf.cast(seed + k, tf.int64))
            every = tf.reshape(primitives.allgather(data, topo.inter, name=f"{name}_{k}"), [m, -1])
            mean, mine = _traced(codec, "decode")(every, b - a, topo.inter.rank())
            means.append(mean)
            own.append(mine)
    return tf.concat(means, 0), tf.concat(own, 0)


_TRACED = {}   # (id of a codec, "encode" | "decode") -> (the codec, its tf.function)


def traces():
    """How many times inter_mean's codec functions were traced in this process (an exchange that traced
    one is no measure of an exchange)."""
    return sum(fn.experimental_get_tracing_count() for _, fn in list(_TRACED.values()))


def _traced(codec, kind):
    """The codec's work in inter_mean as a tf.function (eagerly an exchange of 154K values in int4 took
    about twice as long; the collective between them stays outside, so link_bytes counts it where it
    runs): "encode" (part, seed) -> the message; "decode" (every node's messages, n, this rank's index)
    -> (their mean, what this rank's message decodes to)."""
    key = (id(codec), kind)
    if key not in _TRACED:
        if kind == "encode":
            def fn(part, seed):
                return codec.to_bytes(part, seed=seed)
        else:
            def fn(every, n, rank):
                decoded = [codec.from_bytes(every[i], n) for i in range(every.shape[0])]
                return tf.add_n(decoded) / float(len(decoded)), decoded[rank]
        _TRACED[key] = (codec, tf.function(fn, autograph=False))
    return _TRACED[key][1]


def inter_bytes(s, wire, m, n, coded=None):
    """{"intra": B, "inter": B} a rank sends in inter_mean of a shard of s entries."""
    if m == 1:
        return link_bytes.add()
    counts = []
    for a, b, lossy in _pieces(s, s if coded is None else coded):
        codec = wire if lossy else codecs.NONE
        counts.append(link_bytes.per_rank("allreduce" if by_allreduce(codec) else "allgather", codec.bytes(b - a),
                                          "inter", m, n))
    return link_bytes.add(*counts)


class Exchanges:
    """One background thread that runs the inter-node exchanges in the order they are submitted."""

    def __init__(self):
        self.jobs, self.thread = queue.Queue(), None

    def submit(self, fn):
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="tf_commlib_diloco", daemon=True)
            self.thread.start()
        box = {"done": threading.Event()}
        self.jobs.put((fn, box))
        return box

    def _run(self):
        while True:
            fn, box = self.jobs.get()
            try:
                box["result"] = fn()
            except BaseException as e:   # re-raised on the training thread by wait()
                box["error"] = e
            box["done"].set()
            del fn, box   # nothing of a finished job (and the model it reaches) kept alive here

    @staticmethod
    def wait(box):
        box["done"].wait()
        if "error" in box:
            raise RuntimeError(f"DiLoCo: the inter-node exchange failed: {box['error']}") from box["error"]
        return box["result"]
