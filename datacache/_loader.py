"""Loads datacache's op library (DatacacheMget), built by setup.py into datacache/_datacache_ops*.so.

``ops()`` returns None when the library is not built (the redis-py path reads instead) and raises
ImportError, saying how to rebuild, when it was built against another TensorFlow or from other
sources than ops/datacache and ops/common hold."""
import functools
import json
from pathlib import Path

from datacache._sources import source_hash

_HERE = Path(__file__).resolve().parent
_OPS_SRC = _HERE.parent / "ops"  # present in a source checkout (editable install)
_REBUILD = ("rebuild it with `make install` (or `python setup.py build_ext --inplace`) in the repo "
            "root, or read through redis-py with DataCache(direct_read=False)")


@functools.cache   # a refusal (ImportError) is not cached: it is raised again at the next call
def ops():
    """The op module, or None when the library is not built; ImportError when it is stale."""
    import tensorflow as tf

    info_path = _HERE / "_build_info.json"
    if not any(_HERE.glob("_datacache_ops*.so")) or not info_path.exists():
        return None
    info = json.loads(info_path.read_text())
    if info.get("tensorflow") != tf.__version__:
        raise ImportError(f"datacache op library was built against TensorFlow {info.get('tensorflow')}"
                          f" but {tf.__version__} is installed; {_REBUILD}")
    if _OPS_SRC.is_dir() and info.get("sources") != source_hash(_OPS_SRC):
        raise ImportError("datacache op library is stale (ops/datacache or ops/common changed since "
                          f"it was built); {_REBUILD}")
    return tf.load_op_library(str(_HERE / info["library"]))
