"""What LARS and LAMB share: a step whose per-layer trust ratios come from one PTO call.

Keras calls ``update_step`` once per variable; a cross-layer collective needs the whole list, so
these optimizers replace Keras' step over the whole list (``layerwise_update_step``, installed by
tf_commlib.internals; it receives the list after Keras has clipped the gradients and applied any
decoupled weight decay) and run it in three passes:
  1. per variable, the element-wise part (``_prepare``): the update direction and the element the
     trust ratio is computed from, e.g. (w, g);
  2. all trust ratios with ONE ``pto.parallel_map`` (each rank computes 1/P of the layers' norms and
     ratios, an all-gather of the scalars gives all of them to every rank), or with the same
     function locally when ``pto=False``: the two give the same bits;
  3. per variable, the step (``_finish``).
"""
import re

import keras
import tensorflow as tf

from pto.parallel import parallel_map
from tf_commlib import internals


def check_exclusions(value, name):
    """None, a regular expression, a list/tuple of them (searched in variable.path), or a
    predicate(variable) -> bool. Anything else raises ValueError naming the argument."""
    if value is None or callable(value):
        return value
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"{name} must be None, a predicate(variable) -> bool, or a list of regular "
                         f"expressions (strings) matched against variable paths; got {value!r}")
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"{name}: {p!r} is not a regular expression ({e})") from None
    return list(patterns)


def check_patterns_match(exclusions, name, variables):
    """Each pattern must match some variable: an unknown pattern (a typo such as "bais") would
    silently exclude nothing."""
    if exclusions is None or callable(exclusions):
        return
    paths = [getattr(v, "path", None) or v.name for v in variables]
    for p in exclusions:
        if not any(re.search(p, path) for path in paths):
            raise ValueError(f"{name}: pattern {p!r} matches no variable; the variable paths are "
                             f"{paths[:8]}{' ...' if len(paths) > 8 else ''}")


def is_excluded(exclusions, variable):
    if exclusions is None:
        return False
    if callable(exclusions):
        return bool(exclusions(variable))
    path = getattr(variable, "path", None) or variable.name
    return any(re.search(p, path) for p in exclusions)


def check_non_negative(**values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")


def check_learning_rate(learning_rate):
    """A float >= 0 (ints are accepted), or a schedule / callable (left to Keras)."""
    if callable(learning_rate):
        return learning_rate
    check_non_negative(learning_rate=learning_rate)
    return float(learning_rate)


def trust_ratio(w_norm, g_norm, numerator, denominator):
    """numerator / denominator, or 1 where ||w|| or ||g|| is 0."""
    ok = tf.logical_and(w_norm > 0, g_norm > 0)
    return tf.where(ok, numerator / denominator, tf.ones_like(w_norm))


def norm(x):
    """||x||_2 in one pass (l2_loss is a fused sum of squares; the factor 2 is exact)."""
    return tf.sqrt(2 * tf.nn.l2_loss(x))


class LayerwiseTrust:
    """Mixin (before the Keras optimizer class) for the three-pass step described in the module.

    A subclass sets ``self.pto`` (bool) and ``self.process_set`` and defines
    ``_prepare(grad, variable) -> (state, element or None)`` (None: no adaptation, ratio 1),
    ``_trust`` (a function of one element, fixed per optimizer so that PTO's traced output specs
    are cached) and ``_finish(variable, state, ratio, learning_rate)``.
    """

    def trust_ratios(self, elements):
        """The trust ratio of every element: with PTO, each rank computes 1/P of them."""
        if self.pto:
            return parallel_map(self._trust, elements, self.process_set)
        return [self._trust(e) for e in elements]

    def layerwise_update_step(self, grads, trainable_variables, learning_rate):
        prepared = [self._prepare(tf.convert_to_tensor(g), v) for g, v in zip(grads, trainable_variables)]
        adapted = [i for i, (_, element) in enumerate(prepared) if element is not None]
        ratios = dict(zip(adapted, self.trust_ratios([prepared[i][1] for i in adapted])))
        for i, (variable, (state, _)) in enumerate(zip(trainable_variables, prepared)):
            self._finish(variable, state, ratios.get(i), learning_rate)

    def _pto_config(self):
        if self.process_set is not None:
            raise NotImplementedError(f"{type(self).__name__} with a process_set cannot be "
                                      "serialised; save weights instead")
        return {"pto": self.pto}


internals.override_update_step(LayerwiseTrust, LayerwiseTrust.layerwise_update_step)


def serializable(cls):
    return keras.saving.register_keras_serializable(package="pto")(cls)
