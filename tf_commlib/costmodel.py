"""The alpha-beta cost model: link parameters (LinkParams) and their calibration, the time
formulas of the group primitives and of the compute steps on them, and `choose` (auto): argmin
of the predictions of every registered collective. Each collective's own formula lives in its
module (tf_commlib/collectives/*.py, Collective.time), written with the helpers here.

Layout: m nodes x n ranks per node (P = m*n), d float32 gradient elements (4 bytes), density rho.
Communication follows shi2021 §3.2: eq. (3) for an All-Gather of k FP32 elements over P ranks
(with the p-1 latency steps of Gloo's ring allgatherv instead of log P), eq. (7) for a Reduce-Scatter; ring All-Reduce as in tyagi Table I (2(N-1)·α + 2(N-1)/N·M·β).
Two conventions the papers leave open, fixed here:

* Sparse messages are values *and* int32 indices packed in one message (collectives/
  sparse_message.py): one All-Gather of 8 bytes per entry (eqs. (3) and (9) are written for 4;
  tyagi's AG = α·logN + 2Mcβ(N-1) counts both arrays too).
* beta_inter is the time per byte of one node's inter-node link (its NIC). Concurrent inter-node
  streams of the n ranks of a node (HiTopKComm step 3, 2DTAR's inter All-Reduce) share that link,
  so their bytes are multiplied by n (eq. (9) is written per stream). A world-wide ring (dense,
  NaiveAG) crosses each node boundary once per direction and pays the inter link when m > 1
  (world_link).

Compute: selection costs select_s_per_elem per input element (eq. (8), O(d/n)); scatter-add costs
add_s_per_elem per accumulated element plus mem_s_per_elem per element of the zero-filled output;
error feedback a scatter-add of k into the selection's input and a subtraction; merging sparse
streams (SparCML) merge_s_per_elem per row merged. log is log2; every
term vanishes on a one-rank set, so m = 1 or n = 1 give finite costs. Choice is by argmin of the
predictions (tyagi's closed-form inequalities divide by zero at N = 2). Bytes per link are not
here: see tf_commlib.link_bytes and Collective.bytes.
"""
import dataclasses
import math

BYTES = 4          # float32 values, int32 indices
SPARSE_BYTES = 8   # one entry of a packed sparse message


@dataclasses.dataclass(frozen=True)
class LinkParams:
    """Seconds (alpha), seconds per byte (beta) and seconds per element (compute).

    Defaults: a public-cloud CPU node pair: 25 Gbit/s inside a node (shared memory / loopback TCP
    through Gloo, 20 µs per message), 10 Gbit/s between nodes (a VPC link, 100 µs per message,
    Horovod's negotiation included), MSTopK ~1 ns/element, scatter-add of index-sorted streams
    ~2 ns/element, zero-filling ~0.25 ns/element, merging a sparse stream (sort by index, unique,
    segment sum: sparcml.merge) ~100 ns/entry (one core each).
    """
    alpha_intra: float = 20e-6
    beta_intra: float = 8 / 25e9
    alpha_inter: float = 100e-6
    beta_inter: float = 8 / 10e9
    select_s_per_elem: float = 1e-9
    add_s_per_elem: float = 2e-9
    mem_s_per_elem: float = 0.25e-9
    merge_s_per_elem: float = 100e-9
    compute_curve: tuple = ()   # ((elements, select, add, mem), ...) by size; replaces the three above

    def as_list(self):
        """Every number, the curve's rows flattened at the end."""
        scalars = [float(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "compute_curve"]
        return scalars + [float(v) for row in self.compute_curve for v in row]

    @classmethod
    def from_list(cls, values):
        """The inverse of as_list."""
        n = len(dataclasses.fields(cls)) - 1
        rest = [float(v) for v in values[n:]]
        return cls(*map(float, values[:n]), compute_curve=tuple(
            (int(rest[i]), *rest[i + 1:i + 4]) for i in range(0, len(rest), 4)))

    def compute(self, size):
        """(select, add, mem) seconds per element on arrays of `size` elements. With a compute_curve
        (calibrate() measures one: caches make small arrays cheaper per element), interpolated
        linearly in log(size) between its points and constant beyond them."""
        curve = self.compute_curve
        if not curve:
            return self.select_s_per_elem, self.add_s_per_elem, self.mem_s_per_elem
        if size <= curve[0][0]:
            return tuple(curve[0][1:])
        for lo, hi in zip(curve, curve[1:]):
            if size <= hi[0]:
                w = math.log(size / lo[0]) / math.log(hi[0] / lo[0])
                return tuple(a + w * (b - a) for a, b in zip(lo[1:], hi[1:]))
        return tuple(curve[-1][1:])


def ring_allreduce(nbytes, p, alpha, beta):
    """Ring All-Reduce of nbytes over p ranks: 2(p-1)·α + 2(p-1)/p·nbytes·β (tyagi Table I)."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def allgather(nbytes_each, p, alpha, beta):
    """All-Gather of nbytes_each from each of p ranks: (p-1)·α + (p-1)·nbytes_each·β. Eq. (3) has
    α·log p (recursive doubling); Gloo's allgatherv, which Horovod runs, is a ring of p-1 steps."""
    return (p - 1) * alpha + (p - 1) * nbytes_each * beta


def copy_cost(size, params):
    """One pass writing `size` elements (a pad, a concatenation)."""
    return size * params.compute(size)[2]


def reducescatter(nbytes, p, alpha, beta):
    """Ring Reduce-Scatter of nbytes over p ranks: (p-1)·α + (p-1)/p·nbytes·β (eq. (7))."""
    return (p - 1) * alpha + (p - 1) / p * nbytes * beta


def world_link(m, params):
    """The link that bounds a ring over all ranks: inter-node when there is more than one node."""
    return (params.alpha_inter, params.beta_inter) if m > 1 else (params.alpha_intra, params.beta_intra)


def select_cost(size, params):
    return size * params.compute(size)[0]


def scatter_add_cost(nnz, size, params):
    """Zero-fill of the dense output plus one random add per accumulated element."""
    _, add, mem = params.compute(size)
    return size * mem + nnz * add


def merge_cost(entries, params):
    """Merging packed sparse streams of `entries` rows in all into one index-sorted stream
    (sparcml.merge: argsort, unique, gather, segment sum, pack), linear in the rows."""
    return entries * params.merge_s_per_elem


def residual_cost(k, size, params):
    """Error feedback: the selected entries scattered into a zero-filled length-size tensor, and one
    more pass for the subtraction from the input."""
    return scatter_add_cost(k, size, params) + size * params.compute(size)[2]


def breakdown(algorithm, d, m, n, density, params=None, options=None):
    """Predicted seconds per step of one call of a registered collective: {step: seconds}."""
    return _collective(algorithm).breakdown(d, m, n, density, params, options)


def predict(algorithm, d, m, n, density, params=None, options=None):
    """Predicted seconds of one call of `algorithm` on d float32 elements over m x n ranks
    (its module's time formula, with `options` for it)."""
    return float(sum(breakdown(algorithm, d, m, n, density, params, options).values()))


def choose(d, m, n, density, params=None, candidates=None, options=None):
    """The candidate (default: every registered collective) with the smallest predicted time, ties
    going to the earlier one; options = {algorithm: {option: value}} (algorithm_options)."""
    from tf_commlib.collectives import ALGORITHMS
    options = options or {}
    candidates = list(ALGORITHMS) if candidates is None else list(candidates)
    return min(candidates, key=lambda a: predict(a, d, m, n, density, params, options.get(a)))


def _collective(algorithm):
    from tf_commlib.collectives import ALGORITHMS
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {list(ALGORITHMS)}")
    return ALGORITHMS[algorithm]


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


def calibrate(topo, sizes=(2**20, 2**22), repeats=5, defaults=None, density=0.01,
              latency_size=256, compute_sizes=(2**20, 2**22, 2**24)):
    """Measures LinkParams on the running cluster; every rank returns the same numbers.

    Call it on every rank of a Horovod job (topo = tf_commlib.topology()). Each link is timed with
    the ops the collectives run on it, at the sizes they see: beta from sizes[0] -> sizes[1] floats
    (x4 inside a node, whose dense steps move whole gradients), alpha from a
    `latency_size` message (Horovod's per-call negotiation, a few ms, is most of alpha; the
    intercept of a 4 MB point drowns in noise, and 2**16-float messages hit 40 ms TCP delayed-ACK
    stalls on loopback). Intra: every node at once (as in 2DTAR/HiTopKComm) times Reduce-Scatter
    and All-Gather on its intra set (no collective runs an intra All-Reduce). Inter: All-Reduce and All-Gather by the set of local index 0 only, one stream per
    node link (the per-link beta_inter of the model); the All-Gather at sizes/16 per rank, the
    0.1-3 MB that sparse collectives send (16 MB blasts into a shaped link run at half speed).
    Compute: all ranks at once time MSTopK and scatter-add on arrays of each of `compute_sizes`
    elements, so CPU sharing is included; per-element costs fall as arrays fit the caches, hence
    a compute_curve (the scalars keep the largest size). Merging: sparcml.merge of two index-sorted
    streams of density·d entries each (d the middle compute size), what a SparCML round merges.
    Link medians are averaged
    over the ranks that measured them, compute medians take the slowest rank (allreduces on
    topo.world), so all ranks get the same numbers; a one-rank set keeps its link's default.
    """
    import tensorflow as tf

    from tf_commlib import timing
    from tf_commlib import primitives as P

    if not 0 < latency_size < sizes[0] // 16 < sizes[1] // 16:
        raise ValueError(f"need 0 < latency_size < sizes[0] // 16 < sizes[1] // 16, got {sizes}")
    defaults = defaults or LinkParams()
    counter = iter(range(10**9))

    def barrier():
        P.allreduce(tf.zeros([1]), topo.world, name=f"costmodel_barrier_{next(counter)}").numpy()

    def median_time(fn):
        return timing.median_time(fn, repeats)

    def link_points(pset, tag, scale):
        points = {op: {} for op in scale}
        for op in scale:
            for size in (latency_size, *(int(s * scale[op]) for s in sizes)):
                x = tf.ones([size], tf.float32)
                points[op][size] = median_time(lambda: timing.ready(getattr(P, op)(
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
    total = P.allreduce(local, topo.world, name=f"costmodel_agree_{next(counter)}").numpy()
    sums, counts = total[:len(names)], total[len(names):]
    links = {f: float(sums[i] / counts[i]) if counts[i] > 0 else measured[f] for i, f in enumerate(names)}
    return LinkParams(**links, select_s_per_elem=curve[-1][1], add_s_per_elem=curve[-1][2],
                      mem_s_per_elem=curve[-1][3], merge_s_per_elem=merge, compute_curve=curve)


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
