"""Convergence on real data (sklearn digits), 4 ranks as 2x2: HiTopKComm + MSTopK at density 0.01,
and at tyagi's adaptive density, reach the test accuracy of dense aggregation within 1 percentage
point, same epochs and seeds (one dense run for both)."""
import json

import pytest

from tests import hvdrun


def train(tmp_path, *args, epochs=20):
    out = tmp_path / f"{args[1]}.json"
    hvdrun.run_command(["-m", "tfc_apps.train", *args, "--epochs", epochs, "--json", out], 4, 900, topology="2x2")
    return json.loads(out.read_text())["epochs"]


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return train(tmp_path_factory.mktemp("dense"), "--algorithm", "dense")


def test_hitopk_matches_dense_accuracy(tmp_path, dense):
    sparse = train(tmp_path, "--algorithm", "hitopk", "--density", "0.01", "--selector", "mstopk")
    assert dense[-1]["test_accuracy"] > 0.9  # it did learn
    assert sparse[-1]["test_accuracy"] >= dense[-1]["test_accuracy"] - 0.01, (sparse[-1], dense[-1])
    assert [e["density"] for e in sparse[:5]] == [0.25, 0.0625, 0.015625, 0.01, 0.01]  # DGC warm-up
    assert sparse[-1]["bytes_per_step"] < dense[-1]["bytes_per_step"]


def test_adaptive_density_matches_dense_accuracy(tmp_path, dense):
    from tf_commlib.keras.policy import CANDIDATES
    adaptive = train(tmp_path, "--algorithm", "hitopk", "--density", "adaptive", "--selector", "mstopk")
    assert adaptive[-1]["test_accuracy"] >= dense[-1]["test_accuracy"] - 0.01, (adaptive[-1], dense[-1])
    densities = [e["density"] for e in adaptive]   # warm-up, then the knee chosen among the candidates
    assert densities[:4] == [0.25, 0.0625, 0.015625, 0.004], densities
    assert all(min(CANDIDATES) <= d <= max(CANDIDATES) for d in densities[4:]), densities
