"""AutoEpochs, the part of DistributedOptimizer(algorithm="auto") that turns the cost model, the
candidates' timings on the link and the measured epochs into per-epoch predictions, on a 2x2
topology (one process): what an untried candidate is bounded by, a DGC warm-up weighed over the
fit, a warm-up density predicted from its own timing."""
import numpy as np
import pytest

from tf_commlib.aggregator import Auto


def test_an_untried_candidate_is_tried_by_its_saving_without_overlap(rank0_of_2x2):
    """The overlap auto measures rests on a compute time measured apart from the steps: a compute
    measured too long reads as overlap that hides most of a sparse candidate's saving. An untried
    lossy candidate is therefore tried where the last measured step, less its collectives, plus the
    candidate's, is within the margin; then its own measured steps decide."""
    import keras

    from tf_commlib import alphabeta
    from tf_commlib.keras import DistributedOptimizer

    link = alphabeta.LinkParams(beta_inter=8 / 100e6)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                               auto=Auto(cost_params=link, compute_s=1.0, margin=0.9, diloco=False))   # per step
    opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
    auto = opt.auto_epochs
    assert auto.overlapped == 0.0   # no GPU: the collectives share the cores, nothing hidden until measured
    auto.overlapped = 1.0   # as on a GPU, until an epoch is measured
    density = opt.target_density
    comm = {c: auto.communication_s(c, density) for c in auto.tta.candidates}
    assert comm["hitopk"] < 0.5 * comm["dense"]
    # the compute measured at 1 s hides every collective: all candidates cost the same 1 s
    assert {c: auto.step_s(c, density) for c in ("dense", "hitopk")} == {"dense": 1.0, "hitopk": 1.0}
    assert auto.untried_bound(density) == {} and auto.choose(5) in ("dense", "2dtar")   # exact: a tie
    # dense measured: its step is compute + its whole communication (nothing overlapped on shared cores)
    compute = 0.2 * comm["dense"]
    measured = compute + comm["dense"]
    auto.tta.observe("dense", measured, auto.step_s("dense", density))
    auto.last_measured = ("dense", measured, density, comm["dense"])
    ratio = auto.tta.ratio["dense"]
    bound = auto.untried_bound(density)
    assert set(bound) == {"hitopk", "powersgd"}
    assert bound["hitopk"] * ratio == pytest.approx(compute + comm["hitopk"])
    assert auto.choose(6) == min(bound, key=bound.get)
    # once measured, a candidate's own measurement decides: hitopk measured slower than dense
    auto.tta.observe("hitopk", 2 * measured, auto.step_s("hitopk", density), efficiency=1.0)
    auto.tta.observe("powersgd", 2 * measured, auto.step_s("powersgd", density), efficiency=1.0)
    auto.last_measured = ("powersgd", 2 * measured, density, comm["powersgd"])
    assert auto.untried_bound(density) == {} and auto.choose(7) in ("dense", "2dtar")


def test_a_candidate_is_weighed_over_the_fit_with_its_warm_up(rank0_of_2x2):
    """DGC's warm-up epochs send near-dense traffic: judged on the next epoch alone, hitopk loses to
    an exact collective at epoch 0 and wins after; "auto" weighs each candidate over the epochs the
    fit has left (each at its density) while the schedule runs "auto", so it starts on hitopk instead
    of switching to it later (a second trace of the step)."""
    import keras

    from tf_commlib import alphabeta
    from tf_commlib.keras import DistributedOptimizer

    link = alphabeta.LinkParams(beta_inter=8 / 100e6)
    auto_options = Auto(cost_params=link, compute_s=0.0, candidates=("2dtar", "hitopk"), margin=1.0)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), auto=auto_options)
    opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
    auto = opt.auto_epochs
    assert [opt.density_at(e) for e in range(3)] == [0.25, 0.0625, opt.target_density]   # DGC warm-up
    step = {c: [auto.step_s(c, opt.density_at(e)) for e in range(8)] for c in ("2dtar", "hitopk")}
    assert step["hitopk"][0] > step["2dtar"][0] and step["hitopk"][2] < 0.5 * step["2dtar"][2]
    assert opt.fit_epochs is None and auto.horizon(0) == [0]
    assert auto.predictions(0) == pytest.approx({c: s[0] for c, s in step.items()})
    assert auto.tta.choose(auto.predictions(0)) == "2dtar"   # the next epoch alone: exact
    auto.tta.current = None
    opt.set_fit_epochs(8)
    assert auto.horizon(0) == list(range(8)) and auto.horizon(5) == [5, 6, 7] and auto.horizon(9) == [9]
    assert auto.predictions(0) == pytest.approx({c: np.mean(s) for c, s in step.items()})
    assert auto.choose(0) == "hitopk" and auto.tta.log[-1]["horizon"] == 8   # over the fit: hitopk from the start
    assert auto.settled(0) == pytest.approx({c: s[7] for c, s in step.items()})   # after the warm-up
    assert "plan_s" not in auto.tta.log[-1]   # no epoch measured yet: by the mean over the fit
    # measured: 40 steps an epoch; running 2dtar at epoch 1, hitopk is taken where its saving over
    # epochs 1-7 pays for a new trace of the step, not where the trace costs more
    auto.steps, auto.tta.current = 40, "2dtar"
    saving = 40 * sum(step["2dtar"][e] - step["hitopk"][e] for e in range(1, 8))
    assert saving > 0
    auto.switch_s = 0.5 * saving
    assert auto.choose(1) == "hitopk" and auto.tta.log[-1]["plan_s"]["hitopk"] == pytest.approx(
        40 * sum(step["hitopk"][1:]) + auto.switch_s)
    auto.tta.current, auto.switch_s = "2dtar", 2 * saving
    assert auto.choose(1) == "2dtar"
    # where the schedule leaves "auto", its horizon ends there
    scheduled = DistributedOptimizer(keras.optimizers.SGD(0.1), schedule={0: "auto", 5: "2dtar"}, auto=auto_options)
    scheduled.build([keras.Variable(np.zeros((500, 400), np.float32))])
    scheduled.set_fit_epochs(8)
    assert scheduled.auto_epochs.horizon(0) == [0, 1, 2, 3, 4] and scheduled.auto_epochs.horizon(3) == [3, 4]


def test_a_warm_up_density_is_predicted_from_its_own_timing(rank0_of_2x2):
    """The probe times hitopk at the target density, where fixed costs per call dominate, and at the
    DGC warm-up's densities, where the bytes do: one measured/predicted ratio does not carry from
    one to the other. A warm-up epoch is predicted from its own timing; where the warm-up costs
    more than the target density's ratio says, "auto" starts on PowerSGD instead of hitopk."""
    import keras

    from tf_commlib import alphabeta
    from tf_commlib.keras import DGC, DistributedOptimizer
    from tf_commlib.auto.measure import warmup_densities

    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                               auto=Auto(cost_params=alphabeta.LinkParams(beta_inter=8 / 5e6), compute_s=0.19,
                                         diloco=False))   # the per-step candidates alone (DiLoCo: below)
    assert warmup_densities(opt) == [0.25, 0.0625]
    assert warmup_densities(DistributedOptimizer(keras.optimizers.SGD(0.1), dgc=DGC(warmup=0))) == []
    opt.build([keras.Variable(np.zeros(s, np.float32)) for s in [(3, 3, 64, 64), (3, 3, 64, 128), (128, 10)]]
              + [keras.Variable(np.zeros(64, np.float32))])
    opt.set_fit_epochs(8)
    auto, target = opt.auto_epochs, opt.target_density
    auto.overlapped = 0.0   # a step is compute plus its collectives (as on CPU cores), on any machine
    (lossy,) = [g for g in opt._groups if g.lossy]
    exact_part = {d: auto.communication_s("hitopk", d) - auto._predicted(lossy, "hitopk", d) for d in (0.25, target)}
    auto.probed = {c: auto._predicted(lossy, c, target) for c in auto.settings.candidates}
    auto.probed["hitopk"] *= 0.5   # measured at the target: half the formula's time
    auto._scales = {}
    single = auto.predictions(0)
    assert auto.communication_s("hitopk", 0.25) == pytest.approx(
        exact_part[0.25] + 0.5 * auto._predicted(lossy, "hitopk", 0.25))
    auto.probed_warmup, auto._scales = {"hitopk": {0.25: auto._predicted(lossy, "hitopk", 0.25)}}, {}
    own = auto.predictions(0)
    assert auto.communication_s("hitopk", 0.25) == pytest.approx(exact_part[0.25] + auto.probed_warmup["hitopk"][0.25])
    assert auto.communication_s("hitopk", target) == pytest.approx(exact_part[target] + auto.probed["hitopk"])
    assert own["hitopk"] > single["hitopk"] and own["powersgd"] == pytest.approx(single["powersgd"])
    # PowerSGD timed between the two: the warm-up's own timing decides
    auto.probed["powersgd"] += (single["hitopk"] + own["hitopk"]) / 2 - own["powersgd"]
    for warm, choice in (({}, "hitopk"), (auto.probed_warmup, "powersgd")):
        auto.probed_warmup, auto._scales, auto.tta.current = warm, {}, None
        assert auto.choose(0) == choice
