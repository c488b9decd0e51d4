"""tf_commlib.elastic on Horovod's own elastic driver: a real ``horovodrun --min-np 2 --max-np 4
--host-discovery-script`` job on this machine, two host names (localhost and this machine's name, 2 slots
each: Horovod runs a host without ssh where its address is one of this machine's). One host's ranks are
SIGKILLed mid-epoch; the survivors roll back to their last commit and go on as 2 ranks; the host is
listed again and its new ranks join. The layout and its process sets follow the hosts (2x2, 1x2, 2x2)
and the hierarchical 2DTAR runs on them, with SGD-momentum's update sharded over the ranks (its momentum
moves whole between the layouts).
Checked against numpy: the committed steps cover every epoch's samples once, and SGD-momentum over them
gives the weights every live rank ends with. Also: the state's commit loaded into a rebuilt model and optimizer,
`tfc_apps.train --elastic`, and its refusal outside an elastic job."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import hvdrun
from tests.workers import elastic_worker as worker
from tfc_apps import local_run
from tfc_apps.elastic_local import ElasticJob

pytestmark = pytest.mark.multiprocess


def _events(out):
    path = out / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _replay(steps, momentum=0.0):
    """SGD (Keras' momentum form) on the committed steps: at (epoch, offset, size) the mean gradient of
    the size * BATCH samples after offset in that epoch's order (what the ranks' dense average is)."""
    x, y = worker.data()
    w, v = np.zeros(worker.DIM, np.float64), np.zeros(worker.DIM, np.float64)
    for epoch, offset, size in steps:
        idx = worker.order(epoch)[offset:offset + size * worker.BATCH]
        xb, yb = x[idx].astype(np.float64), y[idx].astype(np.float64)
        v = momentum * v - worker.LR * xb.T @ (xb @ w - yb) / len(idx)
        w += v
    return w


def test_a_lost_node_leaves_the_others_training_and_it_rejoins(tmp_path):
    epochs = 8
    job, out = _job(tmp_path, hvdrun.worker_argv("elastic_worker.py", ["2dtar", epochs, 0.15, "sharded"]))

    def event(until):
        return next((r for r in _events(out) if until(r)), None)

    try:
        job.wait_for("second commit on 4 ranks", lambda: event(
            lambda r: r["kind"] == "commit" and r["size"] == 4 and (r["epoch"], r["offset"]) >= (0, 48)), 240)
        killed = job.drop_second_host()
        resumed = job.wait_for("restart on 2 ranks", lambda: event(
            lambda r: r["kind"] == "train" and r["size"] == 2 and r["t"] > killed), 180)
        job.wait_for("commit on 2 ranks", lambda: event(lambda r: r["kind"] == "commit" and r["size"] == 2), 60)
        listed = job.list_both()
        joined = job.wait_for("restart on 4 ranks after the host was listed again", lambda: event(
            lambda r: r["kind"] == "train" and r["size"] == 4 and r["t"] > listed), 240)
        _finish(job, 300)
    finally:
        job.stop()
    log = job.log()
    reports = hvdrun._reports(out, range(4), log)
    print(f"survivors stepped again {resumed['t'] - killed:.1f} s after the kill; the host's ranks "
          f"joined {joined['t'] - listed:.1f} s after it was listed again")

    steps = reports[0]["steps"]
    assert all(r["steps"] == steps and r["size"] == 4 for r in reports)
    assert all(r["link"] == "horovod" for r in reports)   # not shared memory: it sees a dead peer only at its timeout
    assert [s for _, _, s in steps].count(2) > 0 and steps[-1][2] == 4   # ran on 2 ranks, ended on 4
    for epoch in range(epochs):   # every epoch's samples once: nothing lost or doubled by the rollback
        used = [i for e, offset, size in steps if e == epoch
                for i in worker.order(epoch)[offset:offset + size * worker.BATCH]]
        assert sorted(used) == list(range(worker.N)), f"epoch {epoch}"
    assert all(r["iterations"] == len(steps) for r in reports)   # the steps applied are the committed ones
    weights = np.array([r["weights"] for r in reports])
    assert np.abs(weights - weights[0]).max() == 0   # every live rank the same
    # with momentum, sharded over the ranks: exact only if every reset kept the momentum whole
    np.testing.assert_allclose(weights[0], _replay(steps, worker.MOMENTUM), rtol=1e-4, atol=1e-5)
    # the rollback: the survivors resumed from their last commit before the kill, on the new layout
    commits = [(r["epoch"], r["offset"]) for r in _events(out) if r["kind"] == "commit" and r["t"] < killed]
    assert (resumed["epoch"], resumed["offset"]) >= max(commits)
    # the topology and its process sets made anew at each restart, from the hosts alive: 2x2, 1x2, 2x2
    first = event(lambda r: r["kind"] == "train" and r["size"] == 4)
    sets_2x2 = [[0, 1], [0, 2], [1, 3], [2, 3]]   # the nodes' intra sets, the local indices' inter sets
    assert (first["layout"], first["sets"]) == ([2, 2], sets_2x2), first
    assert (resumed["layout"], resumed["sets"]) == ([1, 2], [[0], [1]]), resumed   # one node: one-rank inter sets
    assert resumed["intra"] == [0, 1] and resumed["inter"] == [resumed["rank"]]
    assert resumed["set_ids"][0] == 0   # the node's set is the world: Horovod's global set
    assert (joined["layout"], joined["sets"]) == ([2, 2], sets_2x2), joined


def test_a_survivor_is_released_when_the_survivor_it_waits_on_sees_the_loss(tmp_path):
    """Rank 1 (on rank 0's host) waits on rank 0's broadcast (tests/workers/lost_peer_worker.py); the
    other host's ranks are SIGKILLed. Rank 0 sees the loss; closing its connections as its Horovod ends
    releases rank 1 at once, rather than after the Gloo timeout (10 minutes here, past this test's waits).
    Without that (a Horovod without third_party/horovod_patches/process-set-finalize-closes-connections.patch)
    this test times out unless the kill lands in a step's own allreduce."""
    job, out = _job(tmp_path, hvdrun.worker_argv("lost_peer_worker.py"),
                    {"HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_GLOO_TIMEOUT_SECONDS": "600"})
    try:
        starts = job.wait_for("4 ranks stepping", lambda: (
            lambda rows: rows if len([r for r in rows if r["kind"] == "step"]) == 4 else None)(_events(out)), 180)
        host = {r["rank"]: r["host"] for r in starts if r["kind"] == "start"}
        assert sorted(host) == [0, 1, 2, 3] and host[1] == host[0] and host[2] == host[3] != host[0], starts
        time.sleep(2)   # stepping on 4 ranks
        killed = job.drop_host(next(h for h in host.values() if h != host[0]))
        resets = job.wait_for("both survivors' reset", lambda: (lambda rows: rows if len(rows) == 2 else None)(
            [r for r in _events(out) if r["kind"] == "reset"]), 150)
        _finish(job, 120)
    finally:
        job.stop()
    assert sorted((r["rank"], r["size"]) for r in resets) == [(0, 2), (1, 2)], resets
    print(f"the survivors started again {max(r['t'] for r in resets) - killed:.1f} s after the kill")
    assert [r["size"] for r in hvdrun._reports(out, range(2), job.log())] == [2, 2]


def _job(tmp_path, argv, env=None):
    out = tmp_path / "out"
    out.mkdir()
    job = ElasticJob(str(tmp_path), argv, env={"HVD_TEST_OUT": str(out), **(env or {})})
    return job, out


def _finish(job, timeout):
    rc = job.finish(timeout)
    assert rc == 0, f"elastic job failed (exit {rc}):\n{job.log()}"


def _drop_and_list_again(job, due):
    """Once due() returns: the second host's ranks killed, the survivors' restart as 1x2 awaited, the host
    listed again, and the job's exit 0 awaited."""
    try:
        due()
        job.drop_second_host()
        job.wait_for("restart on 2 ranks", lambda: job.line("2 ranks as 1x2"), 180)
        job.list_both()
        _finish(job, 400)
    finally:
        job.stop()


def test_train_elastic_goes_on_without_a_lost_node(tmp_path):
    """`tfc_apps.train --elastic` (the small residual network, as bench faults runs it): model.fit under
    tf_commlib.elastic; one host's ranks killed after the first epoch, the other two go on and the host
    joins again once listed."""
    summary = tmp_path / "summary.json"
    job, _ = _job(tmp_path, ["-m", "tfc_apps.train", "--elastic", "--model", "resnet", "--algorithm", "dense", "--epochs", "3",
                             "--commit-every", "5", "--json", str(summary)])
    _drop_and_list_again(job, lambda: job.wait_for("first epoch", lambda: job.line("epoch   1"), 240))
    result = json.loads(summary.read_text())
    restarts = result["restarts"]
    assert [(r["m"], r["n"]) for r in restarts][:2] == [(2, 2), (1, 2)], restarts
    assert all(r["started"] <= r["first_step"] for r in restarts[:2])   # (a join at the last commit steps no more)
    assert result["steps_run"] >= result["steps"]   # rank 0's steps, the rolled-back ones too
    assert [row["epoch"] for row in result["epochs"]] == [1, 2, 3]
    assert result["epochs"][-1]["test_accuracy"] > 0.8


def test_state_refuses_what_is_not_json():
    from tf_commlib import elastic

    with pytest.raises(TypeError):
        elastic.State(epoch=object())
    state = elastic.State(epoch=0)
    with pytest.raises(TypeError):
        state["epoch"] = {1, 2}
    with pytest.raises(ValueError, match="state must be a tf_commlib.elastic.State"):
        elastic.run(lambda s: None)({"epoch": 0})


def _optimizer(kind):
    import keras

    from tf_commlib.keras import DGC, DiLoCo, DistributedOptimizer, Selection, with_loss_scale

    sgd = keras.optimizers.SGD(0.05, momentum=0.9)
    kernels = Selection(dense_layers=lambda v: len(v.shape) <= 1)   # the kernels through the lossy collective
    if kind in ("loss_scaled", "mixed_float16"):   # what compile makes under mixed_float16, around hitopk
        return with_loss_scale(keras.optimizers.LossScaleOptimizer(sgd), algorithm="hitopk", density=0.25,
                               selection=kernels)
    if kind == "diloco":
        return DiLoCo(sgd, sync_every=2)
    if kind == "sharded":   # the momentum in the sharded update's slices
        return DistributedOptimizer(sgd, algorithm="dense", shard_optimizer=True, dgc=DGC(momentum_correction=False))
    return DistributedOptimizer(sgd, algorithm=kind, density=0.25, selection=kernels)


@pytest.mark.parametrize("kind", ["dense", "hitopk", "powersgd", "diloco", "sharded", "loss_scaled", "mixed_float16"])
def test_a_commit_loads_into_a_rebuilt_model_and_optimizer(kind, request):
    """bind() of a fresh model and optimizer (as train() builds them after a reset) gives them the values
    of the last commit: the weights and every optimizer variable (the wrapped optimizer's momentum, the
    step count, DiLoCo's start weights, this rank's residuals and DGC momentum), against the numpy copies
    taken at the commit; the steps after the commit are undone."""
    import keras
    import tensorflow as tf

    import tf_commlib
    from tf_commlib import elastic

    tf_commlib.init()
    rng = np.random.default_rng(3)
    if kind == "mixed_float16":   # the policy of every GPU machine: float16 compute, float32 variables
        policy = keras.mixed_precision.global_policy()
        request.addfinalizer(lambda: keras.mixed_precision.set_global_policy(policy))
        keras.mixed_precision.set_global_policy("mixed_float16")

    def built():
        keras.utils.set_random_seed(5)
        # 40x32: a kernel PowerSGD compresses (over its min_compression_size)
        model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(32), keras.layers.Dense(4)])
        return model, _optimizer(kind)

    def train(model, opt, steps):
        for _ in range(steps):
            x, y = rng.standard_normal((8, 40)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((tf.cast(model(x), tf.float32) - y) ** 2)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    model, opt = built()
    train(model, opt, 3)
    state = elastic.State(epoch=0)
    state.bind(model, opt)
    committed = [v.numpy().copy() for v in model.weights], [v.numpy().copy() for v in opt.variables]
    state["epoch"] = 1
    train(model, opt, 2)
    state.restore()
    assert state["epoch"] == 0
    fresh, fresh_opt = built()
    state.bind(fresh, fresh_opt)
    for v, want in zip(fresh.weights, committed[0]):
        np.testing.assert_array_equal(v.numpy(), want)
    got = [v.numpy() for v in fresh_opt.variables]
    assert len(got) == len(committed[1])
    for g, want, v in zip(got, committed[1], fresh_opt.variables):   # all of it, per-rank state too
        np.testing.assert_array_equal(g, want, err_msg=v.path)
    inner = {id(v) for v in elastic.optimizer_chain(fresh_opt)[-1].variables}   # the wrapped plain optimizer
    assert [i for i, v in enumerate(fresh_opt.variables) if id(v) in inner and committed[1][i].any()]
    assert int(fresh_opt.iterations.numpy()) == 3
    per_rank = [i for i, v in enumerate(fresh_opt.variables) if "residual" in v.path or "dgc_momentum" in v.path]
    if kind in ("hitopk", "powersgd", "loss_scaled", "mixed_float16"):   # this rank's own residuals and DGC momentum
        assert per_rank and all(committed[1][i].any() for i in per_rank)
    if kind == "sharded":   # the slices of the momentum: from the commit's whole state, not zero
        slots = [i for i, v in enumerate(fresh_opt.variables) if v.path.endswith("shard_momentum")]
        assert slots and all(got[i].any() and np.array_equal(got[i], committed[1][i]) for i in slots)


def test_train_elastic_needs_horovods_elastic_mode():
    """`tfc_apps.train --elastic` outside an elastic horovodrun job (no --host-discovery-script) is refused
    before anything starts, naming what is missing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    done = subprocess.run([sys.executable, "-m", "tfc_apps.train", "--elastic"], capture_output=True, text=True,
                          cwd=local_run.ROOT, env={**env, **hvdrun.NO_GPU}, timeout=120)
    assert done.returncode == 2 and "--elastic needs horovodrun's elastic mode: --host-discovery-script" in done.stderr


def test_a_commit_of_another_layout_keeps_the_wrapped_optimizers_state():
    """Where the rebuilt optimizer's variables differ in number or shape from the commit's (its residuals
    follow the layout and the buckets), bind gives it the wrapped optimizer's committed state (step count,
    momentum) and this rank's own DGC momentum; where only their shapes differ, every variable of the same
    shape too, and the residual what this rank owes (across real layouts:
    test_per_rank_state_moves_to_another_layout)."""
    import keras
    import tensorflow as tf

    import tf_commlib
    from tf_commlib import elastic
    from tf_commlib.keras import DistributedOptimizer, Selection

    tf_commlib.init()

    def built():
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32), keras.layers.Dense(4)])
        return model, DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="hitopk",
                                           density=0.25, selection=Selection(dense_layers=lambda v: len(v.shape) <= 1))

    model, opt = built()
    x, y = np.ones((8, 16), np.float32), np.zeros((8, 4), np.float32)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    state = elastic.State()
    state.bind(model, opt)
    inner = [v.numpy().copy() for v in opt.inner_optimizer.variables]
    models, arrays = state._saved_arrays   # as committed on a layout whose residuals were one more
    state._saved_arrays = (models, arrays + [np.ones(7, np.float32)])
    fresh, fresh_opt = built()
    state.bind(fresh, fresh_opt)
    for v, want in zip(fresh_opt.inner_optimizer.variables, inner):
        np.testing.assert_array_equal(v.numpy(), want)
    assert int(fresh_opt.iterations.numpy()) == 3 and any(w.any() for w in inner[1:])
    for v, want in zip(fresh_opt.velocities, state._saved_rank["momentum"]):   # per-rank state: this rank's own
        np.testing.assert_array_equal(v.numpy(), want)
    assert any(m.any() for m in state._saved_rank["momentum"])
    # the same variables, a residual of another length (hitopk's shard on a node of 2): every other one the
    # commit's (the aggregator's step and algorithm too), the residual this rank's own debt
    paths = [v.path for v in opt.variables]
    at = next(i for i, p in enumerate(paths) if "residual" in p)
    state._saved_arrays = (models, arrays[:at] + [np.ones(arrays[at].size // 2 + 1, np.float32)] + arrays[at + 1:])
    again, again_opt = built()
    state.bind(again, again_opt)
    for i, (v, want) in enumerate(zip(again_opt.variables, arrays)):
        if i != at and "dgc_momentum" not in v.path:
            np.testing.assert_array_equal(v.numpy(), want, err_msg=v.path)
    owed = np.concatenate([o.ravel() for o in state._saved_rank["owed"] if o is not None])
    assert owed.any() and sorted(np.abs(again_opt.variables[at].numpy())) == sorted(np.abs(owed))


def test_per_rank_state_moves_to_another_layout(tmp_path):
    """What each rank owes the sum (its residuals in input space) and its DGC momentum, taken on 2x2 and
    loaded on 1x4 and 4x1 (Horovod started again, as at a reset), rank 3 loading none as a rank that
    joined: per variable, the ranks' owed adds up to what ranks 0-2 owed on 2x2 (hitopk's node shards are
    reduce-scattered on 1x4: rank 3 then holds its shard of it), each rank's momentum is its own, PowerSGD's
    Q starts again at zero on every rank; for hitopk, PowerSGD, naive_ag and auto (hitopk running among
    the residuals of its candidates)."""
    from tests.workers import rank_state_move_worker as move

    reports = hvdrun.run("rank_state_move_worker.py", 4, tmp_path, timeout=300)
    for algorithm in move.ALGORITHMS:
        before = [r["2x2"][algorithm] for r in reports]
        owes = [i for i, o in enumerate(before[0]["owed"]) if o is not None]
        assert owes and any(np.any(before[0]["owed"][i]) for i in owes), algorithm   # the kernels: lossy
        for layout, n in (("2x2", 2), ("1x4", 4), ("4x1", 1)):
            after = [r[layout][algorithm] for r in reports]
            shard = -(-1452 // n)   # the 40x33 and 33x4 kernels, one bucket; hitopk keeps a shard of the node's sum
            lengths = {"hitopk": [shard], "powersgd": [1584], "naive_ag": [1452], "auto": [shard, 1584]}[algorithm]
            assert after[0]["residuals"] == lengths, (algorithm, layout)
            if layout == "2x2":
                continue
            assert [a["dropped"] for a in after] == [0] * 4, (algorithm, layout)
            for i in owes:
                owed = sum(np.array(b["owed"][i], np.float64) for b in before[:move.JOINED])
                got = sum(np.array(a["owed"][i], np.float64) for a in after)
                np.testing.assert_allclose(got, owed, rtol=0, atol=1e-6, err_msg=f"{algorithm} {layout} {i}")
            if n == 1:   # a whole vector per rank: the joined rank owes nothing
                assert not any(np.any(o) for o in after[move.JOINED]["owed"] if o is not None), (algorithm, layout)
            for rank, a in enumerate(after):
                zero = [np.zeros_like(m) for m in before[0]["momentum"]]
                want = before[rank]["momentum"] if rank != move.JOINED else zero
                assert all(np.array_equal(g, w) for g, w in zip(a["momentum"], want)), (algorithm, layout, rank)
                assert a["beyond"] == 0.0, (algorithm, layout, rank)   # PowerSGD's Q zero: alike on every rank
    assert max(r["2x2"]["powersgd"]["beyond"] for r in reports) > 0   # it had a Q before


@pytest.mark.parametrize("printed, expected", [
    ("this is not a host list", "printed 'this is not a host list' on line 1: expected one host:slots a line"),
    ("localhost:2\nnode1:many", "printed 'node1:many' on line 2"),
    ("localhost", "(no slots: give --slots-per-host)"),
])
def test_a_discovery_script_that_prints_garbage_is_refused(tmp_path, printed, expected):
    """tfc_apps.horovodrun runs the discovery script once before the launch: a line that is not host:slots
    exits with status 2 naming it (Horovod's driver took it for a host and failed with a TypeError); so
    does a script that fails."""
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nprintf '{printed}\\n'\n")
    script.chmod(0o700)
    failing = tmp_path / "failing.sh"
    failing.write_text("#!/bin/sh\necho 'no inventory' >&2\nexit 3\n")
    failing.chmod(0o700)
    for path, want in ((script, expected), (failing, "exited with status 3: no inventory")):
        done = subprocess.run([sys.executable, "-m", "tfc_apps.horovodrun", "-np", "2", "--min-np", "2",
                               "--host-discovery-script", str(path), "--gloo", sys.executable, "-c", "pass"],
                              capture_output=True, text=True, cwd=local_run.ROOT, timeout=120)
        assert done.returncode == 2 and want in done.stderr, done.stderr[-2000:]


def _replay_reads(source, seed, epoch, parts):
    """The samples each part of an epoch read (datacache's own replay of done= parts): every rank's
    first `samples` of its order under `count` shards of what the earlier parts left."""
    from datacache.shards import _Shard

    reads = []
    for k, (count, samples) in enumerate(parts):
        for rank in range(count):
            shard = _Shard(len(source), rank, count, seed, False, True, seed, source.labels, None, parts[:k],
                           epoch)
            reads.extend(shard.order(epoch)[:samples].tolist())
    return reads


@pytest.mark.timeout(900)
def test_dawnbench_elastic_resumes_an_epoch_on_the_samples_left(tmp_path):
    """The DAWNBench script's --elastic on digits through DataCache: one host's ranks killed mid-epoch,
    the two others finish that epoch on the samples no rank read (re-dealt among them), the host joins
    again. Every epoch reads each sample at most once and as many as an uninterrupted one (up to one
    global batch), every stage's epochs are in the report, and the run learns."""
    import datacache
    from tfc_apps.digits import write_image_folder

    digits = write_image_folder(str(tmp_path / "digits"), size=32)
    log_dir = tmp_path / "log"
    job, _ = _job(tmp_path, ["-m", "tfc_apps.dawnbench", "--elastic", "--data", digits, "--model", "small",
                             "--stages", "16:2:16,20:3:16", "--schedule", "0:2dtar", "--optimizer", "sgd", "--lr",
                             "0.2", "--warmup-epochs", "1", "--label-smoothing", "0",
                             "--commit-every", "3", "--target-top5", "0.9", "--log-dir", str(log_dir)])
    def into_epoch_4():
        # epoch 2's row is written as epoch 3 ends (its evaluation overlaps epoch 3); epoch 4 runs in the
        # same fit (no set-up before its first step)
        job.wait_for("epoch 2's report", lambda: job.line('{"epoch": 2,'), 300)
        row = next(line for line in job.lines if '{"epoch": 2,' in line)
        time.sleep(0.4 * json.loads(row[row.index("{"):])["epoch_s"])

    _drop_and_list_again(job, into_epoch_4)
    summary = json.loads((log_dir / "elastic.json").read_text())
    restarts = summary["restarts"]
    assert [(r["m"], r["n"]) for r in restarts][:2] == [(2, 2), (1, 2)], restarts
    cut = restarts[1]
    assert cut["done"] and cut["done"][0][0] == 4, f"the kill did not land mid-epoch: {restarts}"
    source = datacache.ImageFolderSource(f"{digits}/train")
    n, per_epoch = len(source), [row["parts"] for row in summary["read"]]
    assert len(per_epoch) == 5
    plain = (n // 4 // 16) * 16 * 4   # an epoch's samples on 4 ranks of batch 16
    for epoch, parts in enumerate(per_epoch, start=1):
        reads = _replay_reads(source, 0, epoch, parts)
        assert len(reads) == len(set(reads)), f"epoch {epoch} read a sample twice: {parts}"
        assert plain - 4 * 16 < len(reads) <= plain, (epoch, parts)
    assert any(len(parts) > 1 for parts in per_epoch)   # the epoch that two layouts read
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["top1"] > 0.5, rows
    assert "weights identical on all" in job.log()


def test_auto_carries_what_it_measured_to_another_layout(monkeypatch):
    """What "auto" measured that holds on another layout (compute per step, its overlapped part, a trace's
    cost, each lossy candidate's efficiency, an epoch's steps) goes from an optimizer on 2x2 to one built
    on 1x2, the steps of an epoch doubled (half the ranks take its samples); the link and the measured /
    predicted ratios stay the new layout's, and its choice weighs the candidates with the carried compute."""
    import keras

    from tf_commlib import alphabeta, diloco_sync, replicas
    from tf_commlib.aggregator import Auto
    from tf_commlib.keras import DistributedOptimizer, auto_epoch, optimizer
    from tf_commlib.topology import Topology

    layouts = {"2x2": Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2)),
               "1x2": Topology(m=1, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0,))}
    now = ["2x2"]
    for module in (optimizer, auto_epoch, diloco_sync):
        monkeypatch.setattr(module, "current_topology", lambda: layouts[now[0]])
    monkeypatch.setattr(replicas, "gathered", lambda rows, name: np.repeat(rows, 4, axis=0))

    def built(link):
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1), auto=Auto(cost_params=link, candidates=("2dtar", "hitopk")))
        opt.build([keras.Variable(np.zeros((500, 400), np.float32)), keras.Variable(np.zeros(64, np.float32))])
        return opt

    slow = alphabeta.LinkParams(beta_inter=8 / 100e6)
    before = built(slow)
    auto = before.auto_epochs
    assert auto.compute_s is None and before.auto_measurements()["steps"] is None
    auto.compute_s, auto.overlapped, auto.steps, auto.switch_s = 0.05, 0.5, 40, 1.5
    auto.first_s = {True: 1.7, False: 0.2}
    auto.tta.efficiency = {"hitopk": 0.8}
    auto.tta.observe("2dtar", 0.3, 0.2)   # a ratio of the 2x2 link
    kept = json.loads(json.dumps(before.auto_measurements()))   # as a commit keeps it and a sync sends it
    now[0] = "1x2"
    fast = alphabeta.LinkParams()
    after = built(fast)
    after.load_auto_measurements(kept)
    moved = after.auto_epochs
    assert (moved.compute_s, moved.overlapped, moved.switch_s, moved.first_s) == (0.05, 0.5, 1.5, {True: 1.7, False: 0.2})
    assert moved.tta.efficiency == {"hitopk": 0.8} and moved.steps == 80
    assert moved.tta.ratio == {} and moved.link == fast
    assert moved.step_s("2dtar", after.target_density) > 0.05   # the carried compute, plus this link's collectives
    assert moved.tta.current is None   # none kept: the rebuilt step is traced anew whichever runs
    after.set_epoch(3)   # as the epoch begins: the choice with the carried measurements on this layout's link
    choice = moved.tta.log[-1]
    assert choice["epoch"] == 3 and choice["inputs"]["state"]["efficiency"] == {"hitopk": 0.8}
    assert choice["inputs"]["trace_s"] == 1.5 and choice["inputs"]["state"]["current"] is None
    assert choice["choice"] == moved.tta.current == after.algorithm_at(3)
    assert after.auto_measurements() == {**kept, "steps": 80, "size": 2}
