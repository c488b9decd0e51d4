"""Calibration of the alpha-beta cost model (tf_commlib.alphabeta): calibrate(topo) measures LinkParams on
the running cluster with the ops the collectives run; cached_calibration(topo, path) pays for it once per
cluster (a file keyed by the layout, the hosts, TensorFlow's version and calibrate's arguments).
"""
import dataclasses
import hashlib
import json
import math
import os
import secrets
import socket
import warnings

from tf_commlib.alphabeta import BYTES, LinkParams

_MIN_ALPHA, _MIN_BETA, _MIN_COMPUTE = 1e-6, 1e-13, 1e-13   # floors that keep fitted numbers > 0
_SHAPE = {"allreduce": lambda k: (2 * (k - 1) / k, 2 * (k - 1)),   # (bytes per byte of input, messages)
          "reducescatter": lambda k: ((k - 1) / k, k - 1), "allgather": lambda k: (k - 1, k - 1)}


def _fit(points, k):
    """alpha, beta of one link from {op: {size: seconds}} (three sizes) on a k-rank set, averaged over
    the ops. Ring All-Reduce moves 2(k-1)/k·4s bytes in 2(k-1) messages, Reduce-Scatter (k-1)/k·4s in
    k-1 (eq. (7)), All-Gather (k-1)·4s in k-1 (Gloo's ring; eq. (3) has log k). beta = dt/dbytes between the two large
    sizes; alpha = (t - beta·bytes)/messages of the tiny one."""
    alphas, betas = [], []
    for op, t in points.items():
        per_byte, steps = _SHAPE[op](k)
        tiny, small, big = sorted(t)
        beta = max((t[big] - t[small]) / (BYTES * per_byte * (big - small)), _MIN_BETA)
        alphas.append(max((t[tiny] - beta * BYTES * per_byte * tiny) / steps, _MIN_ALPHA))
        betas.append(beta)
    return sum(alphas) / len(alphas), sum(betas) / len(betas)


def sizes_for(largest_bucket):
    """calibrate's sizes= and compute_sizes= for a job whose largest bucket holds `largest_bucket`
    floats (the larger of fusion_threshold_bytes / 4 and its largest variable): B, that rounded up
    to a power of two within [2**16, 2**22] (calibrate's own largest); compute on arrays of B/16,
    B/4 and B, links with messages of B/4 and B but not under 2**18 and 2**20 floats (smaller ones
    meet TCP delayed-ACK stalls on loopback). calibrate's defaults (1M-16M floats) took 61 s at
    25 Mbit/s and 14 s unshaped for a model with buckets of 0.26M floats."""
    if isinstance(largest_bucket, bool) or not isinstance(largest_bucket, int) or largest_bucket < 1:
        raise ValueError(f"largest_bucket must be an int >= 1, got {largest_bucket!r}")
    big = min(2**22, max(2**16, 1 << (largest_bucket - 1).bit_length()))
    return {"sizes": (max(2**18, big // 4), max(2**20, big)), "compute_sizes": (big // 16, big // 4, big)}


def calibrate(topo, sizes=(2**20, 2**22), repeats=5, defaults=None, density=0.01,
              latency_size=256, compute_sizes=(2**20, 2**22, 2**24)):
    """Measures LinkParams on the running cluster; every rank returns the same numbers. Call it on every
    rank of a Horovod job (topo = tf_commlib.topology()).

    Links are timed with the ops the collectives run on them: beta from sizes[0] -> sizes[1] floats (x4
    inside a node, whose dense steps move whole gradients), alpha from a `latency_size` message (Horovod's
    per-call negotiation is most of it; 2**16-float messages hit 40 ms delayed-ACK stalls on loopback).
    Intra: every node at once, Reduce-Scatter and All-Gather on its intra set. Inter: the ranks of local
    index 0 only (one stream per node link), All-Reduce, and All-Gather at sizes/16 (the 0.1-3 MB sparse
    collectives send; 16 MB blasts into a shaped link run at half speed). Compute: all ranks at once time
    MSTopK and scatter-add on arrays of each of `compute_sizes` elements (a compute_curve: per-element
    costs fall as arrays fit the caches), and sparcml.merge of two streams of density·d entries. Link
    medians are averaged over the ranks that measured them, compute takes the slowest rank; a one-rank
    set keeps its link's default.
    """
    import tensorflow as tf

    from tf_commlib import timing
    from tf_commlib import primitives

    if not 0 < latency_size < sizes[0] // 16 < sizes[1] // 16:
        raise ValueError(f"need 0 < latency_size < sizes[0] // 16 < sizes[1] // 16, got {sizes}")
    defaults = defaults or LinkParams()
    counter = iter(range(10**9))

    def barrier():
        primitives.allreduce(tf.zeros([1]), topo.world, name=f"costmodel_barrier_{next(counter)}").numpy()

    def median_time(fn):
        return timing.median_time(fn, repeats)

    def link_points(pset, tag, scale):
        points = {op: {} for op in scale}
        for op in scale:
            for size in (latency_size, *(int(s * scale[op]) for s in sizes)):
                x = tf.ones([size], tf.float32)
                points[op][size] = median_time(lambda: timing.ready(getattr(primitives, op)(
                    x, pset, name=f"costmodel_{tag}_{op}_{next(counter)}")))
        return points

    measured = dataclasses.asdict(defaults)
    weight = dict.fromkeys(measured, 0.0)
    barrier()
    if topo.n > 1:   # every node at once on its own intra-node set
        a, b = _fit(link_points(topo.intra, "intra", {"reducescatter": 4, "allgather": 4}), topo.n)
        measured.update(alpha_intra=a, beta_intra=b)
        weight.update(alpha_intra=1.0, beta_intra=1.0)
    barrier()
    if topo.m > 1 and topo.local == 0:   # one stream per node link
        a, b = _fit(link_points(topo.inter, "inter", {"allreduce": 1, "allgather": 1 / 16}), topo.m)
        measured.update(alpha_inter=a, beta_inter=b)
        weight.update(alpha_inter=1.0, beta_inter=1.0)
    barrier()
    curve = [compute_points(d, density, topo.rank, median_time, barrier) for d in sorted(compute_sizes)]
    import horovod.tensorflow as hvd
    if topo.size > 1:   # a collective waits for its slowest rank: the max over ranks
        curve = hvd.allreduce(tf.constant(curve, tf.float64), op=hvd.Max,
                              name=f"costmodel_max_{next(counter)}").numpy().tolist()
    curve = tuple((d, *map(float, row)) for d, row in zip(sorted(compute_sizes), curve))
    rows = max(2, 2 * math.ceil(density * sorted(compute_sizes)[len(compute_sizes) // 2]))
    merge = merge_point(rows, topo.rank, median_time, barrier)
    if topo.size > 1:
        merge = float(hvd.allreduce(tf.constant(merge, tf.float64), op=hvd.Max,
                                    name=f"costmodel_merge_{next(counter)}").numpy())
    names = [f for f in measured if f.startswith(("alpha", "beta"))]
    local = tf.constant([measured[f] * weight[f] for f in names] + [weight[f] for f in names], tf.float64)
    total = primitives.allreduce(local, topo.world, name=f"costmodel_agree_{next(counter)}").numpy()
    sums, counts = total[:len(names)], total[len(names):]
    links = {f: float(sums[i] / counts[i]) if counts[i] > 0 else measured[f] for i, f in enumerate(names)}
    return LinkParams(**links, select_s_per_elem=curve[-1][1], add_s_per_elem=curve[-1][2],
                      mem_s_per_elem=curve[-1][3], merge_s_per_elem=merge, compute_curve=curve)


CACHE_VERSION = 1


def calibration_key(topo, calibrate_kwargs):
    """What a cached calibration holds for: the layout, the hosts of all ranks (a hash of their
    hostnames), TensorFlow's version and calibrate's arguments. Collective: every rank calls it."""
    import tensorflow as tf

    arguments = {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(calibrate_kwargs.items())}
    return {"version": CACHE_VERSION, "layout": [topo.m, topo.n], "hosts": _hosts(topo), "tensorflow": tf.__version__,
            "calibrate": arguments}


_HOSTS = {}   # (m, n): the hash of every rank's hostname, gathered once (a rank's host stays while it runs)


def _hosts(topo):
    """The hash of the sorted hostnames of every rank (one all-gather the first time per layout)."""
    import numpy as np
    import tensorflow as tf

    from tf_commlib import primitives

    if (topo.m, topo.n) not in _HOSTS:
        mine = np.frombuffer(hashlib.sha256(socket.gethostname().encode()).digest(), np.uint8)
        every = (primitives.allgather(tf.constant(mine), topo.world, name="costmodel_hosts").numpy()
                 if topo.size > 1 else mine)
        rows = sorted(bytes(row) for row in np.reshape(every, (-1, 32)))
        _HOSTS[(topo.m, topo.n)] = hashlib.sha256(b"".join(rows)).hexdigest()
    return _HOSTS[(topo.m, topo.n)]


def forget_hosts():
    """Forgets the gathered host hashes (Horovod started again on other ranks)."""
    _HOSTS.clear()


def _check_link_values(values):
    scalars = len(dataclasses.fields(LinkParams)) - 1
    if len(values) < scalars or (len(values) - scalars) % 4:
        raise ValueError(f"params must be {scalars} + 4k finite numbers >= 0, got {len(values)} numbers")


def _read_cache(path, key, check=_check_link_values):
    """The cached values for ``key``, or None (no file, another key, or an unreadable file: the
    last two say so). ``check(values)`` raises ValueError for values of the wrong form."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
        values = [float(v) for v in saved["params"]]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError("params must be finite numbers >= 0")
        check(values)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        warnings.warn(f"calibration cache {path} is unreadable ({type(e).__name__}: {e}): measuring again")
        return None
    if saved.get("key") != key:
        print(f"costmodel: calibration cache {path} is for another cluster or settings: measuring again", flush=True)
        return None
    return values


def _write_cache(path, key, values):
    """Writes the cache through a new file (0600, unguessable name, O_EXCL|O_NOFOLLOW) renamed over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".calibration-{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"key": key, "params": [float(v) for v in values]}, f)
    os.replace(tmp, path)


def _check_path(path, remeasure):
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"path must be a file path, got {path!r}")
    if not isinstance(remeasure, bool):
        raise ValueError(f"remeasure must be True or False, got {remeasure!r}")
    return os.fspath(path)


def cached_values(topo, path, key, measure, check=lambda values: None, remeasure=False):
    """(list of floats, "cached" or "measured"): what ``measure()`` returns (the same on every rank),
    kept in ``path`` under ``key`` (calibration_key). Rank 0 reads the file; where it holds values
    for this key and ``remeasure`` is False, every rank gets them (rank 0's float64s, one all-gather);
    else every rank measures and rank 0 writes the file (0600); where measure() returns no values
    (on every rank), ([], "skipped") and no file. Collective: every rank calls it."""
    import numpy as np
    import tensorflow as tf

    from tf_commlib import primitives

    path = _check_path(path, remeasure)
    values = _read_cache(path, key, check) if topo.rank == 0 and not remeasure else None
    if topo.size > 1:   # rank 0's values on every rank, the others adding none: one all-gather
        mine = np.asarray(values or [], np.float64) if topo.rank == 0 else np.zeros(0, np.float64)
        values = primitives.allgather(tf.constant(mine), topo.world, name="costmodel_cache").numpy().tolist()
    if values:
        return [float(v) for v in values], "cached"
    measured = [float(v) for v in measure()]
    if not measured:   # measure() chose not to (the same on every rank): nothing kept
        return [], "skipped"
    if topo.rank == 0:
        _write_cache(path, key, measured)
    return measured, "measured"


def cached_calibration(topo, path, remeasure=False, **calibrate_kwargs):
    """(LinkParams, "cached" or "measured"): calibrate(topo, **calibrate_kwargs), paid once per
    cluster. Rank 0 reads ``path`` (e.g. in the checkpoint directory); where it holds a calibration
    for this key (calibration_key) and ``remeasure`` is False, every rank gets those numbers (sent
    from rank 0 as float64s); else every rank measures and rank 0 writes the file. A file for
    another layout, other hosts or other arguments is measured again; an unreadable one too, with a
    warning naming it. Collective: every rank calls it with the same arguments."""
    values, how = cached_values(topo, path, calibration_key(topo, calibrate_kwargs),
                                lambda: calibrate(topo, **calibrate_kwargs).as_list(), _check_link_values, remeasure)
    return LinkParams.from_list(values), how


def compute_points(d, density, seed, median_time, barrier):
    """[select, add, mem] seconds per element measured on arrays of d elements: MSTopK of
    density·d, a zero-filled scatter-add output, and the adds NaiveAG makes on 4 ranks: four
    index-sorted selections of density·d (what every sparse collective scatters: selections and
    merged streams are sorted by index, which makes the adds far cheaper than in random order)."""
    import numpy as np
    import tensorflow as tf

    from tf_commlib import ops
    from tf_commlib.timing import ready

    x = tf.constant(np.random.default_rng(seed).standard_normal(d, dtype=np.float32))
    barrier()
    t_sel = median_time(lambda: ready(ops.mstopk(x, max(1, math.ceil(density * d)), seed=0)))
    barrier()
    rng = np.random.default_rng(1)
    k = max(1, math.ceil(density * d))
    nnz = 4 * k
    idx = tf.constant(np.concatenate([np.sort(rng.choice(d, k, replace=False)) for _ in range(4)]).astype(np.int32))
    vals = tf.ones([nnz], tf.float32)
    t_fill = median_time(lambda: ready(ops.scatter_add(idx[:1], vals[:1], d)))
    t_add = median_time(lambda: ready(ops.scatter_add(idx, vals, d)))
    return [max(t_sel / d, _MIN_COMPUTE), max((t_add - t_fill) / nnz, _MIN_COMPUTE),
            max(t_fill / d, _MIN_COMPUTE)]


def merge_point(rows, seed, median_time, barrier):
    """Seconds per row of sparcml.merge on two index-sorted streams of rows/2 random entries each."""
    import numpy as np
    import tensorflow as tf

    from tf_commlib.collectives.sparcml import merge
    from tf_commlib.collectives.sparse_message import pack
    from tf_commlib.timing import ready

    rng = np.random.default_rng(seed)
    half = [np.sort(rng.integers(0, 2**30, rows // 2, dtype=np.int32)) for _ in range(2)]
    stream = pack(tf.ones([2 * (rows // 2)], tf.float32), tf.constant(np.concatenate(half)))
    barrier()
    return max(median_time(lambda: ready(merge(stream))) / (2 * (rows // 2)), _MIN_COMPUTE)


def compute_seconds(topo, model, x, y, loss, repeats=5):
    """Seconds of forward+backward per training step of `model` on the batch (x, y) (training=True):
    the median over `repeats` runs of the slowest rank's time, each run started on every rank at once
    (tf_commlib.timing.Timer; CPU sharing is included), so every rank returns the same number.
    Overlapped aggregation runs beside it (DistributedOptimizer(auto=Auto(compute_s=...))). `loss`: loss(y_true, y_pred). The model's
    non-trainable variables (batch-norm statistics) are restored afterwards. Call it at the batch
    and resolution the choice is for (progressive resizing: one stage's)."""
    from tf_commlib import timing

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if not isinstance(getattr(topo, "size", None), int):
        raise ValueError(f"topo must be a tf_commlib topology (tf_commlib.topology()), got {topo!r}")
    step = timing.forward_backward(model, x, y, loss)   # builds the model first: its statistics exist

    def run():
        timing.ready(step())

    with timing.model_state_kept(model):
        run()   # traced on every rank before the timed runs, each of which starts after a barrier
        return timing.Timer(topo).interleaved({"forward_backward": run}, repeats, warmup=0)["forward_backward"]
