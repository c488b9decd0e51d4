"""Convergence on real data (sklearn digits), 4 ranks as 2x2: HiTopKComm + MSTopK at density 0.01,
and at tyagi's adaptive density, reach the test accuracy of dense aggregation within 1 percentage
point, same epochs and seeds. The three trainings run one after another in one job (one launch):
each as `python -m tfc_apps.train ... --json X.json` runs it (tests/workers/sequence_worker.py)."""
import json

import pytest

from tests import hvdrun
from tests.workers.sequence_worker import cases_file

EPOCHS = 20
TRAININGS = {"dense": ["--algorithm", "dense"],
             "hitopk": ["--algorithm", "hitopk", "--density", "0.01", "--selector", "mstopk"],
             "adaptive": ["--algorithm", "hitopk", "--density", "adaptive", "--selector", "mstopk"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each training's per-epoch summary (rank 0's --json)."""
    tmp = tmp_path_factory.mktemp("convergence")
    cases = {name: ("tfc_apps.train", [*args, "--epochs", EPOCHS, "--json", tmp / f"{name}.json"], None)
             for name, args in TRAININGS.items()}
    hvdrun.run("sequence_worker.py", 4, tmp, args=[cases_file(tmp, cases)], topology="2x2", timeout=1500)
    return {name: json.loads((tmp / f"{name}.json").read_text())["epochs"] for name in TRAININGS}


@pytest.mark.timeout(1600)   # the three trainings when this test runs first
def test_hitopk_matches_dense_accuracy(trained):
    dense, sparse = trained["dense"], trained["hitopk"]
    assert len(dense) == len(sparse) == EPOCHS
    assert dense[-1]["test_accuracy"] > 0.9  # it did learn
    assert sparse[-1]["test_accuracy"] >= dense[-1]["test_accuracy"] - 0.01, (sparse[-1], dense[-1])
    assert [e["density"] for e in sparse[:5]] == [0.25, 0.0625, 0.015625, 0.01, 0.01]  # DGC warm-up
    assert sparse[-1]["bytes_per_step"] < dense[-1]["bytes_per_step"]


@pytest.mark.timeout(1600)
def test_adaptive_density_matches_dense_accuracy(trained):
    from tf_commlib.keras.policy import CANDIDATES
    dense, adaptive = trained["dense"], trained["adaptive"]
    assert len(adaptive) == EPOCHS
    assert adaptive[-1]["test_accuracy"] >= dense[-1]["test_accuracy"] - 0.01, (adaptive[-1], dense[-1])
    densities = [e["density"] for e in adaptive]   # warm-up, then the knee chosen among the candidates
    assert densities[:4] == [0.25, 0.0625, 0.015625, 0.004], densities
    assert all(min(CANDIDATES) <= d <= max(CANDIDATES) for d in densities[4:]), densities
