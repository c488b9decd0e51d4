"""Stopping and resuming training loses nothing: residuals and DGC momentum are checkpointed."""
import numpy as np
import pytest


@pytest.fixture(scope="module")
def two_ranks(shared):
    """checkpoint_worker.py's and backup_worker.py's reports, from the shared 1x2 job (tests/hvdrun.py SHARED)."""
    return {name: shared("1x2", name) for name in ("checkpoint", "backup")}


@pytest.mark.timeout(1600)   # the shared 1x2 job when this test runs first
def test_resume_equals_uninterrupted(two_ranks):
    reports = two_ranks["checkpoint"]
    for r in reports:
        assert r["has_residual"] and r["has_momentum"]
        np.testing.assert_allclose(r["backup"], r["full"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(r["checkpoint"], r["full"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(r["saved"], r["full"], rtol=0, atol=1e-6)
        assert r["loaded_optimizer"] == "DistributedOptimizer"
        assert np.abs(np.array(r["partial"]) - np.array(r["full"])).max() > 1e-3  # it did train on
    assert reports[0]["full"] == reports[1]["full"]


def test_per_rank_state_across_a_restart_on_4_ranks(shared):
    """Residuals and DGC momentum differ by rank: tf_commlib.keras.BackupAndRestore keeps one backup
    per rank and resumes exactly; a checkpoint that rank 0 alone wrote is refused on every rank
    (it would silently give every rank rank 0's residuals) unless reset_rank_state() is called."""
    reports = shared("2x2", "rank_state")
    for rank, r in enumerate(reports):
        assert r["residual"] > 0
        assert r["backed_up"] and r["deleted"], "own backup written when interrupted, deleted at the end"
        np.testing.assert_allclose(r["resumed"], r["full"], rtol=0, atol=1e-6)
        assert r["refused"] is not None and "restored from another rank's checkpoint" in r["refused"]
        assert "[None, 0, 0, 0]" in r["refused"], r["refused"]
        assert np.isfinite(r["after_reset"]).all()
        assert r["full"] == reports[0]["full"] and r["after_reset"] == reports[0]["after_reset"]
    # broadcast_variables (root 1) and average_variables over mixed dtypes and shapes, against numpy
    from tests.workers._mixed import rank_values
    root = rank_values(1)
    floats = [[v for v in rank_values(r) if v.dtype.kind == "f"] for r in range(4)]
    for r in reports:
        assert r["broadcast_dtypes"] == ["float32", "int64", "float64", "float64", "float32"]
        # a dtype is sent only where some rank holds other bytes than the root's
        assert r["sent"] == ["float32", "int64", "float64"] and r["sent_again"] == []
        assert r["sent_partly"] == ["float32"] and r["partly"] == [[1.0, 2.0], 7, 3.0]
        assert "root_rank must be a rank, 0 to 3, got 4" in r["bad_root"]
    # a cached measurement: rank 0's values, read back on every rank
    for rank, r in enumerate(reports):
        assert r["measured"] == [[1.5, 2.0 + rank], "measured"] and r["read_back"] == [[1.5, 2.0], "cached"]
        for got, want in zip(r["broadcast"], root):
            np.testing.assert_array_equal(np.asarray(got).reshape(want.shape), want)
        for j, got in enumerate(r["averaged"]):
            want = np.mean([floats[q][j] for q in range(4)], axis=0)
            np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-6, atol=1e-7)


@pytest.mark.timeout(1600)   # two adaptive runs profile and choose (pymoo) once each; and checkpoint_worker.py
def test_backup_and_restore_guarantees(two_ranks):
    """tf_commlib.keras.BackupAndRestore (tests/workers/backup_worker.py): resumes with exactly the
    saved per-rank state; ranks one epoch apart resume at one epoch; two apart raise on every rank;
    AdaptiveDensity's choice survives a restart."""
    reports = two_ranks["backup"]
    for r in reports:
        assert r["residual"] > 0 and r["momentum"] > 0
        assert r["restored_exactly"], "the resumed run starts from the state saved at the interruption"
        assert r["resumed_epochs"] == [2] and r["resumed_equals_full"] and r["deleted"]
        assert r["skew_resume_epoch"] == 1 and r["skew_epochs"] == [1, 2], r
        assert r["skew_equals_full"] and r["kept"]
        assert len(r["apart_errors"]) == 2, r["apart_errors"]
        for e in r["apart_errors"]:
            assert "cannot resume at one epoch" in e and "epochs [0, 2]" in e, e
        assert r["adaptive_full"][0]["profiled"] == "first"   # epoch 1 (after the 1-epoch warm-up)
        assert r["adaptive_resumed"] == r["adaptive_full"][1:], "resumed without re-profiling"
        assert r["adaptive_equals_full"]
    assert reports[0]["adaptive_full"] == reports[1]["adaptive_full"]
