"""Every use of a private TensorFlow or Keras API in tf_commlib, pto, datacache and tfc_apps, each
behind one small function here (tests/test_internals.py fails on such a use anywhere else).

Written for TensorFlow 2.21 and Keras 3 (WRITTEN_FOR); ``check_versions()`` warns once where the
installed versions differ. Where an internal is missing, its function warns once
(InternalMissingWarning, naming the internal and the feature that is lost) and the feature is
off: a call falls back to what the library does without it. An internal without which the
library cannot run raises MissingInternal instead, naming the feature.
"""
import functools
import warnings

import keras
import tensorflow as tf

WRITTEN_FOR = {"tensorflow": "2.21", "keras": "3"}

# the private names (attributes, methods, hooks) used here; tests/test_internals.py looks for these
# outside this module, and for imports of tensorflow.python / keras.src and tf.__internal__
PRIVATE_NAMES = frozenset({
    "experimental_acd_manager", "_is_stateful",                      # tf.Graph / tf.Operation
    "_variables", "_trainable_variables", "_get_variable_index",      # keras.optimizers.Optimizer
    "_overwrite_variable_with_gradient", "_use_weight_decay", "_backend_update_step",
    "_momentums", "_velocities",                                      # keras.optimizers.Lamb
    "_learning_rate", "_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern",
    "_stateful_handle_non_finite_grads",                              # keras.optimizers.LossScaleOptimizer
    "_load_model", "_save_model", "_weights_path", "_prev_weights_path",   # keras.callbacks.BackupAndRestore
    "_training_metadata_path", "_prev_training_metadata_path", "_current_epoch", "_last_batch_seen",
})

OVERLAP = "overlap of aggregation with backprop is off (buckets wait for each other in program order)"


class InternalMissingWarning(RuntimeWarning):
    """A private TensorFlow/Keras API this library uses is missing: the named feature is off."""


class MissingInternal(RuntimeError):
    """A private TensorFlow/Keras API the library cannot run without is missing."""


_warned = set()


def _versions():
    return {"tensorflow": tf.__version__, "keras": keras.__version__}


def warn_once(internal, feature):
    """Warns once per ``internal`` that it is missing and ``feature`` is lost."""
    if internal in _warned:
        return
    _warned.add(internal)
    warnings.warn(f"tf_commlib: {internal} is missing in this TensorFlow/Keras ({_versions()}; written for "
                  f"{WRITTEN_FOR}): {feature}", InternalMissingWarning, stacklevel=3)


def _missing(internal, feature):
    return MissingInternal(f"tf_commlib: {internal} is missing in this TensorFlow/Keras ({_versions()}; "
                           f"written for {WRITTEN_FOR}): {feature}")


@functools.lru_cache(maxsize=None)
def check_versions():
    """Warns once where TensorFlow or Keras is not the version this module was written for."""
    installed = _versions()
    if not installed["tensorflow"].startswith(WRITTEN_FOR["tensorflow"] + ".") or \
            installed["keras"].split(".")[0] != WRITTEN_FOR["keras"]:
        warnings.warn(f"tf_commlib uses private APIs of TensorFlow {WRITTEN_FOR['tensorflow']} and Keras "
                      f"{WRITTEN_FOR['keras']}.x; installed: {installed}. A missing one is reported when used.",
                      InternalMissingWarning, stacklevel=2)
    return installed


# -- TensorFlow: automatic control dependencies (tf_commlib.overlap) --------------------------
def acd_manager(graph):
    """The automatic-control-dependencies manager of ``graph`` (None outside its scope)."""
    if not hasattr(graph, "experimental_acd_manager"):
        warn_once("tf.Graph.experimental_acd_manager", OVERLAP)
        return None
    return graph.experimental_acd_manager


def is_stateful(op):
    """Whether ``op`` is stateful, the test automatic control dependencies chain ops by (False, and
    the feature off, where tf.Operation._is_stateful is missing)."""
    try:
        return op._is_stateful
    except AttributeError:
        warn_once("tf.Operation._is_stateful", OVERLAP)
        return False


def in_xla_context():
    """Whether the op being built is compiled by XLA (inside tf.function(jit_compile=True)), where
    Horovod's and tf_commlib's ops have no kernels (False, with a warning, where the check is missing)."""
    try:
        from tensorflow.python.ops import control_flow_util
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):
        warn_once("tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext",
                  "a step compiled with XLA fails inside TensorFlow instead of naming jit_compile")
        return False


# -- Keras optimizers -------------------------------------------------------------------------
def optimizer_variables(optimizer):
    """The list of variables ``optimizer`` itself created (Optimizer._variables)."""
    try:
        return optimizer._variables
    except AttributeError:
        raise _missing("keras.optimizers.Optimizer._variables",
                       "the optimizer's own variables (its state in checkpoints)") from None


def trainable_variables(optimizer):
    """The variables ``optimizer`` was built for (Optimizer._trainable_variables)."""
    try:
        return optimizer._trainable_variables
    except AttributeError:
        raise _missing("keras.optimizers.Optimizer._trainable_variables",
                       "apply() without trainable_variables: pass them") from None


def variable_index(optimizer, variable):
    """The index of ``variable`` in the optimizer's per-variable state lists."""
    try:
        return optimizer._get_variable_index(variable)
    except AttributeError:
        raise _missing("keras.optimizers.Optimizer._get_variable_index",
                       "the per-variable state of LARS and LAMB") from None


def lamb_moments(optimizer, i):
    """(first moment, second moment) variables of keras.optimizers.Lamb for variable index i."""
    try:
        return optimizer._momentums[i], optimizer._velocities[i]
    except AttributeError:
        raise _missing("keras.optimizers.Lamb._momentums/_velocities", "pto.LAMB's moments") from None


def overwrites_with_gradient(optimizer, variable):
    """Whether the optimizer assigns ``variable`` its gradient instead of a step (float8 scales)."""
    method = getattr(optimizer, "_overwrite_variable_with_gradient", None)
    if method is None:
        warn_once("keras.optimizers.Optimizer._overwrite_variable_with_gradient",
                  "LossScaleOptimizer reads variable.overwrite_with_gradient instead")
        return getattr(variable, "overwrite_with_gradient", False)
    return method(variable)


def uses_weight_decay(optimizer, variable):
    """Whether the optimizer's weight decay applies to ``variable`` (exclude_from_weight_decay)."""
    method = getattr(optimizer, "_use_weight_decay", None)
    if method is None:
        warn_once("keras.optimizers.Optimizer._use_weight_decay",
                  "exclude_from_weight_decay is ignored by the sharded update (every variable decays)")
        return True
    return method(variable)


def momentum_free_copy(optimizer, **changes):
    """A new, unbuilt optimizer of the same class and config with ``changes`` (e.g. momentum=0.0):
    it shares the original's learning rate when that is a schedule or a callable (whatever its
    serialisability; a float's value is copied), and keeps the weight-decay exclusions that
    exclude_from_weight_decay() set, which get_config() does not carry. The original is left as it is."""
    raw = optimizer._learning_rate
    # the config without the learning rate: a callable or an unregistered schedule need not
    # serialise, and the copy takes the object itself
    object.__setattr__(optimizer, "_learning_rate", None)
    try:
        config = optimizer.get_config()
    finally:
        object.__setattr__(optimizer, "_learning_rate", raw)
    value = float(raw.numpy()) if isinstance(raw, keras.Variable) else 0.0
    copy = type(optimizer).from_config({**config, "learning_rate": value, **changes})
    if not isinstance(raw, keras.Variable):
        copy.learning_rate = raw
    for name in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, name):
            object.__setattr__(copy, name, getattr(optimizer, name))
    return copy


def handle_non_finite(loss_scale_optimizer):
    """keras.optimizers.LossScaleOptimizer's step for non-finite gradients: halve the scale and
    reset the growth counter (the same with the public variables where the method is missing)."""
    method = getattr(loss_scale_optimizer, "_stateful_handle_non_finite_grads", None)
    if method is not None:
        return method()
    warn_once("keras.optimizers.LossScaleOptimizer._stateful_handle_non_finite_grads",
              "a non-finite step halves the scale with tf_commlib's own copy of Keras' rule")
    loss_scale_optimizer.step_counter.assign(0)
    loss_scale_optimizer.dynamic_scale.assign(loss_scale_optimizer.dynamic_scale * 0.5)


def override(cls, base, name, method, feature):
    """Sets ``cls.<name>`` (a private hook of Keras' ``base``, which calls it) to ``method``; where
    ``base`` has no such hook, warns once that ``feature`` is off and leaves cls as it is."""
    if not hasattr(base, name):
        warn_once(f"{base.__module__}.{base.__qualname__}.{name}", feature)
        return
    setattr(cls, name, method)


def override_update_step(cls, method):
    """The optimizer step over all variables at once (Optimizer._backend_update_step): PTO's
    layer-wise trust ratios (pto.layerwise)."""
    override(cls, keras.optimizers.Optimizer, "_backend_update_step", method,
             "LARS/LAMB's layer-wise step is off (Keras' per-variable update_step runs)")


# -- Keras BackupAndRestore (tf_commlib.keras.callbacks) ------------------------------------
BACKUP = "per-rank backups (the common resume epoch, tf_commlib's metadata) are off"


def override_backup(cls, load_model, save_model):
    """BackupAndRestore's restore and save hooks (_load_model, _save_model)."""
    override(cls, keras.callbacks.BackupAndRestore, "_load_model", load_model, BACKUP)
    override(cls, keras.callbacks.BackupAndRestore, "_save_model", save_model, BACKUP)


def load_backup(callback):
    """keras.callbacks.BackupAndRestore's own restore of the latest backup."""
    return keras.callbacks.BackupAndRestore._load_model(callback)


def backup_paths(callback):
    """(weights, previous weights, metadata, previous metadata) file paths of a BackupAndRestore."""
    try:
        return (callback._weights_path, callback._prev_weights_path,
                callback._training_metadata_path, callback._prev_training_metadata_path)
    except AttributeError:
        raise _missing("keras.callbacks.BackupAndRestore's backup paths", BACKUP) from None


def backup_position(callback):
    """(epoch, batch) a BackupAndRestore records in its metadata."""
    try:
        return callback._current_epoch, callback._last_batch_seen
    except AttributeError:
        raise _missing("keras.callbacks.BackupAndRestore._current_epoch/_last_batch_seen", BACKUP) from None


check_versions()
