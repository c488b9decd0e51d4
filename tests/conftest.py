import fcntl
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


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
