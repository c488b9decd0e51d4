"""The consistency check of a GradientAggregator's calls: every rank at the same step with the same
shapes, dtypes, algorithm, density, selector and op (tf_commlib.consistency), and state that no
other rank wrote (the owner variable, checkpointed with the residuals)."""
import tensorflow as tf

from tf_commlib import consistency


class ConsistencyGuard:
    """Checks a call's gradients and configuration against every rank's. ``every_call``: checked at
    every call (else at the first call of each signature only). ``spelled_out``: a function giving
    the candidates with "auto" spelled out per bucket, or None before the buckets are known
    (AutoChooser.spelled_out)."""

    def __init__(self, topo, candidates, selector, op, every_call, spelled_out):
        self.topo, self.candidates, self.selector, self.op = topo, candidates, selector, op
        self.every_call, self._spelled_out = every_call, spelled_out
        self.owner = None
        self._named = None
        self._checked = set()

    def build(self, make):
        """Creates the owner variable with ``make(shape, dtype, name)``: 1 + the rank whose state
        (residuals) this is, 0 before the first step; checkpointed with that state."""
        self.owner = make((), tf.int64, "aggregator_state_owner")

    def check(self, grads, step, counter, active, density):
        """Returns grads that depend on the check having passed. ``step``: the caller's step (None:
        ``counter``, the aggregator's step variable); ``active``, ``density``: the aggregator's
        variables of the running candidate and the density."""
        # "auto" spelled out per bucket: ranks that resolve it differently (other cost_params or
        # auto_compute_s) fail the check instead of running different collectives (a hang)
        if self._named is None:
            self._named = self._spelled_out()
        mine = consistency.readable(grads, self._named or self.candidates, self.selector, self.op)
        static = consistency.static_fingerprints(mine)
        step = counter if step is None else step

        def check(step=step):
            owner, me = tf.convert_to_tensor(self.owner), tf.constant(self.topo.rank + 1, tf.int64)
            foreign = tf.where(tf.logical_or(tf.equal(owner, 0), tf.equal(owner, me)), tf.zeros_like(owner), owner)
            rows = consistency.check(self.topo.world, step, static, active, density,
                                     self.candidates, foreign, mine)
            with tf.control_dependencies([rows]):
                claimed = self.owner.assign(me)
            with tf.control_dependencies([claimed]):
                return tf.greater_equal(tf.size(rows), 0)   # true, once the check has passed

        if tf.executing_eagerly():
            if self.every_call or static not in self._checked:
                check()
                self._checked.add(static)
            return grads
        if static not in self._checked:
            # a new signature: checked while tracing (every rank traces it at the same call), before
            # any collective is traced, so a rank that cannot trace them fails with the others
            with tf.init_scope():
                check(step if isinstance(step, int) else counter)
            self._checked.add(static)
        if self.every_call:
            done = check()
        else:   # in a graph: at the first step only
            done = tf.cond(tf.equal(tf.convert_to_tensor(counter), 0), check, lambda: tf.constant(True))
        with tf.control_dependencies([done]):
            return [None if g is None else tf.identity(g) for g in grads]

    def reset(self):
        """Forgets the owner (with the state it owned)."""
        self.owner.assign(tf.zeros(self.owner.shape, self.owner.dtype))
