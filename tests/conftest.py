import fcntl
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# "auto"'s link calibration (measured once per cluster) goes to a folder of this run, not ~/.cache
if "TF_COMMLIB_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TF_COMMLIB_CACHE"] = tempfile.mkdtemp(prefix="tf_commlib_cache_")
    atexit.register(shutil.rmtree, os.environ["TF_COMMLIB_CACHE"], True)

# Markers (pytest.ini) that follow from what a module starts, so that no test can forget them:
# `pytest -m "not slow"` is the quick loop, `-m "not multiprocess"` runs no horovodrun job, and
# `-m "not root"` leaves out what needs root (network namespaces, Slurm's daemons, a second uid).
ROOT_MODULES = {"test_emulated_cluster", "test_slurm", "test_slurm_dawnbench", "test_shm_security", "test_faults"}
SLOW_MODULES = {"test_bench_tta", "test_convergence", "test_dawnbench", "test_emulated_cluster", "test_fidelity",
                "test_slurm", "test_slurm_dawnbench", "test_demo", "test_faults", "test_install"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        if module in ROOT_MODULES or "slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.root)
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if any(hasattr(item.module, name) for name in ("hvdrun", "local_run")) or \
                "shared" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.multiprocess)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real single-node Slurm (tests/slurm_cluster.py), started once and stopped at the end."""
    from tests.slurm_cluster import LOCK, SlurmCluster

    if os.geteuid() != 0:
        pytest.fail("the Slurm tests need root: they start munged, slurmctld and slurmd (run the "
                    "tests as root, as CI does)", pytrace=False)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # Slurm's daemons and munge are machine-wide
        cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


# -- DataCache: the test images (module-scoped: each module gets its own folder) --------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.datacache_data import write_folder

    return write_folder(str(tmp_path_factory.mktemp("images")))


@pytest.fixture(scope="module")
def source(folder):
    from datacache import ImageFolderSource

    return ImageFolderSource(folder)


@pytest.fixture(scope="module")
def ref16(source):
    from datacache import DecodeResize
    from tests.datacache_data import Reference

    return Reference(source, DecodeResize(16))


@pytest.fixture
def redis_cluster():
    """A real Redis Cluster of three masters on 127.0.0.1 (tests/redis_cluster.py), with a random
    password, that keeps serving the slots of the live masters when one dies
    (cluster-require-full-coverage no); every server is stopped at the end, also on failure."""
    from tests.redis_cluster import RedisCluster

    with RedisCluster(full_coverage=False) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def shared(request, tmp_path_factory):
    """shared(layout, case) -> per-rank reports of tests/hvdrun.py's SHARED job on that layout, started
    the first time a test asks (the cases of the modules this session runs; a failing job fails
    every test that reads it)."""
    from tests import hvdrun

    modules = {item.module.__name__.rpartition(".")[2] for item in request.session.items}
    jobs = {}

    def case(layout, name):
        if layout not in jobs:
            try:
                jobs[layout] = hvdrun.run_shared(layout, tmp_path_factory.mktemp(f"shared_{layout}"), modules)
            except Exception as e:   # kept, so that the job runs once however it fails
                jobs[layout] = e
        if isinstance(jobs[layout], Exception):
            raise AssertionError(f"the shared {layout} job (tests/hvdrun.py SHARED) failed:\n{jobs[layout]}")
        return jobs[layout][name]
    return case


@pytest.fixture
def rank0_of_2x2(monkeypatch):
    """One process seen as rank 0 of 2 nodes of 2 ranks by DistributedOptimizer, its AutoEpochs and the
    DiLoCo rounds, with replicas' all-gather returning this rank's rows for all 4 ranks alike."""
    import numpy as np

    from tf_commlib import replicas
    from tf_commlib import diloco_sync
    from tf_commlib.keras import auto_epoch, optimizer
    from tf_commlib.topology import Topology

    topo = Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2))
    for module in (optimizer, auto_epoch, diloco_sync):
        monkeypatch.setattr(module, "current_topology", lambda: topo)
    monkeypatch.setattr(replicas, "gathered", lambda rows, name: np.repeat(rows, 4, axis=0))
    return topo


@pytest.fixture
def registry():
    """The collectives' registry (ALGORITHMS), with what the test registered removed after it: a setting
    that a parsed command line registers (tf_commlib.collectives.setting) stays out of later tests, which
    check every registered collective."""
    from tf_commlib.collectives import ALGORITHMS

    before = set(ALGORITHMS)
    yield ALGORITHMS
    for name in set(ALGORITHMS) - before:
        ALGORITHMS.pop(name)
