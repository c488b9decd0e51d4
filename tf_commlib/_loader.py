"""Loads the op library built by setup.py, refusing a missing or stale one with a clear ImportError."""
import json
from pathlib import Path

import tensorflow as tf

from tf_commlib._sources import source_hash

_HERE = Path(__file__).resolve().parent
_OPS_SRC = _HERE.parent / "ops"  # present in a source checkout (editable install)
_REBUILD = "rebuild it with `make install` (or `python setup.py build_ext --inplace`) in the repo root"


def _load():
    info_path = _HERE / "_build_info.json"
    libs = sorted(_HERE.glob("_tf_commlib_ops*.so"))
    if not libs or not info_path.exists():
        raise ImportError(f"tf_commlib op library not found in {_HERE}; {_REBUILD}")
    info = json.loads(info_path.read_text())
    if info.get("tensorflow") != tf.__version__:
        raise ImportError(f"tf_commlib op library was built against TensorFlow {info.get('tensorflow')}"
                          f" but {tf.__version__} is installed; {_REBUILD}")
    if _OPS_SRC.is_dir() and info.get("sources") != source_hash(_OPS_SRC, info.get("cuda", False)):
        raise ImportError(f"tf_commlib op library is stale (ops/ changed since it was built); {_REBUILD}")
    return tf.load_op_library(str(_HERE / info["library"]))


ops = _load()
