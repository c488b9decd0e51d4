"""The vocabulary of the alpha-beta cost model: link parameters (LinkParams) and the time formulas
of the group primitives and of the compute steps on them. Each collective's own formula lives in
its module (tf_commlib/collectives/*.py, Collective.time), written with the helpers here; the
predictions and `auto` (argmin over the registry) are next to the registry (tf_commlib.collectives:
breakdown, predict, choose), the measuring of LinkParams on a running cluster is
tf_commlib.costmodel.calibrate. This module imports nothing from tf_commlib: both build on it.

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
term vanishes on a one-rank set, so m = 1 or n = 1 give finite costs. Bytes per link are not
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
        (costmodel.calibrate() measures one: caches make small arrays cheaper per element), interpolated
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

