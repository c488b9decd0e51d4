"""DistributedOptimizer(algorithm="auto")'s candidate "diloco" (tf_commlib.auto.rounds): local SGD
inside the nodes, DiLoCo's sync across them every H steps, chosen where predicted well below every
per-step candidate."""
import json

import numpy as np
import pytest

from tests import hvdrun
from tf_commlib import alphabeta, replicas
from tf_commlib.aggregator import Auto
from tf_commlib.auto.decide import TimeToAccuracy
from tf_commlib.auto import rounds

SHAPES = [(3, 3, 64, 64), (3, 3, 64, 128), (128, 10), (64,)]


def test_times_are_the_alpha_beta_formulas():
    """A step's node average: reduce-scatter and all-gather inside the node; a sync's exchange: an
    all-gather of each rank's slice in 4 bits over the nodes, the node's ranks sharing its link."""
    link = alphabeta.LinkParams(alpha_intra=1e-5, beta_intra=1e-9, alpha_inter=1e-3, beta_inter=8 / 5e6)
    d, m, n = 1000, 2, 2
    node, exchange, sync = rounds.times(d, m, n, link)
    assert node == pytest.approx(1e-5 + 0.5 * 4000 * 1e-9 + 1e-5 + 4 * 500 * 1e-9)
    from tf_commlib.collectives import codec

    assert exchange == pytest.approx(1e-3 + codec.get("int4").bytes(500) * 2 * 8 / 5e6)
    assert sync == node


@pytest.mark.parametrize("exchange, step, h", [(0.001, 0.1, 1), (0.05, 0.1, 4), (10.0, 0.1, 8)])
def test_h_is_the_smallest_whose_sync_stays_within_a_fifth_of_its_steps(exchange, step, h):
    assert rounds.interval(exchange, 0.0, step) == h


def test_its_steps_count_as_exact_aggregations():
    """The rounds' steps count as exact aggregation's: chosen where predicted below every per-step
    candidate, not where above."""
    for share, choice in ((1.05, "powersgd"), (0.95, "diloco")):
        tta = TimeToAccuracy(("dense", "powersgd", "diloco"), ["powersgd"], rounds=["diloco"], noise=0.0)
        assert tta.choose([(None, {"dense": 2.0, "powersgd": 1.0, "diloco": share})]) == choice


def test_running_they_are_left_only_where_the_saving_pays_the_traces():
    """Running, the rounds are left for a candidate only where it saves more over the epochs left than the
    traces it costs (6 epochs of 47 steps left, a 2.4 s trace, as bench tta at 5 Mbit/s measured; hitopk
    not run yet: a trace there and one back): not for hitopk at 0.128 s a step against their 0.131 s, for
    hitopk at 0.10 s; a running per-step candidate is not left for them at 0.128 s against 0.131 s."""
    def running(name, times):
        tta = TimeToAccuracy(("dense", "hitopk", "diloco"), ["hitopk"], rounds=["diloco"], noise=0.0)
        tta.current = name
        return tta.choose([(47, times)] * 6, trace_s=2.4)

    assert running("diloco", {"dense": 1.5, "hitopk": 0.128, "diloco": 0.131}) == "diloco"
    assert running("diloco", {"dense": 1.5, "hitopk": 0.10, "diloco": 0.131}) == "hitopk"
    assert running("hitopk", {"dense": 1.5, "hitopk": 0.131, "diloco": 0.128}) == "hitopk"
    assert running(None, {"dense": 1.5, "hitopk": 0.128, "diloco": 0.120}) == "diloco"   # the schedule left "auto"


def test_a_sequence_that_leaves_the_running_rounds_and_comes_back_pays_two_traces():
    """Running rounds at 0.131 s a step, hitopk at 0.10 for one epoch (say a cheaper density) and 0.2 after
    (both have run): leaving for that epoch and coming back costs two traces, worth it at 0.1 s a trace
    (1.46 s saved), not at 1 s."""
    tta = TimeToAccuracy(("dense", "hitopk", "diloco"), ["hitopk"], rounds=["diloco"], noise=0.0)
    tta.observe("hitopk", 0.2, 0.2, efficiency=0.9)
    tta.observe("diloco", 0.131, 0.131)
    cheap, later = {"dense": 1.5, "hitopk": 0.10, "diloco": 0.131}, {"dense": 1.5, "hitopk": 0.2, "diloco": 0.131}
    plan = [(47, cheap)] + [(47, later)] * 5
    tta.current = "diloco"
    weight = tta.sequences(plan, 0.1)
    assert weight["diloco"] == pytest.approx(6 * 47 * 0.131)
    assert weight["hitopk"] == pytest.approx(0.1 + 47 * 0.10 + 0.1 + 5 * 47 * 0.131)
    assert tta.choose(plan, trace_s=0.1) == "hitopk"
    tta.current = "diloco"
    assert tta.choose(plan, trace_s=1.0) == "diloco"
    restored = TimeToAccuracy(("dense", "hitopk", "diloco"), ["hitopk"])
    tta.left = True
    restored.restore(tta.state())
    assert restored.left and restored.kept() is None


def _built(fit=True, **auto):
    """fit: as in model.fit, where CompressionScheduler gives the epochs (set_fit_epochs before the build)."""
    import keras

    from tf_commlib.keras import DistributedOptimizer

    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), auto=Auto(**auto))
    if fit:
        opt.set_fit_epochs(8)
    opt.build([keras.Variable(np.zeros(s, np.float32)) for s in SHAPES])
    return opt


def test_chosen_on_a_slow_link_and_not_on_a_fast_one(rank0_of_2x2):
    """A small model (112K weights, compute 0.19 s a step), the link's formulas: at 1 Mbit/s between nodes
    "diloco" at H = 8 is predicted below every per-step candidate and runs; at 10 Gbit/s, where the step
    hides its collectives under the compute (as on a GPU), a per-step collective runs: the rounds' sync
    waits for the whole of backprop."""
    slow = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    auto = slow.auto_epochs
    assert auto.tta.candidates[-1] == "diloco" and auto.local is not None
    per = auto.per_epoch(0)
    predicted = {c: sum(p[c] for p in per) / len(per) for c in auto.tta.candidates}
    best = min(t for c, t in predicted.items() if c != "diloco")
    assert predicted["diloco"] < best
    assert slow.algorithm_at(0) == "diloco" and auto.local.running and auto.local.interval == 8
    assert slow.sent_bytes_at(0)["inter"] == pytest.approx(auto.local.sent_bytes()["inter"])
    fast = _built(cost_params=alphabeta.LinkParams(), compute_s=0.19, probe=False)
    fast.auto_epochs.overlapped, fast.auto_epochs.tta.current = 1.0, None
    assert fast.auto_epochs.choose(0) != "diloco"
    # a custom loop (no set_fit_epochs): its steps count themselves, so it runs the rounds too
    loop = _built(fit=False, cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    assert loop.algorithm_at(0) == "diloco" and loop.auto_epochs.local.running


def test_not_before_the_compute_per_step_is_known(rank0_of_2x2):
    """Without Auto(compute_s=...), the first epoch runs a per-step candidate: DiLoCo's margin is on whole
    steps. Once the compute is known (the first epoch's measured step less its collectives), it runs."""
    opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), probe=False)
    assert opt.algorithm_at(0) != "diloco"
    opt.auto_epochs.compute_s = 0.19
    assert opt.auto_epochs.choose(1) == "diloco"


def test_a_rank_state_reset_zeroes_its_residual(rank0_of_2x2):
    opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    residual = opt.auto_epochs.local.residual
    residual.assign(np.ones(residual.shape, np.float32))
    opt.reset_rank_state()
    assert not residual.numpy().any()


def test_only_where_asked_or_by_default(rank0_of_2x2):
    """Auto(diloco=False), or candidates named without diloco=True: the per-step candidates alone."""
    slow = alphabeta.LinkParams(beta_inter=8 / 5e6)
    for auto, has in (({}, True), ({"diloco": False}, False), ({"candidates": ("2dtar", "hitopk")}, False),
                      ({"candidates": ("2dtar", "hitopk"), "diloco": True}, True)):
        opt = _built(cost_params=slow, compute_s=0.19, probe=False, **auto)
        assert ("diloco" in opt.auto_epochs.tta.candidates) == has and (opt.auto_epochs.local is not None) == has
    with pytest.raises(ValueError, match="Auto.diloco"):
        Auto(diloco="yes")


def test_a_measured_sync_takes_the_place_of_the_probe(rank0_of_2x2, monkeypatch):
    """Where the candidates were probed (a sync's exchange and one node average), an epoch of "diloco"
    measures its syncs, and the next prediction and H follow from that measure (the probe leaves out the
    sync's other work; until then H is FIRST_INTERVAL); BackupAndRestore keeps it; a step that later takes
    more than Auto.drift times its prediction from the last epoch's syncs has the link measured again."""

    monkeypatch.setattr(replicas, "summed", lambda v: 4 * np.asarray(v, np.float64))   # 4 ranks alike
    opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    auto = opt.auto_epochs
    node = 0.01
    opt.measurements.local = (node, 0.05, node)
    assert auto.running == "diloco" and rounds.interval(0.05, node, 0.19 + node) == 2
    auto.running = None   # as begin_window asks, before the epoch: the probe's times are not a sync's
    assert auto.local_interval() == rounds.FIRST_INTERVAL == 8 != rounds.interval(0.05, node, 0.19 + node)
    auto.running = "diloco"

    def epoch(e, sync_s):   # 32 steps of 0.2 s and 4 syncs, at H = 8
        auto.local.synced, auto.local.sync_s, auto.local.interval = [sync_s] * 4, 4 * sync_s, 8
        auto.end_epoch(e, 0.2, steps=32)
        auto.running = "diloco"   # runs it again

    recalibrated = []
    monkeypatch.setattr(auto, "recalibrate", lambda: recalibrated.append(True))
    epoch(0, 0.3)
    assert auto.local_sync_s == pytest.approx(0.3) and not recalibrated
    auto.running = None   # the next choice's H and prediction
    assert rounds.interval(0.3, 0.0, 0.19 + node) == 8 == auto.local_interval()
    assert auto.communication_s("diloco", 0.01) == pytest.approx(node + 0.3 / 8)
    auto.running = "diloco"
    again = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    again.auto_epochs.restore(json.loads(json.dumps(auto.state())))
    assert again.auto_epochs.local_sync_s == pytest.approx(0.3) and again.auto_epochs.local_restored
    epoch(1, 0.3 * 2)   # a step of 0.2 s + 4 syncs of 0.6 s over 32 steps, predicted at 0.2 + 0.3 / 8
    assert not recalibrated and auto.local_sync_s == pytest.approx(0.6)
    assert auto.tta.ratio["diloco"] == pytest.approx(1.0)   # against 0.2 + 0.6 / 8: counted once
    epoch(2, 0.6 * 20)   # 0.2 + 1.5 s, predicted at 0.2 + 0.6 / 8
    assert recalibrated


def test_a_link_measured_again_is_kept_in_the_state(rank0_of_2x2):
    """A resumed run predicts (and so chooses H) from the link its run measured again, not the given one."""
    opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    assert opt.auto_epochs.state()["link"] is None
    opt.auto_epochs.link, opt.auto_epochs.recalibrations = alphabeta.LinkParams(), 1
    again = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    again.auto_epochs.restore(opt.auto_epochs.state())
    assert again.auto_epochs.link == alphabeta.LinkParams()


def test_ranks_that_would_begin_different_epochs_fail_before_a_collective(rank0_of_2x2, monkeypatch):
    """Where rounds ran and one rank would begin another epoch than the others (a wrong restore, say),
    every rank fails with a ValueError before the wrapped optimizer's state is averaged (a collective
    that the rank beginning rounds would not call: a hang). A fresh build calls no collective (a model's
    copy is built on dawnbench's evaluation thread)."""
    from tf_commlib import replicas

    def no_collective(rows, name):
        raise AssertionError(f"a collective ({name}) in a fresh build")

    with monkeypatch.context() as fresh:
        fresh.setattr(replicas, "gathered", no_collective)
        opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    auto, averaged = opt.auto_epochs, []
    assert auto.local.running
    monkeypatch.setattr(replicas, "average_variables", averaged.append)
    monkeypatch.setattr(replicas, "gathered", lambda rows, name: np.concatenate([rows, rows + [[1, 0, 0, 0]]]))
    with pytest.raises(ValueError, match="the ranks would begin different epochs"):
        auto.begin_window("dense")
    assert not averaged and auto.local.running


def test_a_rank_that_restores_its_previous_backup_after_its_latest_ends_as_the_others(rank0_of_2x2):
    """A rank that saved one epoch more than another restores its latest backup, then its previous one:
    what only the latest held (a link measured again, the compute, a trace's cost, the last epoch) is not
    kept, so it predicts as the ranks that restored the previous one only."""
    given = alphabeta.LinkParams(beta_inter=8 / 1e6)
    ran = _built(cost_params=given, probe=False).auto_epochs
    previous = json.loads(json.dumps(ran.state()))   # nothing measured yet
    ran.compute_s, ran.steps, ran.switch_s, ran.overlapped = 0.25, 32, 3.0, 0.5
    ran.link, ran.recalibrations = alphabeta.LinkParams(), 1
    ran.tta.observe("hitopk", 0.3, 0.1, efficiency=0.8, density=0.01)
    latest = json.loads(json.dumps(ran.state()))
    only_latest, both, only_previous = (_built(cost_params=given, compute_s=0.19, probe=False).auto_epochs
                                        for _ in range(3))
    assert only_previous.running == "diloco" and only_previous.local.running   # the build's choice (the load's)
    only_latest.restore(latest)
    assert (only_latest.compute_s, only_latest.steps, only_latest.switch_s, only_latest.link) == \
        (0.25, 32, 3.0, alphabeta.LinkParams())
    assert only_latest.tta.density == {"hitopk": 0.01} and only_latest.tta.ratio == {"hitopk": pytest.approx(3.0)}
    both.restore(latest)
    both.restore(previous)
    only_previous.restore(previous)
    assert both.state() == only_previous.state() and both.link == only_previous.link == given
    assert (both.compute_s, both.steps, both.switch_s, both.tta.ratio) == (0.19, None, None, {})
    # the epoch it resumes at chooses afresh, as an uninterrupted run's does (rounds as the backup says)
    assert both.running is None and not both.local.running and not both.local_restored
    assert both.per_epoch(1) == only_previous.per_epoch(1)


def test_a_restored_link_has_the_candidates_timed_again_at_the_next_choice(rank0_of_2x2, monkeypatch):
    """The candidates' timings are the link's: a resumed run whose backup holds a link measured again
    during the run times them again on it (from the cache where they were) before it chooses, once."""
    from tf_commlib.auto import measure

    opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    auto = opt.auto_epochs
    timed = {c: 0.1 for c in auto.settings.candidates}
    auto.probed, calls = dict(timed), []   # as if timed when fit started
    monkeypatch.setattr(measure, "probe_candidates", lambda o, v, link: calls.append(link) or (dict(timed), {}))
    monkeypatch.setattr(measure, "probe_local", lambda o, v, link: (0.01, 0.05, 0.01))
    auto.choose(1)
    assert not calls
    auto.restore({**auto.state(), "link": alphabeta.LinkParams().as_list()})
    auto.choose(2)
    auto.choose(3)
    assert calls == [alphabeta.LinkParams()] and auto.probed_on == auto.link == alphabeta.LinkParams()
    assert opt.measurements.local == (0.01, 0.05, 0.01)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("auto_diloco")
    return hvdrun.run("auto_diloco_worker.py", 4, path, args=[str(path / "backup")], topology="2x2", timeout=600,
                      env={"HOROVOD_FUSION_THRESHOLD": "0"})


def test_it_trains_as_diloco_does(run):
    """On a 1 Mbit/s link (given) every epoch runs "diloco"; the weights equal those of
    DiLoCo(SGD, sync_every=H, outer_optimizer=SGD(1.0), inter_compression="int4", overlap=False)
    to 1e-6, and training moved them;
    after each epoch every rank holds the same weights."""
    for r in run:
        assert r["ran"] == ["diloco", "diloco"] and r["h"] in (1, 2, 4, 8)
        assert r["syncs"] == 32 and r["diff"] <= 1e-6 and r["moved"] > 1e-3
        assert r["outer_saved"]
    for epoch in range(2):
        assert len({r["digests"][epoch] for r in run}) == 1


def test_bytes_of_h_steps_and_a_sync_are_the_formula(run):
    """H steps and one sync of epoch 1, counted by the primitives, are H x sent_bytes() on both links;
    between nodes only the sync's int4 slice."""
    for r in run:
        for link in ("intra", "inter"):
            assert r["counted"][link] == pytest.approx(r["formula"][link], rel=1e-9)
        assert 0 < r["counted"]["inter"] < r["counted"]["intra"]


def test_a_resumed_run_ends_as_an_uninterrupted_one(run):
    for r in run:
        assert r["resumed_ran"] == ["diloco"] * 3 and r["resume_diff"] <= 1e-6


def test_a_schedule_that_leaves_auto_ends_its_rounds(run):
    """After an epoch of "diloco", a scheduled 2dtar epoch runs every step's collective from the same
    weights and the same state of the wrapped optimizer on every rank."""
    for r in run:
        assert r["leave_ran"] == ["diloco", "2dtar"] and not r["leave_running"]
    assert len({r["leave_digest"] for r in run}) == 1


def test_a_run_resumed_after_its_rounds_leaves_them_with_the_same_state_on_every_rank(run):
    """Resumed from each rank's backup of an epoch of "diloco" (the wrapped SGD's momentum differs by node
    there), the scheduled 2dtar epoch starts from that state averaged: every rank ends alike."""
    for r in run:
        assert r["resumed_leave_ran"] == ["2dtar", "diloco", "2dtar"]
    assert len({r["resumed_leave_digest"] for r in run}) == 1


def test_under_mixed_float16(run):
    for r in run:
        assert r["mixed_ran"] == ["diloco", "diloco"] and r["mixed_finite"] and r["mixed_moved"] > 1e-3
    assert len({r["mixed_digest"] for r in run}) == 1


def test_a_fast_link_runs_a_collective_every_step(run):
    assert {r["fast_ran"] for r in run} <= {"dense", "2dtar", "hitopk", "powersgd"}
    assert len({r["fast_digest"] for r in run}) == 1


def test_an_epoch_shorter_than_h_syncs_at_its_end():
    """Every epoch of the rounds ends with a sync, so an epoch of 4 steps pays a sync every 4 steps at
    H = 8, one of 45 steps 6 syncs, and with the epoch unknown a sync every H steps."""
    node, exchange, sync = 0.01, 0.4, 0.2
    times = (node, exchange, sync)
    for steps, syncs in ((4, 1 / 4), (45, 6 / 45), (None, 1 / 8), (16, 2 / 16)):
        comm, h = rounds.communication_s(10**6, 2, 2, alphabeta.LinkParams(), 0.1, times, 8, steps)
        assert h == 8 and comm == pytest.approx(node + (exchange + sync) * syncs), steps


def test_untried_they_pay_the_trace_back_as_a_lossy_candidate_does():
    """Running dense (measured), the rounds not run yet at 0.96 of its step: over 2 epochs of 20 steps the
    saving (1.6 s) does not pay a trace there and one back (2 x 1 s); over 20 epochs (16 s) it does."""
    times = {"dense": 1.0, "hitopk": 2.0, "diloco": 0.96}
    for epochs, choice in ((2, "dense"), (20, "diloco")):
        tta = TimeToAccuracy(("dense", "hitopk", "diloco"), ["hitopk"], rounds=["diloco"], noise=0.0)
        tta.observe("dense", 1.0, 1.0)
        tta.current = "dense"
        assert tta.choose([(20, times)] * epochs, trace_s=1.0) == choice


def test_an_epoch_after_rounds_starts_from_synced_weights(rank0_of_2x2, monkeypatch):
    """Where the rounds ran, the next epoch (rounds again, or a per-step collective) begins with the sync
    of the steps since the last one, whether or not a callback synced at the epoch's end: a per-step
    collective averages gradients, not weights, and new rounds start from the weights they find."""
    opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    auto, synced = opt.auto_epochs, []
    assert auto.local.running
    monkeypatch.setattr(auto.local, "synchronize", lambda: synced.append(True))
    monkeypatch.setattr(replicas, "average_variables", lambda variables: None)
    auto.begin_window("dense")
    assert synced == [True] and not auto.local.running
    auto.begin_window("dense")   # no rounds ran: nothing to sync
    assert synced == [True]


def test_the_rounds_step_is_the_mean_with_its_syncs_counted_once(rank0_of_2x2, monkeypatch):
    """At H = 2 half the steps hold a sync: 16 steps of 0.2 s and 16 of 0.5 s (a sync of 0.3 s inside). The
    rounds' measured step is their mean, 0.35 s, whatever the median; a median alone gets the syncs added."""
    monkeypatch.setattr(replicas, "summed", lambda v: 4 * np.asarray(v, np.float64))   # 4 ranks alike
    opt = _built(cost_params=alphabeta.LinkParams(beta_inter=8 / 1e6), compute_s=0.19, probe=False)
    auto = opt.auto_epochs
    calls = [0.2, 0.5] * 16
    for mean_s, expected in ((float(np.mean(calls[1:])), float(np.mean(calls[1:]))), (None, 0.2 + 16 * 0.3 / 32)):
        auto.running = "diloco"
        auto.local.synced, auto.local.sync_s, auto.local.interval = [0.3] * 16, 16 * 0.3, 2
        auto.end_epoch(0, 0.2, steps=32, mean_s=mean_s)
        assert auto.tta.log[-1]["measured_s"] == pytest.approx(expected)
