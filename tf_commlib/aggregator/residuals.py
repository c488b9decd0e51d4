"""The error-feedback state of a GradientAggregator: one residual variable per (bucket, lossy
algorithm the bucket may run), holding what that algorithm did not send; the residuals of the
algorithms not running at a step are flushed into its input (in a step traced for one algorithm,
in that trace's first step only: they are zero after it)."""
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

    def of_bucket(self, i, names=None):
        """The residual variables of bucket i (one per lossy algorithm it may run; of ``names`` only
        where given), in a fixed order."""
        return [var for (j, n), var in sorted(self.residuals.items()) if j == i and (names is None or n in names)]

    def named(self, i):
        """[(algorithm, residual variable)] of bucket i."""
        return [(n, var) for (j, n), var in sorted(self.residuals.items()) if j == i]

    def idle(self, i, name):
        """[(algorithm, residual variable)] of bucket i's lossy algorithms other than ``name``."""
        return [(n, var) for n, var in self.named(i) if n != name]

    def flush_idle(self, i, name, flat, when=None):
        """(flat plus the residuals of bucket i's algorithms other than ``name``, {those algorithms:
        their new value, zero}). ``when``: a boolean tensor; they are added only where it holds, and
        left out of the new values (zero_idle writes them): a step traced for one algorithm flushes
        the others' once, in its first step, instead of reading and zeroing them at every step."""
        d = flat.shape[0]
        idle = self.idle(i, name)

        def added():
            out = flat
            for other, var in idle:
                out = out + ALGORITHMS[other].residual_to_input(var, d, self.topo)
            return out

        if not idle:
            return flat, {}
        if when is not None:
            return tf.cond(when, added, lambda: flat), {}
        return added(), {other: tf.zeros(var.shape, var.dtype) for other, var in idle}

    @staticmethod
    def zero_idle(variables, when):
        """Zeroes ``variables`` (residuals flush_idle added to a step's input) where ``when`` holds."""
        def zero():
            for var in variables:
                var.assign(tf.zeros(var.shape, var.dtype))
            return tf.constant(True)

        if variables:
            tf.cond(when, zero, lambda: tf.constant(False))

    def ordered(self, i, new):
        """The values of ``new`` ({algorithm: value}) in the order of of_bucket(i, new)."""
        return [new[n] for (j, n) in sorted(self.residuals) if j == i and n in new]

    def variables(self):
        return [self.residuals[k] for k in sorted(self.residuals)]

    def owed(self, i, d, dtype):
        """What this rank owes bucket i's sum (length d): its residuals in input space, added up."""
        parts = [ALGORITHMS[name].residual_to_input(tf.convert_to_tensor(var), d, self.topo)
                 for name, var in self.named(i)]
        return tf.add_n(parts) if parts else tf.zeros([d], dtype)

    def take_owed(self, i, x, running=None):
        """Bucket i's residuals made to flush x (what this rank owes, in input space) once: the
        ``running`` algorithm's residual takes it where its collective has input_to_residual (the next
        step adds it to its input), else the first such (flushed as an idle one); the others flush zero
        (their state besides, e.g. PowerSGD's Q, as input_to_residual keeps it; zero without one). Every
        rank of the layout calls it alike (it may be a collective); False where no residual of bucket i
        can hold x."""
        named = self.named(i)
        takers = [name for name, _ in named if ALGORITHMS[name].input_to_residual is not None]
        taker = running if running in takers else (takers[0] if takers else None)
        for name, var in named:
            back = ALGORITHMS[name].input_to_residual
            if back is None:
                var.assign(tf.zeros(var.shape, var.dtype))
                continue
            owed = tf.cast(x if name == taker else tf.zeros_like(x), var.dtype)
            var.assign(back(owed, x.shape[0], self.topo, tf.convert_to_tensor(var)))
        return taker is not None

    def reset(self):
        """Zeroes every residual."""
        for var in self.variables():
            var.assign(tf.zeros(var.shape, var.dtype))
