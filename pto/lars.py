"""LARS (You et al. 2017; shi2021 eq. (11)) for Keras 3, its per-layer trust ratios computed with PTO."""
import functools

import keras
import tensorflow as tf

from pto.layerwise import (LayerwiseTrust, check_exclusions, check_learning_rate, check_non_negative,
                           check_patterns_match, is_excluded, norm, serializable, trust_ratio)
from tf_commlib import internals


def lars_ratio(w_norm, g_norm, decay, eeta):
    """eq. (11) without the learning rate: eeta ||w|| / (||g|| + decay ||w||); 1 where a norm is 0."""
    return trust_ratio(w_norm, g_norm, eeta * w_norm, g_norm + decay * w_norm)


def lars_trust(element, eeta):
    """lars_ratio of one layer's (w, g, decay)."""
    w, g, decay = element
    return lars_ratio(norm(w), norm(g), decay, eeta)


@serializable
class LARS(LayerwiseTrust, keras.optimizers.Optimizer):
    """Layer-wise adaptive rate scaling, exactly eq. (11) of shi2021 / You et al. 2017.

    Per variable w with gradient g, d = weight_decay_rate (0 where excluded from weight decay):
        trust = eeta * ||w|| / (||g|| + d * ||w||)   (1 where ||w|| or ||g|| is 0, or excluded
                                                      from layer adaptation)
        u = g + d * w
        v <- momentum * v + learning_rate * trust * u
        w <- w - v           (Nesterov: w <- w - (momentum * v + learning_rate * trust * u))
    TF Model Garden's LARS takes the norm of g + d*w instead of ||g|| + d*||w||; this follows eq. (11).

    Args:
      exclude_from_weight_decay, exclude_from_layer_adaptation: None (nothing excluded), regular
        expressions searched in variable.path (e.g. ``["bias", "gamma", "beta"]`` for biases and
        batch normalisation), or a predicate(variable) -> bool (not serialisable).
      pto: compute the trust ratios with pto.parallel_map over ``process_set`` (default: all
        Horovod ranks; local compute with one rank or without Horovod). With pto on and off the
        results are the same bits. The gradients and weights must be identical on the ranks of
        the set, as they are after aggregation (tf_commlib.keras.DistributedOptimizer).
      **kwargs: the base Keras optimizer arguments (clipnorm, use_ema, ...).
    Under DistributedOptimizer with momentum correction, LARS's momentum moves into the DGC
    momentum (like SGD's) and LARS takes a plain step with trust ratios on the aggregated update.
    """

    movable_momentum = True   # tf_commlib.keras.DistributedOptimizer may move the momentum out

    def __init__(self, learning_rate, momentum=0.9, weight_decay_rate=0.0, eeta=0.001, nesterov=False,
                 exclude_from_weight_decay=None, exclude_from_layer_adaptation=None, pto=True,
                 process_set=None, name="LARS", **kwargs):
        learning_rate = check_learning_rate(learning_rate)
        check_non_negative(momentum=momentum, weight_decay_rate=weight_decay_rate, eeta=eeta)
        if momentum > 1:
            raise ValueError(f"momentum must be in [0, 1], got {momentum!r}")
        decay_exclusions = check_exclusions(exclude_from_weight_decay, "exclude_from_weight_decay")
        adaptation_exclusions = check_exclusions(exclude_from_layer_adaptation,
                                                 "exclude_from_layer_adaptation")
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.weight_decay_rate, self.eeta = float(weight_decay_rate), float(eeta)
        self.decay_exclusions, self.adaptation_exclusions = decay_exclusions, adaptation_exclusions
        self.pto, self.process_set = bool(pto), process_set
        self._trust = functools.partial(lars_trust, eeta=self.eeta)

    def build(self, var_list):
        if self.built:
            return
        self._layer_constants(var_list)
        super().build(var_list)
        self.velocities = self.add_optimizer_variables(var_list, "velocity") if self.momentum else []

    def _layer_constants(self, var_list):
        check_patterns_match(self.decay_exclusions, "exclude_from_weight_decay", var_list)
        check_patterns_match(self.adaptation_exclusions, "exclude_from_layer_adaptation", var_list)
        self._decays = [0.0 if is_excluded(self.decay_exclusions, v) else self.weight_decay_rate
                        for v in var_list]
        self._adapted = [not is_excluded(self.adaptation_exclusions, v) for v in var_list]

    # the slice-wise form for DistributedOptimizer(shard_optimizer=True) (tf_commlib.keras.sharded)
    def sharded_build(self, var_list):
        self._layer_constants(var_list)
        return ("velocity",) if self.momentum else (), 2

    def sharded_update(self, view, learning_rate):
        """This step on a slice of the flat weights: the same formulas, per-layer norms exchanged;
        the ratios computed per layer and expanded once."""
        w, g = view.w, tf.cast(view.g, view.w.dtype)
        decays = tf.constant(list(map(float, self._decays)) + [0.0], w.dtype)
        w_norm, g_norm = view.layer_norms(w, g)
        adapted = tf.constant(list(map(bool, self._adapted)) + [False])
        ratio = tf.where(adapted, lars_ratio(w_norm, g_norm, decays, self.eeta), tf.ones_like(w_norm))
        u = g + view.per_layer(decays) * w if any(self._decays) else g
        step = view.per_layer(tf.cast(learning_rate, w.dtype) * ratio) * u
        if not self.momentum:
            return w - step
        v = view.slot("velocity")
        new = v * tf.cast(self.momentum, w.dtype) + step
        v.assign(new)
        return w - (step + new * tf.cast(self.momentum, w.dtype)) if self.nesterov else w - new

    def _prepare(self, gradient, variable):
        i = internals.variable_index(self, variable)
        g, w = tf.cast(gradient, variable.dtype), tf.convert_to_tensor(variable)
        element = (w, g, tf.constant(self._decays[i], variable.dtype)) if self._adapted[i] else None
        return (i, w, g), element

    def _finish(self, variable, state, ratio, learning_rate):
        i, w, g = state
        u = g + tf.cast(self._decays[i], w.dtype) * w if self._decays[i] else g
        lr = tf.cast(learning_rate, w.dtype)
        step = (lr if ratio is None else lr * ratio) * u
        if not self.momentum:
            self.assign_sub(variable, step)
            return
        # v <- m v + step; w <- w - v (Nesterov: w <- w - (m v + step)) in one fused pass: TensorFlow's
        # momentum kernel with lr = 1 computes exactly these (accum = accum m + grad; var -= lr accum)
        tf.raw_ops.ResourceApplyMomentum(var=variable.handle, accum=self.velocities[i].handle,
                                         lr=tf.ones([], w.dtype), grad=step,
                                         momentum=tf.cast(self.momentum, w.dtype), use_locking=False,
                                         use_nesterov=self.nesterov)

    def get_config(self):
        config = super().get_config()
        for name, value in (("exclude_from_weight_decay", self.decay_exclusions),
                            ("exclude_from_layer_adaptation", self.adaptation_exclusions)):
            if callable(value):
                raise NotImplementedError(f"LARS with a predicate for {name} cannot be serialised; "
                                          "use regular expressions")
            config[name] = value
        config.update(momentum=self.momentum, weight_decay_rate=self.weight_decay_rate,
                      eeta=self.eeta, nesterov=self.nesterov, **self._pto_config())
        return config
