"""Time to accuracy against the strongest baseline: 4 ranks on the emulated 2x2 cluster train the
same model (same seed, data order, LR schedule and epochs) on an image folder with each
configuration, at each inter-node bandwidth, and the table says how long each needs to reach a
validation top-1, against the baseline dense_fp16 (fp16 on the wire, buckets overlapped with
backprop: what a Horovod or PyTorch DDP user runs)::

    python -m tfc_apps.bench tta [--data DIR] [--inter-mbit 5 25 100 0] [--configs ...] [--json]

One job per bandwidth: the ranks run every configuration one after the other, sharing the input
pipeline (DataCache), which is filled before the first one, so no configuration pays for it. Each
configuration is a run of the DAWNBench script's training (tfc_apps.dawnbench.run.train): its
wall clock starts before the model is built and includes tracing, evaluation after every epoch
and, for `auto`, the calibration of the link and of the compute per step. Without --data the
digits of scikit-learn are written as a class-sorted ImageNet-layout folder (32 px). Inter-node
bandwidth 0 is the same layout unshaped (4 ranks on 127.0.0.1). With --repeats K every configuration
runs K times (seeds --seed .. --seed+K-1: initial weights, data order and augmentation), each seed's
configurations one after the other, and the table gives medians over the seeds (time to target,
samples/s, ...) and their ratios to the baseline's medians."""
import argparse
import copy
import json
import os
import statistics
import sys
import time

# DGC at density 0.01 (MSTopK): 2 warm-up epochs, momentum kept where v was sent (docs/benchmarks.md)
HITOPK = {"density": 0.01, "selector": "mstopk", "dgc_warmup": 2, "no_momentum_masking": True}
OUTER_AVERAGE = {"outer_lr": 1.0, "outer_momentum": 0.0}   # DiLoCo's outer step: the mean of the nodes
# name -> the DAWNBench script's options for it
CONFIGS = {
    "dense_fp32": {"schedule": "0:dense", "no_overlap": True},          # aggregation after backprop, fp32
    "dense_fp16": {"schedule": "0:dense", "compression": "fp16"},       # the baseline
    "2dtar_fp16": {"schedule": "0:2dtar", "compression": "fp16"},
    "hitopk": {"schedule": "0:hitopk", **HITOPK},
    "powersgd": {"schedule": "0:powersgd"},
    # where auto picks hitopk for a bucket, it runs with hitopk's settings
    "auto": {"schedule": "0:auto", "compression": "fp16", "calibrate": True, **HITOPK},
    # local SGD inside nodes, the nodes' pseudo-gradients averaged every H steps, overlapped
    # (tf_commlib.keras.DiLoCo); outer SGD lr 1 without momentum: the paper's Nesterov 0.7/0.9 reached
    # 0.825 top-1 in these 8 epochs against 0.911 (docs/diloco.md)
    "diloco_h8": {"schedule": "0:dense", "diloco": 8, **OUTER_AVERAGE},
    "diloco_h32": {"schedule": "0:dense", "diloco": 32, **OUTER_AVERAGE},
    "diloco_h8_q8": {"schedule": "0:dense", "diloco": 8, "inter_compression": "qsgd8", **OUTER_AVERAGE},
}
BASELINE = "dense_fp16"
LAYOUT = (2, 2)   # nodes x ranks per node


def parser():
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench tta", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--data", default=None, help="DIR with train/ and val/ in ImageNet layout (default: digits written to OUT)")
    a("--inter-mbit", type=int, nargs="+", default=None, help="inter-node bandwidths, 0 = unshaped (default 5 25 100 0)")
    a("--configs", nargs="+", default=None, choices=list(CONFIGS), help=f"default: all; {BASELINE} is the baseline")
    a("--target", type=float, default=None, help="validation top-1 to reach (default 0.85; --quick 0.15)")
    a("--epochs", type=int, default=None, help="epochs per run (default 8; --quick 2)")
    a("--batch", type=int, default=8,
      help="images per rank per step (default 8: 45 steps per epoch on the digits, where the baseline's "
           "communication at 25 Mbit/s is over twice its compute)")
    a("--model", choices=("small", "resnet50"), default="small")
    a("--resolution", type=int, default=32)
    a("--fusion-threshold-bytes", type=int, default=None,
      help="gradient bucket size of every configuration (default: the library's)")
    a("--quick", action="store_true",
      help="a few minutes: 2 epochs of 4 steps, unshaped only, dense_fp32 dense_fp16 hitopk (unless given)")
    a("--seed", type=int, default=0)
    a("--repeats", type=int, default=1,
      help="runs per configuration and bandwidth, with seeds --seed, --seed+1, ...; the table gives medians")
    a("--out", default="bench_out/tta")
    a("--json", action="store_true", help="print one JSON object per run instead of the tables")
    a("--timeout", type=int, default=3600,
      help="seconds one bandwidth's job may take per seed before its ranks are killed")
    a("--worker", action="store_true", help=argparse.SUPPRESS)
    a("--run-dir", default=None, help=argparse.SUPPRESS)
    return p


def resolve(args):
    """Fills the defaults that depend on --quick; raises ValueError naming a bad argument."""
    quick = args.quick
    if args.inter_mbit is None:
        args.inter_mbit = [0] if quick else [5, 25, 100, 0]
    if args.configs is None:
        args.configs = ["dense_fp32", BASELINE, "hitopk"] if quick else list(CONFIGS)
    if args.epochs is None:
        args.epochs = 2 if quick else 8
    args.target = args.target if args.target is not None else (0.15 if quick else 0.85)
    args.steps_per_epoch = 4 if quick else None
    for name in ("inter_mbit", "configs"):
        given = getattr(args, name)
        if len(set(given)) != len(given):
            raise ValueError(f"--{name.replace('_', '-')}: each value once, got {' '.join(map(str, given))}")
    if any(b < 0 for b in args.inter_mbit):
        raise ValueError(f"--inter-mbit must be >= 0 (0: unshaped), got {args.inter_mbit}")
    if not 0 < args.target <= 1:
        raise ValueError(f"--target must be a top-1 in (0, 1], got {args.target!r}")
    for name in ("epochs", "batch", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)!r}")
    if args.fusion_threshold_bytes is not None and args.fusion_threshold_bytes < 0:
        raise ValueError(f"--fusion-threshold-bytes must be >= 0, got {args.fusion_threshold_bytes!r}")
    if args.resolution < 32:
        raise ValueError(f"--resolution must be >= 32, got {args.resolution!r}")
    if args.data and not all(os.path.isdir(os.path.join(args.data, s)) for s in ("train", "val")):
        raise ValueError(f"--data {args.data!r}: needs train/ and val/ (ImageNet layout)")
    return args


def seeds(args):
    return [args.seed + i for i in range(args.repeats)]


def run_name(args, config, seed):
    """A run's folder under its bandwidth's: the configuration's name, and the seed's with --repeats."""
    return config if args.repeats == 1 else f"{config}_seed{seed}"


def dawnbench_argv(args, config, log_dir, seed=None):
    """The DAWNBench script's command line for one configuration (seed: --seed's by default)."""
    opts = CONFIGS[config]
    argv = ["--data", args.data, "--model", args.model, "--optimizer", "sgd", "--warmup-epochs", "1",
            "--stages", f"{args.resolution}:{args.epochs}:{args.batch}", "--schedule", opts["schedule"],
            "--breakdown-steps", "0", "--seed", str(args.seed if seed is None else seed), "--log-dir", log_dir]
    if args.steps_per_epoch:
        argv += ["--steps-per-epoch", str(args.steps_per_epoch)]
    for key in ("density", "selector", "compression", "diloco", "inter_compression", "outer_lr", "outer_momentum"):
        if key in opts:
            argv += [f"--{key.replace('_', '-')}", str(opts[key])]
    if opts.get("dgc_warmup"):   # the warm-up leaves at least the last epoch at the target density
        argv += ["--dgc-warmup", str(min(opts["dgc_warmup"], args.epochs - 1))]
    if args.fusion_threshold_bytes is not None:
        argv += ["--fusion-threshold-bytes", str(args.fusion_threshold_bytes)]
    argv += [f"--{flag.replace('_', '-')}" for flag in ("no_overlap", "calibrate", "no_momentum_masking")
             if opts.get(flag)]
    return argv


def worker(args):
    """On every rank, per seed: the input pipeline once, filled; then each configuration's training."""
    import keras

    import tf_commlib
    from tfc_apps.dawnbench import config as dawnbench_config
    from tfc_apps.dawnbench.data import Data
    from tfc_apps.dawnbench.run import train

    topo = tf_commlib.init()
    for seed in seeds(args):
        parsed = {c: dawnbench_config.parse(dawnbench_argv(args, c, os.path.join(args.run_dir, run_name(args, c, seed)),
                                                           seed)) for c in args.configs}
        first = parsed[args.configs[0]]
        data = Data(first, topo)   # the seed's data order and shards
        try:
            stage = first.stage_list[0]
            for _ in data.train(stage, 0):   # fills the cache: no configuration pays for it
                pass
            for _ in data.val(stage) or ():
                pass
            for config in args.configs:
                keras.backend.clear_session()
                if topo.rank == 0:
                    print(f"# tta: {config}" + (f" seed {seed}" if args.repeats > 1 else ""), file=sys.stderr,
                          flush=True)
                train(copy.copy(parsed[config]), topo, data)
        finally:
            data.close()
    return 0


def read_run(run_dir, config):
    path = os.path.join(run_dir, config, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if "epoch" in r]


def summarize(rows, config, inter_mbit, link, target, seed=0):
    """One run's JSON object (contract: config, inter_mbit, tta_s, final_top1, samples_per_s,
    inter_mb_per_step, baseline)."""
    rates = sorted(r["images_per_s"] for r in (rows[1:] or rows))
    reached = next((r for r in rows if r["top1"] is not None and r["top1"] >= target), None)
    return {"config": config, "inter_mbit": inter_mbit, "seed": seed, "link": link, "target_top1": target,
            "tta_s": None if reached is None else reached["wall_s"],
            "tta_epoch": None if reached is None else reached["epoch"],
            "final_top1": rows[-1]["top1"], "best_top1": max(r["top1"] for r in rows),
            "samples_per_s": rates[len(rates) // 2],
            "inter_mb_per_step": rows[-1]["inter_bytes_per_step"] / 1e6,
            "intra_mb_per_step": rows[-1]["intra_bytes_per_step"] / 1e6,
            "wall_s": rows[-1]["wall_s"], "train_s": sum(r["epoch_s"] for r in rows),
            "eval_s": sum(r["eval_s"] for r in rows), "other_s": sum(r["other_s"] for r in rows),
            "epochs": [{"epoch": r["epoch"], "wall_s": r["wall_s"], "top1": r["top1"], "loss": r["loss"]}
                       for r in rows],
            "baseline": config == BASELINE}


def add_ratios(results):
    """tta_vs_baseline: a run's time to target over the baseline's at its bandwidth and seed (None where
    either never reached it)."""
    for r in results:
        base = next((b for b in results if b["inter_mbit"] == r["inter_mbit"] and b.get("seed") == r.get("seed")
                     and b["baseline"]), None)
        ok = base is not None and base["tta_s"] and r["tta_s"] is not None
        r["tta_vs_baseline"] = r["tta_s"] / base["tta_s"] if ok else None
        r["speed_vs_baseline"] = r["samples_per_s"] / base["samples_per_s"] if base else None


def _median(values):
    """The median, None counting as never (larger than any value); None if the median is never."""
    ordered = sorted(values, key=lambda v: (v is None, v or 0))
    mid = ordered[(len(ordered) - 1) // 2:len(ordered) // 2 + 1]
    return None if None in mid else statistics.fmean(mid)


def medians(results):
    """One row per (bandwidth, configuration): a single run as it is; K runs (--repeats) as the
    medians over their seeds of time to target, its epoch, final top-1, samples/s and wall time, the
    ratios to the baseline being those of the medians (as the verdict states them); `runs` counts
    the runs and `tta_each_s` lists their times (each run's own ratio stays in its JSON object)."""
    groups = {}
    for r in results:
        groups.setdefault((r["inter_mbit"], r["config"]), []).append(r)
    out = []
    for runs in groups.values():
        row = dict(runs[0], runs=len(runs), tta_each_s=[r["tta_s"] for r in runs])
        if len(runs) > 1:
            row.pop("epochs", None)
            for key in ("tta_s", "tta_epoch", "final_top1", "samples_per_s", "inter_mb_per_step", "wall_s"):
                row[key] = _median([r.get(key) for r in runs])
        out.append(row)
    for row in (r for r in out if r["runs"] > 1):
        base = next((b for b in out if b["inter_mbit"] == row["inter_mbit"] and b["baseline"]), None)
        row["tta_vs_baseline"] = row["tta_s"] / base["tta_s"] if base and base["tta_s"] and row["tta_s"] else None
        row["speed_vs_baseline"] = row["samples_per_s"] / base["samples_per_s"] if base else None
    return out


def verdict(runs):
    """Which configuration reached the target first at one bandwidth, and by how much (runs: one row
    per configuration, from medians())."""
    reached = sorted((r for r in runs if r["tta_s"] is not None), key=lambda r: r["tta_s"])
    if not reached:
        return "no configuration reached the target: raise --epochs or lower --target"
    best, base = reached[0], next((r for r in runs if r["baseline"]), None)
    if base is None:
        return f"fastest to target: {best['config']} ({best['tta_s']:.0f} s); the baseline {BASELINE} did not run"
    if base["tta_s"] is None:
        return f"{best['config']} won: {best['tta_s']:.0f} s; the baseline {BASELINE} never reached the target"
    if best["baseline"]:
        second = reached[1] if len(reached) > 1 else None
        tail = (f"; the best compressed or other configuration, {second['config']}, needed "
                f"{second['tta_s'] / base['tta_s']:.2f}x its time") if second else ""
        return f"the baseline {BASELINE} won ({base['tta_s']:.0f} s): compression lost here{tail}"
    return (f"{best['config']} won: {best['tta_s']:.0f} s, {best['tta_s'] / base['tta_s']:.2f}x the baseline's "
            f"{base['tta_s']:.0f} s ({base['tta_s'] / best['tta_s']:.2f}x faster)")


def best_line(runs):
    """What a user who changes nothing gets at one bandwidth: ``auto`` against the fastest
    configuration to target (runs: one row per configuration, from medians()); None without auto."""
    auto = next((r for r in runs if r["config"] == "auto"), None)
    if auto is None:
        return None
    reached = sorted((r for r in runs if r["tta_s"] is not None), key=lambda r: r["tta_s"])
    if not reached:
        return "best: no configuration reached the target"
    best = reached[0]
    if auto["tta_s"] is None:
        return f"best: {best['config']} ({best['tta_s']:.0f} s); auto never reached the target"
    if best is auto or best["tta_s"] == auto["tta_s"]:
        return f"best: auto ({auto['tta_s']:.0f} s) was the fastest configuration"
    return (f"best: {best['config']} ({best['tta_s']:.0f} s); auto {auto['tta_s']:.0f} s, "
            f"{auto['tta_s'] / best['tta_s']:.2f}x the fastest")


def add_auto_vs_best(rows):
    """auto_vs_best on auto's rows: its time to target over the fastest configuration's at its
    bandwidth and seed (None where auto or every configuration never reached it)."""
    for r in (r for r in rows if r["config"] == "auto"):
        same = [b["tta_s"] for b in rows if b["inter_mbit"] == r["inter_mbit"] and b.get("seed") == r.get("seed")
                and b["tta_s"] is not None]
        r["auto_vs_best"] = r["tta_s"] / min(same) if same and r["tta_s"] is not None else None


def json_lines(results):
    """One JSON object per run (its epochs left out: they are in OUT/tta.json)."""
    return "\n".join(json.dumps({k: v for k, v in r.items() if k != "epochs"}) for r in results)


def fmt(v, spec, none="never"):
    return none if v is None else format(v, spec)


def tables(results, target):
    rows, out = medians(results), []
    seeds_run = max(r["runs"] for r in rows)
    repeated = seeds_run > 1
    for mbit in dict.fromkeys(r["inter_mbit"] for r in rows):
        runs = [r for r in rows if r["inter_mbit"] == mbit]
        out.append(f"inter-node {'unshaped' if mbit == 0 else f'{mbit} Mbit/s'} ({runs[0]['link']}); "
                   f"time to top-1 >= {target}" + (f"; medians of {seeds_run} seeds" if repeated else ""))
        out.append(f"{'config':>11} {'tta s':>7} {'vs base':>7} {'epoch':>5} {'final top1':>10} {'samples/s':>9} "
                   f"{'vs base':>7} {'inter MB/step':>13} {'wall s':>7}" + ("  tta s of each seed" if repeated else ""))
        for r in runs:
            epoch = r["tta_epoch"]
            epoch = "-" if epoch is None else f"{epoch:.0f}" if epoch == int(epoch) else f"{epoch:.1f}"
            out.append(f"{r['config']:>11} {fmt(r['tta_s'], '7.1f'):>7} {fmt(r['tta_vs_baseline'], '7.2f', '-'):>7} "
                       f"{epoch:>5} "
                       f"{r['final_top1']:10.4f} {r['samples_per_s']:9.1f} "
                       f"{fmt(r['speed_vs_baseline'], '7.2f', '-'):>7} {r['inter_mb_per_step']:13.3f} "
                       f"{r['wall_s']:7.1f}" + (f"  {' '.join(fmt(t, '.1f') for t in r['tta_each_s'])}"
                                                if repeated else ""))
        out.append(verdict(runs))
        if best_line(runs):
            out.append(best_line(runs))
        out.append("")
    return "\n".join(out)


def plot(results, target, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bands = list(dict.fromkeys(r["inter_mbit"] for r in results))
    fig, axes = plt.subplots(1, len(bands), figsize=(5.2 * len(bands), 4.4), squeeze=False)
    colors = {c: f"C{i}" for i, c in enumerate(dict.fromkeys(r["config"] for r in results))}
    for ax, mbit in zip(axes[0], bands):
        labelled = set()
        for r in (r for r in results if r["inter_mbit"] == mbit):   # with --repeats: a line per seed
            label = None if r["config"] in labelled else r["config"] + (" (baseline)" if r["baseline"] else "")
            labelled.add(r["config"])
            ax.plot([e["wall_s"] for e in r["epochs"]], [e["top1"] for e in r["epochs"]], marker="o",
                    color=colors[r["config"]], lw=2.2 if r["baseline"] else 1.2, label=label)
        ax.axhline(target, color="gray", ls="--", lw=0.8)
        ax.set_title("unshaped" if mbit == 0 else f"inter-node {mbit} Mbit/s", fontsize=10)
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("validation top-1")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_data(out):
    from tfc_apps import digits

    root = os.path.join(out, "digits32")
    if not os.path.exists(os.path.join(root, ".complete")):
        digits.write_image_folder(root)
        open(os.path.join(root, ".complete"), "w").close()
    return root


def measure(args):
    """Runs every bandwidth's job (args from parser() + resolve()); returns (results with their ratios
    to the baseline, the bandwidths whose job failed)."""
    from tfc_apps import emulated, local_run

    os.makedirs(args.out, exist_ok=True)
    args.data = args.data or default_data(args.out)
    results, failed = [], []
    for mbit in args.inter_mbit:
        run_dir = os.path.join(args.out, f"mbit{mbit}")
        for config in args.configs:   # a run's old rows would be appended to (a resumed DAWNBench log)
            for seed in seeds(args):
                old = os.path.join(run_dir, run_name(args, config, seed), "metrics.jsonl")
                if os.path.exists(old):
                    os.remove(old)
        forwarded = ["--data", args.data, "--configs", *args.configs, "--epochs", str(args.epochs),
                     "--batch", str(args.batch), "--model", args.model, "--resolution", str(args.resolution),
                     "--seed", str(args.seed), "--repeats", str(args.repeats), "--target", str(args.target),
                     "--run-dir", run_dir,
                     *([] if args.fusion_threshold_bytes is None
                       else ["--fusion-threshold-bytes", str(args.fusion_threshold_bytes)]),
                     *(["--quick"] if args.quick else [])]
        launch = emulated.unshaped(*LAYOUT) if mbit == 0 else emulated.launcher(*LAYOUT, mbit)
        with launch as (prefix, link):
            print(f"# {link}", file=sys.stderr, flush=True)
            try:
                local_run.run(["-m", "tfc_apps.bench", "tta", "--worker", *forwarded], launcher=prefix,
                              capture=False, timeout=args.timeout * args.repeats)
            except local_run.JobFailed as e:
                print(f"bench tta: the ranks failed at {mbit} Mbit/s: {str(e)[:2000]}", file=sys.stderr)
                failed.append(mbit)
        for seed in seeds(args):
            for config in args.configs:
                rows = read_run(run_dir, run_name(args, config, seed))
                if rows:
                    results.append(summarize(rows, config, mbit, link, args.target, seed))
    add_ratios(results)
    add_auto_vs_best(results)
    return results, failed


def report(args, results, title=None):
    """Writes OUT/tta.json and OUT/tta.png; prints the tables (or JSON lines with --json)."""
    with open(os.path.join(args.out, "tta.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json_lines(results) if args.json else tables(results, args.target), flush=True)
    png = os.path.join(args.out, "tta.png")
    plot(results, args.target, title or f"{args.model} on {os.path.basename(os.path.normpath(args.data))}, "
         f"4 ranks as {LAYOUT[0]}x{LAYOUT[1]}: validation top-1 vs wall-clock", png)
    return png


def main(argv):
    p = parser()
    args = p.parse_args(argv)
    try:
        resolve(args)
    except ValueError as e:
        p.error(str(e))
    if args.worker:
        return worker(args)
    started = time.perf_counter()
    results, failed = measure(args)
    if not results:
        return 1
    png = report(args, results)
    print(f"plot: {png}; {time.perf_counter() - started:.0f} s in all", file=sys.stderr)
    return 1 if failed else 0
