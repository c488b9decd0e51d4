"""The tests' layer over tfc_apps.local_run (the one launcher): runs a worker module
(tests/workers/<name>.py, as ``python -m tests.workers.<name>``) or any command on N local ranks
with horovodrun (Gloo), or through tfc_apps.cluster_launch, and collects each rank's JSON.

A worker calls ``report(rank, obj)`` (tests/workers/_report.py) to write ``rank<R>.json`` into
$HVD_TEST_OUT. A run that exceeds its timeout has its ranks killed (local_run.kill_ranks: then
anything left in its process group) and fails the test; it never hangs CI. Jobs see no GPU."""
import json
from pathlib import Path

from tfc_apps import local_run
from tfc_apps.local_run import ROOT

WORKERS = Path(__file__).resolve().parent / "workers"
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
kill_ranks = local_run.kill_ranks   # stops a job from launch() (kill and resume tests)


def worker_argv(worker, args=()):
    """``python`` arguments that run tests/workers/<worker> (a file name) as a module."""
    return ["-m", f"tests.workers.{worker.removesuffix('.py')}", *map(str, args)]


def launch(argv, np_, topology=None, env=None, cwd=None):
    """Starts ``python argv...`` on np_ local ranks under horovodrun (Gloo), in its own process
    group, output (stdout and stderr) in a pipe; np_=None runs it as one plain process."""
    return local_run.start(argv, np_, topology=topology, env={**NO_GPU, **(env or {})}, cwd=cwd)


def output(proc, timeout, what):
    """proc's output once it exits; past the timeout its ranks are killed and the test fails."""
    try:
        return local_run.wait(proc, timeout)
    except local_run.JobTimeout as e:
        raise AssertionError(f"{what} timed out after {timeout}s:\n{e.log[-4000:]}") from None


def run_command(argv, np_, timeout, topology=None, env=None):
    """Runs ``launch(argv, np_, ...)`` to its end; returns its output; fails the test if it times out
    (its ranks killed) or exits non-zero."""
    proc = launch(argv, np_, topology, env)
    what = " ".join(map(str, argv[:3]))
    log = output(proc, timeout, what)
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{log[-6000:]}"
    return log


def _reports(out, ranks, log):
    reports = []
    for r in ranks:
        path = out / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no report:\n{log[-4000:]}"
        reports.append(json.loads(path.read_text()))
    return reports


def run(worker, np_, tmp_path, args=(), topology=None, timeout=240, env=None, expect_fail=False):
    """Runs tests/workers/<worker> on np_ ranks; returns the list of per-rank reports (rank order)."""
    out = Path(tmp_path) / f"hvd_{worker.removesuffix('.py')}"
    out.mkdir(parents=True, exist_ok=True)
    # from the repository root: `-m tests.workers.x` finds this checkout's tests/ (the cwd is first on sys.path)
    proc = launch(worker_argv(worker, args), np_, topology, {"HVD_TEST_OUT": str(out), **(env or {})}, cwd=ROOT)
    log = output(proc, timeout, f"{worker} on {np_} ranks")
    if expect_fail:
        assert proc.returncode != 0, f"{worker} was expected to fail:\n{log[-4000:]}"
        return log
    assert proc.returncode == 0, f"{worker} failed (exit {proc.returncode}):\n{log[-6000:]}"
    return _reports(out, range(np_), log)


def run_cluster(worker, tmp_path, args=(), local=None, np_per_node=None, timeout=240, env=None):
    """Runs tests/workers/<worker> through tfc_apps.cluster_launch: on the namespaces made by
    scripts/emulate_cluster.sh, or with ``local=M`` on 127.0.0.1. Returns (reports, log)."""
    out = Path(tmp_path) / f"cluster_{worker.removesuffix('.py')}"
    out.mkdir(parents=True, exist_ok=True)
    launcher = local_run.cluster_launch_prefix(local, np_per_node, timeout)
    proc = local_run.start(worker_argv(worker, args), launcher=launcher, cwd=ROOT,
                           env={**NO_GPU, "HVD_TEST_OUT": str(out), **(env or {})})
    # the launcher enforces the timeout itself (exit 124); this is a backstop that kills the ranks
    log = output(proc, timeout + 30, f"cluster_launch of {worker}")
    assert proc.returncode == 0, f"{worker} failed (exit {proc.returncode}):\n{log[-6000:]}"
    ranks = sorted(int(p.stem[4:]) for p in out.glob("rank*.json"))
    assert ranks == list(range(len(ranks))) and ranks, f"missing rank reports {ranks}:\n{log[-4000:]}"
    return _reports(out, ranks, log), log


# Workers of several test modules that need nothing of their launch but its layout: per layout, one
# job runs them one after another (tests/workers/sequence_worker.py), one launch (~25 s of
# TensorFlow imports and Gloo set-up on 2 cores) instead of one per module. In this order on 2x2:
# aggregator runs every registered collective before interface registers two of its own (removed
# when it ends: calibrate chooses among every registered one);
# consistency, whose ranks go out of step on purpose, last.
# layout -> case -> (worker, its arguments, the test module that reads its reports, timeout in s).
SHARED = {
    "2x2": {"aggregator": ("aggregator_worker.py", [], "test_aggregator", 240),
            "interface": ("interface_worker.py", [], "test_collective_interface", 240),
            "calibrate": ("calibrate_worker.py", [], "test_costmodel", 120),
            "codec": ("codec_worker.py", [], "test_value_codec", 240),
            "rank_state": ("rank_state_worker.py", [], "test_checkpoint", 500),
            "consistency": ("consistency_worker.py", [], "test_out_of_step", 300)},
    "1x4": {"collectives": ("collectives_worker.py", [], "test_collectives", 240),
            "powersgd": ("powersgd_worker.py", [], "test_powersgd", 240),
            "pto_all": ("pto_worker.py", ["all"], "test_pto_ranks", 500)},
    "1x2": {"adaptive_hitopk": ("adaptive_worker.py", ["hitopk"], "test_adaptive_density", 300),
            "checkpoint": ("checkpoint_worker.py", [], "test_checkpoint", 600),
            "backup": ("backup_worker.py", [], "test_checkpoint", 600),
            "dgc": ("dgc_worker.py", [], "test_keras_optimizer", 240),
            "epoch_policy": ("epoch_policy_worker.py", [], "test_keras_optimizer", 240)},
    "3x1": {"collectives": ("collectives_worker.py", [], "test_collectives", 240),
            "artopk": ("artopk_worker.py", [], "test_artopk", 400),
            "pto_map": ("pto_worker.py", ["map"], "test_pto_ranks", 240)},
}


def run_shared(layout, tmp_path, modules):
    """SHARED[layout]'s cases of the test modules in `modules` (those this session runs), in one job
    on that layout: {case: per-rank reports}."""
    from tests.workers.sequence_worker import cases_file

    chosen = {name: spec for name, spec in SHARED[layout].items() if spec[2] in modules}
    if not chosen:
        return {}
    cases = {name: (f"tests.workers.{worker.removesuffix('.py')}", args, None)
             for name, (worker, args, _, _) in chosen.items()}
    m, n = map(int, layout.split("x"))
    reports = run("sequence_worker.py", m * n, tmp_path, args=[cases_file(tmp_path, cases)], topology=layout,
                  timeout=sum(spec[3] for spec in chosen.values()))
    return {name: [r[name] for r in reports] for name in chosen}
