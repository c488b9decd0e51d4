"""Collective benchmark like shi2021 Figs. 7 and 8: time vs size of every collective in
tf_commlib.collectives.ALGORITHMS against the calibrated cost model, the model's choice against the
fastest measured, and the per-step breakdown of HiTopKComm. Run it on every rank of a Horovod job:

    scripts/emulate_cluster.sh up 2 2 --inter-mbit 500
    python -m tfc_apps.cluster_launch -- .venv/bin/python -m tfc_apps.bench comm [--quick]
    scripts/emulate_cluster.sh down

(or ``horovodrun -np 4 -H localhost:4 --gloo`` with TF_COMMLIB_TOPOLOGY=2x2). Every timed run
starts after a barrier; each rank times it and the run's time is the maximum over the ranks. The
algorithms of one size are timed in interleaved rounds (Timer.interleaved), so that load from
other processes spreads over all of them.
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import tensorflow as tf

import tf_commlib
from tf_commlib import alphabeta, collectives, costmodel, ops
from tfc_apps.bench.common import print_json, print_table
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.collectives import hitopk
from tf_commlib.collectives.error_feedback import unsent
from tf_commlib.collectives.sparse_message import allgather_sparse
from tf_commlib.timing import Timer, ready

DEFAULT_SIZES = [2**20, 2**22, 2**24, 25_000_000, 2**26]
STAGES = ["reducescatter", "select", "inter_allgather", "intra_allgather", "residual"]


def select(x, k):
    return ops.mstopk(x, k, seed=0)


def collective_fn(name, x, topo, density, graph=False):
    """One call of the collective, blocking until all its outputs (for sparse ones: aggregate,
    residual and sent indices) are ready; with graph=True inside tf.function, as in training."""
    algo = ALGORITHMS[name]
    if algo.lossy:
        fn = lambda v: algo.fn(v, topo, algo.scaled(density), select, None)  # noqa: E731
    else:
        fn = lambda v: algo.fn(v, topo)  # noqa: E731
    if graph:
        fn = tf.function(fn)
    return lambda: ready(fn(x))


def staged(steps, timer, repeats, warmup=1):
    """Runs `steps` = [(name, fn(state) -> tensor or tuple of tensors)] in order, each after a
    barrier and timed on its own until its result is ready (timing.ready: one element fetched);
    returns {name: median over runs of the slowest rank's time}."""
    per_step = {name: [] for name, _ in steps}
    for i in range(warmup + repeats):
        state = {}
        for name, fn in steps:
            timer.barrier()
            start = time.perf_counter()
            state[name] = fn(state)
            ready(state[name])
            if i >= warmup:
                per_step[name].append(time.perf_counter() - start)
    flat = [t for name, _ in steps for t in per_step[name]]
    maxed = timer.max_over_ranks(flat).reshape(len(steps), repeats)
    return {name: float(np.median(maxed[j])) for j, (name, _) in enumerate(steps)}


def hitopk_steps(x, topo, density):
    """HiTopKComm (collectives/hitopk.py) step by step, as in shi2021 Fig. 8."""
    d = x.shape[0]
    return [
        ("reducescatter", lambda st: hitopk.reduce_shard(x, topo)),
        ("select", lambda st: tuple(hitopk.select_shard(st["reducescatter"], d, topo, density, select))),
        ("inter_allgather", lambda st: hitopk.inter_gather(*st["select"], topo)),
        ("intra_allgather", lambda st: hitopk.intra_gather(st["inter_allgather"], st["select"][1], d, topo,
                                                      density)),
        ("residual", lambda st: unsent(st["reducescatter"], *st["select"])),
    ]


def naive_ag_steps(x, topo, density):
    """NaiveAG (collectives/naive_ag.py) step by step: selection, All-Gathers, scatter-add."""
    d = x.shape[0]
    k = max(1, math.ceil(density * d))
    return [
        ("select", lambda st: tuple(select(x, k))),
        ("allgather", lambda st: allgather_sparse(*st["select"], topo.world)),
        ("scatter_add", lambda st: ops.scatter_add(st["allgather"][1], st["allgather"][0], d)),
        ("residual", lambda st: unsent(x, *st["select"])),
    ]


def plot(rows, stage_rows, m, n, density, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for j, name in enumerate(dict.fromkeys(r["algorithm"] for r in rows)):
        color = f"C{j}"
        rs = [r for r in rows if r["algorithm"] == name]
        ax.plot([r["size"] for r in rs], [r["median_s"] for r in rs], "o-", color=color,
                label=f"{name} measured")
        ax.plot([r["size"] for r in rs], [r["predicted_s"] for r in rs], "x--", color=color,
                label=f"{name} predicted")
    ax.set(xscale="log", yscale="log", xlabel="gradient size (float32 elements)", ylabel="seconds",
           title=f"collectives on {m}x{n} ranks, density {density} (cf. shi2021 Fig. 7)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "comm_time_vs_size.png"), dpi=120)
    plt.close(fig)

    stage_rows = [r for r in stage_rows if r["algorithm"] == "hitopk"]
    sizes = sorted({r["size"] for r in stage_rows})
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    width = 0.38
    for i, size in enumerate(sizes):
        for off, key, hatch in ((-width / 2, "median_s", None), (width / 2, "predicted_s", "//")):
            bottom = 0.0
            for j, st in enumerate(STAGES):
                v = next(r[key] for r in stage_rows if r["size"] == size and r["stage"] == st)
                ax.bar(i + off, v, width, bottom=bottom, color=f"C{j}", hatch=hatch, edgecolor="k",
                       linewidth=0.3, label=st if (i == 0 and hatch is None) else None)
                bottom += v
    ax.set_xticks(range(len(sizes)), [f"{s / 1e6:g}M" for s in sizes])
    ax.set(xlabel="gradient size (float32 elements); left bar measured, right (hatched) predicted",
           ylabel="seconds", title=f"HiTopKComm steps on {m}x{n} ranks, density {density} (cf. Fig. 8)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "hitopk_breakdown.png"), dpi=120)
    plt.close(fig)


def main(argv):
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench comm", description=(
        "Collective benchmark (shi2021 Figs. 7 and 8): time against size of every collective, the calibrated "
        "cost model's prediction and choice, and HiTopKComm's per-step breakdown. Run it on every rank of a "
        "Horovod job: on the emulated cluster, or under horovodrun -H / Slurm on your own hosts to measure "
        "your own link (docs/cluster.md)."))
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="float32 elements per tensor")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS),
                   help="collectives to time (the model chooses among these)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs (median of the max over ranks)")
    p.add_argument("--calibrate-repeats", type=int, default=None,
                   help="timed runs per calibration point (default: max(5, --repeats))")
    p.add_argument("--graph", action="store_true",
                   help="time each collective inside tf.function (as in training) instead of eagerly")
    p.add_argument("--quick", action="store_true", help="smoke run: sizes 1M and 4M, 3 repeats")
    p.add_argument("--no-calibrate", action="store_true", help="predict with the default LinkParams")
    p.add_argument("--out", default="bench_out", help="folder for the PNG plots (rank 0)")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of the tables")
    args = p.parse_args(argv)
    sizes = args.sizes or ([2**20, 2**22] if args.quick else DEFAULT_SIZES)
    repeats = 3 if args.quick and args.repeats == 5 else args.repeats

    topo = tf_commlib.init()
    lead = topo.rank == 0
    start = time.perf_counter()
    params = alphabeta.LinkParams() if args.no_calibrate else costmodel.calibrate(
        topo, repeats=args.calibrate_repeats or max(5, repeats))
    if lead:
        print(f"# {topo.m}x{topo.n} ranks, density {args.density}, {repeats} repeats, "
              f"inter link {os.environ.get('TF_COMMLIB_INTER_MBIT') or 'unshaped'} Mbit/s; "
              f"{'graph' if args.graph else 'eager'} mode; "
              f"calibration {time.perf_counter() - start:.1f}s: {params}", file=sys.stderr, flush=True)
    timer = Timer(topo)
    rows, stage_rows, choice_rows = [], [], []
    for size in sizes:
        x = tf.constant(np.random.default_rng(topo.rank).standard_normal(size, dtype=np.float32))
        measured = timer.interleaved({name: collective_fn(name, x, topo, args.density, args.graph)
                                      for name in args.algorithms}, repeats)
        for name in args.algorithms:
            sent = ALGORITHMS[name].sent_bytes(size, topo.m, topo.n, args.density)
            rows.append({"size": size, "algorithm": name, "median_s": measured[name],
                         "predicted_s": collectives.predict(name, size, topo.m, topo.n, args.density, params),
                         "intra_bytes": sent["intra"], "inter_bytes": sent["inter"]})
        for name, steps in (("hitopk", hitopk_steps), ("naive_ag", naive_ag_steps)):
            if name not in args.algorithms:
                continue
            stages = staged(steps(x, topo, args.density), timer, repeats)
            predicted = collectives.breakdown(name, size, topo.m, topo.n, args.density, params)
            stage_rows += [{"size": size, "algorithm": name, "stage": st, "median_s": t,
                            "predicted_s": predicted[st]} for st, t in stages.items()]
        chosen = collectives.choose(size, topo.m, topo.n, args.density, params, args.algorithms)
        fastest = min(measured, key=measured.get)
        nan = float("nan")
        choice_rows.append({"size": size, "chosen": chosen, "fastest": fastest,
                            "ratio": measured[chosen] / measured[fastest],
                            "hitopk_vs_dense": measured.get("dense", nan) / measured.get("hitopk", nan),
                            "hitopk_vs_naive": measured.get("naive_ag", nan) / measured.get("hitopk", nan)})
        if lead:
            print(f"# size {size} done at {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
        del x
    if not lead:
        return 0
    for r in rows + stage_rows:
        r["ratio"] = r["median_s"] / r["predicted_s"] if r["predicted_s"] > 0 else float("nan")
    if args.json:
        print_json(rows, ["size", "algorithm", "median_s", "predicted_s", "intra_bytes", "inter_bytes"],
                   sys.stdout)
        print_json(stage_rows, ["size", "algorithm", "stage", "median_s", "predicted_s"], sys.stdout)
    else:
        cols = [("median_s", "measured s", "{:.4f}"), ("predicted_s", "predicted s", "{:.4f}"),
                ("ratio", "meas/pred", "{:.2f}")]
        sent = [("intra_bytes", "intra B/rank", "{:.0f}"), ("inter_bytes", "inter B/rank", "{:.0f}")]
        print_table(rows, [("size", "size", "{}"), ("algorithm", "algorithm", "{}")] + cols + sent, sys.stdout)
        print("\nsteps of hitopk (cf. shi2021 Fig. 8) and naive_ag, each timed on its own", file=sys.stdout)
        print_table(stage_rows, [("size", "size", "{}"), ("algorithm", "algorithm", "{}"),
                                 ("stage", "step", "{}")] + cols, sys.stdout)
        print("\nmodel choice vs fastest measured", file=sys.stdout)
        print_table(choice_rows, [("size", "size", "{}"), ("chosen", "model choice", "{}"),
                                  ("fastest", "fastest", "{}"), ("ratio", "choice/fastest", "{:.2f}"),
                                  ("hitopk_vs_dense", "dense/hitopk", "{:.2f}"),
                                  ("hitopk_vs_naive", "naive_ag/hitopk", "{:.2f}")], sys.stdout)
    sys.stdout.flush()
    os.makedirs(args.out, exist_ok=True)
    plot(rows, stage_rows, topo.m, topo.n, args.density, args.out)
    print(f"plots: {args.out}/comm_time_vs_size.png, {args.out}/hitopk_breakdown.png", file=sys.stderr)
    return 0
