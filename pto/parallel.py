"""The parallel tensor operator (shi2021 §4.2, eqs. (12)-(14)).

After gradient aggregation every rank holds the same gradients and weights, so an operation on them
that every rank would compute identically can be split: rank p computes OP on its part (eq. (13))
and one all-gather assembles the result (eq. (14)) on every rank.

``parallel_map(fn, tensors)`` maps fn over a list of elements (tensors or tuples of tensors),
giving each rank a share balanced by cost (elements); ``parallel_elementwise(fn, x)`` splits one
long tensor into P slices for an element-wise fn. The partition is a pure function of the static
shapes, so every rank agrees on it without talking; the results travel in ONE variable-length
all-gather (tf_commlib.primitives: shared memory inside a node) and come back bit-identical to
running fn on everything locally. Eager and inside tf.function; one rank (or no Horovod) computes
locally.

The inputs must be identical on all ranks (PTO's premise): the first call with each signature
all-gathers a fingerprint of the shapes and values and raises on every rank if ranks differ.
"""
import heapq
import zlib
from functools import lru_cache

import tensorflow as tf

from tf_commlib import primitives

CALL_COST = 4096     # a call's fixed overhead, in elements, added to each element's cost
ALIGN = 64           # parallel_elementwise slices start at multiples of 64 elements (whole SIMD packets)
_CACHE_LIMIT = 4096  # traced output specs kept


def partition(costs, parts):
    """Greedy longest-processing-time split of items with these costs into `parts` lists of
    indices (each ascending): the costliest first (ties: lower index), each to the least loaded
    part (ties: lower part). Deterministic, so every rank computes the same split."""
    heap = [(0, p) for p in range(parts)]
    owned = [[] for _ in range(parts)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, p = heapq.heappop(heap)
        owned[p].append(i)
        heapq.heappush(heap, (load + costs[i], p))
    return [sorted(o) for o in owned]


_partition = lru_cache(maxsize=256)(lambda costs, parts: partition(list(costs), parts))


def _default_set(process_set):
    if process_set is not None:
        return process_set
    import horovod.tensorflow as hvd
    return hvd.global_process_set if hvd.is_initialized() else None


def _spec(item):
    """The item's structure of TensorSpecs; every shape must be static (the partition uses it)."""
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), item)
    for s in tf.nest.flatten(specs):
        if not s.shape.is_fully_defined():
            raise ValueError(f"pto: tensors need fully defined static shapes, got {s.shape}")
    return specs


_out_specs = {}


def _output_spec(fn, spec):
    """fn's output structure of TensorSpecs for an input spec (traced once, not run)."""
    key = (fn, spec)
    if key not in _out_specs:
        if len(_out_specs) >= _CACHE_LIMIT:
            _out_specs.clear()
        with tf.init_scope():
            out = tf.function(fn).get_concrete_function(spec).structured_outputs
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), out)
        for s in tf.nest.flatten(specs):
            if not s.shape.is_fully_defined() or s.dtype in (tf.string, tf.resource, tf.variant):
                raise ValueError(f"pto: fn must return numeric tensors of static shape, got {s}")
        _out_specs[key] = specs
    return _out_specs[key]


def _signature_fingerprint(fn, specs, process_set):
    name = getattr(fn, "__qualname__", type(fn).__name__)
    text = repr([(tuple(s.shape), s.dtype.name) for s in tf.nest.flatten(specs)]) + name
    return zlib.crc32(f"{text}|{process_set.process_set_id}".encode()) & 0x7FFFFFFF


def _value_fingerprint(tensors):
    """64 bits of farmhash over the bytes of every tensor."""
    rows = [tf.fingerprint(tf.reshape(tf.cast(t, tf.uint8) if t.dtype == tf.bool else t, [1, -1]))
            for t in tensors]
    whole = tf.fingerprint(tf.reshape(tf.concat(rows, 0), [1, -1]))
    return tf.reshape(tf.bitcast(whole, tf.int64), [])


_checked = None        # signatures checked so far, for graphs and eager code (a hash table)
_checked_eagerly = set()


def _check_identical(fn, items, specs, process_set):
    """Once per signature: all ranks of the set must pass the same shapes and values. Returns the
    control dependencies for what follows."""
    global _checked
    if _checked is None:
        with tf.init_scope():
            _checked = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, 0)
    key = _signature_fingerprint(fn, specs, process_set)
    if key in _checked_eagerly:
        return []
    sig = tf.constant(key, tf.int64)
    message = ("pto: the ranks of the process set passed different inputs to a parallel op; they "
               "must be identical on every rank (broadcast the weights and aggregate the gradients "
               "first)")

    def check():
        mine = tf.stack([sig, _value_fingerprint(tf.nest.flatten(items))])[None]
        seen = primitives.allgather(mine, process_set)
        if tf.executing_eagerly() and not bool(tf.reduce_all(seen == mine)):
            raise ValueError(f"{message}; (signature, value) fingerprints by rank: "
                             f"{seen.numpy().tolist()}")
        ok = tf.debugging.assert_equal(seen, tf.repeat(mine, tf.shape(seen)[0], 0), message=message)
        with tf.control_dependencies([ok, _checked.insert(sig, tf.constant(1, tf.int64))]):
            return tf.constant(True)

    if tf.executing_eagerly():
        if int(_checked.lookup(sig)) == 0:
            check()
        _checked_eagerly.add(key)
        return []
    return [tf.cond(_checked.lookup(sig) > 0, lambda: tf.constant(True), check)]


def _wire_dtype(specs):
    dtypes = {s.dtype for s in specs}
    if len(dtypes) == 1 and tf.bool not in dtypes:
        return dtypes.pop()
    return tf.uint8    # mixed dtypes travel as bytes


def _to_wire(t, wire):
    if t.dtype == wire:
        return tf.reshape(t, [-1])
    if t.dtype == tf.bool:
        return tf.reshape(tf.cast(t, tf.uint8), [-1])
    return tf.reshape(tf.bitcast(t, tf.uint8), [-1])


def _wire_length(spec, wire):
    n = spec.shape.num_elements()
    return n if spec.dtype == wire or spec.dtype == tf.bool else n * spec.dtype.size


def _from_wire(piece, spec, wire):
    if spec.dtype == wire:
        return tf.reshape(piece, spec.shape)
    if spec.dtype == tf.bool:
        return tf.reshape(piece, spec.shape) != 0
    size = spec.dtype.size
    shape = [spec.shape.num_elements()] + ([size] if size > 1 else [])
    return tf.reshape(tf.bitcast(tf.reshape(piece, shape), spec.dtype), spec.shape)


def _uniform(flat_specs, wire):
    """The spec shared by every element's output when each is one tensor of the wire dtype."""
    first = flat_specs[0][0] if flat_specs[0] else None
    if first is None or first.dtype != wire or any(f != [first] for f in flat_specs):
        return None
    return first


def parallel_map(fn, tensors, process_set=None, check=True):
    """[fn(e) for e in tensors], computed in parallel over the ranks of process_set (default: all).

    Each element e is a tensor or a (nested) tuple of tensors with static shapes; fn(e) returns a
    tensor or a nested structure of numeric tensors of static shape. Rank p runs fn on its share
    (balanced by elements, plus CALL_COST per element), one variable-length all-gather returns
    every result, in the original order, on every rank; the results are bit-identical to local
    compute for a deterministic fn. The elements must be identical on all ranks: with check=True
    the first call per signature verifies it (a fingerprint all-gather) and raises ValueError
    (InvalidArgumentError in a tf.function) on every rank if they differ.
    """
    items = [tf.nest.map_structure(tf.convert_to_tensor, t) for t in tensors]
    process_set = _default_set(process_set)
    if process_set is None or process_set.size() == 1 or not items:
        return [fn(e) for e in items]
    if process_set.rank() is None or process_set.rank() < 0:
        raise ValueError(f"pto: this rank is not in process_set {process_set.ranks}")
    specs = [_spec(e) for e in items]
    costs = tuple(sum(s.shape.num_elements() for s in tf.nest.flatten(sp)) + CALL_COST for sp in specs)
    owned = _partition(costs, process_set.size())
    out_specs = [_output_spec(fn, sp) for sp in specs]
    flat_specs = [tf.nest.flatten(o) for o in out_specs]
    wire = _wire_dtype([s for f in flat_specs for s in f])
    deps = _check_identical(fn, items, specs, process_set) if check else []
    with tf.control_dependencies(deps):
        mine = [t for i in owned[process_set.rank()] for t in tf.nest.flatten(fn(items[i]))]
        send = tf.concat([_to_wire(t, wire) for t in mine], 0) if mine else tf.zeros([0], wire)
    gathered = primitives.allgather(send, process_set)
    order = [i for part in owned for i in part]
    uniform = _uniform(flat_specs, wire)
    if uniform is not None:   # e.g. one scalar per element: a gather and an unstack, not 2N ops
        rows = tf.reshape(gathered, [len(items), *uniform.shape])
        back = sorted(range(len(order)), key=order.__getitem__)   # row of element i in `order`
        return [tf.nest.pack_sequence_as(out_specs[i], [t])
                for i, t in enumerate(tf.unstack(tf.gather(rows, back)))]
    lengths = [_wire_length(s, wire) for i in order for s in flat_specs[i]]
    pieces = iter(tf.split(gathered, lengths))
    results = [None] * len(items)
    for i in order:
        flat = [_from_wire(next(pieces), s, wire) for s in flat_specs[i]]
        results[i] = tf.nest.pack_sequence_as(out_specs[i], flat)
    return results


def parallel_elementwise(fn, x, process_set=None, check=True):
    """fn(x) for an element-wise fn (eq. (13) on one long tensor): x is split into P slices of
    whole multiples of ALIGN elements, rank p computes fn on slice p, one all-gather joins them.
    fn must return one element per input element (any dtype); the result has x's shape."""
    x = tf.convert_to_tensor(x)
    process_set = _default_set(process_set)
    if process_set is None or process_set.size() == 1:
        return fn(x)
    if not x.shape.is_fully_defined():
        raise ValueError(f"pto: x needs a fully defined static shape, got {x.shape}")
    d, parts = x.shape.num_elements(), process_set.size()
    chunk = -(-d // (parts * ALIGN)) * ALIGN
    sizes = [max(0, min(chunk, d - p * chunk)) for p in range(parts)]
    slices = tf.split(tf.reshape(x, [-1]), sizes)
    for n, s in zip(sizes, slices):
        out = _output_spec(fn, _spec(s))
        if not isinstance(out, tf.TensorSpec) or out.shape.num_elements() != n:
            raise ValueError(f"pto: parallel_elementwise needs an element-wise fn (one output per "
                             f"element); for {n} elements it returned {out}")
    results = parallel_map(fn, slices, process_set, check)
    return tf.reshape(tf.concat([tf.reshape(r, [-1]) for r in results], 0), x.shape)
