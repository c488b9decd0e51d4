"""Adaptive density (tyagi's adaptive compression ratio): the knee of the NSGA-II front, bad
candidates, profiling that restores the state bit for bit (2 ranks). Convergence on digits within
1 % of dense: tests/test_convergence.py."""
import math

import keras
import numpy as np
import pytest

from tests import hvdrun
from tf_commlib.keras import DistributedOptimizer
from tf_commlib.keras.adaptive import knee_density, reprofile_reason
from tf_commlib.keras.policy import CANDIDATES


def test_knee_of_a_symmetric_tradeoff_is_the_middle():
    # t_sync falls from 1 to 0 and 1/gain rises from 0 to 1 linearly in log10(density): the knee
    # (nearest the ideal after normalising) is the middle, 10^-2 between 10^-1 and 10^-3
    density = knee_density([0.1, 0.001], [0.5, 0.5], [1.0, 0.0], [1e9, 1.0])
    assert math.log10(density) == pytest.approx(-2.0, abs=0.05)


def test_knee_picks_a_candidate_that_is_best_everywhere():
    # 0.011 is cheapest to sync and has the best gain: the front shrinks to it
    density = knee_density(CANDIDATES, [1e-3] * 5, [5, 3, 1, 2, 4], [0.5, 0.6, 0.9, 0.6, 0.5])
    assert density == pytest.approx(0.011, rel=0.03)


def grid_knee(densities, t_compute, t_sync, gains):
    """The same knee by brute force: every point of a fine log grid is on the front when the
    objectives are monotone and opposed; the nearest to the ideal after normalising."""
    order = np.argsort(densities)
    logd = np.log10(np.array(densities))[order]
    grid = np.linspace(logd[0], logd[-1], 20001)
    f = np.stack([np.interp(grid, logd, np.array(v, float)[order]) for v in (t_compute, t_sync, 1 / np.array(gains))], 1)
    f = (f - f.min(0)) / np.where(f.max(0) > f.min(0), f.max(0) - f.min(0), 1)
    return 10 ** grid[np.argmin(np.linalg.norm(f, axis=1))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_knee_matches_a_grid_search(seed):
    rng = np.random.default_rng(seed)
    sync = np.sort(rng.uniform(0.01, 10, 5))[::-1]   # denser (first) is slower to sync ...
    gains = np.sort(rng.uniform(0.05, 1, 5))[::-1]   # ... and keeps more per step
    compute = np.full(5, 1e-3)
    got = knee_density(CANDIDATES, compute, sync, gains)
    want = grid_knee(CANDIDATES, compute, sync, gains)   # within the spacing of 40 individuals over 2 decades
    assert math.log10(got) == pytest.approx(math.log10(want), abs=0.1)
    assert knee_density([0.05], [1.0], [1.0], [0.5]) == 0.05   # one candidate: it


def test_reprofile_when_the_gain_moves_ten_percent_or_the_link_changes():
    from tf_commlib.alphabeta import LinkParams
    link, slower = LinkParams(), LinkParams(beta_inter=8 / 1e9)
    assert reprofile_reason(None, link, None, None, 0.1) == "first"
    assert reprofile_reason(link, slower, 0.5, 0.5, 0.1) == "link"
    assert reprofile_reason(link, LinkParams(), None, 0.3, 0.1) is None   # the first epoch sets the baseline
    assert reprofile_reason(link, link, 0.5, 0.46, 0.1) is None
    assert reprofile_reason(link, link, 0.5, 0.45, 0.1) == "gain"
    assert reprofile_reason(link, link, 0.5, 0.56, 0.1) == "gain"


@pytest.mark.parametrize("kwargs, message", [
    ({"density": ()}, "candidate"),
    ({"density": []}, "candidate"),
    ({"density": (0.1, 0.0)}, "candidates must be densities"),
    ({"density": (0.1, 1.5)}, "candidates must be densities"),
    ({"density": ("0.1",)}, "candidates must be densities"),
    ({"density": "sparse"}, "density"),
])
def test_bad_adaptive_configuration_raises_before_training(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **kwargs)


def test_adaptive_configuration_round_trips():
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), density=(0.2, 0.02))
    config = opt.get_config()
    assert config["density"] == [0.2, 0.02]
    again = DistributedOptimizer.from_config(config)
    assert again.adaptive and again.candidates == (0.2, 0.02) and again.target_density == 0.2
    default = DistributedOptimizer.from_config(DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                                    density="adaptive").get_config())
    assert default.candidates == CANDIDATES


@pytest.mark.parametrize("algorithm", ["star", "hitopk"])
def test_profiling_restores_the_state_bit_for_bit(algorithm, tmp_path, shared):
    if algorithm == "hitopk":   # a shard's residual, on 1x2 (in the shared job, tests/hvdrun.py SHARED)
        reports = shared("1x2", "adaptive_hitopk")
    else:   # the flat one, on 2x1
        reports = hvdrun.run("adaptive_worker.py", 2, tmp_path, args=[algorithm], topology="2x1", timeout=300)
    for r in reports:
        assert r["variables"] > 10 and all(r["identical"]), (r["rank"], r["identical"])
        assert r["densities"] == r["densities_without"] == [CANDIDATES[0]]   # the density came back too
        assert r["traces"][0] == r["traces"][1]   # five densities, no new trace: the density is a variable
        assert [row["density"] for row in r["rows"]] == list(CANDIDATES)
        gains = [row["gain"] for row in r["rows"]]
        assert all(0 < g <= 1 for g in gains) and gains[0] > gains[-1], gains   # sparser keeps less per step
        syncs = [row["t_sync"] for row in r["rows"]]
        assert syncs == sorted(syncs, reverse=True) and syncs[-1] > 0
    same = [[(row["gain"], row["t_compute"], row["t_sync"]) for row in r["rows"]] for r in reports]
    assert same[0] == same[1]   # gains all-reduced, times predicted: every rank chooses alike
