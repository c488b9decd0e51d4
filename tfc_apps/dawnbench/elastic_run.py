"""--elastic: the DAWNBench run under tf_commlib.elastic (horovodrun's elastic mode). A lost node's ranks
leave and the others roll back to their last commit; a node the discovery script lists again joins.

The state holds the epoch and what each layout read of it (``done``: [ranks, samples per rank] parts,
the first the epoch's first layout). At every (re)start the data (DataCache's shards of the live ranks
and the node's embedded Redis), the model and the optimizer are built for the new layout, and
``state.bind`` gives them the last commit. The epoch in progress goes on with the samples no part read
(``Data.rest``: every sample once over the epoch, whatever the layouts), the stage's later epochs as in
a plain run. The learning rate follows the epochs done (``StagedLinear.resume``), its peak the global
batch of the ranks alive. The per-epoch report is the plain run's (metrics.jsonl on rank 0, resumed at
the committed epoch); at the end rank 0 writes elastic.json to --log-dir: each (re)start (epoch, the
parts of it read before, layout, time), what each epoch read (its parts) and the steps committed.
"""
import json
import os
import time

import keras
import tensorflow as tf

import tf_commlib
from tf_commlib import elastic
from tf_commlib.keras import default_callbacks
from tf_commlib.keras.callbacks import MetricAverage
from tfc_apps.dawnbench import models
from tfc_apps.dawnbench.data import Data
from tfc_apps.dawnbench.report import EpochReport, Log, Reporter
from tfc_apps.dawnbench.run import learning_rate, make_optimizer, weights_digest


class Position(keras.callbacks.Callback):
    """The position in the state: after every step this rank's batch is added to the last part of
    state["done"] (every rank reads as many), every ``every`` steps since the (re)start a commit, and
    at an epoch's end the next epoch and a commit. Put it after the EpochReport (its allreduce is then
    in the committed epoch)."""

    def __init__(self, state, every, size, batch):
        super().__init__()
        self.state, self.every, self.size, self.batch, self.steps = state, every, size, batch, 0

    def on_train_batch_end(self, batch, logs=None):
        done = self.state["done"]
        self.state["done"] = done[:-1] + [[done[-1][0], done[-1][1] + self.batch]]
        self.state["steps"] += 1
        self.steps += 1
        if self.steps % self.every == 0:
            self.state.commit()   # where the hosts changed: HostsUpdatedInterrupt on every rank

    def on_epoch_end(self, epoch, logs=None):
        parts = [part for part in self.state["done"] if part[1] > 0]
        self.state["read"] = self.state["read"] + [{"epoch": epoch + 1, "parts": parts}]
        self.state["epoch"], self.state["done"] = epoch + 1, [[self.size, 0]]
        self.state.commit()


def stage_at(stages, epoch):
    return next(s for s in stages if s.first_epoch <= epoch < s.first_epoch + s.epochs)


def run(args):
    """The run under tf_commlib.elastic; returns rank 0's epoch rows (every rank's: the same list)."""
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    tf_commlib.init()
    if tf.config.list_physical_devices("GPU"):
        keras.mixed_precision.set_global_policy("mixed_float16")
    state = elastic.State(epoch=0, done=[], steps=0, restarts=[], read=[])

    @elastic.run
    def train(state):
        topo = tf_commlib.topology()
        data = Data(args, topo)
        try:
            return _train(args, topo, data, state)
        finally:
            data.close()

    rows = train(state)
    if tf_commlib.topology().rank == 0:
        with open(os.path.join(args.log_dir, "elastic.json"), "w") as f:
            json.dump({"restarts": state["restarts"], "read": state["read"], "steps": state["steps"]}, f, indent=1)
    return rows


def _train(args, topo, data, state):
    stages = args.stage_list
    last_epoch = stages[-1].first_epoch + stages[-1].epochs - 1
    model = models.build(args.model, data.num_classes, args.seed)
    loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=args.label_smoothing)
    lr = learning_rate(args, data, topo)   # its peak: the global batch of the ranks alive
    model.compile(make_optimizer(args, data, topo, lr=lr), loss, jit_compile=False)
    stepping = elastic.optimizer_chain(model.optimizer)[-1]   # the optimizer whose steps lr counts
    state.bind(model, model.optimizer)
    done = [part for part in state["done"] if part[1] > 0]   # what earlier layouts read of this epoch
    state["done"] = done + [[topo.size, 0]]
    state["restarts"] = state["restarts"] + [{"epoch": state["epoch"], "done": done, "m": topo.m, "n": topo.n,
                                              "at": time.time()}]
    log = Log(args.log_dir, topo, state["epoch"], args.target_top5)
    reporter = Reporter(log, model, topo, last_epoch)
    if log.resume_unscored is not None:   # the evaluation of the last epoch's row, cut by the reset
        reporter.resume_val = lambda s=stage_at(stages, state["epoch"] - 1): data.val(s)
    if topo.rank == 0:
        print(f"dawnbench elastic: {topo.size} ranks as {topo.m}x{topo.n} from epoch {state['epoch'] + 1}"
              + (f", after {sum(c * s for c, s in done)} of its samples" if done else ""), flush=True)
    common = [c for c in default_callbacks() if not isinstance(c, MetricAverage)]
    finished = False
    try:
        while state["epoch"] <= last_epoch:
            epoch, stage = state["epoch"], stage_at(stages, state["epoch"])
            done = [part for part in state["done"] if part[1] > 0]
            if done:   # the rest of an epoch that other layouts began
                ds, steps = data.rest(stage, epoch, done)
                epochs = 1
            else:
                steps, epochs = data.steps(stage), stage.first_epoch + stage.epochs - epoch
                ds = data.train(stage, epoch, epochs)
            read = sum(c * s for c, s in done)   # the learning rate at the epochs done, this fit's steps
            begun = read / (read + steps * stage.batch * topo.size)
            lr.resume(epoch + begun, int(stepping.iterations.numpy()), (1 - begun) / steps)
            model.make_train_function(force=True)   # this fit's shapes and learning rate
            report = EpochReport(reporter, None if args.synthetic else (lambda s=stage: data.val(s)), stage, steps)
            model.fit(ds, initial_epoch=epoch, epochs=epoch + epochs, steps_per_epoch=steps, verbose=0,
                      shuffle=False, callbacks=common + [report, Position(state, args.commit_every, topo.size,
                                                                           stage.batch)])
        finished = True
    finally:
        reporter.close(finished)
    digest = weights_digest(model, topo)
    if topo.rank == 0:
        print(f"weights identical on all {topo.size} ranks: sha256 {digest}", flush=True)
        log.plot(f"{args.log_dir}/accuracy_throughput.png")
    return log.rows
