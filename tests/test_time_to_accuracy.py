"""The choice of DistributedOptimizer(algorithm="auto") by predicted time to accuracy, from given
measurements (tf_commlib.auto.decide), and the efficiency it measures against a numpy
reference of error feedback."""
import numpy as np
import pytest

from tf_commlib.aggregator import Auto
from tf_commlib.aggregator.chooser import AUTO_CANDIDATES
from tf_commlib.auto.decide import TimeToAccuracy, delivered_fraction

CANDIDATES = ("dense", "2dtar", "hitopk", "powersgd")
LOSSY = ("hitopk", "powersgd")


def topk_with_error_feedback(us, k):
    """Each step sends the k largest entries of u + residual and keeps the rest (DGC's error
    feedback, one rank); returns what was sent each step and the residual after each step."""
    r, sent, residuals = np.zeros_like(us[0]), [], []
    for u in us:
        acc = u + r
        keep = np.argsort(-np.abs(acc))[:k]
        s = np.zeros_like(acc)
        s[keep] = acc[keep]
        r = acc - s
        sent.append(s)
        residuals.append(r)
    return sent, residuals


@pytest.mark.parametrize("k", [1, 5, 20, 100])
def test_efficiency_is_the_part_of_exact_progress_that_was_applied(k):
    """eta from residuals at both ends and the sum of u = <sum(sent), sum(u)> / ||sum(u)||^2, computed
    from what top-k with error feedback actually sent, starting from a nonzero residual."""
    rng = np.random.default_rng(k)
    warm = [rng.normal(size=100) + 0.3 for _ in range(5)]
    us = [rng.normal(size=100) + 0.3 for _ in range(12)]
    sent, residuals = topk_with_error_feedback(warm + us, k)
    r_start, r_end, window = residuals[len(warm) - 1], residuals[-1], sent[len(warm):]
    total_u, total_sent = np.sum(us, 0), np.sum(window, 0)
    num, den = delivered_fraction(r_start, r_end, total_u)
    assert 1 + num / den == pytest.approx(total_sent @ total_u / (total_u @ total_u), rel=1e-12)
    from tf_commlib.keras.auto_epoch import delivered   # what AutoEpochs sums, in TensorFlow float32
    assert delivered(r_start.astype(np.float32), r_end.astype(np.float32), total_u.astype(np.float32)) == \
        pytest.approx([num, den], rel=1e-4, abs=1e-4 * den)
    if k == 100:   # everything sent: exact
        assert 1 + num / den == pytest.approx(1.0)


def test_sparser_top_k_delivers_less_of_the_progress():
    rng = np.random.default_rng(0)
    us = [rng.normal(size=200) + 0.1 for _ in range(20)]
    etas = []
    for k in (100, 20, 2):
        sent, residuals = topk_with_error_feedback(us, k)
        num, den = delivered_fraction(np.zeros(200), residuals[-1], np.sum(us, 0))
        etas.append(1 + num / den)
    assert etas[0] > etas[1] > etas[2]


def test_choice_by_time_per_progress_from_measurements():
    """25 Mbit/s-like predictions: PowerSGD's step is the shortest; it runs and delivers a fifth of
    the progress (under the guard), so hitopk (not yet measured: assumed 1) is tried next; it
    delivers half (above the guard: taken as exact's progress) and stays."""
    tta = TimeToAccuracy(CANDIDATES, LOSSY, guard=0.3)
    predicted = {"dense": 0.50, "2dtar": 0.40, "hitopk": 0.15, "powersgd": 0.12}
    assert tta.choose(predicted, epoch=0) == "powersgd"
    assert tta.observe("powersgd", 0.12, 0.12, efficiency=0.2) is False
    assert tta.seconds_per_progress("powersgd", 0.12) == pytest.approx(0.12 / 0.2)
    assert tta.choose(predicted, epoch=1) == "hitopk"
    tta.observe("hitopk", 0.15, 0.15, efficiency=0.5)
    assert tta.choose(predicted, epoch=2) == "hitopk"
    assert tta.seconds_per_progress("hitopk", 0.15) == pytest.approx(0.15)
    # unshaped-like: every step is compute-bound, lossy ones no faster: exact (ties go to the earlier)
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    assert tta.choose({"dense": 0.05, "2dtar": 0.05, "hitopk": 0.05, "powersgd": 0.05}) == "dense"


def test_measured_step_times_correct_the_predictions():
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    predicted = {"dense": 0.30, "2dtar": 0.35, "hitopk": 0.20, "powersgd": 0.25}
    assert tta.choose(predicted) == "hitopk"
    tta.observe("hitopk", 0.60, 0.20, efficiency=1.0)   # three times its prediction
    # the others, not measured, take hitopk's ratio: dense is still predicted faster than 2dtar
    assert tta.seconds_per_progress("dense", 0.30) == pytest.approx(0.90)
    assert tta.choose(predicted) == "hitopk"   # all scaled alike
    tta.observe("dense", 0.30, 0.30)           # dense measured as predicted: the latest ratio is 1
    assert tta.choose(predicted) == "powersgd"   # not measured: 0.25 x 1
    tta.observe("powersgd", 0.50, 0.25, efficiency=1.0)
    assert tta.choose(predicted) == "dense"


def test_switching_needs_a_margin_and_drift_asks_for_calibration():
    tta = TimeToAccuracy(CANDIDATES, LOSSY, switch=0.9, drift=1.5)
    assert tta.choose({"dense": 1.0, "2dtar": 1.0, "hitopk": 2.0, "powersgd": 2.0}) == "dense"
    assert tta.choose({"dense": 1.0, "2dtar": 0.95, "hitopk": 2.0, "powersgd": 2.0}) == "dense"   # 5 %: stays
    assert tta.choose({"dense": 1.0, "2dtar": 0.85, "hitopk": 2.0, "powersgd": 2.0}) == "2dtar"
    assert tta.observe("2dtar", 0.85, 0.85) is False
    assert tta.observe("2dtar", 0.90, 0.85) is False          # within drift
    assert tta.observe("2dtar", 0.30, 0.85, comparable=False) is False   # another density: no verdict
    assert tta.ratio["2dtar"] == 0.30 / 0.85                              # but the ratio is kept
    assert tta.observe("2dtar", 0.90, 0.85) is True            # the link got slower
    tta.recalibrated()
    assert tta.ratio == {} and tta.last is None
    assert tta.observe("2dtar", float("nan"), 0.85) is False   # not a measurement


def _cheapest_sequences(tta, plan, allowed, switch_s):
    """plan_seconds by enumeration: every sequence of allowed candidates over plan's epochs, each
    change (also from the running candidate) costing switch_s, None: no change after the first epoch."""
    import itertools

    best = {}
    for seq in itertools.product(allowed, repeat=len(plan)):
        changes = sum(a != b for a, b in zip(seq, seq[1:]))
        if switch_s is None and changes:
            continue
        total = sum(steps * tta.seconds_per_progress(c, times[c]) for (steps, times), c in zip(plan, seq))
        total += (switch_s or 0.0) * (changes + (tta.current is not None and seq[0] != tta.current))
        best[seq[0]] = min(best.get(seq[0], np.inf), total)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_a_plan_is_the_cheapest_sequence_over_the_horizon_with_a_trace_per_change(seed):
    """plan_seconds equals the enumeration of every sequence of candidates (random step times,
    measured ratios and efficiencies, with and without a running candidate)."""
    rng = np.random.default_rng(seed)
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    tta.observe("hitopk", 1.0, rng.uniform(0.5, 2.0), efficiency=rng.uniform(0.1, 1.0))
    tta.current = [None, "dense", "hitopk"][seed % 3]
    plan = [(int(rng.integers(1, 50)), {c: rng.uniform(0.1, 1.0) for c in CANDIDATES}) for _ in range(4)]
    for switch_s in (None, 0.0, 2.0, 40.0):
        assert tta.plan_seconds(plan, CANDIDATES, switch_s) == pytest.approx(
            _cheapest_sequences(tta, plan, CANDIDATES, switch_s), rel=1e-12)


def test_a_cheaper_candidate_for_a_few_epochs_runs_only_where_it_saves_more_than_its_traces():
    """During DGC's warm-up (two epochs) PowerSGD's step is 0.1 s shorter than hitopk's, after it
    0.04 s longer: over 40 steps an epoch, moving to PowerSGD and back saves 8 s and costs two
    traces; it is chosen where a trace costs 3 s, not where it costs 10 s (or is not measured yet)."""
    warm, after = {"dense": 1.0, "2dtar": 0.9, "hitopk": 0.5, "powersgd": 0.4}, \
                  {"dense": 1.0, "2dtar": 0.9, "hitopk": 0.3, "powersgd": 0.34}
    plan = [(40, warm), (40, warm)] + [(40, after)] * 6
    mean = {c: np.mean([t[c] for _, t in plan]) for c in CANDIDATES}

    def running_hitopk():
        tta = TimeToAccuracy(CANDIDATES, LOSSY, switch=1.0)
        tta.observe("hitopk", 0.5, 0.5, efficiency=1.0)
        tta.observe("powersgd", 0.4, 0.4, efficiency=1.0)
        tta.current = "hitopk"
        return tta

    assert running_hitopk().choose(mean, plan=plan, switch_s=3.0) == "powersgd"
    assert running_hitopk().choose(mean, plan=plan, switch_s=10.0) == "hitopk"
    assert running_hitopk().choose(mean, plan=plan, switch_s=None) == "hitopk"   # 1.6 s less over the run
    tta = running_hitopk()
    tta.choose(mean, epoch=0, plan=plan, switch_s=3.0)
    assert tta.log[-1]["plan_s"]["powersgd"] == pytest.approx(2 * 40 * 0.4 + 3 + 3 + 6 * 40 * 0.3)
    assert tta.log[-1]["switch_s"] == 3.0
    with pytest.raises(ValueError, match=r"predicted has no time for \['powersgd'\]"):
        tta.choose(mean, plan=[(40, {c: t for c, t in after.items() if c != "powersgd"})], switch_s=3.0)


def test_with_the_default_margin_a_faster_candidate_is_taken_at_once_and_the_running_one_is_kept():
    """Auto.switch (0.9) weighs the best sequence, trace included, against staying on the running
    candidate over the horizon: a candidate 0.8x as slow is moved to at once, for 8 epochs of 40
    steps and a 10 s trace (256 + 10 s against 0.9 x 320 s), not for 1 epoch left (32 + 10 > 36); a
    running candidate the margin protects stays even when a recalibration made it untried again."""
    plan = [(40, {"dense": 1.0, "2dtar": 0.8, "hitopk": 2.0, "powersgd": 2.0})] * 8

    def running_dense():
        tta = TimeToAccuracy(CANDIDATES, LOSSY)
        tta.current = "dense"
        return tta

    mean = plan[0][1]
    assert running_dense().choose(mean, plan=plan, switch_s=10.0) == "2dtar"
    assert running_dense().choose(mean, plan=plan[:1], switch_s=10.0) == "dense"
    tta = TimeToAccuracy(CANDIDATES, LOSSY, margin=0.5)
    tta.observe("hitopk", 0.5, 0.5, efficiency=1.0)
    tta.current = "hitopk"
    tta.recalibrated()   # hitopk has no measured ratio now: untried, but it is the one running
    times = {"dense": 0.52, "2dtar": 0.52, "hitopk": 0.5, "powersgd": 2.0}
    assert tta.choose(times, plan=[(40, times)] * 5, switch_s=1.0) == "hitopk"


def test_efficiency_is_kept_for_lossy_candidates_only_and_bounded():
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    tta.observe("dense", 1.0, 1.0, efficiency=0.3)
    tta.observe("hitopk", 1.0, 1.0, efficiency=-2.0)
    tta.observe("powersgd", 1.0, 1.0, efficiency=1.7)
    assert tta.efficiency == {"hitopk": tta.min_efficiency, "powersgd": 1.0}


def test_state_round_trip_and_errors():
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    tta.choose({c: 1.0 for c in CANDIDATES})
    tta.observe("dense", 2.0, 1.0)
    tta.observe("hitopk", 1.0, 1.0, efficiency=0.5)
    other = TimeToAccuracy(CANDIDATES, LOSSY)
    other.restore(tta.state())
    assert other.state() == tta.state()
    with pytest.raises(ValueError, match=r"predicted has no time for \['powersgd'\]"):
        tta.choose({"dense": 1, "2dtar": 1, "hitopk": 1})
    with pytest.raises(ValueError, match="'qsgd_x' is not a candidate"):
        tta.observe("qsgd_x", 1.0, 1.0)
    with pytest.raises(ValueError, match="candidates must name at least one"):
        TimeToAccuracy((), ())


def test_auto_candidates_and_knobs_are_checked():
    assert Auto().candidates == AUTO_CANDIDATES
    assert Auto.from_config(Auto(candidates=["dense", "hitopk"], switch=0.9, drift=2).to_config()) == \
        Auto(candidates=("dense", "hitopk"), switch=0.9, drift=2.0)
    for kwargs, match in (({"candidates": ("dense", "nope")}, "Auto.candidates must be distinct names"),
                          ({"candidates": "dense"}, "Auto.candidates"), ({"candidates": ()}, "Auto.candidates"),
                          ({"candidates": ("dense", "dense")}, "Auto.candidates"),
                          ({"switch": 0}, r"Auto.switch must be a number in \(0, 1\]"),
                          ({"drift": 1.0}, "Auto.drift must be a finite number > 1"),
                          ({"drift": True}, "Auto.drift")):
        with pytest.raises(ValueError, match=match):
            Auto(**kwargs)


def test_the_train_app_and_dawnbench_take_auto():
    from tfc_apps import train
    from tfc_apps.dawnbench import config

    assert train.parser().parse_args(["--algorithm", "auto"]).algorithm == "auto"
    assert config.parse(["--synthetic", "--schedule", "0:auto"]).schedule_map == {0: "auto"}


def test_the_defaults_are_auto_without_momentum_masking():
    """DistributedOptimizer(opt) runs auto, and DGC's momentum factor masking is off in the library
    and both command lines (--momentum-masking turns it on; --no-momentum-masking is the default)."""
    import keras

    from tf_commlib.keras import DGC, DistributedOptimizer
    from tfc_apps import train
    from tfc_apps.dawnbench import config

    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    assert opt.algorithm == "auto" and opt.schedule == {0: "auto"} and not opt.dgc.momentum_masking
    assert opt.dgc.warmup == 2 and DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="hitopk").dgc == DGC()
    assert DGC().momentum_masking is False and train.parser().parse_args([]).algorithm == "auto"
    for parse in (train.parser().parse_args, lambda argv: config.parse(["--synthetic", *argv])):
        assert not parse([]).momentum_masking and parse(["--momentum-masking"]).momentum_masking
        assert not parse(["--no-momentum-masking"]).momentum_masking
        with pytest.raises(SystemExit):
            parse(["--momentum-masking", "--no-momentum-masking"])


def test_an_untried_lossy_candidate_needs_the_margin():
    """Not yet run, a lossy candidate is tried only where it is predicted at most `margin` times the
    fastest exact one; once measured, only its measured time counts."""
    predicted = {"dense": 1.0, "2dtar": 0.9, "hitopk": 0.6, "powersgd": 0.8}
    tta = TimeToAccuracy(CANDIDATES, LOSSY, margin=0.5)
    assert tta.choose(predicted) == "2dtar"                       # 0.6 > 0.5 x 0.9
    assert tta.choose({**predicted, "hitopk": 0.4}) == "hitopk"   # 0.4 <= 0.45
    tta = TimeToAccuracy(CANDIDATES, LOSSY, margin=0.5)
    tta.observe("hitopk", 0.6, 0.6, efficiency=0.9)
    assert tta.choose(predicted) == "hitopk"


def test_a_lossy_candidate_it_would_move_to_after_warm_up_runs_from_the_start():
    """Over the run (DGC's warm-up epochs included) hitopk is predicted a little faster than 2dtar,
    not by the margin; once the warm-up is over, by more than the margin: "auto" would run 2dtar,
    then move to hitopk (a second trace of the step), so it starts on hitopk."""
    predicted = {"dense": 1.0, "2dtar": 0.95, "hitopk": 0.93, "powersgd": 1.2}
    settled = {"dense": 1.0, "2dtar": 0.95, "hitopk": 0.8, "powersgd": 1.2}
    assert TimeToAccuracy(CANDIDATES, LOSSY, margin=0.9).choose(predicted) == "2dtar"   # 0.93 > 0.9 x 0.95
    assert TimeToAccuracy(CANDIDATES, LOSSY, margin=0.9).choose(predicted, settled=settled) == "hitopk"
    # not within the margin once settled, or slower than 2dtar over the run: 2dtar
    assert TimeToAccuracy(CANDIDATES, LOSSY, margin=0.9).choose(
        predicted, settled={**settled, "hitopk": 0.9}) == "2dtar"
    assert TimeToAccuracy(CANDIDATES, LOSSY, margin=0.9).choose(
        {**predicted, "hitopk": 0.96}, settled=settled) == "2dtar"
    # measured, only its measured time counts (the rule is for untried candidates)
    tta = TimeToAccuracy(CANDIDATES, LOSSY, margin=0.9)
    tta.observe("2dtar", 0.95, 0.95)
    tta.observe("hitopk", 1.2, 1.0, efficiency=0.9)
    assert tta.choose(predicted, settled=settled) == "2dtar"
    with pytest.raises(ValueError, match="powersgd"):
        tta.choose(predicted, settled={c: t for c, t in settled.items() if c != "powersgd"})


def test_settings_of_one_collective_are_told_apart_by_their_measured_efficiency():
    """hitopk at a tenth of its density waits until hitopk has run an epoch at the target density
    (a warm-up's does not count); tried then, it counts at its efficiency over hitopk's, and where that
    makes it slower per unit of progress, "auto" goes back to hitopk."""
    names, lossy = ("dense", "hitopk", "hitopk_0.1", "powersgd", "powersgd_r1"), \
        ("hitopk", "hitopk_0.1", "powersgd", "powersgd_r1")
    predicted = {"dense": 1.0, "hitopk": 0.5, "hitopk_0.1": 0.4, "powersgd": 0.7, "powersgd_r1": 0.6}
    assert TimeToAccuracy(names, lossy).choose(predicted) == "hitopk_0.1"   # every setting counts as exact
    tta = TimeToAccuracy(names, lossy, families=[("hitopk", "hitopk_0.1"), ("powersgd", "powersgd_r1")])
    assert tta.waiting() == {"hitopk_0.1", "powersgd_r1"}
    assert tta.choose(predicted) == "hitopk"
    tta.observe("hitopk", 0.5, 0.5, efficiency=0.95, settled=False)   # a DGC warm-up epoch
    assert tta.choose(predicted) == "hitopk" and tta.waiting() == {"hitopk_0.1", "powersgd_r1"}
    tta.observe("hitopk", 0.5, 0.5, efficiency=0.88)
    assert tta.waiting() == {"powersgd_r1"}
    assert tta.choose(predicted) == "hitopk_0.1"   # untried: optimism (0.4 <= 0.9 x 0.5)
    tta.observe("hitopk_0.1", 0.4, 0.4, efficiency=0.6)
    assert tta.relative_efficiency("hitopk_0.1") == pytest.approx(0.6 / 0.88)
    assert tta.relative_efficiency("hitopk") == 1.0 and tta.relative_efficiency("powersgd") == 1.0
    assert tta.seconds_per_progress("hitopk_0.1", 0.4) == pytest.approx(0.4 * 0.88 / 0.6)
    assert tta.choose(predicted) == "hitopk"   # 0.5 <= 0.9 x 0.587
    # on a slower link the harder setting's step saves more than its efficiency costs
    slower = {**predicted, "hitopk": 1.0, "hitopk_0.1": 0.5, "powersgd": 1.2, "powersgd_r1": 1.1}
    assert tta.choose(slower) == "hitopk_0.1"   # 0.5 x 0.88 / 0.6 < 0.9 x 1
    # below the guard the absolute efficiency counts, as for any lossy candidate
    tta.observe("hitopk_0.1", 0.4, 0.4, efficiency=0.2)
    assert tta.seconds_per_progress("hitopk_0.1", 0.4) == pytest.approx(0.4 / 0.2)
    again = TimeToAccuracy(names, lossy, families=tta.families)
    again.restore(tta.state())
    assert again.state() == tta.state() and again.settled_efficiency == {"hitopk": 0.88, "hitopk_0.1": 0.2}
    # the settled efficiencies hold for one target density: a new one (AdaptiveDensity) clears them
    again.at_target(0.01)
    again.at_target(0.004)
    assert again.settled_efficiency == {} and again.waiting() == {"hitopk_0.1", "powersgd_r1"}
    for families in ([("hitopk", "dense")], [("hitopk", "hitopk_0.1"), ("hitopk", "powersgd")]):
        with pytest.raises(ValueError, match="families must hold distinct lossy candidates"):
            TimeToAccuracy(names, lossy, families=families)


def test_families_are_registered_copies_from_the_most_bytes_to_the_least(registry):
    from tf_commlib.aggregator.chooser import families
    from tf_commlib.collectives import setting

    copy = setting("hitopk:density_scale=0.1")
    sent = {"hitopk": 10, copy: 1, "powersgd": 5}.get
    assert families([copy, "powersgd", "hitopk"], sent) == [("hitopk", copy)]
    assert families(["hitopk", "powersgd"], sent) == []


def test_a_harder_setting_waits_only_for_a_setting_that_may_run():
    """Where the setting before it is kept out (an untried lossy candidate not within the margin of the
    fastest exact one), the harder one is weighed as a lone candidate; in a chain each waits for the one
    before it."""
    names, lossy = ("dense", "hitopk", "hitopk_0.1", "hitopk_0.01"), ("hitopk", "hitopk_0.1", "hitopk_0.01")
    family = [("hitopk", "hitopk_0.1", "hitopk_0.01")]
    predicted = {"dense": 1.0, "hitopk": 0.95, "hitopk_0.1": 0.5, "hitopk_0.01": 0.45}
    tta = TimeToAccuracy(names, lossy, margin=0.9, families=family)
    assert tta.waiting() == {"hitopk_0.1", "hitopk_0.01"} and tta.waiting({"hitopk"}) == {"hitopk_0.01"}
    assert tta.choose(predicted) == "hitopk_0.1"   # hitopk: 0.95 > 0.9 x 1.0, never tried
    tta = TimeToAccuracy(names, lossy, margin=0.9, families=family)
    assert tta.choose({**predicted, "hitopk": 0.8}) == "hitopk"   # within the margin: it runs first
    tta.observe("hitopk", 0.8, 0.8, efficiency=0.9)
    assert tta.waiting() == {"hitopk_0.01"} and tta.choose({**predicted, "hitopk": 0.8}) == "hitopk_0.1"


def test_a_logged_decision_replays_to_its_choice():
    """Each decision logs its inputs (the settings, the state before it, the predictions, the plan and a
    trace's cost); tf_commlib.auto.decide.replay makes the same choice from them, after a round trip
    through JSON, through margins, a family, the rounds, measured epochs and a plan."""
    import json

    from tf_commlib.auto.decide import replay

    tta = TimeToAccuracy(CANDIDATES + ("hitopk_x", "diloco"), LOSSY + ("hitopk_x",), margin=0.5,
                         rounds=["diloco"], families=[("hitopk", "hitopk_x")])
    times = {"dense": 1.0, "2dtar": 0.8, "hitopk": 0.45, "powersgd": 0.5, "hitopk_x": 0.3, "diloco": 0.35}
    for epoch in range(6):
        plan = [(40, {c: t * (1 + 0.1 * e) for c, t in times.items()}) for e in range(3)] if epoch >= 2 else None
        choice = tta.choose(times, epoch, settled=times, plan=plan, switch_s=2.0 if epoch >= 2 else None)
        ran = {"hitopk": 0.55, "powersgd": 0.5}.get(choice, times[choice] * 1.1)
        tta.observe(choice, ran, times[choice], efficiency=0.2 if choice == "hitopk_x" else 0.7)
        times = {**times, "diloco": 0.33 + 0.05 * epoch}
    decisions = [json.loads(json.dumps(row)) for row in tta.log if "choice" in row]
    assert len({d["choice"] for d in decisions}) > 1   # the choice moved: the state before each one matters
    assert [replay(d) for d in decisions] == [d["choice"] for d in decisions]
    moved = json.loads(json.dumps(decisions[-1]))
    moved["inputs"]["predicted"] = {c: (0.01 if c == "dense" else 9.0) for c in moved["inputs"]["predicted"]}
    moved["inputs"]["plan"] = None
    assert replay(moved) == "dense"   # the inputs decide: a replay is no lookup of the logged choice
