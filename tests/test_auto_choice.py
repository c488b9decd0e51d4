"""DistributedOptimizer(algorithm="auto") on 4 ranks (2x2): every rank makes the same choice each
epoch and runs it; a rank that chose otherwise is an error on every rank, not a hang."""
import pytest

from tests import hvdrun
from tf_commlib.aggregator.chooser import AUTO_CANDIDATES
from tf_commlib.collectives import ALGORITHMS


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def reports(tmp_path_factory, cache):
    return hvdrun.run("auto_worker.py", 4, tmp_path_factory.mktemp("auto"), topology="2x2", timeout=300,
                      env={"TF_COMMLIB_CACHE": str(cache)})


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
    # the first epoch traced the step: what a change of candidate costs is measured, and the later
    # choices weigh sequences of candidates over the fit's remaining epochs with it
    assert ran[0]["switch_s"] > 0
    decided = [row for row in first["log"] if "choice" in row]
    assert decided[0]["unit"] == "s per step of progress" and decided[0]["inputs"]["trace_s"] is None
    assert all(row["unit"] == "s over the epochs left" and row["inputs"]["trace_s"] > 0 for row in decided[1:])


def test_a_rank_that_chooses_otherwise_fails_every_rank(reports):
    for r in reports:
        assert r["error"] is not None and "the ranks chose different collectives" in r["error"], r


def test_without_link_parameters_the_link_is_measured_once_and_kept(reports, cache):
    """The second run has no Auto(cost_params=...): fit measured the link on every rank (the same
    numbers) and rank 0 kept them in $TF_COMMLIB_CACHE/calibration-<hash of layout and sizes>.json,
    readable by its user only."""
    import json
    import os
    import stat

    assert len({r["calibrated_beta_inter"] for r in reports}) == 1
    (path,) = cache.glob("calibration-*.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    saved = json.loads(path.read_text())
    assert reports[0]["calibrated_beta_inter"] in saved["params"]   # LinkParams.as_list()


def test_without_link_parameters_each_candidate_is_timed_once_and_kept(reports, cache):
    """With Auto(probe=True) and the link measured, fit also times every candidate's aggregation of the model's
    buckets (the same numbers on every rank, kept 0600 beside the calibration, under a key holding
    the link), hitopk also at the DGC warm-up's densities, and the DiLoCo rounds' node average and
    exchange."""
    import json
    import os
    import stat

    probed = reports[0]["probed"]
    assert set(probed) == set(AUTO_CANDIDATES) and all(s > 0 for s in probed.values())
    assert all(r["probed"] == probed for r in reports)
    # the candidates' timings, and (2x2: several nodes) those of the DiLoCo rounds, each in its file
    files = {json.loads(p.read_text())["key"]["calibrate"]["probe"] == "diloco": p for p in cache.glob("probe-*.json")}
    assert sorted(files) == [False, True] and len(list(cache.glob("probe-*.json"))) == 2
    path = files[False]
    assert stat.S_IMODE(os.stat(path).st_mode) == stat.S_IMODE(os.stat(files[True]).st_mode) == 0o600
    local = json.loads(files[True].read_text())
    assert len(local["params"]) == 3 and all(s > 0 for s in local["params"])   # node average, exchange, sync
    assert reports[0]["calibrated_beta_inter"] in local["key"]["calibrate"]["link"]
    saved = json.loads(path.read_text())
    # hitopk also at the DGC warm-up's densities (its bytes depend on them; PowerSGD's do not)
    warm = reports[0]["probed_warmup"]
    assert set(warm) == {"hitopk"} and [d for d, _ in warm["hitopk"]] == [0.0625, 0.25]
    assert all(s > 0 for _, s in warm["hitopk"]) and all(r["probed_warmup"] == warm for r in reports)
    assert saved["key"]["calibrate"]["warmup"] == [["hitopk", 0.25], ["hitopk", 0.0625]]
    used, timed_there, at_target = reports[0]["warm_ratio"]   # the warm-up epoch is predicted from its own timing
    assert used == pytest.approx(timed_there) and used != pytest.approx(at_target)
    assert saved["params"] == [probed[c] for c in AUTO_CANDIDATES] + [s for _, s in reversed(warm["hitopk"])]
    assert reports[0]["calibrated_beta_inter"] in saved["key"]["calibrate"]["link"]   # the link it was timed on
    assert saved["key"]["layout"] == [2, 2]
