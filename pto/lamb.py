"""keras.optimizers.Lamb with its per-layer trust ratios computed with PTO."""
import keras
import tensorflow as tf

from pto.layerwise import LayerwiseTrust, check_learning_rate, check_non_negative, norm, serializable, trust_ratio
from tf_commlib import internals


def lamb_ratio(w_norm, r_norm):
    """||w|| / ||r|| for the Adam direction r; 1 where a norm is 0 (as keras.optimizers.Lamb)."""
    return trust_ratio(w_norm, r_norm, w_norm, r_norm)


def lamb_trust(element):
    """lamb_ratio of one layer's (w, r)."""
    w, r = element
    return lamb_ratio(norm(w), norm(r))


@serializable
class LAMB(LayerwiseTrust, keras.optimizers.Lamb):
    """The arguments and update of ``keras.optimizers.Lamb`` (its ``weight_decay`` is Keras's
    decoupled decay, applied before the step), plus ``pto`` and ``process_set`` as in pto.LARS:
    each rank computes 1/P of the layers' ||w||, ||r|| and ratios; pto on and off give the same bits.
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, pto=True,
                 process_set=None, name="LAMB", **kwargs):
        learning_rate = check_learning_rate(learning_rate)
        check_non_negative(epsilon=epsilon)
        for arg, beta in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not callable(beta):
                check_non_negative(**{arg: beta})
                if beta >= 1:
                    raise ValueError(f"{arg} must be in [0, 1), got {beta!r}")
        if kwargs.get("weight_decay") is not None:
            check_non_negative(weight_decay=kwargs["weight_decay"])
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                         name=name, **kwargs)
        self.pto, self.process_set = bool(pto), process_set
        self._trust = lamb_trust

    def _prepare(self, gradient, variable):
        """keras.optimizers.Lamb.update_step up to the direction r = m_hat / (sqrt(v_hat) + eps)."""
        m, v = internals.lamb_moments(self, internals.variable_index(self, variable))
        r = self._direction(tf.cast(gradient, variable.dtype), m, v, tf.cast(self.iterations + 1, variable.dtype))
        return r, (tf.convert_to_tensor(variable), r)

    def _direction(self, g, m, v, step):
        """Updates the moments m, v (variables) with g; returns r = m_hat / (sqrt(v_hat) + eps)."""
        beta_1_power = tf.pow(tf.cast(self.beta_1, g.dtype), step)
        beta_2_power = tf.pow(tf.cast(self.beta_2, g.dtype), step)
        self.assign_add(m, (g - m) * (1 - self.beta_1))
        self.assign_add(v, (tf.square(g) - v) * (1 - self.beta_2))
        return (m / (1.0 - beta_1_power)) / (tf.sqrt(v / (1.0 - beta_2_power)) + self.epsilon)

    # the slice-wise form for DistributedOptimizer(shard_optimizer=True) (tf_commlib.keras.sharded)
    def sharded_build(self, var_list):
        return ("momentum", "velocity"), 2

    def sharded_update(self, view, learning_rate):
        """This step on a slice of the flat weights (after Keras' weight decay), norms exchanged."""
        w = view.w
        r = self._direction(tf.cast(view.g, w.dtype), view.slot("momentum"), view.slot("velocity"), view.step)
        w_norm, r_norm = view.layer_norms(w, r)
        return w - view.per_layer(lamb_ratio(w_norm, r_norm) * tf.cast(learning_rate, w.dtype)) * r

    def _finish(self, variable, r, ratio, learning_rate):
        self.assign_sub(variable, ratio * tf.cast(learning_rate, variable.dtype) * r)

    def get_config(self):
        return {**super().get_config(), **self._pto_config()}
