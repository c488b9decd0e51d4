"""Which op sources go into datacache's library (``ops/datacache`` and the shared headers of
``ops/common``), and their hash: setup.py records it, datacache/_loader.py checks it. Standard
library only: setup.py loads this file by path."""
import hashlib
from pathlib import Path

DIRS = ("datacache", "common")   # under ops/


def op_sources(ops_dir, cuda=False):
    """The C++ sources and headers of the library (it has no CUDA kernels: ``cuda`` is ignored)."""
    ops_dir = Path(ops_dir)
    return sorted(p for d in DIRS for p in (ops_dir / d).rglob("*") if p.suffix in (".cc", ".h"))


def source_hash(ops_dir, cuda=False):
    h = hashlib.sha256()
    for p in op_sources(ops_dir):
        h.update(str(p.relative_to(ops_dir)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()
