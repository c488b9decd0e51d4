"""Stopping and resuming training loses nothing: residuals and DGC momentum are checkpointed."""
import numpy as np

from tests import hvdrun


def test_resume_equals_uninterrupted(tmp_path):
    reports = hvdrun.run("checkpoint_worker.py", 2, tmp_path, topology="1x2", timeout=400)
    for r in reports:
        assert r["has_residual"] and r["has_momentum"]
        np.testing.assert_allclose(r["backup"], r["full"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(r["checkpoint"], r["full"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(r["saved"], r["full"], rtol=0, atol=1e-6)
        assert r["loaded_optimizer"] == "DistributedOptimizer"
        assert np.abs(np.array(r["partial"]) - np.array(r["full"])).max() > 1e-3  # it did train on
    assert reports[0]["full"] == reports[1]["full"]
