"""Per-epoch report of the DAWNBench script: images/s, top-1/top-5 on the validation set, wall
time and time-to-accuracy, as JSON lines (``metrics.jsonl``), TensorBoard scalars and a PNG.
A resumed run continues the same log (rows of epochs it repeats are replaced).

The validation pass of epoch e runs on a copy of the model in a background thread while epoch
e + 1 trains; its counts cross the network with the BN statistics and the loss of epoch e + 1 in
one allreduce, and its row is written then (the run's last epoch is evaluated at once)."""
import concurrent.futures
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

from tf_commlib import primitives
from tf_commlib.replicas import average_variables
from tf_commlib.keras.optimizer import distributed_optimizer

PENDING = "pending_row.json"   # rank 0: the last epoch's row while its evaluation runs (for a resume)


class Log:
    """Rank 0's metrics.jsonl; the wall clock continues across a resume."""

    def __init__(self, log_dir, topo, start_epoch, target):
        self.topo, self.target = topo, target
        self.path = os.path.join(log_dir, "metrics.jsonl")
        self.pending_path = os.path.join(log_dir, PENDING)
        self.rows = []
        self.unscored = None   # a resumed run's row of its last completed epoch, if not written yet
        if topo.rank == 0:
            os.makedirs(log_dir, exist_ok=True)
            if start_epoch > 0 and os.path.exists(self.path):
                with open(self.path) as f:
                    rows = [json.loads(line) for line in f if line.strip()]
                self.rows = [r for r in rows if "epoch" in r and r["epoch"] <= start_epoch]
            if start_epoch > 0 and os.path.exists(self.pending_path) and start_epoch not in [r["epoch"] for r in self.rows]:
                with open(self.pending_path) as f:
                    pending = json.load(f)
                if pending.get("epoch") == start_epoch:
                    self.unscored = pending
            self._rewrite()
            self.writer = tf.summary.create_file_writer(os.path.join(log_dir, "tensorboard"))
        self.resume_unscored = None   # every rank: the resumed epoch whose row waits for its evaluation
        if start_epoch > 0:
            flag = primitives.broadcast(tf.constant([float(self.unscored is not None)], tf.float64), 0, topo.world)
            self.resume_unscored = start_epoch if flag.numpy()[0] > 0 else None
        last = self.unscored or (self.rows[-1] if self.rows else None)
        self.offset = last["wall_s"] if last else 0.0
        self.last = self.offset   # wall_s of the last row (every rank; pending ones too)
        self.t0 = time.perf_counter()
        self.tta = next((r["wall_s"] for r in self.rows if (r.get("top5") or 0) >= target), None)

    def wall(self):
        return self.offset + time.perf_counter() - self.t0

    def _rewrite(self):
        with open(self.path, "w") as f:
            for r in self.rows:
                f.write(json.dumps(r) + "\n")

    def keep_pending(self, row):
        """Rank 0 keeps the row of an epoch whose evaluation is running (a resumed run finishes it)."""
        if self.topo.rank == 0:
            with open(self.pending_path + ".tmp", "w") as f:
                json.dump(row, f)
            os.replace(self.pending_path + ".tmp", self.pending_path)

    def add(self, row):
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


class Evaluator:
    """The validation pass on a copy of the model, in a background thread: ``start`` takes a
    snapshot of the weights (every rank holds the same ones; one traced read) and returns at once;
    the thread builds the copy (once), the validation set (``val()``, once per stage) and counts;
    ``local_counts`` waits for this rank's (top-1 hits, top-5 hits, images)."""

    def __init__(self, model):
        self.model, self.copy, self.counts = model, None, None
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dawnbench-eval")
        self.future = None
        self.snapshot = tf.function(lambda: [tf.identity(v) for v in model.variables])

    def start(self, val):
        self.future = self.pool.submit(self._run, self.snapshot(), val)

    def _build(self):
        self.copy = keras.models.clone_model(self.model)
        if [v.shape for v in self.copy.variables] != [v.shape for v in self.model.variables]:
            raise RuntimeError(f"the evaluation copy of {self.model.name} does not have its variables")

        @tf.function
        def counts(x, y):   # traced once per resolution, by the first evaluation
            logits = self.copy(x, training=False)
            y = tf.cast(y, tf.int32)
            return tf.stack([tf.reduce_sum(tf.cast(tf.math.in_top_k(y, logits, 1), tf.float32)),
                             tf.reduce_sum(tf.cast(tf.math.in_top_k(y, logits, 5), tf.float32)),
                             tf.cast(tf.size(y), tf.float32)])
        self.counts = counts

    def _run(self, values, val):
        if self.copy is None:
            self._build()
        for c, v in zip(self.copy.variables, values):
            c.assign(v)
        total = np.zeros(3, np.float64)
        for x, y in val():
            total += self.counts(x, y).numpy()
        return total

    def local_counts(self):
        if self.future is None:
            return np.zeros(3)
        out, self.future = self.future.result(), None
        return out

    def close(self):
        self.pool.shutdown(wait=True)


def _accuracy(counts):
    c1, c5, n = counts
    return (float(c1 / n), float(c5 / n)) if n else (None, None)


class Reporter:
    """One per training run (several stages): the epoch rows, the evaluation in flight, and the
    one allreduce per epoch (BN statistics, the loss, the last epoch's validation counts)."""

    def __init__(self, log, model, topo, last_epoch):
        self.log, self.model, self.topo, self.last_epoch = log, model, topo, last_epoch
        self.evaluator = Evaluator(model)
        self.pending = log.unscored   # rank 0's row that waits for its counts (else None)
        self.awaiting = log.resume_unscored is not None   # every rank: counts to contribute
        self.resume_val = None   # a resumed run's validation set of that row's stage

    def resume(self):
        """A resumed run: the restored model is the one of the pending row (its evaluation was cut)."""
        if self.log.resume_unscored is not None:
            self.evaluator.start(self.resume_val)
            self.log.resume_unscored = None

    def _exchange(self, loss, counts):
        """One allreduce: the mean of the float32 non-trainable variables (BN statistics, so every
        rank holds the same model) and of the loss, the sum of the validation counts."""
        floats = [v for v in self.model.non_trainable_variables if v.dtype == "float32"]
        others = [v for v in self.model.non_trainable_variables if v.dtype != "float32"]
        sizes = [int(np.prod(v.shape, dtype=np.int64)) for v in floats]
        flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in floats]
                         + [tf.constant([loss], tf.float32), tf.constant(counts, tf.float32)], 0)
        total = primitives.allreduce(flat, self.topo.world, average=False)
        parts = tf.split(total, sizes + [1, 3])
        for v, part in zip(floats, parts):
            v.assign(tf.reshape(part / self.topo.size, v.shape))
        if others:
            average_variables(others)
        return float(parts[-2].numpy()[0]) / self.topo.size, parts[-1].numpy().astype(np.float64)

    def epoch_end(self, epoch, logs, elapsed, val, stage, steps):
        end = time.perf_counter()
        counts = self.evaluator.local_counts() if self.awaiting else np.zeros(3)
        loss, counts = self._exchange(float((logs or {}).get("loss", np.nan)), counts)
        if self.pending is not None:   # the previous epoch's row, now with its accuracy
            self._finish(self.pending, counts)
        self.pending, self.awaiting = None, False
        opt = distributed_optimizer(self.model)
        row = {"epoch": epoch + 1, "resolution": stage.resolution, "batch": stage.batch,
               "algorithm": opt.algorithm_at(epoch), "loss": loss, "top1": None, "top5": None}
        if val is not None:
            self.evaluator.start(val)
            if epoch == self.last_epoch:   # nothing left to overlap it with
                c = primitives.allreduce(tf.constant(self.evaluator.local_counts(), tf.float64), self.topo.world,
                                average=False).numpy()
                row["top1"], row["top5"] = _accuracy(c)
            else:
                self.awaiting = True
        eval_s = time.perf_counter() - end
        sent = opt.sent_bytes_at(epoch)
        wall = self.log.wall()
        row.update({"epoch_s": elapsed, "eval_s": eval_s,
                    # since the last row (or the start): set-up, data sets, callbacks, checkpoints
                    "other_s": wall - self.log.last - elapsed - eval_s,
                    "images_per_s": steps * stage.batch * self.topo.size / elapsed,
                    # bytes a rank sends per step inside its node and between nodes (the collectives' formulas)
                    "intra_bytes_per_step": sent["intra"], "inter_bytes_per_step": sent["inter"],
                    "wall_s": wall})
        if getattr(opt, "interval_log", None):   # DiLoCo(sync_every="auto"): its last choice of H, and why
            row["interval_choice"] = opt.interval_log[-1]
        self.log.last = wall
        if self.awaiting:
            self.pending = row if self.topo.rank == 0 else None
            self.log.keep_pending(row)
        else:
            self._finish(row, None)

    def _finish(self, row, counts):
        if counts is not None:
            row["top1"], row["top5"] = _accuracy(counts)
        self.log.add(row)

    def close(self, finished=True):
        """finished=False (an elastic reset): the pending row stays for the restarted run to score."""
        self.evaluator.close()
        if finished and self.topo.rank == 0 and os.path.exists(self.log.pending_path):
            os.remove(self.log.pending_path)


class EpochReport(keras.callbacks.Callback):
    """One stage's epochs: times them and hands them to the run's Reporter. Put it before the
    checkpoint callback: the checkpoint then holds the averaged BN statistics."""

    def __init__(self, reporter, val, stage, steps):
        """val: a function that returns the stage's validation set (called in the evaluation
        thread, so that its set-up overlaps training too), or None (no validation set)."""
        super().__init__()
        self.reporter, self.val, self.stage, self.steps = reporter, val, stage, steps
        self.step_s = None

    def on_epoch_begin(self, epoch, logs=None):
        self.reporter.resume()   # after the checkpoint's restore (on_train_begin)
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        elapsed = time.perf_counter() - self.start
        self.step_s = elapsed / self.steps
        self.reporter.epoch_end(epoch, logs, elapsed, self.val, self.stage, self.steps)
