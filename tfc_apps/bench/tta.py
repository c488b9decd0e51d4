"""Time to accuracy against the strongest baseline: 4 ranks on the emulated 2x2 cluster train the
same model (same seed, data order, LR schedule and epochs) on an image folder with each
configuration, at each inter-node bandwidth, and the table says how long each needs to reach a
validation top-1, against the baseline dense_fp16 (fp16 on the wire, buckets overlapped with
backprop: what a Horovod or PyTorch DDP user runs)::

    python -m tfc_apps.bench tta [--data DIR | --dataset patches] [--inter-mbit 5 25 100 0] [--configs ...] [--json]

One job per bandwidth: the ranks run every configuration one after the other, sharing the input
pipeline (DataCache), which is filled before the first one, so no configuration pays for it. Each
configuration is a run of the DAWNBench script's training (tfc_apps.dawnbench.run.train): its
wall clock starts before the model is built and includes tracing, evaluation after every epoch
and, for `auto`, reading its calibration: the link, the compute per step and each candidate's
aggregation are measured once per bandwidth before the first seed's configurations (kept in the
bandwidth's folder, as on a cluster where they are paid once) and read by every `auto` run; the
table gives the seconds that took beside auto's rows. Without --data the
digits of scikit-learn (or, with --dataset patches, tfc_apps.patches' photo patches) are written as a
class-sorted ImageNet-layout folder (32 px). Inter-node
bandwidth 0 is the same layout unshaped (4 ranks on 127.0.0.1). With --repeats K every configuration
runs K times (seeds --seed .. --seed+K-1: initial weights, data order and augmentation), each seed's
configurations one after the other, and the table gives medians over the seeds (time to target,
samples/s, ...) and their ratios to the baseline's medians."""
import argparse
import copy
import glob
import json
import os
import sys
import time

from tfc_apps.bench.tta_table import BASELINE, add_auto_vs_best, add_ratios, json_lines, plot, summarize, tables

# DGC at density 0.01 (MSTopK): 2 warm-up epochs, momentum kept where v was sent (docs/benchmarks.md)
HITOPK = {"density": 0.01, "selector": "mstopk", "dgc_warmup": 2, "no_momentum_masking": True}
AUTO = {"schedule": "0:auto", "compression": "fp16", "calibrate": True, **HITOPK}
OUTER_AVERAGE = {"outer_lr": 1.0, "outer_momentum": 0.0}   # DiLoCo's outer step: the mean of the nodes
# name -> the DAWNBench script's options for it
CONFIGS = {
    "dense_fp32": {"schedule": "0:dense", "no_overlap": True},          # aggregation after backprop, fp32
    "dense_fp16": {"schedule": "0:dense", "compression": "fp16"},       # the baseline
    "2dtar_fp16": {"schedule": "0:2dtar", "compression": "fp16"},
    "hitopk": {"schedule": "0:hitopk", **HITOPK},
    "powersgd": {"schedule": "0:powersgd"},
    # the same collectives compressing harder: a tenth of hitopk's density, PowerSGD at rank 1 instead of 4
    "hitopk_0.001": {"schedule": "0:hitopk", **HITOPK, "density": 0.001},
    "powersgd_r1": {"schedule": "0:powersgd", "powersgd_rank": 1},
    # where auto picks hitopk for a bucket, it runs with hitopk's settings
    "auto": AUTO,
    # auto among the per-step lossy collectives only (named candidates: no DiLoCo rounds), and the same with
    # the harder settings beside them, told apart by their measured efficiency (docs/collectives.md)
    "auto_per_step": {**AUTO, "auto_candidates": ("hitopk", "powersgd")},
    "auto_settings": {**AUTO, "auto_candidates": ("hitopk", "hitopk:density_scale=0.1", "powersgd", "powersgd:rank=1")},
    # local SGD inside nodes, the nodes' pseudo-gradients averaged every H steps, overlapped
    # (tf_commlib.keras.DiLoCo); outer SGD lr 1 without momentum: the paper's Nesterov 0.7/0.9 reached
    # 0.825 top-1 in these 8 epochs against 0.911 (docs/diloco.md)
    "diloco_h8": {"schedule": "0:dense", "diloco": 8, **OUTER_AVERAGE},
    "diloco_h32": {"schedule": "0:dense", "diloco": 32, **OUTER_AVERAGE},
    "diloco_h8_q8": {"schedule": "0:dense", "diloco": 8, "inter_compression": "qsgd8", **OUTER_AVERAGE},
    # 4 bits, each 1024 values scaled by their largest magnitude: half diloco_h8_q8's bytes between nodes
    "diloco_h8_int4": {"schedule": "0:dense", "diloco": 8, "inter_compression": "int4", **OUTER_AVERAGE},
    # diloco_h8_int4 where every rank waits for each exchange: no update a sync late, which cost a point
    # of final top-1 on the digits (docs/diloco.md)
    "diloco_h8_int4_no_overlap": {"schedule": "0:dense", "diloco": 8, "inter_compression": "int4", "no_overlap": True,
                                  **OUTER_AVERAGE},
    # H chosen by the run from its measured step and exchange times (DiLoCo(sync_every="auto"))
    "diloco_auto_q8": {"schedule": "0:dense", "diloco": "auto", "inter_compression": "qsgd8", **OUTER_AVERAGE},
}
LAYOUT = (2, 2)   # nodes x ranks per node
PATCHES_PER_CLASS = (400, 80)   # training and validation images per class of --dataset patches
CALIBRATION = "auto_calibration.json"   # in a bandwidth's folder: {config: the seconds its calibration took}


def parser():
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench tta", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--data", default=None, help="DIR with train/ and val/ in ImageNet layout (default: --dataset written to OUT)")
    a("--dataset", choices=("digits", "patches"), default=None,
      help="without --data, the real image set written to OUT: digits (sklearn's, 1438 training images) or "
           "patches (photographs that sklearn and matplotlib ship, 10 regions as classes, "
           f"{PATCHES_PER_CLASS[0] * 10} training images; tfc_apps.patches)")
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
    if args.data and args.dataset:
        raise ValueError(f"--dataset {args.dataset} writes the images that --data {args.data!r} gives: one of them")
    args.dataset = args.dataset or (None if args.data else "digits")
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
    for key in ("density", "selector", "compression", "diloco", "inter_compression", "outer_lr", "outer_momentum",
                "powersgd_rank"):
        if key in opts:
            argv += [f"--{key.replace('_', '-')}", str(opts[key])]
    if opts.get("dgc_warmup"):   # the warm-up leaves at least the last epoch at the target density
        argv += ["--dgc-warmup", str(min(opts["dgc_warmup"], args.epochs - 1))]
    if args.fusion_threshold_bytes is not None:
        argv += ["--fusion-threshold-bytes", str(args.fusion_threshold_bytes)]
    argv += [f"--{flag.replace('_', '-')}" for flag in ("no_overlap", "calibrate", "no_momentum_masking")
             if opts.get(flag)]
    if opts.get("auto_candidates"):
        argv += ["--auto-candidates", *opts["auto_candidates"]]
    if opts.get("calibrate"):   # paid once per cluster: the bandwidth's first run measures, the others read it
        argv += ["--calibration-cache", os.path.join(os.path.dirname(os.path.normpath(log_dir)), "calibration.json")]
    return argv


def worker(args):
    """On every rank, per seed: the input pipeline once, filled; then each configuration's training."""
    import keras

    import tf_commlib
    from tfc_apps.dawnbench import config as dawnbench_config
    from tfc_apps.dawnbench.data import Data
    from tfc_apps.dawnbench.run import calibrate, train

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
            if seed == args.seed:   # paid once per cluster, before the runs of auto (each of its candidate sets)
                seconds = {c: calibrate(copy.copy(parsed[c]), topo, data) for c in args.configs
                           if CONFIGS[c].get("calibrate")}
                if seconds and topo.rank == 0:
                    with open(os.path.join(args.run_dir, CALIBRATION), "w") as f:
                        json.dump({"calibration_s": seconds}, f)
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


def default_data(out, dataset="digits"):
    """OUT/<dataset>32: the image set as a 32 px ImageNet-layout folder, written once."""
    root = os.path.join(out, f"{dataset}32")
    if not os.path.exists(os.path.join(root, ".complete")):
        DATASETS[dataset](root)
        open(os.path.join(root, ".complete"), "w").close()
    return root


def _digits(root):
    from tfc_apps import digits
    digits.write_image_folder(root)


def _patches(root):
    from tfc_apps import patches
    patches.write_patch_folder(root, train_per_class=PATCHES_PER_CLASS[0], val_per_class=PATCHES_PER_CLASS[1])


DATASETS = {"digits": _digits, "patches": _patches}


def measure(args):
    """Runs every bandwidth's job (args from parser() + resolve()); returns (results with their ratios
    to the baseline, the bandwidths whose job failed)."""
    from tfc_apps import emulated, local_run

    os.makedirs(args.out, exist_ok=True)
    args.data = args.data or default_data(args.out, args.dataset)
    results, failed = [], []
    for mbit in args.inter_mbit:
        run_dir = os.path.join(args.out, f"mbit{mbit}")
        for name in ("calibration.json", "calibration-*.json", CALIBRATION, "compute-*.json", "probe-*.json"):   # measured anew
            for old in glob.glob(os.path.join(run_dir, name)):
                os.remove(old)
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
        calibration = os.path.join(run_dir, CALIBRATION)
        calibration_s = None
        if os.path.exists(calibration):
            with open(calibration) as f:
                calibration_s = json.load(f)["calibration_s"]   # {config: seconds}
        for seed in seeds(args):
            for config in args.configs:
                rows = read_run(run_dir, run_name(args, config, seed))
                if rows:
                    results.append(summarize(rows, config, mbit, link, args.target, seed))
                    if calibration_s and config in calibration_s:
                        results[-1]["calibration_s"] = calibration_s[config]
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
