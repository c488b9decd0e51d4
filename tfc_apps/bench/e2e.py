"""End-to-end throughput (shi2021 Table 3 / Fig. 1 analogue): ResNet-50 on synthetic data through
model.fit with DistributedOptimizer, images/s of Dense-SGD, 2DTAR-SGD and MSTopK-SGD (hitopk +
mstopk) at several resolutions, with the per-step breakdown, on the emulated 2x2 cluster::

    python -m tfc_apps.bench e2e [--resolutions 64 96 128] [--inter-mbit 500] [--json]

Brings the emulated cluster up and down itself (as root; otherwise the same layout on 127.0.0.1,
unshaped, and says so). One launch: every configuration runs in the same ranks, one after the
other on the same model; a configuration's images/s is the median over its timed steps after
warm-up steps (tracing), from rank 0's step clock (steps are synchronous across ranks).
"""
import argparse
import json
import os
import sys
import time

CONFIGS = {"dense": ("dense", 1.0), "2dtar": ("2dtar", 1.0),
           "hitopk@0.001": ("hitopk", 0.001), "hitopk@0.01": ("hitopk", 0.01)}
ROWS = "e2e_rows.jsonl"   # rank 0 appends one JSON object per configuration
PHASES = ("input", "forward_backward", "selection", "communication", "optimizer")


def parser():
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench e2e", description=__doc__.split("\n")[0])
    p.add_argument("--resolutions", type=int, nargs="+", default=[64, 96, 128])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--batch", type=int, default=8, help="images per rank per step")
    p.add_argument("--steps", type=int, default=4, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (tracing)")
    p.add_argument("--breakdown-steps", type=int, default=2, help="steps per phase in the breakdown (0: off)")
    p.add_argument("--model", choices=("resnet50", "small"), default="resnet50")
    p.add_argument("--layout", default="2x2", help="MxN: nodes x ranks per node")
    p.add_argument("--inter-mbit", type=int, default=500, help="shaped inter-node link")
    p.add_argument("--out", default="bench_out", help="folder for e2e.json and e2e_throughput.png")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of the table")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def worker(args):
    """Runs on every rank: each resolution x configuration, timed; rank 0 writes out/e2e.json."""
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_commlib
    from tfc_apps.dawnbench import breakdown, models
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
        for label in args.configs:
            algorithm, density = CONFIGS[label]
            # A fresh model per configuration, after dropping the last one's: each configuration's
            # step functions, optimizer slots and residuals otherwise stay alive (the ranks reached
            # 6 GB each after 7 ResNet-50 configurations and the OOM killer ended the run).
            model = opt = None
            keras.backend.clear_session()
            model = models.build(args.model, 1000, seed=0)
            opt = DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), algorithm=algorithm,
                                       density=density, selector="mstopk")
            model.compile(opt, loss, jit_compile=False)
            clock = StepClock()
            model.fit(ds, steps_per_epoch=args.warmup + args.steps, epochs=1, verbose=0, shuffle=False,
                      callbacks=default_callbacks() + [clock])
            step_s = float(np.median(clock.steps[args.warmup:]))
            phases = (breakdown.measure(model, opt, ds, loss, algorithm, density, "mstopk", topo,
                                        args.breakdown_steps) if args.breakdown_steps else {})
            row = {"resolution": res, "config": label, "algorithm": algorithm, "density": density,
                   "step_s": step_s, "images_per_s": args.batch * topo.size / step_s,
                   **{p: phases.get(p, float("nan")) for p in PHASES}}
            if topo.rank == 0:
                with open(os.path.join(args.out, ROWS), "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"# {res}px {label}: {row['images_per_s']:.1f} images/s", file=sys.stderr, flush=True)
    return 0


def table(result, link):
    rows = result["rows"]
    lines = [f"ResNet-50 end to end, {result['layout']} ranks, batch {result['batch']}/rank, {link}",
             f"{'res':>4} {'config':>13} {'images/s':>9} {'vs dense':>8} {'vs 2dtar':>8}  "
             + " ".join(f"{p[:12]:>12}" for p in PHASES) + "  (ms per step, phases timed apart)"]
    for r in rows:
        same = {q["config"]: q["images_per_s"] for q in rows if q["resolution"] == r["resolution"]}
        ratio = lambda base: r["images_per_s"] / same[base] if base in same else float("nan")  # noqa: E731
        lines.append(f"{r['resolution']:>4} {r['config']:>13} {r['images_per_s']:9.2f} {ratio('dense'):8.2f} "
                     f"{ratio('2dtar'):8.2f}  " + " ".join(f"{r[p] * 1e3:12.1f}" for p in PHASES))
    return "\n".join(lines)


def plot(result, link, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    resolutions = list(dict.fromkeys(r["resolution"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(configs)
    for j, c in enumerate(configs):
        ys = [next((r["images_per_s"] for r in rows if r["config"] == c and r["resolution"] == res), 0)
              for res in resolutions]
        ax.bar([i + j * width for i in range(len(resolutions))], ys, width, label=c)
    ax.set_xticks([i + width * (len(configs) - 1) / 2 for i in range(len(resolutions))],
                  [f"{res}²" for res in resolutions])
    ax.set(ylabel="images/s (all ranks)", title=f"ResNet-50, {link}")
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
              "--layout", args.layout, "--out", args.out]
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
    result = {"layout": f"{m}x{n}", "batch": args.batch, "link": link, "rows": rows}
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(result, f)
    if args.json:
        for r in result["rows"]:
            print(json.dumps({"layout": result["layout"], "link": link, **r}))
    else:
        print(table(result, link))
    plot(result, link, os.path.join(args.out, "e2e_throughput.png"))
    print(f"plot: {args.out}/e2e_throughput.png", file=sys.stderr)
    return 1 if failed else 0
