"""Checks of DistributedOptimizer's arguments and what it derives from them (the momentum it takes
over from the wrapped optimizer, the qRGC group's options)."""
import math
import numbers

import keras


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_arguments(optimizer, momentum_correction, momentum, nesterov, local_clip_norm,
                    momentum_masking, warmup, dense_layers, dense_warmup_epochs, qrgc,
                    fusion_threshold_bytes, seed, name, overlap, shard_optimizer):
    """ValueError naming the first bad argument of DistributedOptimizer (the collective's own
    arguments are checked by tf_commlib.aggregator.check_config)."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"optimizer must be a Keras 3 optimizer (not a DistributedOptimizer), got {optimizer!r}")
    if getattr(optimizer, "_tf_commlib_wrapped", False):
        raise ValueError("optimizer is already wrapped by a DistributedOptimizer (which took over its "
                         "momentum); wrap a new instance, e.g. type(opt).from_config(opt.get_config())")
    for arg, value in (("momentum_correction", momentum_correction), ("nesterov", nesterov),
                       ("momentum_masking", momentum_masking), ("qrgc", qrgc), ("overlap", overlap),
                       ("shard_optimizer", shard_optimizer)):
        if not isinstance(value, bool):
            raise ValueError(f"{arg} must be True or False, got {value!r}")
    if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, numbers.Real)
                                 or not 0.0 <= momentum < 1.0):
        raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
    if local_clip_norm is not None and (isinstance(local_clip_norm, bool) or not isinstance(local_clip_norm, numbers.Real)
                                        or not 0.0 < local_clip_norm < math.inf):
        raise ValueError(f"local_clip_norm must be a positive finite number, got {local_clip_norm!r}")
    if warmup is not None and (not _is_int(warmup) or warmup < 0):
        raise ValueError(f"warmup must be a number of epochs >= 0, got {warmup!r}")
    if dense_layers is not None and not callable(dense_layers):
        raise ValueError(f"dense_layers must be a predicate variable -> bool, got {dense_layers!r}")
    if not _is_int(dense_warmup_epochs) or dense_warmup_epochs < 0:
        raise ValueError(f"dense_warmup_epochs must be an int >= 0, got {dense_warmup_epochs!r}")
    if not _is_int(fusion_threshold_bytes) or fusion_threshold_bytes < 0:
        raise ValueError(f"fusion_threshold_bytes must be an int >= 0, got {fusion_threshold_bytes!r}")
    if seed is not None and not _is_int(seed):
        raise ValueError(f"seed must be None or an int, got {seed!r}")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be None or a string, got {name!r}")


def take_momentum(optimizer, momentum_correction, momentum, nesterov):
    """(m, nesterov) of DGC's momentum correction, which keeps the velocity in the wrapper: a
    keras.optimizers.SGD (or an optimizer with ``movable_momentum``) hands over its momentum and
    nesterov and is set to plain SGD; another optimizer needs ``momentum``. (0.0, nesterov) without
    momentum_correction."""
    if not momentum_correction:
        return 0.0, nesterov
    if isinstance(optimizer, keras.optimizers.SGD) or getattr(optimizer, "movable_momentum", False):
        m = float(optimizer.momentum) if momentum is None else float(momentum)
        nesterov = nesterov or optimizer.nesterov
        optimizer.momentum, optimizer.nesterov = 0.0, False
        return m, nesterov
    if momentum is None:
        raise ValueError("momentum_correction needs momentum= when the wrapped optimizer is "
                         f"not keras.optimizers.SGD (got {type(optimizer).__name__})")
    return float(momentum), nesterov


def qrgc_options(algorithm_options):
    """algorithm_options for the qRGC group: value_codec "mean" added for every registered
    algorithm that takes it and where algorithm_options does not set value_codec."""
    from tf_commlib.collectives import ALGORITHMS

    out = {name: dict(opts) for name, opts in (algorithm_options or {}).items()}
    for name, coll in ALGORITHMS.items():
        if "value_codec" in coll.options and "value_codec" not in out.get(name, {}):
            try:
                coll.resolve_options({**out.get(name, {}), "value_codec": "mean"})
            except ValueError:   # the algorithm refuses "mean" (SparCML's merged streams)
                continue
            out.setdefault(name, {})["value_codec"] = "mean"
    return out
