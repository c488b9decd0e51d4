"""Loss scaling (mixed_float16) with a finite check over every rank, around a DistributedOptimizer
whose aggregation it does not hold back (docs/mixed_precision.md)."""
import keras
import tensorflow as tf

from tf_commlib import internals, primitives
from tf_commlib.collectives.interface import plain_python
from tf_commlib.keras.optimizer import DistributedOptimizer, distributed_optimizer
from tf_commlib.topology import topology as current_topology


@keras.saving.register_keras_serializable(package="tf_commlib")
class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """keras.optimizers.LossScaleOptimizer whose finite check is global: the gradients count as finite
    only if they are finite on every rank (one 1-element allreduce per step), so every rank applies or
    skips a step together: the loss scale and iterations stay equal on every rank, and a skipped step
    leaves the DistributedOptimizer's residuals and DGC momentum untouched.

    Around a DistributedOptimizer the aggregation does not wait for the check: every rank aggregates
    its unscaled gradients (non-finite entries sent as 0) as soon as each bucket's exist, overlapped
    with backprop as without loss scaling; the one allreduce then says whether any rank's gradients,
    or the aggregated ones (an fp16 sum on the wire can overflow), were non-finite, and only a
    finite step writes state (DistributedOptimizer.aggregate's commit) and updates the weights."""

    def check_finite(self, grads):
        distributed_optimizer(self).mark_checked_globally()
        return self._globally(super().check_finite(grads))

    def _globally(self, finite):
        opt = distributed_optimizer(self)
        if hasattr(opt, "finite_check"):   # DiLoCo: node-wide
            return opt.finite_check(tf.cast(tf.logical_not(finite), tf.float32))
        overflowed = primitives.allreduce(tf.reshape(tf.cast(tf.logical_not(finite), tf.float32), [1]),
                                 current_topology().world)
        return tf.equal(overflowed[0], 0.0)

    @plain_python
    def apply(self, grads, trainable_variables=None):
        inner = self.inner_optimizer
        if not isinstance(inner, DistributedOptimizer):   # DiLoCo: counts a skipped step too
            with inner.counted_by_wrapper():
                super().apply(grads, trainable_variables)
            inner.count_step(trainable_variables or internals.trainable_variables(self))
            return
        if not self.built:
            if trainable_variables is not None:   # Keras passes them at the first step
                inner.measure(trainable_variables)
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        inner.mark_checked_globally()
        inner._ensure_built(trainable_variables)
        tvs = trainable_variables or internals.trainable_variables(self)
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        local = keras.optimizers.LossScaleOptimizer.check_finite(self, grads)
        scale = self.dynamic_scale
        unscaled = [g if g is None or internals.overwrites_with_gradient(self, v)
                    else tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) / tf.cast(scale, g.dtype)
                    for g, v in zip(grads, tvs)]
        update, commit = inner.aggregate(unscaled)
        aggregated = keras.optimizers.LossScaleOptimizer.check_finite(self, update)
        finite = self._globally(tf.logical_and(local, aggregated))

        def step():
            commit()
            inner.apply_update(update, tvs)
            grow = tf.equal(self.step_counter, self.dynamic_growth_steps - 1)
            self.step_counter.assign(tf.where(grow, tf.zeros_like(self.step_counter), self.step_counter + 1))
            self.dynamic_scale.assign(tf.where(grow, self.dynamic_scale * 2.0, self.dynamic_scale))

        tf.cond(finite, step, lambda: internals.handle_non_finite(self))
        inner.count_step(tvs)   # applied or skipped: auto's DiLoCo rounds count every step


def global_loss_scale(model):
    """Makes the finite check of the keras.optimizers.LossScaleOptimizer that model.compile puts around a
    tf_commlib optimizer under mixed_float16 global: ``model.optimizer`` becomes a
    tf_commlib.keras.LossScaleOptimizer around the same optimizer, with the same initial scale, growth
    steps and name (and, where the Keras one has stepped, its scale and growth counter). Call it before
    the first step; CompileGuard (in default_callbacks()) calls it when model.fit starts. Nothing
    to do where the model's optimizer is no Keras LossScaleOptimizer (or a tf_commlib one already)."""
    opt = model.optimizer
    distributed_optimizer(model)   # ValueError if there is none
    if type(opt) is not keras.optimizers.LossScaleOptimizer:
        return
    replacement = LossScaleOptimizer(opt.inner_optimizer, initial_scale=opt.initial_scale,
                                     dynamic_growth_steps=opt.dynamic_growth_steps, name=opt.name)
    if opt.built:
        with tf.init_scope():
            replacement.build(internals.trainable_variables(opt))
            replacement.step_counter.assign(opt.step_counter)
            replacement.dynamic_scale.assign(opt.dynamic_scale)
    model.optimizer = replacement


def with_loss_scale(optimizer, **options):
    """DistributedOptimizer(optimizer's inner optimizer, **options) inside a tf_commlib.keras.LossScaleOptimizer
    with the initial_scale, dynamic_growth_steps and name of ``optimizer``, a keras.optimizers.LossScaleOptimizer
    that has not stepped: loss scaling goes outside the aggregation (the gradients are unscaled before
    they reach DGC momentum and the residuals) and its finite check is global."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(f"optimizer must be a keras.optimizers.LossScaleOptimizer, got {optimizer!r}")
    if optimizer.built:
        raise ValueError("optimizer is a LossScaleOptimizer that has already been built (it has taken "
                         "steps); wrap a new one")
    return LossScaleOptimizer(DistributedOptimizer(optimizer.inner_optimizer, **options), name=optimizer.name,
                              initial_scale=optimizer.initial_scale,
                              dynamic_growth_steps=optimizer.dynamic_growth_steps)
