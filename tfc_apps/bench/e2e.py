"""End-to-end throughput and exposed communication (shi2021 Table 3 / Fig. 1 analogue): a model
(ResNet-50 by default) on synthetic data through model.fit with DistributedOptimizer, images/s of
each configuration at several resolutions, with the per-step breakdown, on the emulated 2x2 cluster::

    python -m tfc_apps.bench e2e [--resolutions 64 96 128] [--inter-mbit 500] [--json]

Brings the emulated cluster up and down itself (as root; otherwise the same layout on 127.0.0.1,
unshaped, and says so). One launch per resolution: every configuration (and fusion threshold) runs
in the same ranks, one after the other, on a fresh model; a configuration's images/s is the median
over its timed steps after warm-up steps (tracing), from rank 0's step clock (steps are synchronous
across ranks).

Exposed communication: after its timed steps, each configuration's phases are timed apart, in
interleaved rounds on every rank (tf_commlib.timing.Timer, the slowest rank's time): compute_s =
forward+backward (one GradientTape step, as fit's) + the update (DGC momentum and the wrapped
optimizer's step, on copies), comm_s = the aggregation alone (twins of the optimizer's aggregators,
same algorithm, compression, fusion threshold, with fresh state, on that step's gradients).
exposed_comm_s = step_s - compute_s (what communication adds to the step; with perfect overlap
max(0, comm_s - compute_s)), overlap_ratio = step_s / max(compute_s, comm_s) (1: the shorter one
hidden entirely; the sum of both when nothing overlaps gives up to 2).
"""
import argparse
import io
import json
import os
import statistics
import sys
import time

from tfc_apps.bench.common import print_table

# name -> (algorithm, density, compression, overlap); the first four are the original names
CONFIGS = {"dense": ("dense", 1.0, "none", True), "2dtar": ("2dtar", 1.0, "none", True),
           "hitopk@0.001": ("hitopk", 0.001, "none", True), "hitopk@0.01": ("hitopk", 0.01, "none", True),
           "dense_fp32": ("dense", 1.0, "none", False),      # the old baseline: aggregation after backprop
           "dense_fp16": ("dense", 1.0, "fp16", True),       # THE baseline: fp16 on the wire, overlapped
           "2dtar_fp16": ("2dtar", 1.0, "fp16", True),
           "hitopk@0.01_no_overlap": ("hitopk", 0.01, "none", False),
           "powersgd": ("powersgd", 1.0, "none", True)}
DEFAULT_CONFIGS = ["dense_fp32", "dense_fp16", "2dtar_fp16", "hitopk@0.001", "hitopk@0.01",
                   "hitopk@0.01_no_overlap", "powersgd"]
BASELINE, OLD_BASELINE = "dense_fp16", "dense_fp32"
ROWS = "e2e_rows.jsonl"   # rank 0 appends one JSON object per configuration
PHASES = ("input", "forward_backward", "optimizer", "aggregation")   # seconds per step, timed apart
# the target: dense fp16, overlapped, at 100 Mbit/s: step <= 1.15 x max(compute, communication)
TARGET_MBIT, TARGET_RATIO = 100, 1.15


def parser():
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench e2e", description=__doc__.split("\n")[0])
    p.add_argument("--resolutions", type=int, nargs="+", default=[64, 96, 128])
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=list(CONFIGS),
                   help=f"default: {' '.join(DEFAULT_CONFIGS)}")
    p.add_argument("--fusion-threshold-bytes", type=int, nargs="+", default=None,
                   help="bucket size(s) of DistributedOptimizer; several: each configuration at each "
                        "(a sweep); default: the library's default")
    p.add_argument("--batch", type=int, default=8, help="images per rank per step")
    p.add_argument("--steps", type=int, default=4, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (tracing)")
    p.add_argument("--breakdown-steps", type=int, default=2,
                   help="rounds per phase in the breakdown (0: off, no exposed communication)")
    p.add_argument("--model", choices=("resnet50", "small"), default="resnet50")
    p.add_argument("--layout", default="2x2", help="MxN: nodes x ranks per node")
    p.add_argument("--inter-mbit", type=int, default=500, help="shaped inter-node link")
    p.add_argument("--out", default="bench_out", help="folder for e2e.json and e2e_throughput.png")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of the table")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def exposure(step_s, phases):
    """The exposed-communication columns of a row from its step time and phases (seconds):
    compute_s = forward_backward + optimizer, comm_s = aggregation, exposed_comm_s = step_s -
    compute_s, overlap_ratio = step_s / max(compute_s, comm_s). NaN where a phase is missing."""
    nan = float("nan")
    compute = phases.get("forward_backward", nan) + phases.get("optimizer", nan)
    comm = phases.get("aggregation", nan)
    longer = max(compute, comm) if compute == compute and comm == comm else nan
    return {"compute_s": compute, "comm_s": comm, "exposed_comm_s": step_s - compute,
            "overlap_ratio": step_s / longer if longer > 0 else nan}


def measure_phases(model, optimizer, dataset, loss_fn, topo, reps):
    """Seconds per step of input, forward_backward, optimizer (DGC momentum + the wrapped optimizer's
    step, on copies) and aggregation (twins of the optimizer's aggregators, fresh state), each timed
    apart on every rank in interleaved rounds (the slowest rank's time, median over ``reps``). The
    model's non-trainable state (BN statistics that a training pass updates) is put back afterwards."""
    import tensorflow as tf

    from tf_commlib.timing import Timer, forward_backward, model_state_kept, ready
    from tfc_apps.dawnbench.breakdown import update_copy

    it = iter(dataset)
    x, y = next(it)
    t = time.perf_counter()
    for _ in range(reps):
        ready(next(it))
    out = {"input": (time.perf_counter() - t) / reps}
    step = forward_backward(model, x, y, loss_fn)
    with model_state_kept(model):
        grads = step()
        update = update_copy(optimizer, model.trainable_variables, grads)
        groups = [(agg.twin(topo), idx) for agg, idx in optimizer.aggregators()]

        @tf.function
        def aggregate(gs):
            return [agg.aggregate([gs[i] for i in idx], sent="indices")[0] for agg, idx in groups]

        fns = {"forward_backward": lambda: ready(step()), "optimizer": lambda: ready(update(grads)),
               "aggregation": lambda: ready(aggregate(grads))}
        out.update(Timer(topo).interleaved(fns, reps))
    return out


def worker(args):
    """Runs on every rank: each resolution x threshold x configuration, timed; rank 0 appends rows."""
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_commlib
    from tfc_apps.dawnbench import models
    from tf_commlib.keras import DistributedOptimizer, default_callbacks

    class StepClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = []

        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(time.perf_counter() - self.t)

    topo = tf_commlib.init()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for res in args.resolutions:
        rng = np.random.default_rng(topo.rank)
        x = (rng.random((args.batch, res, res, 3), np.float32) * 2 - 1)
        y = rng.integers(0, 1000, args.batch).astype(np.int32)
        ds = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(2)
        for threshold in args.fusion_threshold_bytes or [None]:
            for label in args.configs:
                algorithm, density, compression, overlap = CONFIGS[label]
                # A fresh model per configuration, after dropping the last one's: each configuration's
                # step functions, optimizer slots and residuals otherwise stay alive (the ranks reached
                # 6 GB each after 7 ResNet-50 configurations and the OOM killer ended the run).
                model = opt = None
                keras.backend.clear_session()
                model = models.build(args.model, 1000, seed=0)
                opt = DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), algorithm=algorithm,
                                           density=density, compression=compression,
                                           overlap=overlap,
                                           **({} if threshold is None else {"fusion_threshold_bytes": threshold}))
                model.compile(opt, loss, jit_compile=False)
                clock = StepClock()
                model.fit(ds, steps_per_epoch=args.warmup + args.steps, epochs=1, verbose=0, shuffle=False,
                          callbacks=default_callbacks() + [clock])
                step_s = float(np.median(clock.steps[args.warmup:]))
                phases = (measure_phases(model, opt, ds, loss, topo, args.breakdown_steps)
                          if args.breakdown_steps else {})
                row = {"resolution": res, "config": label, "algorithm": algorithm, "density": density,
                       "compression": compression, "overlap": overlap,
                       "fusion_threshold_bytes": opt.fusion_threshold_bytes,
                       "buckets": sum(len(agg.buckets) for agg, _ in opt.aggregators()),
                       "step_s": step_s, "images_per_s": args.batch * topo.size / step_s,
                       **{p: phases.get(p, float("nan")) for p in PHASES}, **exposure(step_s, phases)}
                if topo.rank == 0:
                    with open(os.path.join(args.out, ROWS), "a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"# {res}px {label} threshold {opt.fusion_threshold_bytes}: "
                          f"{row['images_per_s']:.1f} images/s", file=sys.stderr, flush=True)
    return 0


MODEL_NAMES = {"resnet50": "ResNet-50", "small": "the small residual network"}
COLUMNS = [("resolution", "res", "{}"), ("threshold_mb", "fusion MB", "{:.3g}"), ("buckets", "buckets", "{}"),
           ("config", "config", "{}"), ("images_per_s", "images/s", "{:.2f}"),
           ("vs_old", f"vs {OLD_BASELINE}", "{:.2f}"), ("vs_base", f"vs {BASELINE}", "{:.2f}"),
           ("step_ms", "step ms", "{:.1f}"), ("compute_ms", "compute ms", "{:.1f}"), ("comm_ms", "comm ms", "{:.1f}"),
           ("exposed_ms", "exposed ms", "{:.1f}"), ("overlap_ratio", "step/max", "{:.2f}"),
           ("forward_backward_ms", "fwd+bwd ms", "{:.1f}"), ("optimizer_ms", "update ms", "{:.1f}"),
           ("input_ms", "input ms", "{:.1f}")]


def medians(rows, group):
    """{config: median images/s of its rows} at one (resolution, fusion threshold): a configuration
    given more than once (``--configs dense_fp16 dense_fp16 ...``) counts by its median run."""
    runs = {}
    for q in rows:
        if (q["resolution"], q.get("fusion_threshold_bytes")) == group:
            runs.setdefault(q["config"], []).append(q["images_per_s"])
    return {c: float(statistics.median(v)) for c, v in runs.items()}


def table_rows(rows):
    """The rows as the table shows them: ratios of images/s to dense_fp32 and to dense_fp16 (their
    median run where they ran more than once) at the same resolution and fusion threshold (NaN where
    that configuration did not run), times in ms."""
    out = []
    for r in rows:
        same = medians(rows, (r["resolution"], r.get("fusion_threshold_bytes")))
        ratio = lambda base: r["images_per_s"] / same[base] if base in same else float("nan")  # noqa: E731
        ms = {f"{name}_ms": r.get(key, float("nan")) * 1e3
              for name, key in (("step", "step_s"), ("compute", "compute_s"), ("comm", "comm_s"),
                                ("exposed", "exposed_comm_s"), *((p, p) for p in PHASES))}
        out.append({**r, **ms, "vs_old": ratio(OLD_BASELINE), "vs_base": ratio(BASELINE),
                    "threshold_mb": r.get("fusion_threshold_bytes", float("nan")) / 2**20,
                    "buckets": r.get("buckets", "?"), "overlap_ratio": r.get("overlap_ratio", float("nan"))})
    return out


def target_lines(rows, shaped_mbit):
    """One line per dense_fp16 row: whether step <= 1.15 x max(compute, comm) (the target,
    stated at 100 Mbit/s; at another link the ratio is shown and the target not judged); where
    dense_fp16 ran more than once at a resolution and bucket size (``--configs dense_fp16
    dense_fp16 ...``), a last line judges the median of those rows' ratios (one step's noise on a
    shared machine decides a single row)."""
    lines, groups = [], {}
    for r in rows:
        if r["config"] != BASELINE:
            continue
        where = f"{r['resolution']}px, fusion {r.get('fusion_threshold_bytes', float('nan')) / 2**20:.3g} MB"
        key = (r["resolution"], r.get("fusion_threshold_bytes"))
        groups.setdefault(key, (where, []))[1].append(r.get("overlap_ratio", float("nan")))
        lines.append(_judge(where, r.get("overlap_ratio", float("nan")), shaped_mbit))
    for where, ratios in groups.values():
        measured = sorted(x for x in ratios if x == x)
        if len(measured) > 1:
            median = (measured[(len(measured) - 1) // 2] + measured[len(measured) // 2]) / 2
            lines.append(_judge(f"{where}, median of {len(measured)} rows", median, shaped_mbit))
    return lines


def _judge(where, ratio, shaped_mbit):
    head = (f"target ({BASELINE} at {TARGET_MBIT} Mbit/s: step <= {TARGET_RATIO} x max(compute, comm)), "
            f"{where}: step/max = {ratio:.3f}")
    if ratio != ratio:
        return f"{head}: not judged (no breakdown)"
    if shaped_mbit != TARGET_MBIT:
        link = f"{shaped_mbit} Mbit/s" if shaped_mbit else "an unshaped link"
        return f"{head}: not judged (this run: {link}; run with --inter-mbit {TARGET_MBIT})"
    return f"{head}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}"


def table(result, link):
    buf = io.StringIO()
    print(f"{MODEL_NAMES.get(result.get('model'), result.get('model', 'ResNet-50'))} end to end, "
          f"{result['layout']} ranks, batch {result['batch']}/rank, {link}; ms per step; compute = fwd+bwd + "
          "update, comm = aggregation alone (timed apart), exposed = step - compute, step/max = step / "
          "max(compute, comm)", file=buf)
    print_table(table_rows(result["rows"]), COLUMNS, buf)
    for line in target_lines(result["rows"], result.get("shaped_mbit")):
        print(line, file=buf)
    return buf.getvalue().rstrip("\n")


def plot(result, link, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    groups = list(dict.fromkeys((r["resolution"], r.get("fusion_threshold_bytes")) for r in rows))
    several = len({g[1] for g in groups}) > 1
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(configs)
    for j, c in enumerate(configs):   # a configuration that ran more than once: its median run
        ys = [medians(rows, g).get(c, 0) for g in groups]
        ax.bar([i + j * width for i in range(len(groups))], ys, width, label=c)
    ax.set_xticks([i + width * (len(configs) - 1) / 2 for i in range(len(groups))],
                  [f"{res}²" + (f"\n{thr / 2**20:.3g} MB" if several else "") for res, thr in groups])
    name = MODEL_NAMES.get(result.get("model"), "ResNet-50")
    ax.set(ylabel="images/s (all ranks)", title=f"{name}, {link}"[:90])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    p = parser()
    args = p.parse_args(argv)
    for name in ("batch", "steps", "inter_mbit"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 1 or args.breakdown_steps < 0 or min(args.resolutions) < 32:
        p.error("--warmup must be >= 1, --breakdown-steps >= 0, --resolutions >= 32")
    if args.fusion_threshold_bytes is not None and min(args.fusion_threshold_bytes) < 0:
        p.error(f"--fusion-threshold-bytes must be >= 0, got {args.fusion_threshold_bytes}")
    try:
        m, n = (int(v) for v in args.layout.lower().split("x"))
    except ValueError:
        p.error(f"--layout must be MxN (nodes x ranks per node), got {args.layout!r}")
    if args.worker:
        return worker(args)
    from tfc_apps import emulated, local_run

    # One job per resolution (its configurations' ratios come from one run): a rank's memory grows
    # with every configuration it runs, and four ranks of ResNet-50 fill this machine's 24 GB after
    # about six. Rank 0 appends a row per configuration, so a failed job keeps what it measured.
    os.makedirs(args.out, exist_ok=True)
    rows_path = os.path.join(args.out, ROWS)
    if os.path.exists(rows_path):
        os.remove(rows_path)
    common = ["--configs", *args.configs, "--batch", str(args.batch), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--breakdown-steps", str(args.breakdown_steps), "--model", args.model,
              "--layout", args.layout, "--out", args.out,
              *(["--fusion-threshold-bytes", *map(str, args.fusion_threshold_bytes)]
                if args.fusion_threshold_bytes else [])]
    failed = []
    with emulated.launcher(m, n, args.inter_mbit) as (prefix, link):
        print(f"# {link}", file=sys.stderr, flush=True)
        for res in args.resolutions:
            rc, _ = local_run.run(["-m", "tfc_apps.bench", "e2e", "--worker", "--resolutions", res, *common],
                                  launcher=prefix, capture=False, check=False)
            if rc:
                print(f"bench e2e: the ranks failed at {res}px (exit {rc})", file=sys.stderr)
                failed.append(res)
    rows = []
    if os.path.exists(rows_path):
        with open(rows_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        return 1
    shaped = None if "NOT shaped" in link else args.inter_mbit
    result = {"layout": f"{m}x{n}", "batch": args.batch, "model": args.model, "link": link,
              "shaped_mbit": shaped, "rows": rows}
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(result, f)
    if args.json:
        for r in result["rows"]:
            print(json.dumps({"layout": result["layout"], "link": link, **r}))
        for line in target_lines(rows, shaped):
            print(line, file=sys.stderr)
    else:
        print(table(result, link))
    plot(result, link, os.path.join(args.out, "e2e_throughput.png"))
    print(f"plot: {args.out}/e2e_throughput.png", file=sys.stderr)
    return 1 if failed else 0
