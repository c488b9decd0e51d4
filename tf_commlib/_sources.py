"""Which op sources go into tf_commlib's library, and their hash (setup.py records it, the loader
checks it). ``ops/datacache`` is datacache's own library (datacache/_sources.py), not hashed here."""
import hashlib
from pathlib import Path

OTHER_LIBRARIES = ("datacache",)   # ops/ subdirectories built into another package's library


def op_sources(ops_dir, cuda):
    """The C++ sources and headers compiled for a CPU build, plus the CUDA ones for a CUDA build."""
    ops_dir = Path(ops_dir)
    files = [p for p in ops_dir.rglob("*") if p.suffix in (".cc", ".h")
             and p.relative_to(ops_dir).parts[0] not in OTHER_LIBRARIES]
    if not cuda:
        files = [p for p in files if not p.name.endswith((".cu.cc", ".cu.h"))]
    return sorted(files)


def source_hash(ops_dir, cuda):
    h = hashlib.sha256()
    for p in op_sources(ops_dir, cuda):
        h.update(str(p.relative_to(ops_dir)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()
