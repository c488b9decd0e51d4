"""Runs a tf_commlib module on N local ranks with horovodrun (Gloo) and plots training summaries;
shared by the main job (tfc_apps.demo) and the convergence benchmark."""
import json
import os
import subprocess
import sys
from pathlib import Path


def horovodrun(np_, module, *args, topology="2x2", launcher=None):
    """Runs `python -m module args` on np_ local ranks (or through `launcher`, a command prefix
    such as tfc_apps.emulated's); prints rank 0's output; raises on failure."""
    run = Path(sys.executable).parent / "horovodrun"
    env = dict(os.environ, TF_COMMLIB_TOPOLOGY=topology, TF_CPP_MIN_LOG_LEVEL="2")
    prefix = launcher or [str(run), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo"]
    cmd = [*prefix, sys.executable, "-m", module, *args]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout.splitlines():  # rank 0's output, without Horovod's prefix
        if line.startswith("[0]<stdout>:"):
            print(line[len("[0]<stdout>:"):], flush=True)
    if proc.returncode:
        print(proc.stdout[-3000:], file=sys.stderr)
        raise SystemExit(f"{module} failed with exit code {proc.returncode}")


def train(np_, out_dir, name, *args, topology="2x2", launcher=None):
    """Runs tfc_apps.train and returns its summary (written by rank 0)."""
    summary = Path(out_dir) / f"{name}.json"
    horovodrun(np_, "tfc_apps.train", *args, "--json", str(summary), topology=topology, launcher=launcher)
    run = json.loads(summary.read_text())
    run["label"] = name
    return run


def median_rate(run):
    """Median samples/s over the second half of the epochs (after tracing and DGC's density warm-up)."""
    rates = sorted(r["samples_per_s"] for r in run["epochs"][len(run["epochs"]) // 2:])
    return rates[len(rates) // 2]


def summary_table(runs):
    """Final and best accuracy, median samples/s over the second half of the epochs and the last
    epoch's kB a rank sends per step inside its node and between nodes."""
    lines = [f"{'run':26s} {'final test acc':>14s} {'best':>6s} {'samples/s':>10s} "
             f"{'intra kB/step':>13s} {'inter kB/step':>13s}"]
    for run in runs:
        e = run["epochs"]
        lines.append(f"{run['label']:26s} {e[-1]['test_accuracy']:14.4f} "
                     f"{max(r['test_accuracy'] for r in e):6.4f} {median_rate(run):10.1f} "
                     f"{e[-1]['intra_bytes_per_step'] / 1e3:13.1f} {e[-1]['inter_bytes_per_step'] / 1e3:13.1f}")
    return "\n".join(lines)


def plot_accuracy(runs, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ax.plot([r["epoch"] for r in run["epochs"]], [r["test_accuracy"] for r in run["epochs"]],
                marker="o", label=run["label"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
