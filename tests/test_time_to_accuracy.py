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


def _reference(tta, plan, trace_s):
    """{first candidate: the least T over every sequence of candidates that starts with it}, by
    enumeration (the model of tf_commlib.auto.decide, written out)."""
    import itertools

    def per_progress(c, t):
        eta = tta.efficiency.get(c, 1.0)
        ratio = tta.ratio.get(c, tta.ratio.get(tta.last, 1.0))
        return t * ratio / (1.0 if eta >= tta.guard else eta)

    best = {}
    for seq in itertools.product(tta.candidates, repeat=len(plan)):
        total = sum(steps * per_progress(c, times[c]) for c, (steps, times) in zip(seq, plan))
        before = tta.current
        for c in seq:
            if c != before:
                total += trace_s * (1 if c in tta.ratio else 2)
            before = c
        best[seq[0]] = min(best.get(seq[0], np.inf), total)
    return best


def _plan(times, epochs, steps=None):
    return [(steps, dict(times)) for _ in range(epochs)]


def test_choice_by_time_per_progress_from_measurements():
    """25 Mbit/s-like predictions before anything is measured: PowerSGD's step is the shortest and runs.
    It delivers a fifth of the progress (under the guard), so hitopk (not yet measured: taken at 1) is
    predicted faster per step of progress; measured at half (above the guard: as exact's progress), it stays."""
    tta = TimeToAccuracy(CANDIDATES, LOSSY, guard=0.3)
    predicted = {"dense": 0.50, "2dtar": 0.40, "hitopk": 0.15, "powersgd": 0.12}
    assert tta.choose(_plan(predicted, 8), epoch=0) == "powersgd"
    assert tta.log[-1]["unit"] == "s per step of progress"
    tta.observe("powersgd", 0.12, 0.12, efficiency=0.2)
    assert tta.seconds_per_progress("powersgd", 0.12) == pytest.approx(0.6)
    assert tta.choose(_plan(predicted, 7, steps=100), epoch=1, trace_s=1.0) == "hitopk"
    tta.observe("hitopk", 0.15, 0.15, efficiency=0.5)
    assert tta.choose(_plan(predicted, 6, steps=100), epoch=2, trace_s=1.0) == "hitopk"
    assert tta.log[-1]["predicted_s"]["hitopk"] == pytest.approx(6 * 100 * 0.15)


def test_measured_step_times_correct_the_predictions():
    """A candidate's measured / predicted ratio scales its prediction; one that has not run takes the
    ratio of the last candidate that did."""
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    tta.observe("dense", 2.0, 1.0)
    assert tta.seconds_per_progress("dense", 1.0) == pytest.approx(2.0)
    assert tta.seconds_per_progress("hitopk", 0.5) == pytest.approx(1.0)
    tta.observe("hitopk", 0.3, 0.5, efficiency=0.9)
    assert tta.seconds_per_progress("hitopk", 0.5) == pytest.approx(0.3)
    assert tta.seconds_per_progress("powersgd", 0.5) == pytest.approx(0.3)   # the last measured: hitopk's


@pytest.mark.parametrize("seed", range(6))
def test_the_choice_is_the_cheapest_sequence_over_the_epochs_left(seed):
    """sequences() equals the enumeration of every sequence of candidates (random step times, measured
    ratios and efficiencies, tried and untried candidates, with and without a running one)."""
    rng = np.random.default_rng(seed)
    tta = TimeToAccuracy(CANDIDATES, LOSSY, noise=0.0)
    tta.observe("hitopk", 1.0, rng.uniform(0.5, 2.0), efficiency=rng.uniform(0.1, 1.0))
    tta.observe("dense", 1.0, rng.uniform(0.5, 2.0))
    tta.current = [None, "dense", "hitopk"][seed % 3]
    plan = [(int(rng.integers(1, 50)), {c: rng.uniform(0.1, 1.0) for c in CANDIDATES}) for _ in range(4)]
    for trace_s in (0.0, 2.0, 40.0):
        expected = _reference(tta, plan, trace_s)
        assert tta.sequences(plan, trace_s) == pytest.approx(expected, rel=1e-12)
        running = tta.current
        choice = tta.choose(plan, trace_s=trace_s)
        assert expected[choice] == pytest.approx(min(expected.values()), rel=1e-12)
        tta.current = running


@pytest.mark.parametrize("steps_left, expected", [(8, "dense"), (40, "dense"), (1000, "hitopk"), (4000, "hitopk")])
def test_a_trial_is_priced_against_the_steps_left(steps_left, expected):
    """Running dense at 1 s a step, hitopk (untried) predicted at 0.8 s and a trace at 30 s: trying it
    costs a trace there and one back, so it pays only where the steps left save more than 60 s and the
    noise (over 446 steps); a short run (Horovod's benchmark at 3 iterations of 4 batches) keeps what runs."""
    tta = TimeToAccuracy(("dense", "hitopk"), ("hitopk",))
    tta.current = "dense"
    tta.observe("dense", 1.0, 1.0)
    assert tta.choose([(steps_left, {"dense": 1.0, "hitopk": 0.8})], trace_s=30.0) == expected
    tta.current = "dense"
    tta.observe("hitopk", 0.8, 0.8, efficiency=0.9)   # tried: one trace, over 223 steps
    assert tta.choose([(steps_left, {"dense": 1.0, "hitopk": 0.8})], trace_s=30.0) == \
        ("hitopk" if steps_left > 223 else "dense")


def test_a_cheaper_candidate_for_a_few_epochs_runs_only_where_it_saves_more_than_its_traces():
    """hitopk is cheaper during two epochs only, by 20 s each; with a trace at 10 s (tried: one there,
    one back) the sequence dense, hitopk, hitopk, dense wins; at 30 s staying on dense does."""
    tta = TimeToAccuracy(("dense", "hitopk"), ("hitopk",))
    tta.observe("hitopk", 1.0, 1.0, efficiency=1.0)
    tta.observe("dense", 1.0, 1.0)
    tta.current = "dense"
    plan = [(10, {"dense": 1.0, "hitopk": 3.0}), (10, {"dense": 3.0, "hitopk": 1.0}),
            (10, {"dense": 3.0, "hitopk": 1.0}), (10, {"dense": 1.0, "hitopk": 3.0})]
    assert tta.choose(plan, trace_s=10.0) == "dense"   # the first epoch: dense, then hitopk
    assert tta.log[-1]["predicted_s"]["dense"] == pytest.approx(10 + 10 + 10 + 10 + 2 * 10.0)
    tta.current = "dense"
    assert tta.choose(plan[1:], trace_s=10.0) == "hitopk"
    tta.current = "dense"
    assert tta.choose(plan[1:], trace_s=30.0) == "dense"


def test_predictions_within_the_noise_are_a_tie():
    """Within NOISE (7 %) of the least predicted time, the running candidate stays, else the earliest
    candidate runs: a 10 Gbit/s link where every step is mostly compute runs dense, not rounds 6 % faster."""
    from tf_commlib.auto.decide import NOISE

    assert NOISE == 0.07
    tta = TimeToAccuracy(CANDIDATES + ("diloco",), LOSSY, rounds=["diloco"])
    times = {"dense": 1.0, "2dtar": 0.97, "hitopk": 0.96, "powersgd": 1.1, "diloco": 0.94}
    assert tta.choose(_plan(times, 4)) == "dense"
    tta.current = "hitopk"
    assert tta.choose(_plan(times, 4)) == "hitopk"
    assert tta.choose(_plan({**times, "diloco": 0.85}, 4)) == "diloco"   # 11 % below: measurably faster


def test_drift_asks_for_calibration_only_at_the_same_density():
    tta = TimeToAccuracy(CANDIDATES, LOSSY, drift=1.5)
    assert not tta.observe("hitopk", 1.0, 1.0, efficiency=0.9, density=0.25)
    assert not tta.observe("hitopk", 2.0, 1.0, efficiency=0.9, density=0.01)   # another density: no sign
    assert tta.observe("hitopk", 4.0, 1.0, efficiency=0.9, density=0.01)
    assert not tta.observe("dense", 1.0, 1.0) and not tta.observe("dense", 1.4, 1.0)
    tta.recalibrated()
    assert tta.ratio == {} and tta.last is None


def test_efficiency_is_kept_for_lossy_candidates_only_and_bounded():
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    tta.observe("dense", 1.0, 1.0, efficiency=0.3)
    tta.observe("hitopk", 1.0, 1.0, efficiency=-2.0)
    tta.observe("powersgd", 1.0, 1.0, efficiency=1.7)
    assert tta.efficiency == {"hitopk": -2.0, "powersgd": 1.0}
    assert tta.seconds_per_progress("hitopk", 1.0) == np.inf   # delivered nothing: never chosen


def test_state_round_trip_and_errors():
    tta = TimeToAccuracy(CANDIDATES, LOSSY)
    tta.choose(_plan({c: 1.0 for c in CANDIDATES}, 2))
    tta.observe("dense", 2.0, 1.0)
    tta.observe("hitopk", 1.0, 1.0, efficiency=0.5, density=0.01)
    other = TimeToAccuracy(CANDIDATES, LOSSY)
    other.restore(tta.state())
    assert other.state() == tta.state()
    with pytest.raises(ValueError, match=r"missing \['powersgd'\]"):
        tta.choose(_plan({"dense": 1, "2dtar": 1, "hitopk": 1}, 1))
    with pytest.raises(ValueError, match="plan must hold an epoch"):
        tta.choose([])
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


def test_a_logged_decision_replays_to_its_choice():
    """Each decision logs its inputs (the settings, the state before it, the plan and a trace's cost);
    tf_commlib.auto.decide.replay makes the same choice from them, after a round trip through JSON,
    through the rounds, measured epochs and changes of choice."""
    import json

    from tf_commlib.auto.decide import replay

    tta = TimeToAccuracy(CANDIDATES + ("diloco",), LOSSY, rounds=["diloco"])
    times = {"dense": 1.0, "2dtar": 0.8, "hitopk": 0.45, "powersgd": 0.5, "diloco": 0.35}
    for epoch in range(6):
        steps = 40 if epoch else None
        plan = [(steps, {c: t * (1 + 0.1 * e) for c, t in times.items()}) for e in range(6 - epoch)]
        choice = tta.choose(plan, epoch, trace_s=2.0 if epoch else None)
        ran = {"hitopk": 0.55, "powersgd": 0.5}.get(choice, times[choice] * 1.1)
        tta.observe(choice, ran, times[choice], efficiency=0.2 if choice == "powersgd" else 0.7)
        times = {**times, "diloco": 0.33 + 0.1 * epoch}
    decisions = [json.loads(json.dumps(row)) for row in tta.log if "choice" in row]
    assert len({d["choice"] for d in decisions}) > 1   # the choice moved: the state before each one matters
    assert [replay(d) for d in decisions] == [d["choice"] for d in decisions]
    moved = json.loads(json.dumps(decisions[-1]))
    moved["inputs"]["plan"] = [[None, {c: (0.01 if c == "dense" else 9.0) for c in CANDIDATES + ("diloco",)}]]
    assert replay(moved) == "dense"   # the inputs decide: a replay is no lookup of the logged choice
