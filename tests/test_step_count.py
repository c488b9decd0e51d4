"""DiLoCo and the default optimizer train with no callback: the optimizer's own step counts the inner
steps and syncs the nodes every H of them, on 4 ranks as 2x2, against a numpy simulation of DiLoCo
(tests/workers/step_count_worker.py: a linear model, MSE, each rank its own batches)."""
import numpy as np
import pytest

from tests import hvdrun
from tests.workers.step_count_worker import BATCH, D, STEPS, WIDE, data

M, N, LR = 2, 2, 0.05


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return hvdrun.run("step_count_worker.py", 4, tmp_path_factory.mktemp("step_count"), topology="2x2",
                      timeout=400)


def _grad(w, rank, batch):
    """The gradient of mean((x w - y)^2) on a rank's batch."""
    x, y = data(rank, len(w))
    xb, yb = x[batch * BATCH:(batch + 1) * BATCH].astype(np.float64), y[batch * BATCH:(batch + 1) * BATCH, 0]
    return 2.0 * xb.T @ (xb @ w - yb) / BATCH


def diloco(steps, h, batches, outer="nesterov", skip=(), final_sync=True):
    """Every node's weights after `steps` inner SGD steps, the gradients averaged over the node's ranks, a
    sync every h steps (and at the end where final_sync) with the outer optimizer: "nesterov" (Keras SGD lr
    0.7, momentum 0.9, Nesterov: DiLoCo's default) or "average" (lr 1, no momentum). skip: (node, step)
    pairs a node skips (its step is still counted)."""
    start, buf = np.zeros(D), np.zeros(D)
    w = [start.copy() for _ in range(M)]

    def sync():
        nonlocal start, buf
        g = np.mean([start - wk for wk in w], axis=0)
        if outer == "nesterov":
            buf = 0.9 * buf - 0.7 * g
            start = start + 0.9 * buf - 0.7 * g
        else:
            start = start - g
        for k in range(M):
            w[k] = start.copy()

    for i in range(steps):
        for k in range(M):
            if (k, i) not in skip:
                w[k] = w[k] - LR * np.mean([_grad(w[k], k * N + j, batches(i)) for j in range(N)], axis=0)
        if (i + 1) % h == 0:
            sync()
    if final_sync and steps % h:
        sync()
    return w


def _close(got, want, tol=2e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max()), (got, want)


@pytest.mark.slow
def test_a_custom_loop_of_apply_gradients_alone_syncs_every_h_steps(reports):
    """DiLoCo(sync_every=3) stepped only by apply_gradients: 7 steps sync at 3 and 6 by themselves; after
    the 7th the nodes differ by one step; synchronize() ends every rank at the numpy simulation."""
    for r in reports:
        assert r["loop_steps"] == 7 and r["loop_synced_at"] == 6
        _close(r["loop_before_sync"], diloco(7, 3, lambda i: i % STEPS, final_sync=False)[r["node"]])
        _close(r["loop"], diloco(7, 3, lambda i: i % STEPS)[0])
    assert reports[0]["loop_before_sync"] != reports[2]["loop_before_sync"]


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_model_fit_without_callbacks_syncs_and_ends_in_sync(reports, steps_per_execution):
    """model.fit with no callback, 2 epochs of 4 batches, H = 3: syncs at steps 3 and 6 and at fit's end,
    every rank at the numpy simulation, with Keras running one step or two per call."""
    want = diloco(8, 3, lambda i: i % (STEPS // 2))[0]
    for r in reports:
        assert r[f"fit_{steps_per_execution}_steps"] == 8
        _close(r[f"fit_{steps_per_execution}"], want)


@pytest.mark.slow
def test_a_loss_scaled_step_skipped_by_one_node_still_counts(reports):
    """LossScaleOptimizer(DiLoCo(sync_every=4)): rank 0's infinite loss at step 2 makes node 0 skip that
    step (its scale halves, the other node's does not); the step counts on every rank, so the syncs at 4
    and 8 still meet, and every rank ends at the simulation where node 0 skipped step 2."""
    want = diloco(STEPS, 4, lambda i: i % STEPS, skip={(0, 2)})[0]
    for r in reports:
        assert r["skip_steps"] == STEPS
        assert r["skip_scale"] == (4.0 if r["node"] == 0 else 8.0)
        _close(r["skip"], want)
    # the skip changed the result: without it the weights are others
    assert np.abs(np.array(want) - diloco(STEPS, 4, lambda i: i % STEPS)[0]).max() > 1e-4


@pytest.mark.slow
def test_the_default_optimizer_in_a_custom_loop_measures_and_trains_alike_on_every_rank(reports):
    """DistributedOptimizer(SGD) with its defaults ("auto") stepped only by apply_gradients: it measured the
    link and timed its candidates when built (no callback did); every rank holds the same weights, which
    moved towards the least-squares solution. Where auto chose an exact candidate (16 bits on the wire)
    they are synchronous SGD's on the mean gradient of the 4 ranks, to fp16's rounding (on this machine's
    loopback the probe may time hitopk fastest for a 4.8 KB bucket: then its residuals hold back part)."""
    w = np.zeros(WIDE)
    for i in range(STEPS):
        w = w - 0.01 * np.mean([_grad(w, r, i % STEPS) for r in range(M * N)], axis=0)
    assert len({str(r["default"]) for r in reports}) == 1
    measured, probed = reports[0]["default_measured"]
    assert measured and {"dense", "2dtar", "hitopk", "powersgd"} <= set(probed)
    decisions = [d for d in reports[0]["default_log"] if "choice" in d]   # what it chose, and why
    assert decisions[0]["choice"] == reports[0]["default_algorithm"] and decisions[0]["epoch"] == 0
    assert set(decisions[0]["predicted_s"]) >= set(probed)
    got = np.array(reports[0]["default"])

    def loss(v):
        return np.mean([np.mean((data(r, WIDE)[0] @ v - data(r, WIDE)[1][:, 0]) ** 2) for r in range(M * N)])

    assert loss(got) < 0.9 * loss(np.zeros(WIDE))
    if reports[0]["default_algorithm"] in ("dense", "2dtar"):
        _close(got, w, tol=5e-3)
