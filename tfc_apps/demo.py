"""The main job (`make demo`): 4 ranks as 2 nodes x 2 ranks, on the emulated cluster with a shaped
inter-node link when this machine allows it (root, ip, tc; else on 127.0.0.1 unshaped, saying why):
  1. the topology check (hierarchical allreduce equals a plain one),
  2. model.fit of a small CNN on sklearn's digits, dense,
  3. the same with HiTopKComm + MSTopK at density 0.01 (DGC momentum correction and warm-up),
then a comparison table with hitopk's speedup over dense and a PNG of test accuracy vs epoch."""
import argparse
from pathlib import Path

from tfc_apps import emulated
from tfc_apps.local_run import horovodrun, median_rate, plot_accuracy, summary_table, train


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--inter-mbit", type=int, default=25,
                   help="inter-node link of the emulated cluster (at 25 Mbit/s the small CNN's dense gradient, "
                        "237 kB, takes about as long to cross it as a step takes on 2 cores)")
    p.add_argument("--out", default="demo_out")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    epochs = ["--epochs", str(args.epochs)]
    with emulated.launcher(2, 2, args.inter_mbit) as (launcher, link):
        print(f"# {link}", flush=True)
        horovodrun(4, "tfc_apps.check", launcher=launcher)
        runs = [train(4, out, "dense", "--algorithm", "dense", *epochs, launcher=launcher),
                train(4, out, "hitopk+mstopk@0.01", "--algorithm", "hitopk", "--density", "0.01", *epochs,
                      launcher=launcher)]
    print("\n" + summary_table(runs))
    dense, hitopk = runs
    print(f"hitopk+mstopk vs dense on the {link}: {median_rate(hitopk) / median_rate(dense):.2f}x samples/s, "
          f"final test accuracy {hitopk['epochs'][-1]['test_accuracy']:.4f} vs {dense['epochs'][-1]['test_accuracy']:.4f}")
    plot_accuracy(runs, f"digits CNN, 4 ranks ({link}): dense vs HiTopKComm+MSTopK", out / "accuracy.png")
    print(f"plot: {out / 'accuracy.png'}")


if __name__ == "__main__":
    main()
