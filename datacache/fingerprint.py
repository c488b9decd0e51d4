"""The name of a preprocess configuration, part of every cache key.

In order of precedence: ``preprocess_key=`` (any string the user chooses, e.g. "resnet-224-v2");
``preprocess.config()`` (a JSON-serialisable dict, as Keras layers have); otherwise a fingerprint of
the function itself: its code, constants, defaults, closure values and the plain global values
(numbers, strings, tuples) it reads, recursively through the functions it calls by name, partials
and tf.functions. The output shape and dtype are always added, so two resolutions never share
entries even when their functions fingerprint alike.
"""
import functools
import hashlib
import json
import logging
import types

log = logging.getLogger("datacache")
_PLAIN = (int, float, str, bytes, bool, type(None))


def _plain(value):
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (tuple, list, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _describe(value, depth, seen):
    if _plain(value):
        return repr(value)
    fn = getattr(value, "python_function", None)   # tf.function
    if fn is not None:
        return _describe(fn, depth, seen)
    if isinstance(value, functools.partial):
        return "partial(" + ",".join(_describe(v, depth, seen) for v in
                                     (value.func, *value.args, *sorted(value.keywords.items()))) + ")"
    if isinstance(value, types.MethodType):
        return "method(" + _describe(value.__func__, depth, seen) + "," + _describe(value.__self__, depth, seen) + ")"
    if isinstance(value, types.FunctionType):
        return _function(value, depth, seen)
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    config = getattr(value, "get_config", None) or getattr(value, "config", None)
    if callable(config):
        try:
            return f"{type(value).__qualname__}:{json.dumps(config(), sort_keys=True, default=repr)}"
        except Exception:
            pass
    if isinstance(value, type) or callable(value) and hasattr(value, "__module__") and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    text = repr(value)
    if " at 0x" in text:   # an object identity, not a value: it would change every run
        log.warning("datacache: preprocess captures %s, which cannot be fingerprinted; pass "
                    "preprocess_key= to name the preprocess configuration", type(value).__qualname__)
        return type(value).__qualname__
    return text


def _code(code):
    consts = tuple(_code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    return repr((code.co_code, consts, code.co_names, code.co_varnames))


def _function(fn, depth, seen):
    if fn in seen or depth > 4:
        return f"fn:{fn.__module__}.{fn.__qualname__}"
    seen.add(fn)
    if not isinstance(getattr(fn, "__module__", None), str) or fn.__module__.split(".")[0] in (
            "tensorflow", "keras", "numpy", "tf_keras"):
        return f"fn:{fn.__module__}.{fn.__qualname__}"
    parts = [fn.__qualname__, _code(fn.__code__), _describe(fn.__defaults__, depth, seen),
             _describe(fn.__kwdefaults__, depth, seen)]
    for cell in fn.__closure__ or ():
        try:
            parts.append(_describe(cell.cell_contents, depth + 1, seen))
        except ValueError:   # an empty cell
            parts.append("<empty>")
    names = set(fn.__code__.co_names)
    for const in fn.__code__.co_consts:   # names read by nested functions and comprehensions
        if isinstance(const, types.CodeType):
            names.update(const.co_names)
    for name in sorted(names):
        if name in fn.__globals__:
            value = fn.__globals__[name]
            if _plain(value) or isinstance(value, (types.FunctionType, functools.partial)):
                parts.append(f"{name}={_describe(value, depth + 1, seen)}")
    return "fn(" + "|".join(parts) + ")"


def preprocess_fingerprint(preprocess, preprocess_key=None):
    """A string naming the preprocess configuration (see the module docstring)."""
    if preprocess_key is not None:
        return "key:" + str(preprocess_key)
    config = getattr(preprocess, "config", None)
    if callable(config) and not isinstance(preprocess, types.FunctionType):
        return f"config:{type(preprocess).__qualname__}:{json.dumps(config(), sort_keys=True, default=repr)}"
    return "code:" + hashlib.sha256(_describe(preprocess, 0, set()).encode()).hexdigest()
