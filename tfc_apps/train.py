"""Distributed training of a small CNN on sklearn's digits with tf_commlib (run under horovodrun
or tfc_apps.cluster_launch or scripts/slurm/train.sbatch). Prints per-epoch test accuracy,
samples/s and the bytes a rank sends per step inside its node (intra) and between nodes (inter),
from the collectives' formulas; rank 0 writes a JSON summary. With --ckpt-dir every rank backs up
its state after each epoch and a restarted (requeued) run resumes from there.

  horovodrun -np 4 -H localhost:4 --gloo python -m tfc_apps.train --algorithm hitopk --density 0.01
"""
import argparse
import json
import os
import sys
import time

import keras
import numpy as np

import tf_commlib
from tfc_apps import digits
from tf_commlib.collectives import ALGORITHMS
from tf_commlib.keras import (DGC, AdaptiveDensity, BackupAndRestore, DistributedOptimizer, Selection,
                              default_callbacks, distributed_optimizer)
from tf_commlib.keras.adaptive import profile_batches


def parse_schedule_arg(text):
    """'0:hitopk,13:2dtar' -> {0: 'hitopk', 13: '2dtar'}"""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        epoch, name = part.split(":")
        out[int(epoch)] = name.strip()
    return out


def density_arg(text):
    return text if text == "adaptive" else float(text)


MODELS = {"cnn": digits.small_cnn, "resnet": digits.small_resnet}


def parser():
    p = argparse.ArgumentParser(prog="python -m tfc_apps.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithm", default="auto", choices=sorted(ALGORITHMS) + ["auto"],
                   help="a collective, or auto (default): each epoch the one with the least predicted time to "
                        "accuracy on the measured link")
    p.add_argument("--density", type=density_arg, default=0.01, help="a fraction, or 'adaptive'")
    p.add_argument("--candidates", default=None, help="densities for --density adaptive, e.g. 0.1,0.01")
    p.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"],
                   help="16-bit values on the wire of the dense collectives (fp16: the dense fp16 baseline)")
    p.add_argument("--selector", default="mstopk")
    p.add_argument("--model", default="cnn", choices=sorted(MODELS),
                   help="cnn: two convolutions and two dense layers; resnet: a small residual network")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate (cosine decay to 0)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--no-momentum-correction", action="store_true")
    masking = p.add_mutually_exclusive_group()
    masking.add_argument("--momentum-masking", action="store_true",
                         help="DGC's momentum factor masking (off by default, as in DGC())")
    masking.add_argument("--no-momentum-masking", action="store_true", help="the default: no masking")
    p.add_argument("--warmup", type=int, default=4, help="DGC density warm-up epochs")
    p.add_argument("--local-clip-norm", type=float, default=None)
    p.add_argument("--schedule", default=None, help="e.g. 0:hitopk,13:2dtar")
    p.add_argument("--topology", default=None, help="e.g. 2x2 (default: Horovod's layout)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="rank 0 writes the per-epoch summary here")
    p.add_argument("--ckpt-dir", default=None,
                   help="back up each rank's state here after every epoch and resume from it")
    p.add_argument("--elastic", action="store_true",
                   help="under horovodrun's elastic mode (--host-discovery-script): a lost node's ranks leave, the "
                        "others roll back to their last commit and go on; a node listed again joins (tf_commlib.elastic)")
    p.add_argument("--commit-every", type=int, default=10, help="with --elastic: steps between commits")
    p.add_argument("--deterministic", action="store_true",
                   help="TF op determinism (a resumed run ends bit for bit where an uninterrupted one does)")
    return p


class FailAt(keras.callbacks.Callback):
    """Test hook: TF_COMMLIB_TEST_FAIL_AT=RANK:EPOCH:CODE makes that rank exit with CODE as the
    1-based EPOCH begins; RANK:EPOCH:CODE:BATCH as the 0-based BATCH of that epoch begins (the
    fault benchmark's kill at a step). A negative CODE kills it with that signal (-9: a rank that
    dies). The message it prints first carries the time (``at t=<time.time()>``)."""

    def __init__(self, rank, spec):
        super().__init__()
        self.rank = rank
        fields = [int(v) for v in spec.split(":")]
        if len(fields) not in (3, 4):
            raise ValueError(f"TF_COMMLIB_TEST_FAIL_AT must be RANK:EPOCH:CODE[:BATCH], got {spec!r}")
        self.at_rank, self.at_epoch, self.code = fields[:3]
        self.at_batch = fields[3] if len(fields) == 4 else None
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if self.at_batch is None:
            self._fail(f"epoch {epoch + 1}")

    def on_train_batch_begin(self, batch, logs=None):
        if self.at_batch is not None and batch == self.at_batch:
            self._fail(f"epoch {self.epoch + 1} batch {batch}")

    def _fail(self, where):
        if self.rank == self.at_rank and self.epoch + 1 == self.at_epoch:
            print(f"rank {self.rank}: exiting with {self.code} at {where} (TF_COMMLIB_TEST_FAIL_AT) "
                  f"at t={time.time():.3f}", file=sys.stderr, flush=True)
            if self.code < 0:
                os.kill(os.getpid(), -self.code)
            raise SystemExit(self.code)


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
        x, y = self.test
        acc = np.mean(np.argmax(self.model.predict(x, verbose=0, batch_size=512), axis=-1) == y)
        opt = distributed_optimizer(self.model)
        algo = opt.algorithm_at(epoch)
        density = opt.density_at(epoch) if algo == "auto" or algo in ALGORITHMS and ALGORITHMS[algo].lossy else 1.0
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


def weights_sha256(model):
    """sha256 of the model's weights: each variable's path, dtype, shape and raw bytes, in order."""
    import hashlib

    h = hashlib.sha256()
    for v in model.weights:
        a = np.ascontiguousarray(v.numpy())
        h.update(f"{v.path}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def build(args, steps=None, lr=None):
    """The model, compiled with its DistributedOptimizer (learning rate `lr`, default a cosine decay over `steps`)."""
    model = MODELS[args.model](args.seed)
    lr = keras.optimizers.schedules.CosineDecay(args.lr, steps) if lr is None else lr
    opt = DistributedOptimizer(
        keras.optimizers.SGD(lr, momentum=args.momentum), algorithm=args.algorithm, compression=args.compression,
        density=args.density if args.candidates is None else [float(c) for c in args.candidates.split(",")],
        dgc=DGC(momentum_correction=not args.no_momentum_correction, momentum_masking=args.momentum_masking,
                warmup=args.warmup or 0, local_clip_norm=args.local_clip_norm),
        selection=Selection(selector=args.selector, seed=args.seed), schedule=parse_schedule_arg(args.schedule))
    # no compiled metrics (the report measures test accuracy): Keras builds them while it traces the
    # first step, and a trace that creates variables runs twice
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model, opt


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.candidates is not None and args.density != "adaptive":
        p.error("--candidates goes with --density adaptive")
    if args.elastic:
        from tf_commlib import elastic

        if not elastic.is_elastic():
            p.error("--elastic needs horovodrun's elastic mode: --host-discovery-script (with --min-np, --max-np)")
        if args.ckpt_dir or args.topology or args.density == "adaptive":
            p.error("--elastic keeps its state in memory, takes the layout from the live hosts and a fixed "
                    "density: no --ckpt-dir, --topology or --density adaptive")
    if args.commit_every < 1:
        p.error(f"--commit-every must be >= 1, got {args.commit_every}")
    if args.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    topo = tf_commlib.init(args.topology)
    label = f"{args.algorithm}@{args.density}" if args.algorithm not in ("dense", "2dtar") else args.algorithm
    if args.elastic:
        return train_elastic(args, label)
    (x, y), test = digits.load(topo.rank, topo.size, args.seed)
    model, opt = build(args, args.epochs * (len(y) // args.batch_size + (len(y) % args.batch_size > 0)))
    if topo.rank == 0:
        print(f"[{label}] {topo.size} ranks as {topo.m}x{topo.n} (nodes x ranks per node)", flush=True)
    report = EpochReport(topo, test, len(y), label)
    adapt = [AdaptiveDensity(profile_batches(x, y, args.batch_size))] if args.density == "adaptive" else []
    extra = [BackupAndRestore(args.ckpt_dir)] if args.ckpt_dir else []
    if os.environ.get("TF_COMMLIB_TEST_FAIL_AT"):
        extra.append(FailAt(topo.rank, os.environ["TF_COMMLIB_TEST_FAIL_AT"]))
    # the report first, then the backup; the profiling counts in the epoch time
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, shuffle=False, verbose=0,
              callbacks=default_callbacks() + [report] + adapt + extra)
    if topo.rank == 0 and args.json:
        write_summary(args, label, report.rows, model)
    return report.rows


def train_elastic(args, label):
    """The run under tf_commlib.elastic: every epoch walks one global order of the training set (the same
    whatever the world size) in global batches of size x --batch-size, rank r taking the r-th slice of
    each; fit runs one epoch at a time from the committed position; after a reset the model and
    optimizer are built for the new layout and get the last commit."""
    from tf_commlib import elastic

    (x_all, y_all), test = digits.load(0, 1, args.seed)
    state = elastic.State(epoch=0, offset=0, steps=0, rows=[], restarts=[])
    commits = Commits(state, args.commit_every)

    @elastic.run
    def run(state):
        topo = tf_commlib.topology()
        lr = SampleCosine(args.lr, args.epochs * len(y_all))
        model, opt = build(args, lr=lr)
        state.bind(model, opt)
        lr.start(state["epoch"] * len(y_all) + state["offset"], int(opt.iterations.numpy()),
                 topo.size * args.batch_size)
        state["restarts"] = state["restarts"] + [{"epoch": state["epoch"], "offset": state["offset"], "m": topo.m,
                                                  "n": topo.n, "started": time.time(), "first_step": None}]
        if topo.rank == 0:
            print(f"[{label}] {topo.size} ranks as {topo.m}x{topo.n} from epoch {state['epoch'] + 1}, "
                  f"sample {state['offset']}", flush=True)
        while state["epoch"] < args.epochs:
            g = topo.size * args.batch_size
            starts = np.arange(state["offset"], len(y_all) - g + 1, g)   # whole global batches
            idx = (starts[:, None] + topo.rank * args.batch_size + np.arange(args.batch_size)).ravel()
            report = EpochReport(topo, test, len(idx), label)
            commits.global_batch = g
            if len(idx):
                model.fit(x_all[idx], y_all[idx], batch_size=args.batch_size, epochs=state["epoch"] + 1,
                          initial_epoch=state["epoch"], shuffle=False, verbose=0,
                          callbacks=default_callbacks() + [report, commits])
            state["rows"] = state["rows"] + report.rows
            state["epoch"], state["offset"] = state["epoch"] + 1, 0
            state.commit()
        return model

    model = run(state)
    if tf_commlib.topology().rank == 0 and args.json:
        write_summary(args, label, state["rows"], model, steps=state["steps"], steps_run=commits.steps_run,
                      restarts=state["restarts"])
    return state["rows"]


def write_summary(args, label, rows, model, **extra):
    w = np.concatenate([v.numpy().ravel() for v in model.weights]).astype(np.float64)
    with open(args.json, "w") as f:
        json.dump({"label": label, "args": vars(args), "epochs": rows, **extra,
                   "weights": {"count": int(w.size), "sum": float(w.sum()),
                               "l2": float(np.sqrt((w * w).sum())), "sha256": weights_sha256(model)}},
                  f, indent=1)


class SampleCosine(keras.optimizers.schedules.LearningRateSchedule):
    """--elastic: the cosine decay of `peak` to 0 over `total` samples of the run, whatever the number of
    ranks (a reset changes the samples a step takes). ``start(done, step, per_step)`` after a (re)start:
    `done` samples were done at the optimizer's step count `step`, each step after it takes `per_step`."""

    def __init__(self, peak, total):
        self.peak, self.total, self.done, self.step, self.per_step = float(peak), float(total), 0.0, 0, 0.0

    def start(self, done, step, per_step):
        self.done, self.step, self.per_step = float(done), int(step), float(per_step)

    def __call__(self, step):
        import tensorflow as tf

        done = self.done + (tf.cast(step, tf.float32) - self.step) * self.per_step
        return 0.5 * self.peak * (1.0 + tf.cos(np.pi * tf.clip_by_value(done / self.total, 0.0, 1.0)))

    def get_config(self):
        return {"peak": self.peak, "total": self.total}


class Commits(keras.callbacks.Callback):
    """--elastic: after every step, the epoch's position (samples of the global order done) and the steps
    of the committed run in the state, and the time of the first step after a (re)start in its last
    "restarts" row; every `every` steps a commit (where the hosts changed, HostsUpdatedInterrupt ends fit
    on every rank). ``steps_run`` counts the steps this process ran, those rolled back included.
    ``global_batch``: the samples of a step on the current layout (set before each fit)."""

    def __init__(self, state, every):
        super().__init__()
        self.state, self.every, self.global_batch, self.steps_run = state, every, None, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps_run += 1
        last = self.state["restarts"][-1]
        if last["first_step"] is None:
            self.state["restarts"] = self.state["restarts"][:-1] + [{**last, "first_step": time.time()}]
        self.state["offset"] += self.global_batch
        self.state["steps"] += 1
        if (batch + 1) % self.every == 0:
            self.state.commit()


if __name__ == "__main__":
    main()
