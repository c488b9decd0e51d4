"""The main job (`make demo`): on this machine, 4 ranks as an emulated 2 nodes x 2 ranks,
  1. the topology check (hierarchical allreduce equals a plain one),
  2. model.fit of a small CNN on sklearn's digits, dense,
  3. the same with HiTopKComm + MSTopK at density 0.01 (DGC momentum correction and warm-up),
then a comparison table and a PNG of test accuracy vs epoch for both."""
import argparse
from pathlib import Path

from tf_commlib.local_run import horovodrun, plot_accuracy, summary_table, train


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--out", default="demo_out")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    horovodrun(4, "tf_commlib.check")
    epochs = ["--epochs", str(args.epochs)]
    runs = [train(4, out, "dense", "--algorithm", "dense", *epochs),
            train(4, out, "hitopk+mstopk@0.01", "--algorithm", "hitopk", "--density", "0.01", *epochs)]
    print("\n" + summary_table(runs))
    plot_accuracy(runs, "digits CNN, 4 ranks (emulated 2x2): dense vs HiTopKComm+MSTopK",
                  out / "accuracy.png")
    print(f"plot: {out / 'accuracy.png'}")


if __name__ == "__main__":
    main()
