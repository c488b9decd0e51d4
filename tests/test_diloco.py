"""tf_commlib.keras.DiLoCo: local SGD inside nodes, an outer optimizer across them every H steps."""
import keras
import numpy as np
import pytest

from tests import hvdrun


# Horovod fuses the tensors that are ready in the same cycle, so which gradients share an allreduce (and
# the order a ring sums each value in) depends on timing; the dense reference of the exactness anchor
# must not (a loaded machine gave 9e-4 on 1x4 with fusion on)
NO_FUSION = {"HOROVOD_FUSION_THRESHOLD": "0"}


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory):
    return hvdrun.run("diloco_worker.py", 4, tmp_path_factory.mktemp("diloco"), args=["all"], topology="2x2",
                      timeout=600, env=NO_FUSION)


def _same(reports, key):
    return len({str(r[key]) for r in reports}) == 1


@pytest.mark.parametrize("layout", ["2x2", "1x4"])
def test_h1_without_momentum_or_overlap_is_synchronous_dense_training(layout, tmp_path, two_by_two):
    """Inner SGD, H=1, outer SGD lr 1 momentum 0, no compression: the weights of DistributedOptimizer's
    dense allreduce training to 1e-6 (and training moved them)."""
    reports = two_by_two if layout == "2x2" else hvdrun.run("diloco_worker.py", 4, tmp_path, args=["anchor"],
                                                             topology=layout, timeout=400, env=NO_FUSION)
    for r in reports:
        assert r["anchor_diff"] <= 1e-6
        assert r["anchor_moved"] > 1e-3


def test_every_rank_holds_the_same_weights_after_each_sync(two_by_two):
    """H=3, 4 steps per epoch: syncs at steps 3 and 6 and at each epoch end; the digests (batch-norm
    statistics included) agree on every rank there. Between syncs the ranks of a node share their
    trainable weights and the two nodes differ."""
    rows = [r["rows"] for r in two_by_two]
    synced = [i for i, row in enumerate(rows[0]) if row[1]]
    assert [rows[0][i][0] for i in synced] == [3, 4, 6, 8]
    for i in synced:
        assert len({r[i][2] for r in rows}) == 1, rows[0][i]
    step1 = [r[0][3] for r in rows]
    assert step1[0] == step1[1] and step1[2] == step1[3] and step1[0] != step1[2]
    assert _same(two_by_two, "bn_mean") and np.abs(two_by_two[0]["bn_mean"]).max() > 0


@pytest.mark.parametrize("compression", ["None", "qsgd8", "int4"])
def test_bytes_of_one_interval_are_the_formula(two_by_two, compression):
    """H inner steps and one sync, counted by the primitives, equal interval_bytes() on both links; the
    8-bit codec sends about a quarter of float32 between nodes, the 4-bit one an eighth."""
    for r in two_by_two:
        assert r[f"synced_{compression}"] == 3
        for link in ("intra", "inter"):
            assert r[f"counted_{compression}"][link] == pytest.approx(r[f"formula_{compression}"][link], rel=1e-9)
    ratio = two_by_two[0]["counted_qsgd8"]["inter"] / two_by_two[0]["counted_None"]["inter"]
    assert 0.24 < ratio < 0.27
    ratio = two_by_two[0]["counted_int4"]["inter"] / two_by_two[0]["counted_None"]["inter"]
    assert 0.12 < ratio < 0.14


def test_int4_mean_between_nodes_is_the_mean_of_what_each_node_sends(two_by_two):
    """inter_mean in int4 on every rank: the mean over the nodes of each node's slice as int4 decodes it
    (numpy over every node's slice), and this rank's own message, which error feedback keeps the rest of;
    the rounding itself is not nothing."""
    for r in two_by_two:
        assert r["int4_mean_error"] <= 1e-6 and r["int4_own_error"] <= 1e-6
        assert r["int4_rounding"] > 1e-3


def test_overlapped_exchange_runs_while_the_next_steps_go_on(two_by_two):
    """overlap=True, H=2: sync 1's exchange (on the background thread) is held until step 3 has ended, which
    a synchronous exchange would never see (it would wait in vain, released False); synchronize()
    then gives every rank the same weights, while before it the nodes differed."""
    for r in two_by_two:
        assert r["released"] == [True]
        events = {(e, i): t for e, i, t in r["timeline"]}
        assert events[("step_end", 3)] < events[("exchange_start", 1)] < events[("exchange_end", 1)]
    assert _same(two_by_two, "overlap_final")
    between = [r["between_syncs"] for r in two_by_two]
    assert between[0] == between[1] and between[2] == between[3] and between[0] != between[2]


def test_overlap_applies_every_interval_once(two_by_two):
    """Constant gradients, outer SGD lr 1 momentum 0, H=3, 7 steps, then synchronize(): with and without
    overlap every rank ends at w0 - lr * 7 * mean gradient, so no interval (the partial last one included)
    is lost or applied twice; before synchronize() the nodes differ."""
    for r in two_by_two:
        assert r["linear_False"] < 1e-5 and r["linear_True"] < 1e-5
    partial = [r["linear_partial_True"] for r in two_by_two]
    assert partial[0] == partial[1] and partial[0] != partial[2]


def test_mixed_float16_overflow_skips_a_step_in_its_node_only(two_by_two):
    """Rank 0 overflows at step 2: ranks 0 and 1 skip it (weights unchanged, loss scale halved), node 1
    steps; no byte crosses nodes outside the syncs (steps 4 and 8). At step 8 node 1's weights are NaN:
    every rank skips that outer step and restarts from the start weights of step 4."""
    d = [r["mixed_digests"] for r in two_by_two]
    s = [r["mixed_scales"] for r in two_by_two]
    assert d[0][1] == d[0][0] and d[1][1] == d[1][0] and d[0][1] == d[1][1]
    assert d[2][1] != d[2][0] and d[3][1] == d[2][1]
    assert s[0][1] == s[1][1] == s[2][1] / 2 == s[3][1] / 2
    for r in two_by_two:
        assert [b > 0 for b in r["mixed_inter"]] == [False, False, False, True] * 2
        assert r["mixed_finite"]
    assert len({r[3] for r in d}) == 1 and len({r[7] for r in d}) == 1 and d[0][7] == d[0][3]
    # keras.optimizers.LossScaleOptimizer checks per rank: a rank that overflowed would skip the node exchange
    # its partners wait in, so apply() refuses it, naming the global one
    for r in two_by_two:
        assert "tf_commlib.keras.LossScaleOptimizer" in r["per_rank_check"]


def test_resume_from_backup_is_bit_identical(two_by_two):
    """overlap=True, 8-bit codec with residuals, batch norm: interrupted at step 7 (between syncs) and
    resumed by a new model from BackupAndRestore, it ends bit-identical to an uninterrupted run, also with
    BackupAndRestore before default_callbacks() (it saves before their epoch-end sync)."""
    for r in two_by_two:
        assert r["interrupted"] == "interrupted"
        assert r["resume_resumed"] == r["resume_full"]
        assert r["resume_steps"] == 12
    assert _same(two_by_two, "resume_full")


def test_an_exchange_that_traced_is_no_measure_of_one(monkeypatch):
    """An exchange that traced the codec's functions is recorded as NaN (every rank records one): with no
    other, H is not chosen yet; with one timed, its median (one process)."""
    from tf_commlib.auto import interval
    from tf_commlib.auto.interval import Window, measured_times
    from tf_commlib.topology import Topology

    monkeypatch.setattr(interval, "current_topology", lambda: Topology(m=1, n=1, rank=0, node=0, local=0, intra_ranks=(0,), inter_ranks=(0,)))

    window = Window(True)
    window.steps += [0.1, 0.1]
    window.work.append(0.01)
    window.exchange.append(float("nan"))
    assert measured_times(window) is None
    window.exchange.append(0.05)
    assert measured_times(window) == pytest.approx((0.05, 0.01, 0.1))


def test_auto_interval_is_chosen_alike_on_every_rank_from_the_measured_times(two_by_two):
    """sync_every="auto", 4 epochs of 4 steps: the first epochs run AUTO_START; once a sync without a trace
    has been timed (epoch 2's end) H is chosen, the same on every rank, and it is choose_interval of the
    all-gathered numbers it logs; the next epoch runs it, and every rank ends with the same weights."""
    from tf_commlib.keras.diloco import AUTO_START, choose_interval

    first = two_by_two[0]
    for r in two_by_two:
        assert r["auto_log"] == first["auto_log"] and r["auto_epochs"] == first["auto_epochs"]
    log = first["auto_log"]
    assert [row["steps"] for row in log] == [12, 16]
    for row in log:
        assert row["step_s"] > 0 and row["exchange_s"] > 0 and row["sync_s"] >= 0
        assert row["sync_every"] == choose_interval(row["exchange_s"], row["sync_s"], row["step_s"])
    assert first["auto_epochs"][:3] == [AUTO_START] * 3 and first["auto_epochs"][3] == log[0]["sync_every"]
    assert first["auto_algorithms"] == [f"diloco_h{h}" for h in first["auto_epochs"]]
    assert _same(two_by_two, "auto_final")
    # the chosen H is an optimizer variable (BackupAndRestore keeps it); a fixed H's optimizer has none, so
    # it keeps the variables, and the checkpoints, it always had
    assert first["interval_variables"] == {"auto": ["diloco_interval"], "fixed": []}


def test_choose_interval_takes_the_smallest_h_whose_link_is_hidden():
    """With overlap: the smallest H of AUTO_INTERVALS whose H steps take the exchange within HIDDEN and a
    sync's work within SYNC_WORK; without: the smallest whose syncs add at most EXPOSED; the largest
    where none does; negative or non-finite times are refused, naming the argument."""
    from tf_commlib.keras.diloco import AUTO_INTERVALS, EXPOSED, HIDDEN, SYNC_WORK, choose_interval

    step = 0.1
    assert choose_interval(0.0, 0.0, step) == 1
    assert choose_interval(HIDDEN * 4 * step, 0.0, step) == 4               # just hidden at H=4
    assert choose_interval(HIDDEN * 4 * step * 1.01, 0.0, step) == 8        # just not
    assert choose_interval(0.0, SYNC_WORK * 16 * step * 1.01, step) == 32   # the sync's work decides
    assert choose_interval(1e6, 0.0, step) == AUTO_INTERVALS[-1]
    assert choose_interval(EXPOSED * 8 * step * 0.5, EXPOSED * 8 * step * 0.5, step, overlap=False) == 8
    assert choose_interval(EXPOSED * 8 * step * 0.5, EXPOSED * 8 * step * 0.51, step, overlap=False) == 16
    # a faster link never gets a larger H
    hs = [choose_interval(x, 0.01, step) for x in np.linspace(0.0, 20.0, 201)]
    assert hs == sorted(hs)
    for args, name in (((-1.0, 0.0, step), "exchange_s"), ((0.0, float("nan"), step), "sync_s"),
                       ((0.0, 0.0, float("inf")), "step_s"), ((0.0, 0.0, True), "step_s")):
        with pytest.raises(ValueError, match=name):
            choose_interval(*args)


# -- bad input: a clear error naming the argument, before any step -----------------------------
def _sgd():
    return keras.optimizers.SGD(0.1)


@pytest.mark.parametrize("make, message", [
    (lambda D: D(_sgd(), sync_every=0), "sync_every"),
    (lambda D: D(_sgd(), sync_every=True), "sync_every"),
    (lambda D: D(_sgd(), sync_every=2.5), "sync_every"),
    (lambda D: D(_sgd(), sync_every="often"), "sync_every"),
    (lambda D: D(_sgd(), sync_every=4, outer_optimizer="sgd"), "outer_optimizer"),
    (lambda D: D(_sgd(), sync_every=4, inter_compression="int3"), "inter_compression"),
    (lambda D: D(_sgd(), sync_every=4, inter_compression="mean"), "inter_compression"),
    (lambda D: D(_sgd(), sync_every=4, inter_compression="qsgd4"),
     "inter_compression 'qsgd4': its error is not bounded"),
    (lambda D: D(_sgd(), sync_every=4, inter_compression="qsgd2"), "inter_compression 'qsgd2'"),
    (lambda D: D(_sgd(), sync_every=4, overlap="yes"), "overlap"),
    (lambda D: D("sgd", sync_every=4), "inner_optimizer"),
    (lambda D: D(keras.optimizers.SGD(0.1, use_ema=True), sync_every=4), "inner_optimizer"),
])
def test_bad_arguments_name_themselves(make, message):
    from tf_commlib.keras import DiLoCo

    with pytest.raises(ValueError, match=message):
        make(DiLoCo)


def test_a_distributed_optimizer_is_neither_inner_nor_wrapped():
    from tf_commlib.keras import DiLoCo, DistributedOptimizer

    with pytest.raises(ValueError, match="inner_optimizer"):
        DiLoCo(DistributedOptimizer(_sgd()), sync_every=4)
    with pytest.raises(ValueError, match="optimizer must be"):
        DistributedOptimizer(DiLoCo(_sgd(), sync_every=4))
    opt = _sgd()
    with pytest.raises(ValueError, match="outer_optimizer"):
        DiLoCo(opt, sync_every=4, outer_optimizer=opt)


def test_config_round_trip():
    from tf_commlib.keras import DiLoCo

    opt = DiLoCo(keras.optimizers.AdamW(1e-3), sync_every=16, inter_compression="fp16", overlap=False)
    again = DiLoCo.from_config(opt.get_config())
    assert (again.sync_every, again.inter_compression, again.overlap) == (16, "fp16", False)
    assert isinstance(again.inner_optimizer, keras.optimizers.AdamW)
    outer = again.outer_optimizer
    assert float(outer.learning_rate.numpy()) == pytest.approx(0.7) and (outer.momentum, outer.nesterov) == (0.9, True)
    auto = DiLoCo.from_config(DiLoCo(keras.optimizers.SGD(0.1), sync_every="auto").get_config())
    assert auto.auto_interval and auto.get_config()["sync_every"] == "auto"


@pytest.mark.parametrize("extra, message", [
    (["--diloco", "-1"], "--diloco must be >= 0"),
    (["--diloco", "often"], "must be an int or 'auto'"),
    (["--diloco", "8", "--compression", "fp16"], "--compression"),
    (["--diloco", "8", "--schedule", "0:hitopk,3:2dtar"], "--schedule"),
    (["--diloco", "8", "--breakdown-steps", "3"], "--breakdown-steps"),
    (["--inter-compression", "qsgd8"], "goes with --diloco"),
    (["--diloco", "8", "--outer-momentum", "1.0"], "--outer-momentum"),
])
def test_the_dawnbench_script_checks_its_diloco_flags(extra, message, capsys):
    from tfc_apps.dawnbench import config

    with pytest.raises(SystemExit):
        config.parse(["--synthetic", "--breakdown-steps", "0", *extra] if "--breakdown-steps" not in extra
                     else ["--synthetic", *extra])
    assert message in capsys.readouterr().err


def test_bench_tta_passes_diloco_settings_to_the_script():
    import argparse

    from tfc_apps.bench import tta
    from tfc_apps.dawnbench import config

    args = tta.resolve(argparse.Namespace(**{**vars(tta.parser().parse_args([])), "data": None}))
    args.data = "DIR"
    argv = tta.dawnbench_argv(args, "diloco_h8_q8", "log")
    assert argv[argv.index("--diloco") + 1] == "8" and argv[argv.index("--inter-compression") + 1] == "qsgd8"
    parsed = config.parser().parse_args(argv)
    assert parsed.diloco == 8 and parsed.breakdown_steps == 0
    argv = tta.dawnbench_argv(args, "diloco_auto_q8", "log")
    parsed = config.parser().parse_args(argv)
    assert parsed.diloco == "auto" and parsed.inter_compression == "qsgd8"
    assert config.parse(["--synthetic", "--breakdown-steps", "0", "--schedule", "0:dense", "--diloco", "auto"]).diloco == "auto"
