"""Private TensorFlow/Keras APIs are used only in tf_commlib/internals.py, and a missing one warns once,
naming the feature that is lost."""
import ast
import types
import warnings
from pathlib import Path

import pytest
import tensorflow as tf

from tf_commlib import internals, overlap

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tf_commlib", "pto", "datacache", "tfc_apps")
ALLOWED = ROOT / "tf_commlib" / "internals.py"

# what the scan looks for outside tf_commlib/internals.py
PRIVATE_MODULES = ("tensorflow.python", "tensorflow.core", "keras.src", "keras._tf_keras")
PRIVATE_NAMES = {
    "experimental_acd_manager", "_is_stateful",
    "_variables", "_trainable_variables", "_get_variable_index",
    "_overwrite_variable_with_gradient", "_use_weight_decay", "_backend_update_step",
    "_momentums", "_velocities", "_stateful_handle_non_finite_grads",
    "_learning_rate", "_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern",
    "_load_model", "_save_model", "_weights_path", "_prev_weights_path",
    "_training_metadata_path", "_prev_training_metadata_path", "_current_epoch", "_last_batch_seen",
}
MODULE_ALIASES = {"tf": "tensorflow", "tensorflow": "tensorflow", "keras": "keras"}


def private_uses(source, name="<snippet>"):
    """["name:line what"] for every private TensorFlow/Keras API use in source: imports of
    PRIVATE_MODULES, tf./keras. attributes that are private (tf.python, tf.__internal__, tf._x,
    keras.src), the PRIVATE_NAMES as attributes, in getattr/hasattr/setattr/delattr, or defined as
    methods (overrides of Keras' hooks)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Import):
            what = next((a.name for a in node.names if a.name.startswith(PRIVATE_MODULES)), None)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(PRIVATE_MODULES):
            what = node.module
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_NAMES:
                what = "." + node.attr
            elif isinstance(node.value, ast.Name) and node.value.id in MODULE_ALIASES and \
                    (node.attr in ("python", "src", "core", "__internal__") or
                     node.attr.startswith("_") and not node.attr.endswith("__")):
                what = f"{node.value.id}.{node.attr}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1 and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value in PRIVATE_NAMES:
            what = f"{node.func.id}(..., {node.args[1].value!r})"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in PRIVATE_NAMES:
            what = f"def {node.name}"
        if what:
            found.append(f"{name}:{node.lineno} {what}")
    return found


def test_the_scan_lists_what_internals_uses():
    assert PRIVATE_NAMES == set(internals.PRIVATE_NAMES)


@pytest.mark.parametrize("snippet", [
    "from tensorflow.python.framework import ops",
    "import keras.src.optimizers",
    "x = tf.python.framework.ops",
    "x = tf.__internal__.nest",
    "def f(op):\n    return op._is_stateful",
    "def f(g):\n    return getattr(g, 'experimental_acd_manager', None)",
    "class O(keras.optimizers.Optimizer):\n    def _backend_update_step(self, g, v, lr):\n        pass",
    "class O:\n    def step(self, v):\n        return self._overwrite_variable_with_gradient(v)",
    "vs = opt._trainable_variables",
])
def test_the_scan_flags_private_uses(snippet):
    assert private_uses(snippet), snippet


def test_the_scan_passes_public_uses():
    assert not private_uses("import tensorflow as tf\nimport keras\n"
                            "g = tf.compat.v1.get_default_graph()\nx = keras.optimizers.SGD(0.1).variables\n"
                            "class C:\n    def __init__(self):\n        self._stamps = {}\n")


def test_private_apis_only_in_internals():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != ALLOWED:
                found += private_uses(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "private TensorFlow/Keras API outside tf_commlib/internals.py:\n" + "\n".join(found)


def test_written_for_the_installed_versions():
    with warnings.catch_warnings():
        warnings.simplefilter("error", internals.InternalMissingWarning)
        internals.check_versions.cache_clear()
        installed = internals.check_versions()
    assert installed["tensorflow"].startswith("2.21.") and installed["keras"].startswith("3.")


def _missing_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, internals.InternalMissingWarning)]


def test_a_missing_internal_warns_once_naming_the_lost_feature(monkeypatch):
    """A graph without the automatic-control-dependencies manager (tf.Graph.experimental_acd_manager
    taken away): the step runs in program order, and one warning says overlap is off."""
    monkeypatch.setattr(internals, "_warned", set())
    real = tf.compat.v1.get_default_graph
    monkeypatch.setattr(tf.compat.v1, "get_default_graph",
                        lambda: types.SimpleNamespace(get_operations=lambda: real().get_operations()))

    @tf.function
    def step(x):
        since = overlap.op_count()
        stamp = tf.timestamp()
        overlap.run_independently(since)
        since = overlap.op_count()
        again = tf.timestamp()
        overlap.run_independently(since)
        return x + tf.cast(stamp + again, x.dtype)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert float(step(tf.constant(1.0))) > 1.0
    messages = _missing_warnings(caught)
    assert len(messages) == 1, messages
    assert "tf.Graph.experimental_acd_manager" in messages[0]
    assert "overlap of aggregation with backprop is off" in messages[0]


def test_each_missing_internal_names_its_feature(monkeypatch):
    monkeypatch.setattr(internals, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert internals.is_stateful(types.SimpleNamespace()) is False
        assert internals.is_stateful(types.SimpleNamespace()) is False
        assert internals.uses_weight_decay(types.SimpleNamespace(), None) is True
    messages = _missing_warnings(caught)
    assert len(messages) == 2, messages
    assert "_is_stateful" in messages[0] and "overlap of aggregation with backprop is off" in messages[0]
    assert "_use_weight_decay" in messages[1] and "exclude_from_weight_decay is ignored" in messages[1]
    with pytest.raises(internals.MissingInternal, match="_trainable_variables"):
        internals.trainable_variables(types.SimpleNamespace())
