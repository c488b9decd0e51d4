"""AutoEpochs, the part of DistributedOptimizer(algorithm="auto") that turns the cost model, the
candidates' timings on the link and the measured epochs into per-epoch predictions, on a 2x2
topology (one process): a DGC warm-up weighed over the fit, a trace priced against the epochs left,
a warm-up density predicted from its own timing."""
import numpy as np
import pytest

from tf_commlib.aggregator import Auto


def _mean(auto, epoch):
    per = auto.per_epoch(epoch)
    return {c: sum(p[c] for p in per) / len(per) for c in auto.tta.candidates}


def test_a_candidate_is_weighed_over_the_fit_with_its_warm_up(rank0_of_2x2):
    """DGC's warm-up epochs send near-dense traffic: judged on the next epoch alone, hitopk loses to
    an exact collective at epoch 0 and wins after; "auto" weighs each candidate over the epochs the
    fit has left (each at its density) while the schedule runs "auto", so it starts on hitopk instead
    of switching to it later (a second trace of the step)."""
    import keras

    from tf_commlib import alphabeta
    from tf_commlib.keras import DistributedOptimizer

    link = alphabeta.LinkParams(beta_inter=8 / 100e6)
    auto_options = Auto(cost_params=link, compute_s=0.0, candidates=("2dtar", "hitopk"))
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), auto=auto_options)
    opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
    auto = opt.auto_epochs
    assert [opt.density_at(e) for e in range(3)] == [0.25, 0.0625, opt.target_density]   # DGC warm-up
    step = {c: [auto.step_s(c, opt.density_at(e)) for e in range(8)] for c in ("2dtar", "hitopk")}
    assert step["hitopk"][0] > step["2dtar"][0] and step["hitopk"][2] < 0.5 * step["2dtar"][2]
    assert opt.fit_epochs is None and auto.horizon(0) == [0]
    assert _mean(auto, 0) == pytest.approx({c: s[0] for c, s in step.items()})
    assert auto.choose(0) == "2dtar"   # the next epoch alone: exact
    auto.tta.current = None
    opt.set_fit_epochs(8)
    assert auto.horizon(0) == list(range(8)) and auto.horizon(5) == [5, 6, 7] and auto.horizon(9) == [9]
    assert _mean(auto, 0) == pytest.approx({c: np.mean(s) for c, s in step.items()})
    assert auto.choose(0) == "hitopk" and auto.tta.log[-1]["horizon"] == 8   # over the fit: hitopk from the start
    assert auto.tta.log[-1]["unit"] == "s per step of progress"   # no epoch measured yet: by the mean over the fit
    # measured: 40 steps an epoch; running 2dtar at epoch 1, hitopk (not run yet) is taken where its
    # saving over epochs 1-7 pays for a trace to it and one back, not where the traces cost more
    auto.steps, auto.tta.current = 40, "2dtar"
    auto.tta.observe("2dtar", step["2dtar"][0], step["2dtar"][0])
    saving = 40 * sum(step["2dtar"][e] - step["hitopk"][e] for e in range(1, 8))
    assert saving > 0
    auto.switch_s = 0.4 * saving
    assert auto.choose(1) == "hitopk" and auto.tta.log[-1]["predicted_s"]["hitopk"] == pytest.approx(
        40 * sum(step["hitopk"][1:]) + 2 * auto.switch_s)
    auto.tta.current, auto.switch_s = "2dtar", 0.6 * saving
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
    auto.tta.noise = 0.0   # the two candidates are close: the least prediction, not a tie
    (lossy,) = [g for g in opt._groups if g.lossy]
    exact_part = {d: auto.communication_s("hitopk", d) - auto._predicted(lossy, "hitopk", d) for d in (0.25, target)}
    auto.probed = {c: auto._predicted(lossy, c, target) for c in auto.settings.candidates}
    auto.probed["hitopk"] *= 0.5   # measured at the target: half the formula's time
    single = _mean(auto, 0)
    assert auto.communication_s("hitopk", 0.25) == pytest.approx(
        exact_part[0.25] + 0.5 * auto._predicted(lossy, "hitopk", 0.25))
    auto.probed_warmup = {"hitopk": {0.25: auto._predicted(lossy, "hitopk", 0.25)}}
    own = _mean(auto, 0)
    assert auto.communication_s("hitopk", 0.25) == pytest.approx(exact_part[0.25] + auto.probed_warmup["hitopk"][0.25])
    assert auto.communication_s("hitopk", target) == pytest.approx(exact_part[target] + auto.probed["hitopk"])
    assert own["hitopk"] > single["hitopk"] and own["powersgd"] == pytest.approx(single["powersgd"])
    # PowerSGD timed between the two: the warm-up's own timing decides
    auto.probed["powersgd"] += (single["hitopk"] + own["hitopk"]) / 2 - own["powersgd"]
    for warm, choice in (({}, "hitopk"), (auto.probed_warmup, "powersgd")):
        auto.probed_warmup, auto.tta.current = warm, None
        assert auto.choose(0) == choice


def test_the_probe_is_priced_against_the_steps_of_the_fit(rank0_of_2x2, monkeypatch):
    """Timing the candidates pays where the fit's steps times the most the choice can save per step exceed
    what the probe's other runs cost (each at its first run's seconds); Auto(probe=None) prices it where
    fit's epochs and steps are known, Auto(probe=True) and a loop that gives no steps always time."""
    import keras

    from tf_commlib import alphabeta, costmodel
    from tf_commlib.auto import measure
    from tf_commlib.keras import DistributedOptimizer

    predicted = {"dense": 1.6, "2dtar": 1.1, "hitopk": 1.3, "powersgd": 0.4}   # ResNet-50 at 500 Mbit/s
    assert not measure.probe_pays(12, 15.0, 6, predicted)   # 14 s to save against 75 s
    assert measure.probe_pays(100, 15.0, 6, predicted)      # 120 s against 75 s
    from tf_commlib.keras import auto_epoch

    monkeypatch.setattr(measure, "current_topology", auto_epoch.current_topology)   # rank 0 of 2x2
    monkeypatch.setattr(costmodel, "cached_calibration", lambda topo, path, **kw: (alphabeta.LinkParams(), "cached"))
    asked = []
    monkeypatch.setattr(measure, "probe_candidates",
                        lambda opt, variables, link, steps=None: asked.append(steps) or (None, {}))
    variables = [keras.Variable(np.zeros((500, 400), np.float32))]
    for probe, fit, expected in ((None, (3, 4), 12), (None, None, None), (True, (3, 4), None)):
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1), auto=Auto(probe=probe, diloco=False))
        if fit:
            opt.set_fit_epochs(*fit)
        opt.measure(variables)
        assert asked[-1] == expected and opt.measurements.probed is None   # not paid: not timed
