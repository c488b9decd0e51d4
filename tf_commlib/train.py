"""Distributed training of a small CNN on sklearn's digits with tf_commlib (run under horovodrun
or tf_commlib.cluster_launch). Prints per-epoch test accuracy, samples/s and the bytes a rank sends
per step inside its node (intra) and between nodes (inter), from the collectives' formulas; rank 0
writes a JSON summary.

  horovodrun -np 4 -H localhost:4 --gloo python -m tf_commlib.train --algorithm hitopk --density 0.01
"""
import argparse
import json
import time

import keras
import numpy as np

import tf_commlib
from tf_commlib import digits
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.keras import DistributedOptimizer, default_callbacks


def parse_schedule_arg(text):
    """'0:hitopk,13:2dtar' -> {0: 'hitopk', 13: '2dtar'}"""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        epoch, name = part.split(":")
        out[int(epoch)] = name.strip()
    return out


def parser():
    p = argparse.ArgumentParser(prog="python -m tf_commlib.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithm", default="hitopk", choices=sorted(ALGORITHMS))
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--selector", default="mstopk")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate (cosine decay to 0)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--no-momentum-correction", action="store_true")
    p.add_argument("--no-momentum-masking", action="store_true")
    p.add_argument("--warmup", type=int, default=4, help="DGC density warm-up epochs")
    p.add_argument("--local-clip-norm", type=float, default=None)
    p.add_argument("--schedule", default=None, help="e.g. 0:hitopk,13:2dtar")
    p.add_argument("--topology", default=None, help="e.g. 2x2 (default: Horovod's layout)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="rank 0 writes the per-epoch summary here")
    return p


class EpochReport(keras.callbacks.Callback):
    """Test accuracy, samples/s and bytes sent per step after each epoch (rank 0 prints)."""

    def __init__(self, topo, test, samples_per_epoch, label):
        super().__init__()
        self.topo, self.test, self.samples, self.label = topo, test, samples_per_epoch, label
        self.rows = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        elapsed = time.perf_counter() - self.start
        _, acc = self.model.evaluate(*self.test, verbose=0, batch_size=512)
        opt = self.model.optimizer
        algo = opt.algorithm_at(epoch)
        density = opt.density_at(epoch) if algo == "auto" or ALGORITHMS[algo].sparse else 1.0
        sent = opt.sent_bytes_at(epoch)
        row = {"epoch": epoch + 1, "algorithm": algo, "density": density,
               "train_loss": float(logs.get("loss", np.nan)), "test_accuracy": float(acc),
               "samples_per_s": self.samples * self.topo.size / elapsed,
               "intra_bytes_per_step": sent["intra"], "inter_bytes_per_step": sent["inter"],
               "bytes_per_step": sent["intra"] + sent["inter"]}
        self.rows.append(row)
        if self.topo.rank == 0:
            print(f"[{self.label}] epoch {row['epoch']:3d}  {algo:8s} density {density:<8.4g} "
                  f"loss {row['train_loss']:.4f}  test acc {acc:.4f}  "
                  f"{row['samples_per_s']:8.1f} samples/s  kB/step intra {sent['intra'] / 1e3:8.1f} "
                  f"inter {sent['inter'] / 1e3:8.1f}", flush=True)


def main(argv=None):
    args = parser().parse_args(argv)
    topo = tf_commlib.init(args.topology)
    (x, y), test = digits.load(topo.rank, topo.size, args.seed)
    model = digits.small_cnn(args.seed)
    steps = args.epochs * (len(y) // args.batch_size + (len(y) % args.batch_size > 0))
    lr = keras.optimizers.schedules.CosineDecay(args.lr, steps)
    opt = DistributedOptimizer(
        keras.optimizers.SGD(lr, momentum=args.momentum), algorithm=args.algorithm,
        density=args.density, selector=args.selector,
        momentum_correction=not args.no_momentum_correction,
        momentum_masking=not args.no_momentum_masking, warmup=args.warmup,
        local_clip_norm=args.local_clip_norm, schedule=parse_schedule_arg(args.schedule),
        seed=args.seed)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)

    label = f"{args.algorithm}@{args.density}" if args.algorithm not in ("dense", "2dtar") else args.algorithm
    report = EpochReport(topo, test, len(y), label)
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, shuffle=False, verbose=0,
              callbacks=default_callbacks() + [report])
    if topo.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"label": label, "args": vars(args), "epochs": report.rows}, f, indent=1)
    return report.rows


if __name__ == "__main__":
    main()
