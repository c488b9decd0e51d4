"""Convergence benchmark (DGC Fig. 3 ordering): 4 ranks (2x2) on digits with dense aggregation,
naive allgather top-k with and without momentum correction, HiTopKComm, AR-Topk (star, var),
SparCML (ssar_rd, ssar_split_ag, dsar_split_ag) and star with tyagi's adaptive density; table and PNG."""
import argparse
import os
import sys

from tfc_apps.local_run import plot_accuracy, summary_table, train

CONFIGS = {
    "dense": ["--algorithm", "dense"],
    "naive_ag, no momentum corr.": ["--algorithm", "naive_ag", "--no-momentum-correction",
                                    "--no-momentum-masking", "--warmup", "0"],
    "naive_ag + DGC": ["--algorithm", "naive_ag"],
    "hitopk + DGC": ["--algorithm", "hitopk"],
    "star + DGC": ["--algorithm", "star"],
    "var + DGC": ["--algorithm", "var"],
    "ssar_rd + DGC": ["--algorithm", "ssar_rd"],
    "ssar_split_ag + DGC": ["--algorithm", "ssar_split_ag"],
    "dsar_split_ag + DGC": ["--algorithm", "dsar_split_ag"],
    "star, adaptive density": ["--algorithm", "star", "--density", "adaptive"],
}


def main(argv):
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench convergence", description=__doc__)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for name, extra in CONFIGS.items():
        if name != "dense" and "--density" not in extra:
            extra = extra + ["--density", str(args.density)]
        runs.append(train(4, args.out, name, *extra, "--epochs", str(args.epochs)))
    print("\n" + summary_table(runs))
    path = os.path.join(args.out, "convergence.png")
    plot_accuracy(runs, f"digits, 4 ranks, density {args.density}", path)
    print(f"plot: {path}", file=sys.stderr)
    return 0
