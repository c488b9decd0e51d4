"""datacache depends on neither tf_commlib nor pto: its own op library (loader, source hash) and its
own node layout from Horovod (and the emulated layout's environment variable)."""
import ast
import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from datacache import _loader, cache, direct
from datacache import _sources as dc_sources
from tf_commlib import _sources as tfc_sources

ROOT = Path(__file__).resolve().parents[1]


def test_datacache_imports_nothing_of_tf_commlib_or_pto():
    for path in sorted((ROOT / "datacache").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad = [n for n in names if n.split(".")[0] in ("tf_commlib", "pto")]
            assert not bad, f"{path.relative_to(ROOT)}:{node.lineno} imports {bad}"


def test_each_library_hashes_only_its_own_sources(tmp_path):
    ops = tmp_path / "ops"
    shutil.copytree(ROOT / "ops", ops)

    def hashes():
        return tfc_sources.source_hash(ops, False), dc_sources.source_hash(ops)

    assert "datacache" not in {p.relative_to(ops).parts[0] for p in tfc_sources.op_sources(ops, True)}
    assert {p.relative_to(ops).parts[0] for p in dc_sources.op_sources(ops)} == {"datacache", "common"}
    before = hashes()
    for changed, same in [("datacache/mget_op.cc", "tf_commlib"), ("topk/topk_ops.cc", "datacache"),
                          ("common/checks.h", None)]:   # both compile ops/common
        (ops / changed).write_text("// changed\n", encoding="utf-8")
        after = hashes()
        assert [a == b for a, b in zip(after, before)] == [same == "tf_commlib", same == "datacache"], changed
        before = after


@pytest.fixture
def library_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(_loader, "_HERE", tmp_path)
    _loader.ops.cache_clear()
    yield tmp_path
    _loader.ops.cache_clear()


def test_a_missing_library_means_the_redis_py_path(library_dir):
    import redis

    assert _loader.ops() is None
    assert direct.direct_attrs(redis.Redis(host="127.0.0.1", port=1)) is None


def test_a_stale_or_foreign_library_is_refused(library_dir):
    import tensorflow as tf

    (library_dir / "_datacache_ops.so").write_bytes(b"")
    info = {"tensorflow": tf.__version__, "cuda": False, "sources": "0" * 64, "library": "_datacache_ops.so"}
    (library_dir / "_build_info.json").write_text(json.dumps(info))
    with pytest.raises(ImportError, match="datacache op library is stale.*build_ext --inplace"):
        _loader.ops()
    info.update(tensorflow="0.0", sources=dc_sources.source_hash(ROOT / "ops"))
    (library_dir / "_build_info.json").write_text(json.dumps(info))
    with pytest.raises(ImportError, match="built against TensorFlow 0.0.*direct_read=False"):
        _loader.ops()


class FakeHorovod(types.ModuleType):
    """horovod.tensorflow on 4 ranks of 2 real hosts (2 ranks each), as rank `rank`."""

    def __init__(self, rank, initialized=True):
        super().__init__("horovod.tensorflow")
        self._rank, self._initialized = rank, initialized

    def is_initialized(self):
        return self._initialized

    def rank(self):
        return self._rank

    def size(self):
        return 4

    def local_rank(self):
        return self._rank % 2

    def local_size(self):
        return 2

    def cross_rank(self):
        return self._rank // 2


def test_the_node_layout_is_horovods_or_the_emulated_one(monkeypatch):
    monkeypatch.delenv(cache.LAYOUT_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "horovod.tensorflow", raising=False)
    assert cache._topology() is None   # Horovod not even imported
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", FakeHorovod(3, initialized=False))
    assert cache._topology() is None
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", FakeHorovod(3))
    assert cache._topology() == cache.Node(rank=3, size=4, node=1, local=1, n=2)
    for spec, want in [("4x1", (3, 0, 1)), ("1x4", (0, 3, 4)), (" 2 X 2 ", (1, 1, 2))]:
        monkeypatch.setenv(cache.LAYOUT_ENV, spec)
        assert cache._topology()[2:] == want, spec
    monkeypatch.setenv(cache.LAYOUT_ENV, "3x2")
    with pytest.raises(ValueError, match="not an MxN layout of the 4 ranks"):
        cache._topology()
