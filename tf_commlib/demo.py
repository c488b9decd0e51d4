"""The main job (`make demo`): on this machine, 4 ranks as an emulated 2 nodes x 2 ranks,
  1. the topology check (hierarchical allreduce equals a plain one),
  2. model.fit of a small CNN on sklearn's digits, dense,
  3. the same with HiTopKComm + MSTopK at density 0.01 (DGC momentum correction and warm-up),
then a comparison table and a PNG of test accuracy vs epoch for both."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def horovodrun(np_, module, *args, topology="2x2"):
    run = Path(sys.executable).parent / "horovodrun"
    env = dict(os.environ, TF_COMMLIB_TOPOLOGY=topology, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [str(run), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, "-m", module, *args]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout.splitlines():  # rank 0's output, without Horovod's prefix
        if line.startswith("[0]<stdout>:"):
            print(line[len("[0]<stdout>:"):], flush=True)
    if proc.returncode:
        print(proc.stdout[-3000:], file=sys.stderr)
        raise SystemExit(f"{module} failed with exit code {proc.returncode}")


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ax.plot([r["epoch"] for r in run["epochs"]], [r["test_accuracy"] for r in run["epochs"]],
                marker="o", label=run["label"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title("digits CNN, 4 ranks (emulated 2x2): dense vs HiTopKComm+MSTopK")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--out", default="demo_out")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    horovodrun(4, "tf_commlib.check")
    runs = []
    for name, extra in [("dense", ["--algorithm", "dense"]),
                        ("hitopk", ["--algorithm", "hitopk", "--density", "0.01"])]:
        summary = out / f"{name}.json"
        horovodrun(4, "tf_commlib.train", *extra, "--epochs", str(args.epochs), "--json", str(summary))
        runs.append(json.loads(summary.read_text()))
    print(f"\n{'run':16s} {'final test acc':>14s} {'best':>6s} {'samples/s':>10s} {'kB/step':>9s}")
    for run in runs:
        e = run["epochs"]
        sps = sorted(r["samples_per_s"] for r in e)[len(e) // 2]
        print(f"{run['label']:16s} {e[-1]['test_accuracy']:14.4f} {max(r['test_accuracy'] for r in e):6.4f} "
              f"{sps:10.1f} {e[-1]['bytes_per_step'] / 1e3:9.1f}")
    plot(runs, out / "accuracy.png")
    print(f"plot: {out / 'accuracy.png'}")


if __name__ == "__main__":
    main()
