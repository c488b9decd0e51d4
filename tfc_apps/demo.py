"""The main job (`make demo`): 4 ranks as 2 nodes x 2 ranks, on the emulated cluster with a shaped
inter-node link when this machine allows it (root, ip, tc; else on 127.0.0.1 unshaped, saying why):
  1. the topology check (hierarchical allreduce equals a plain one),
  2. time to accuracy (tfc_apps.bench tta) of a small ResNet on sklearn's digits written as a
     class-sorted image folder: the baseline a Horovod user runs (dense allreduce with fp16 on the
     wire, buckets overlapped with backprop) against HiTopKComm + MSTopK at density 0.01,
then the table, the time each needs to reach the same validation accuracy, and a PNG of
validation accuracy against wall-clock seconds."""
import argparse
from pathlib import Path

from tfc_apps import emulated
from tfc_apps.bench import tta
from tfc_apps.local_run import horovodrun

CONFIGS = ("dense_fp16", "hitopk")


def same_accuracy(results):
    """(accuracy, {config: seconds}): the lower of the runs' best validation top-1, which every run
    reached, and the wall-clock seconds each needed to reach it."""
    level = min(r["best_top1"] for r in results)
    return level, {r["config"]: next(e["wall_s"] for e in r["epochs"] if e["top1"] >= level) for r in results}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--inter-mbit", type=int, default=25,
                   help="inter-node link of the emulated cluster (0: unshaped)")
    p.add_argument("--target", type=float, default=0.85, help="validation top-1 for the time-to-accuracy table")
    p.add_argument("--out", default="demo_out")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    with emulated.launcher(2, 2, args.inter_mbit) as (launcher, link):
        print(f"# {link}", flush=True)
        horovodrun(4, "tfc_apps.check", launcher=launcher)
    bench = tta.parser().parse_args(["--inter-mbit", str(args.inter_mbit), "--configs", *CONFIGS,
                                     "--epochs", str(args.epochs), "--target", str(args.target),
                                     "--out", str(out)])
    tta.resolve(bench)
    results, failed = tta.measure(bench)
    if failed or len(results) != len(CONFIGS):
        raise SystemExit(f"the training job failed at {failed} Mbit/s")
    png = tta.report(bench, results, title=f"small ResNet on digits, 4 ranks as 2x2, "
                                           f"{'unshaped' if args.inter_mbit == 0 else f'{args.inter_mbit} Mbit/s between nodes'}")
    level, seconds = same_accuracy(results)
    base, ours = seconds["dense_fp16"], seconds["hitopk"]
    print(f"time to validation top-1 {level:.4f} (the lower best accuracy of the two): dense_fp16 {base:.1f} s, "
          f"hitopk {ours:.1f} s: hitopk needs {ours / base:.2f}x the baseline's time")
    print(f"plot: {png}")


if __name__ == "__main__":
    main()
