"""DistributedOptimizer(shard_optimizer=True): ZeRO-1, the sharded optimizer update.

On 4 ranks (2x2 and 1x4): the sharded update of SGD-momentum, Adam, AdamW, pto.LARS and pto.LAMB,
with and without DGC momentum correction, equals the unsharded one and the numpy reference on
variables that straddle the slices; replicas are bit-identical; the state per rank is ~1/P; the
bytes counted equal the formula. Sharded over a node's ranks (2x2) across a hitopk -> 2dtar switch.
Single process: the argument errors. Two launches of tests/workers/zero_worker.py: every 2x2 job in
one (on_2x2), the 1x4 ones in the other (on_1x4)."""
import keras
import numpy as np
import pytest

import pto
from tests import hvdrun
from tests.workers.sequence_worker import cases_file
from tests import pto_reference as ref
from tf_commlib.keras import DGC, DistributedOptimizer, Selection
from tf_commlib.keras.sharded import SUPPORTED, world_sharded

DECAYED = [len(s) > 1 for s in ref.ZERO_SHAPES]   # the 1-D ones are named bias*


def reference(kind, correction, weights, grads_by_rank):
    momentum = 0.9 if correction else 0.0
    avg = ref.dgc_average(grads_by_rank, momentum)
    if kind == "sgd":
        return ref.sgd(weights, avg, 0.1, momentum=0.0 if correction else 0.9, nesterov=not correction)
    if kind == "adam":
        return ref.adam(weights, avg, 0.01)
    if kind == "adamw":
        return ref.adam(weights, avg, 0.01, weight_decay=0.05, decayed=DECAYED)
    if kind == "lars":
        return ref.lars(weights, avg, 0.5, momentum=0.0 if correction else 0.9, weight_decay_rate=0.01,
                        eeta=0.01, decayed=DECAYED, adapted=DECAYED)
    return ref.lamb(weights, avg, 0.01, weight_decay=0.01)


def check_exact(reports, kinds):
    weights = ref.zero_inputs(0, 3)[0]
    grads_by_rank = [ref.zero_inputs(r, 3)[1] for r in range(4)]
    for kind in kinds:
        for correction in (False, True):
            name = f"{kind}_{correction}"
            want = reference(kind, correction, weights, grads_by_rank)
            for r in reports:
                case = r["cases"][name]
                sharded, unsharded = case["sharded"], case["unsharded"]
                assert sharded["iterations"] == unsharded["iterations"] == 3, name
                assert max(np.abs(np.array(w) - np.array(u)).max()
                           for w, u in zip(sharded["weights"], unsharded["weights"])) <= 1e-6, name
                assert max(np.abs(np.array(w) - u).max() for w, u in zip(sharded["weights"], want)) <= 1e-6, name
                assert max(np.abs(np.array(w) - u).max() for w, u in zip(sharded["weights"], weights)) > 1e-3, name
                assert sharded["digest"] == reports[0]["cases"][name]["sharded"]["digest"], (name, r["rank"])
                if unsharded["state_bytes"]:   # 1/P of the state, plus the padding
                    assert 0.25 <= sharded["state_bytes"] / unsharded["state_bytes"] <= 0.26, name
                else:
                    assert sharded["state_bytes"] == 0, name
            # per step, the bytes counted on all ranks are 4 times the formula's (an average per rank)
            counted = {link: sum(r["cases"][name]["sharded"]["counted"][link] for r in reports) for link in ("intra", "inter")}
            formula = reports[0]["cases"][name]["sharded"]["formula"]
            assert counted == pytest.approx({link: 4 * 3 * formula[link] for link in counted}, rel=1e-12), name
            plain = reports[0]["cases"][name]["unsharded"]["formula"]
            total = sum(counted.values()) / 4 / 3
            norm = 2 * 3 / 4 * 4 * (len(weights) + 1) * 2 if kind in ("lars", "lamb") else 0   # one allreduce of 7 x 2 floats
            # the plain allreduce's bytes, plus the padding of a bucket to a multiple of P (< P entries
            # of 4 bytes each, through reduce-scatter + all-gather) where its length is not one
            padding = total - sum(plain.values()) - norm
            assert 0 <= padding <= len(weights) * 3 * 2 * 4, (name, total, plain, norm)
    return reports


KINDS = "sgd,adam,adamw,lars,lamb"
SPARSE_KINDS = "lars,sgd,adam"
SCHEDULES = ("2dtar", "hitopk,2dtar")


@pytest.fixture(scope="module")
def backups(tmp_path_factory):
    """Where on_2x2's fit of each schedule keeps its BackupAndRestore backups."""
    tmp = tmp_path_factory.mktemp("zero_backups")
    return {schedule: tmp / f"backup_{i}" for i, schedule in enumerate(SCHEDULES)}


def _jobs(layout, jobs, tmp_path_factory, timeout):
    """Per rank, {name: report}: zero_worker's jobs ({name: argv}) one after another in one launch
    (tests/workers/sequence_worker.py; a launch of 4 ranks costs ~20 s before its first job)."""
    tmp = tmp_path_factory.mktemp(f"zero_{layout}")
    cases = {name: ("tests.workers.zero_worker", argv, None) for name, argv in jobs.items()}
    reports = hvdrun.run("sequence_worker.py", 4, tmp, topology=layout, args=[cases_file(tmp, cases)],
                         timeout=timeout)
    return [{name: r[name] for name in jobs} for r in reports]


@pytest.fixture(scope="module")
def on_2x2(backups, tmp_path_factory):
    """One launch on 2x2 for every 2x2 job of this file: exact (2dtar), sparse, compression, a fit
    per schedule."""
    jobs = {"exact": ["exact", "2dtar", KINDS], "sparse": ["sparse", SPARSE_KINDS], "compression": ["compression"],
            "full_state": ["full_state"],
            **{f"fit {s}": ["fit", backups[s], s] for s in SCHEDULES}}
    return _jobs("2x2", jobs, tmp_path_factory, 900)


@pytest.fixture(scope="module")
def on_1x4(on_2x2, backups, tmp_path_factory):
    """One launch on 1x4: exact (dense), then resuming from on_2x2's fit's 2dtar backups (so it runs
    after on_2x2)."""
    return _jobs("1x4", {"exact": ["exact", "dense", KINDS], "load_elsewhere": ["load_elsewhere", backups["2dtar"]]},
                 tmp_path_factory, 600)


@pytest.mark.parametrize("layout, algorithm, slots", [("2x2", "2dtar", (0, 2, 1, 3)), ("1x4", "dense", (0, 1, 2, 3))])
def test_sharded_updates_equal_unsharded_and_numpy(layout, algorithm, slots, request):
    reports = [r["exact"] for r in request.getfixturevalue(f"on_{layout}")]
    check_exact(reports, KINDS.split(","))
    # dense: rank r owns slice r of each bucket; 2dtar: rank (node i, local l) owns slice l*m + i
    assert [r["slices"] for r in reports] == [[[2256, s * 564, 564], [80, s * 20, 20]] for s in slots]


def test_sharded_over_a_node_with_hitopk_then_2dtar(on_2x2):
    """hitopk for an epoch, then 2dtar (DAWNBench's switch): the update is sharded over a node's n = 2
    ranks, equals the unsharded one, replicas bit-identical, state 1/n, bytes = the formula."""
    reports = [r["sparse"] for r in on_2x2]
    for kind in SPARSE_KINDS.split(","):
        for correction in (False, True):
            name = f"{kind}_{correction}"
            for r in reports:
                sharded, unsharded = r["cases"][name]["sharded"], r["cases"][name]["unsharded"]
                assert sharded["iterations"] == unsharded["iterations"] == 4, name
                assert max(np.abs(np.array(w) - np.array(u)).max()
                           for w, u in zip(sharded["weights"], unsharded["weights"])) <= 1e-6, name
                assert max(np.abs(np.array(w) - np.array(u)).max()
                           for w, u in zip(sharded["weights"], ref.zero_inputs(0, 1)[0])) > 1e-3, name
                assert sharded["digest"] == reports[0]["cases"][name]["sharded"]["digest"], (name, r["rank"])
                if unsharded["state_bytes"]:   # 1/n of the state (n = 2 ranks per node), plus padding
                    assert 0.5 <= sharded["state_bytes"] / unsharded["state_bytes"] <= 0.51, name
            for epoch in (0, 1):   # hitopk, then 2dtar: the bytes counted on 4 ranks = 4 x 2 steps x formula
                counted = {link: sum(r["cases"][name]["sharded"]["counted"][epoch][link] for r in reports)
                           for link in ("intra", "inter")}
                formula = reports[0]["cases"][name]["sharded"]["formula"][epoch]
                assert counted == pytest.approx({link: 8 * formula[link] for link in counted}, rel=1e-12), (name, epoch)
                plain = reports[0]["cases"][name]["unsharded"]["formula"][epoch]
                assert formula["inter"] == pytest.approx(plain["inter"]), (name, epoch)   # nothing more between nodes
    assert len({r["uneven_runs"] for r in reports}) == 1   # graphs that differ by rank: one named all-gather
    # local rank l = rank % 2 owns [l*s, (l+1)*s) of each bucket padded to 2*s (sparse group, dense group)
    for r in reports:
        l = r["rank"] % 2
        assert all(start == l * s and dp == 2 * s for dp, start, s in r["slices"]), r["slices"]


def test_the_sharded_state_whole_moves_to_another_slicing(on_2x2):
    """sharded_full_state (what tf_commlib.elastic keeps at a commit): Adam's moments gathered from the
    slices of 4 ranks equal the unsharded optimizer's, on every rank; loaded into slices over a node's 2
    ranks and gathered back, they are unchanged."""
    for r in on_2x2:
        got = r["full_state"]
        assert got["slots"] == ["momentum", "velocity"] and got["shapes"] == [list(s) for s in ref.ZERO_SHAPES]
        assert got["vs_unsharded"] <= 1e-6 and got["nonzero"], got
        assert got["gathered_back"] == 0, got
        assert got["slices"] != got["node_slices"]   # 4-way over all ranks, then 2-way over the node


def test_16_bit_weight_deltas(on_2x2):
    reports = [r["compression"] for r in on_2x2]
    weights = ref.zero_inputs(0, 1)[0]
    exact = [np.array(w) for w in reports[0]["exact_one"]["weights"]]
    for compression, rel, absolute in (("fp16", 2.0 ** -11, 2.0 ** -25), ("bf16", 2.0 ** -8, 0.0)):
        for r in reports:
            got = [np.array(w) for w in r[compression]["one"]["weights"]]
            for g, e, w in zip(got, exact, weights):
                delta = np.abs(w - e)
                err = np.abs(g - e)
                # the delta's rounding, and float32's in w - delta
                assert np.all(err <= delta * rel + absolute + 2.0 ** -23 * np.abs(w)), compression
            assert max(np.abs(g - e).max() for g, e in zip(got, exact)) > 0, compression   # it was rounded
            assert r[compression]["three"]["digest"] == reports[0][compression]["three"]["digest"]
        counted = {link: sum(r[compression]["one"]["counted"][link] for r in reports) for link in ("intra", "inter")}
        formula = reports[0][compression]["one"]["formula"]
        assert counted == pytest.approx({link: 4 * formula[link] for link in counted}, rel=1e-12)
        # 16-bit bytes: half of float32's (the norm exchange stays float32)
        assert sum(reports[0][compression]["one"]["formula"].values()) < 0.6 * sum(reports[0]["exact_one"]["formula"].values())


def test_argument_errors():
    with pytest.raises(ValueError, match="shard_optimizer must be True or False"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="dense", shard_optimizer=1)
    # one dense / 2dtar algorithm: sharded over all ranks; anything else over the ranks of a node
    for kwargs, world in (({"algorithm": "hitopk"}, False), ({"algorithm": "auto"}, False),
                          ({"algorithm": "dense", "schedule": {0: "dense", 2: "2dtar"}}, False),
                          ({"algorithm": "dense", "selection": Selection(qrgc=True), "schedule": {0: "hitopk"}}, False),
                          ({"algorithm": "2dtar"}, True), ({"algorithm": "dense", "compression": "fp16"}, True)):
        dist = DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer=True, **kwargs)
        assert world_sharded(dist.schedule) is world, kwargs
    for opt in (keras.optimizers.RMSprop(0.1), keras.optimizers.Lamb(0.1), keras.optimizers.Nadam()):
        with pytest.raises(ValueError, match=f"shard_optimizer: {type(opt).__name__} has no slice-wise form") as e:
            DistributedOptimizer(opt, algorithm="dense", shard_optimizer=True, dgc=DGC(momentum_correction=False))
        assert SUPPORTED in str(e.value)
    for kwargs in ({"clipnorm": 1.0}, {"clipvalue": 1.0}, {"global_clipnorm": 1.0}, {"use_ema": True},
                   {"gradient_accumulation_steps": 2}):
        with pytest.raises(ValueError, match=f"shard_optimizer does not support the wrapped optimizer's {next(iter(kwargs))}"):
            DistributedOptimizer(keras.optimizers.SGD(0.1, **kwargs), algorithm="dense", shard_optimizer=True)
    for opt in (keras.optimizers.SGD(0.1), keras.optimizers.Adam(), keras.optimizers.AdamW(), pto.LARS(0.1), pto.LAMB()):
        dist = DistributedOptimizer(opt, algorithm="2dtar", shard_optimizer=True, dgc=DGC(momentum_correction=False))
        config = dist.get_config()
        assert config["shard_optimizer"] is True
        assert DistributedOptimizer.from_config(config).shard_optimizer is True
    assert DistributedOptimizer(keras.optimizers.SGD(0.1)).get_config()["shard_optimizer"] is False


@pytest.mark.parametrize("schedule, share", [("2dtar", 0.26), ("hitopk,2dtar", 0.51)])
def test_fit_sharded_lars_resume_and_other_layout(schedule, share, request):
    """model.fit, interrupted and resumed from BackupAndRestore, ends where an uninterrupted fit
    does; with hitopk for epoch 0 then 2dtar, interrupted after epoch 0, so the resumed run starts
    at the switch with the restored residuals and slices."""
    reports = [r[f"fit {schedule}"] for r in request.getfixturevalue("on_2x2")]
    for r in reports:
        assert r["full"] == reports[0]["full"]               # replicas bit-identical after model.fit
        assert r["resumed"] == r["full"] != r["interrupted"]   # resume equals uninterrupted, bit for bit
        assert r["iterations"] == 3 * 96 // 16
        assert r["state_bytes"] <= share * r["weights_bytes"]   # LARS's velocity: this rank's slices
        assert r["loss"][-1] < r["loss"][0]
    if schedule != "2dtar":
        return
    for r in request.getfixturevalue("on_1x4"):   # the 2dtar backups, resumed on 1x4
        assert "shard_optimizer state loads only into the same world size, layout and schedule kind" in \
            r["load_elsewhere"]["error"]
