"""PTO benchmark (shi2021 §5.4: LARS 11 -> 7 ms on ResNet-50, 30 -> 14 ms on a Transformer): the
step time of pto.LARS and pto.LAMB with their trust ratios computed unsharded (pto=False) and with
PTO, at P = 1, 2, 4 local ranks, on the variable shapes of keras.applications.ResNet50(weights=None)
and of a Transformer-base encoder, with random weights and gradients (the same on every rank).

    python -m tfc_apps.bench pto [--ranks 1 2 4] [--models resnet50 transformer] [--repeats 10] [--json]

The driver starts one ``horovodrun --gloo -np P`` job per P; every rank runs both steps inside
tf.function, timed in alternating rounds after a barrier (tf_commlib.timing.Timer), and a run's time
is the slowest rank's. The all-gather's
share is the time of one all-gather of the scalars this rank sends, over the PTO step. "ratios"
columns time the trust ratios alone (the part PTO shards; the element-wise update is not sharded).

The sharded step (DistributedOptimizer(shard_optimizer=True), ZeRO-1, tf_commlib.keras.sharded) is
timed on the rank's slices of the reduce-scattered gradient (dense collective, its reduce-scatter
excluded like the unsharded steps' allreduce): ``step_sharded_s`` is the slice update with the
per-layer norm exchange, the all-gather of the weights and their write; ``allgather_weights_s``
that all-gather alone, which replaces the allreduce's own all-gather (so ``sharded_vs_unsharded``
compares (step_sharded - allgather_weights) with the unsharded step). Bytes per step and rank
(formulas): ``bytes_allreduce`` (the dense allreduce of the gradients; the unsharded step),
``bytes_pto`` (plus PTO's all-gather of the ratios), ``bytes_sharded`` (reduce-scatter + all-gather
of weights + ``norm_exchange_bytes``); optimizer state per rank ``state_bytes_unsharded`` /
``state_bytes_sharded``.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tfc_apps import local_run
MODELS = ("resnet50", "transformer")
OPTIMIZERS = ("lars", "lamb")


def transformer_shapes(layers=6, d=512, ff=2048, vocab=32000):
    """Transformer-base encoder (Vaswani et al.): embedding, then per layer q/k/v/o projections,
    two layer norms and the feed-forward block, each with its bias."""
    shapes = [(vocab, d)]
    for _ in range(layers):
        shapes += [(d, d), (d,)] * 4 + [(d,), (d,)] + [(d, ff), (ff,), (ff, d), (d,)] + [(d,), (d,)]
    return shapes


def resnet50_shapes():
    import keras
    return [tuple(v.shape) for v in keras.applications.ResNet50(weights=None).trainable_variables]


def make_optimizer(kind, use_pto):
    import pto
    if kind == "lars":
        return pto.LARS(1e-6, momentum=0.9, weight_decay_rate=5e-5, pto=use_pto)
    return pto.LAMB(1e-6, weight_decay=0.01, pto=use_pto)


def captured(fn):
    """tf.function of fn with its default arguments bound first: the tensors they hold become
    captures. Left as arguments, 400+ tensors would be flattened and matched against the traced
    signature in Python on every call (~10 ms here), a cost no training step pays."""
    import tensorflow as tf
    return tf.function(lambda: fn())


def sharded_steps(kind, variables, grads):
    """(the sharded DistributedOptimizer, {name: fn}): its step on this rank's slices of the averaged
    gradient (reduce-scattered once, outside the timing), and the weights' all-gather alone."""
    from tf_commlib.keras import DGC, DistributedOptimizer

    opt = DistributedOptimizer(make_optimizer(kind, False), algorithm="dense", dgc=DGC(momentum_correction=False),
                               shard_optimizer=True)
    opt.build(variables)
    pieces = opt._sharded.reduce_scatter(grads)[0]
    sharded = opt._sharded
    step = captured(lambda: (sharded.step(pieces), opt.iterations)[1])
    gather = captured(lambda: [g.aggregator.sharded.all_gather(pieces) for g in sharded.groups])
    return opt, {"step_sharded_s": lambda: step().numpy(),
                 "allgather_weights_s": lambda: [t.numpy() for ts in gather() for t in ts]}


def sharded_bytes(opt, variables, mine, topo):
    """Bytes per step and rank by the formulas, and the optimizer state per rank."""
    from tf_commlib import link_bytes

    sharded = opt._sharded
    plain = sum(link_bytes.add(*(g.aggregator.sent_bytes() for g in sharded.groups)).values())
    ratios = sum(link_bytes.per_rank("allgather", 4 * mine, "world", topo.m, topo.n).values()) if topo.size > 1 else 0.0
    weights = sum(int(np.prod(v.shape)) * 4 for v in variables)
    return {"bytes_allreduce": plain, "bytes_pto": plain + ratios,
            "bytes_sharded": sum(sharded.sent_bytes().values()), "norm_exchange_bytes": sum(sharded.norm_bytes().values()),
            "state_bytes_unsharded": weights * len(sharded.slots), "state_bytes_sharded": sharded.state_bytes()}


def worker(spec_path, result_path, repeats):
    """One rank of the job: times the steps and writes the slowest rank's medians (rank 0)."""
    import keras
    import tensorflow as tf

    import tf_commlib
    from pto.parallel import CALL_COST, partition
    from tf_commlib import primitives
    from tf_commlib.timing import Timer

    topo = tf_commlib.init()
    spec = json.loads(Path(spec_path).read_text())
    timer = Timer(topo)

    def timed(fns):
        return timer.interleaved(fns, repeats, warmup=2)

    rows = []
    for model, shapes in spec["models"].items():
        rng = np.random.default_rng(0)   # the same w and g on every rank, as after aggregation
        weights = [rng.standard_normal(s, dtype=np.float32) * 0.05 for s in shapes]
        grads = [tf.constant(rng.standard_normal(s, dtype=np.float32) * 0.01) for s in shapes]
        variables = [keras.Variable(w) for w in weights]
        del weights
        costs = [int(np.prod(s)) + CALL_COST for s in shapes]
        mine = len(partition(costs, topo.size)[topo.rank])
        gather = tf.function(lambda x: primitives.allgather(x, topo.world))
        allgather_s = timed({"ag": lambda: gather(tf.ones([mine])).numpy()})["ag"] if topo.size > 1 else 0.0
        for kind in spec["optimizers"]:
            row = {"model": model, "optimizer": kind, "ranks": topo.size, "tensors": len(shapes),
                   "elements": int(sum(np.prod(s) for s in shapes)), "allgather_s": allgather_s}
            fns = {}
            for mode, use_pto in (("unsharded", False), ("pto", True)):
                opt = make_optimizer(kind, use_pto)
                opt.build(variables)
                step = captured(lambda opt=opt: (opt.apply(grads, variables), opt.iterations)[1])
                fns[f"step_{mode}_s"] = lambda step=step: step().numpy()
                elements = [(v.value, g) for v, g in zip(variables, grads)]
                if kind == "lars":
                    elements = [(w, g, tf.constant(0.0)) for w, g in elements]
                ratios = captured(lambda opt=opt, elements=elements: tf.stack(opt.trust_ratios(elements)))
                fns[f"ratios_{mode}_s"] = lambda ratios=ratios: ratios().numpy()
            sharded, extra = sharded_steps(kind, variables, grads)
            fns.update(extra)
            row.update(timed(fns))   # unsharded, PTO and sharded in alternating rounds: no warmer allocator
            del fns
            row.update(sharded_bytes(sharded, variables, mine, topo))
            del sharded
            rows.append(row)
        del variables, grads
    if topo.rank == 0:
        Path(result_path).write_text(json.dumps(rows))


def launch(ranks, spec_path, result_path, repeats, timeout):
    """One job of `ranks` local ranks (1xP, no GPU); past `timeout` seconds its ranks are killed."""
    rc, log = local_run.run(["-m", "tfc_apps.bench.pto", "--worker", spec_path, "--result", result_path,
                             "--repeats", repeats], ranks, topology=f"1x{ranks}", env={"CUDA_VISIBLE_DEVICES": ""},
                            timeout=timeout, check=False)
    if rc != 0:
        raise RuntimeError(f"tfc_apps.bench.pto on {ranks} ranks failed (exit {rc}):\n{log[-4000:]}")
    return json.loads(Path(result_path).read_text())


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["model"], r["optimizer"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 4), squeeze=False)
    for ax, (model, kind) in zip(axes[0], keys):
        rs = sorted((r for r in rows if (r["model"], r["optimizer"]) == (model, kind)), key=lambda r: r["ranks"])
        x = np.arange(len(rs))
        ax.bar(x - 0.2, [r["step_unsharded_s"] * 1e3 for r in rs], 0.4, label="unsharded")
        ax.bar(x + 0.2, [r["step_pto_s"] * 1e3 for r in rs], 0.4, label="PTO")
        ax.bar(x + 0.2, [r["allgather_s"] * 1e3 for r in rs], 0.4, color="k", alpha=0.5, label="all-gather")
        ax.set_xticks(x, [str(r["ranks"]) for r in rs])
        ax.set(xlabel="local ranks", ylabel="step ms", title=f"{kind.upper()} {model}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench pto", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="local ranks P, one job each")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    p.add_argument("--repeats", type=int, default=10, help="timed steps (median of the slowest rank's)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    p.add_argument("--out", default="bench_out", help="folder for pto_steps.png")
    p.add_argument("--json", action="store_true", help="print one JSON object per row instead of the table")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.result, args.repeats)
    if any(r < 1 for r in args.ranks) or args.repeats < 1:
        p.error("--ranks and --repeats must be positive")
    from tfc_apps.bench.common import print_json, print_table

    shapes = {"resnet50": resnet50_shapes, "transformer": transformer_shapes}
    rows = []
    with tempfile.TemporaryDirectory(prefix="pto_bench_") as tmp:
        spec = os.path.join(tmp, "spec.json")
        Path(spec).write_text(json.dumps({"models": {m: shapes[m]() for m in args.models},
                                          "optimizers": args.optimizers}))
        for ranks in args.ranks:
            start = time.perf_counter()
            rows += launch(ranks, spec, os.path.join(tmp, f"result{ranks}.json"), args.repeats, args.timeout)
            print(f"# {ranks} ranks done in {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    for r in rows:
        r["pto_vs_unsharded"] = r["step_pto_s"] / r["step_unsharded_s"]
        r["ratios_pto_vs_unsharded"] = r["ratios_pto_s"] / r["ratios_unsharded_s"]
        r["allgather_share"] = r["allgather_s"] / r["step_pto_s"]
        r["sharded_vs_unsharded"] = (r["step_sharded_s"] - r["allgather_weights_s"]) / r["step_unsharded_s"]
        r["state_ratio"] = r["state_bytes_sharded"] / r["state_bytes_unsharded"]
    keys = ["model", "optimizer", "ranks", "tensors", "elements", "step_unsharded_s", "step_pto_s",
            "pto_vs_unsharded", "ratios_unsharded_s", "ratios_pto_s", "ratios_pto_vs_unsharded",
            "allgather_s", "allgather_share", "step_sharded_s", "allgather_weights_s", "sharded_vs_unsharded",
            "bytes_allreduce", "bytes_pto", "bytes_sharded", "norm_exchange_bytes", "state_bytes_unsharded",
            "state_bytes_sharded", "state_ratio"]
    if args.json:
        print_json(rows, keys, sys.stdout)
    else:
        ms = "{:.1f}"
        shown = [{k: v * 1e3 if k.endswith("_s") else v for k, v in r.items()} for r in rows]
        print_table(shown, [("model", "model", "{}"), ("optimizer", "opt", "{}"), ("ranks", "P", "{}"),
                           ("tensors", "tensors", "{}"), ("step_unsharded_s", "step ms", ms),
                           ("step_pto_s", "PTO step ms", ms), ("pto_vs_unsharded", "PTO/unsh", "{:.2f}"),
                           ("ratios_unsharded_s", "ratios ms", ms), ("ratios_pto_s", "PTO ratios ms", ms),
                           ("ratios_pto_vs_unsharded", "PTO/unsh", "{:.2f}"),
                           ("allgather_s", "allgather ms", "{:.2f}"), ("allgather_share", "AG share", "{:.2f}"),
                           ("step_sharded_s", "sharded ms", ms), ("allgather_weights_s", "AG w ms", ms),
                           ("sharded_vs_unsharded", "(sh-AG)/unsh", "{:.2f}"),
                           ("bytes_allreduce", "B allreduce", "{:.0f}"), ("bytes_pto", "B PTO", "{:.0f}"),
                           ("bytes_sharded", "B sharded", "{:.0f}"), ("norm_exchange_bytes", "B norms", "{:.0f}"),
                           ("state_bytes_unsharded", "state B", "{:.0f}"), ("state_bytes_sharded", "sh state B", "{:.0f}"),
                           ("state_ratio", "state ratio", "{:.3f}")],
                    sys.stdout)
    os.makedirs(args.out, exist_ok=True)
    plot(rows, os.path.join(args.out, "pto_steps.png"))
    print(f"plot: {args.out}/pto_steps.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
