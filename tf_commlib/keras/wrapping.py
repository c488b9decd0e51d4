"""What a tf_commlib optimizer wrapper (DistributedOptimizer, DiLoCo) shares about the Keras optimizer
it wraps: which optimizers are wrappers (``WRAPPERS``, each class adds itself), that an optimizer
steps for one wrapper only, DGC's momentum handover, the forwarding of learning rate, step count and
final values (``InnerSteps``), and finding the wrapper of a model (``distributed_optimizer``)."""
import contextlib
import weakref

import keras
import tensorflow as tf

from tf_commlib import internals

WRAPPED = weakref.WeakSet()   # optimizers a DistributedOptimizer steps with (each serves one)
WRAPPERS = []   # tf_commlib's optimizer wrappers (DistributedOptimizer and DiLoCo add themselves)


def check_optimizer(optimizer):
    """ValueError unless optimizer is a Keras 3 optimizer that no wrapper steps with yet and that is
    neither a wrapper nor a LossScaleOptimizer."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError("optimizer is a keras.optimizers.LossScaleOptimizer: loss scaling goes outside the "
                         "aggregation; use tf_commlib.keras.with_loss_scale(optimizer, ...), which gives "
                         "tf_commlib.keras.LossScaleOptimizer(DistributedOptimizer(optimizer.inner_optimizer, ...))")
    if isinstance(optimizer, tuple(WRAPPERS)) or not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"optimizer must be a Keras 3 optimizer (not a DistributedOptimizer or DiLoCo), got {optimizer!r}")
    if optimizer in WRAPPED or optimizer.built:
        raise ValueError("optimizer already steps (it is built, or another DistributedOptimizer wraps it); "
                         "wrap a new instance, e.g. type(opt).from_config(opt.get_config())")


def momentum_handover(optimizer, dgc):
    """(the optimizer that steps, DGC's m, nesterov): with momentum correction a keras.optimizers.SGD
    (or an optimizer with ``movable_momentum``) hands over its momentum and nesterov and steps as a copy
    without them; another optimizer needs DGC(momentum=...)."""
    if not dgc.momentum_correction:
        return optimizer, 0.0, dgc.nesterov
    if isinstance(optimizer, keras.optimizers.SGD) or getattr(optimizer, "movable_momentum", False):
        m = float(optimizer.momentum) if dgc.momentum is None else float(dgc.momentum)
        nesterov = dgc.nesterov or bool(optimizer.nesterov)
        if optimizer.momentum or optimizer.nesterov:
            try:
                optimizer = internals.momentum_free_copy(optimizer, momentum=0.0, nesterov=False)
            except (NotImplementedError, TypeError, ValueError) as e:
                raise ValueError(f"optimizer: DGC's momentum correction steps with a copy of "
                                 f"{type(optimizer).__name__} without momentum, which its config cannot make ({e}); "
                                 "give it momentum=0 and DGC(momentum=...)") from e
        return optimizer, m, nesterov
    if dgc.momentum is None:
        raise ValueError("dgc: momentum correction needs DGC(momentum=...) when the wrapped optimizer is not "
                         f"keras.optimizers.SGD (got {type(optimizer).__name__}), or DGC(momentum_correction=False)")
    return optimizer, float(dgc.momentum), dgc.nesterov


class InnerSteps:
    """For a wrapper of a Keras optimizer that steps through ``inner_optimizer``: its learning rate,
    step count and final variable values are the inner one's."""

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.inner_optimizer.learning_rate = value

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    # -- loss scaling around it -----------------------------------------------------------------
    # keras.optimizers.LossScaleOptimizer sets its inner optimizer's loss_scale_factor to None: the one
    # sign that a LossScaleOptimizer wraps this one (apply() refuses one whose finite check is per rank)
    _wrapped_by_loss_scale = _finite_checked_globally = False

    def mark_checked_globally(self):
        """A tf_commlib.keras.LossScaleOptimizer around this one checks finiteness on every rank."""
        self._finite_checked_globally = True

    # -- the end of a step, counted by the step itself ----------------------------------------
    _count_deferred = False   # True while a LossScaleOptimizer steps it: that one counts the step

    def _step_done(self):
        """What the wrapper does in Python once a step's updates are written (count it, sync every H
        steps); nothing by default."""

    def _counts_steps(self):
        """Whether the step must run _step_done (in a traced step, a tf.py_function each step)."""
        return False

    def count_step(self, variables):
        """Runs _step_done once this step's updates of ``variables`` are written: at once eagerly; in a
        traced step (model.fit's train function, a custom loop's tf.function) as a tf.py_function after
        reads of the variables, so every step counts, whatever calls it and whether or not a callback
        follows it. A LossScaleOptimizer around the wrapper calls it after its finite check, skipped
        steps included (counted_by_wrapper)."""
        if not self._counts_steps():
            return
        if tf.executing_eagerly():
            self._step_done()
            return
        with tf.control_dependencies([tf.identity(v) for v in variables]):
            tf.py_function(self._step_done, [], [])

    @contextlib.contextmanager
    def counted_by_wrapper(self):
        """While a wrapper (tf_commlib.keras.LossScaleOptimizer) traces this one's step inside its finite
        check: apply() leaves the count to the wrapper, which calls count_step once, applied or skipped."""
        before, self._count_deferred = self._count_deferred, True
        try:
            yield
        finally:
            self._count_deferred = before



def distributed_optimizer(model_or_optimizer):
    """The tf_commlib optimizer (a DistributedOptimizer or a DiLoCo) of a Keras model (its ``optimizer``)
    or of an optimizer, found through wrappers' ``inner_optimizer`` (e.g. the LossScaleOptimizer that
    compile adds under mixed_float16)."""
    opt = model_or_optimizer.optimizer if isinstance(model_or_optimizer, keras.Model) else model_or_optimizer
    while not isinstance(opt, tuple(WRAPPERS)):
        if not isinstance(opt, keras.optimizers.Optimizer) or not hasattr(opt, "inner_optimizer"):
            raise ValueError(f"model_or_optimizer has no DistributedOptimizer: {model_or_optimizer!r}")
        opt = opt.inner_optimizer
    return opt
