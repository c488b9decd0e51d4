"""The error-feedback state of a GradientAggregator: one residual variable per (bucket, lossy
algorithm the bucket may run), holding what that algorithm did not send; the residuals of the
algorithms not running at a step are flushed into its input."""
import tensorflow as tf

from tf_commlib.collectives import ALGORITHMS


class ResidualStore:
    """``residuals``: {(bucket index, algorithm name): variable}, filled by ``build``."""

    def __init__(self, topo):
        self.topo = topo
        self.residuals = {}

    def build(self, make, buckets, names_of, algorithm_options):
        """Creates with ``make(shape, dtype, name)`` the residual of every lossy algorithm among
        ``names_of(i, bucket)`` (the names bucket i may run), bucket by bucket, in name order."""
        for i, bucket in enumerate(buckets):
            d = sum(bucket.sizes)
            for name in sorted(names_of(i, bucket)):
                coll = ALGORITHMS[name]
                if coll.lossy:
                    options = coll.formula_options(algorithm_options.get(name), bucket.shapes, d)
                    size = coll.state_size(d, self.topo, options)
                    self.residuals[(i, name)] = make([size], bucket.dtype, f"residual_{i}_{name}")

    def of_bucket(self, i):
        """The residual variables of bucket i (one per lossy algorithm it may run), in a fixed order."""
        return [var for (j, _), var in sorted(self.residuals.items()) if j == i]

    def flush_idle(self, i, name, flat):
        """(flat plus the residuals of bucket i's algorithms other than ``name``, {those algorithms:
        their new value, zero})."""
        d, new = flat.shape[0], {}
        for (j, other), var in self.residuals.items():
            if j == i and other != name:
                flat = flat + ALGORITHMS[other].residual_to_input(var, d, self.topo)
                new[other] = tf.zeros(var.shape, var.dtype)
        return flat, new

    def ordered(self, i, new):
        """The values of ``new`` ({algorithm: value}) in the order of of_bucket(i)."""
        return [new[n] for (j, n) in sorted(self.residuals) if j == i]

    def variables(self):
        return [self.residuals[k] for k in sorted(self.residuals)]

    def reset(self):
        """Zeroes every residual."""
        for var in self.variables():
            var.assign(tf.zeros(var.shape, var.dtype))
