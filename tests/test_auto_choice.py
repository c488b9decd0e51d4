"""DistributedOptimizer(algorithm="auto") on 4 ranks (2x2): every rank makes the same choice each
epoch and runs it; a rank that chose otherwise is an error on every rank, not a hang."""
import pytest

from tests import hvdrun
from tf_commlib.aggregator.chooser import AUTO_CANDIDATES
from tf_commlib.collectives import ALGORITHMS


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return hvdrun.run("auto_worker.py", 4, tmp_path_factory.mktemp("auto"), topology="2x2", timeout=300)


def test_every_rank_runs_the_same_choice_and_learns_the_efficiency(reports):
    first = {k: v for k, v in reports[0].items() if k != "error"}
    assert all({k: v for k, v in r.items() if k != "error"} == first for r in reports[1:])
    choices = [row["choice"] for row in first["log"] if "choice" in row]
    assert len(choices) == 3 and set(choices) <= set(AUTO_CANDIDATES)
    steps = len(first["ran"]) // 3
    assert first["ran"] == [c for c in choices for _ in range(steps)]
    assert ALGORITHMS[choices[0]].lossy   # the link is declared slow: a lossy candidate first
    ran = [row for row in first["log"] if "ran" in row]
    assert [row["ran"] for row in ran] == choices and all(row["measured_s"] > 0 for row in ran)
    lossy = [row for row in ran if ALGORITHMS[row["ran"]].lossy]
    assert all(0 < row["efficiency"] <= 1.0 + 1e-9 for row in lossy)
    assert first["efficiency"] == pytest.approx({row["ran"]: row["efficiency"] for row in lossy})


def test_a_rank_that_chooses_otherwise_fails_every_rank(reports):
    for r in reports:
        assert r["error"] is not None and "algorithm" in r["error"], r
