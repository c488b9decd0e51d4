"""Per-epoch report of the DAWNBench script: images/s, top-1/top-5 on the validation set, wall
time and time-to-accuracy, as JSON lines (``metrics.jsonl``), TensorBoard scalars and a PNG.
A resumed run continues the same log (rows of epochs it repeats are replaced)."""
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

from tf_commlib import primitives as P
from tf_commlib.keras.callbacks import average_variables
from tf_commlib.keras.optimizer import distributed_optimizer


class Log:
    """Rank 0's metrics.jsonl; the wall clock continues across a resume."""

    def __init__(self, log_dir, topo, start_epoch, target):
        self.topo, self.target = topo, target
        self.path = os.path.join(log_dir, "metrics.jsonl")
        self.rows = []
        if topo.rank == 0:
            os.makedirs(log_dir, exist_ok=True)
            if start_epoch > 0 and os.path.exists(self.path):
                with open(self.path) as f:
                    rows = [json.loads(line) for line in f if line.strip()]
                self.rows = [r for r in rows if "epoch" in r and r["epoch"] <= start_epoch]
            self._rewrite()
            self.writer = tf.summary.create_file_writer(os.path.join(log_dir, "tensorboard"))
        self.offset = self.rows[-1]["wall_s"] if self.rows else 0.0
        self.last = self.offset   # wall_s of the last row added (every rank)
        self.t0 = time.perf_counter()
        self.tta = next((r["wall_s"] for r in self.rows if (r.get("top5") or 0) >= target), None)

    def wall(self):
        return self.offset + time.perf_counter() - self.t0

    def _rewrite(self):
        with open(self.path, "w") as f:
            for r in self.rows:
                f.write(json.dumps(r) + "\n")

    def add(self, row):
        self.last = row["wall_s"]
        if self.topo.rank != 0:
            return
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        with self.writer.as_default():
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "epoch":
                    tf.summary.scalar(k, v, step=row["epoch"])
        self.writer.flush()
        print(json.dumps(row), flush=True)
        if self.tta is None and row.get("top5") is not None and row["top5"] >= self.target:
            self.tta = row["wall_s"]
            print(f"time-to-accuracy: top-5 {row['top5']:.4f} >= {self.target} after {self.tta:.1f} s "
                  f"(epoch {row['epoch']})", flush=True)

    def plot(self, path):
        if self.topo.rank != 0 or not self.rows:
            return
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        wall = [r["wall_s"] for r in rows]
        for key in ("top1", "top5"):
            if rows[0].get(key) is not None:
                a.plot(wall, [r[key] for r in rows], marker="o", label=key)
        a.axhline(self.target, color="gray", ls="--", lw=0.8)
        a.set_xlabel("wall time (s)")
        a.set_ylabel("validation accuracy")
        a.legend()
        b.bar([r["epoch"] for r in rows], [r["images_per_s"] for r in rows])
        b.set_xlabel("epoch")
        b.set_ylabel("images/s (all ranks)")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


_COUNTS = {}


def _counts_fn(model):
    """One traced function per model (not one per epoch)."""
    if id(model) not in _COUNTS:
        @tf.function
        def counts(x, y):
            logits = model(x, training=False)
            y = tf.cast(y, tf.int32)
            return tf.stack([tf.reduce_sum(tf.cast(tf.math.in_top_k(y, logits, 1), tf.float64)),
                             tf.reduce_sum(tf.cast(tf.math.in_top_k(y, logits, 5), tf.float64)),
                             tf.cast(tf.size(y), tf.float64)])
        _COUNTS[id(model)] = counts
    return _COUNTS[id(model)]


def evaluate(model, dataset, world):
    """Top-1 and top-5 over every rank's share of the validation set."""
    if dataset is None:
        return None, None
    counts = _counts_fn(model)
    total = tf.zeros(3, tf.float64)
    for x, y in dataset:
        total += counts(x, y)
    c1, c5, n = P.allreduce(total, world, average=False).numpy()
    return float(c1 / n), float(c5 / n)


class EpochReport(keras.callbacks.Callback):
    """Averages BN statistics over the ranks (so every rank holds the same model), evaluates, logs."""

    def __init__(self, log, val, stage, steps, topo):
        super().__init__()
        self.log, self.val, self.stage, self.steps, self.topo = log, val, stage, steps, topo
        self.step_s = None

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        elapsed = end - self.start
        self.step_s = elapsed / self.steps
        average_variables(self.model.non_trainable_variables)
        top1, top5 = evaluate(self.model, self.val, self.topo.world)
        eval_s = time.perf_counter() - end
        opt = distributed_optimizer(self.model)
        sent = opt.sent_bytes_at(epoch)
        wall = self.log.wall()
        row = {"epoch": epoch + 1, "resolution": self.stage.resolution, "batch": self.stage.batch,
               "algorithm": opt.algorithm_at(epoch), "loss": float((logs or {}).get("loss", np.nan)),
               "top1": top1, "top5": top5, "epoch_s": elapsed, "eval_s": eval_s,
               # since the last row (or the start): set-up, data sets, callbacks, checkpoints
               "other_s": wall - self.log.last - elapsed - eval_s,
               "images_per_s": self.steps * self.stage.batch * self.topo.size / elapsed,
               # bytes a rank sends per step inside its node and between nodes (the collectives' formulas)
               "intra_bytes_per_step": sent["intra"], "inter_bytes_per_step": sent["inter"],
               "wall_s": wall}
        self.log.add(row)
