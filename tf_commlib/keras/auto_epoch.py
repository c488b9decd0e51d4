"""DistributedOptimizer(algorithm="auto"): ``AutoEpochs`` turns the optimizer's buckets and measured
epochs into the inputs of tf_commlib.auto.decide (each candidate's predicted step in every epoch left,
the steps, a trace's cost, a lossy candidate's measured efficiency) and runs the candidate "diloco"
(tf_commlib.auto.rounds). Every rank decides from the same allreduced numbers; one that did not would
fail the aggregators' consistency check at its next step.
"""
import math

import numpy as np
import tensorflow as tf

from tf_commlib import costmodel, fusion, replicas
from tf_commlib.alphabeta import LinkParams
from tf_commlib.auto import rounds
from tf_commlib.auto.decide import TimeToAccuracy
from tf_commlib.collectives import ALGORITHMS, predict
from tf_commlib.topology import topology as current_topology


class AutoEpochs:
    """The choice of ``opt`` (a DistributedOptimizer whose schedule runs "auto"), built with it."""

    def __init__(self, opt):
        self.opt, self.settings = opt, opt.auto
        local = rounds.enabled(self.settings, current_topology(), opt)
        self.tta = TimeToAccuracy(self.settings.candidates + ((rounds.NAME,) if local else ()),
                                  [c for c in self.settings.candidates if ALGORITHMS[c].lossy],
                                  drift=self.settings.drift, rounds=(rounds.NAME,) if local else ())
        self.local = None   # candidate "diloco"'s LocalRounds (built with the optimizer where it is one)
        self.local_restored = False   # a backup written while "diloco" ran: the next epoch begins from its end
        self.local_sync_s = None   # a sync of "diloco" as its last epoch measured it (exchange included)
        self.link = self.settings.cost_params or opt.measurements.link
        self.compute_s = self.settings.compute_s
        # the part of the shorter of compute and communication a step hides until an epoch is measured: all
        # where a GPU computes; none on CPU cores, which the collectives share (docs/collectives.md)
        self.overlapped = self.overlapped_at_start = 1.0 if opt.overlap and tf.config.list_physical_devices("GPU") \
            else 0.0
        self.sums, self.start = {}, None   # per compressible variable: sum of u; residuals at the epoch's start
        self.running, self.recalibrations = None, 0   # the measured epoch's candidate; links measured again
        self.probed = opt.measurements.probed   # {candidate: seconds} (measure.probe_candidates)
        self.probed_warmup = opt.measurements.probed_warmup   # {candidate: {density: seconds}}
        self.probed_on, self.variables = self.link, []   # the link the candidates were timed on
        self.steps = self.switch_s = None   # the last measured epoch's steps; a new trace's seconds
        self.first_s = {}   # traced (True/False) -> the last such epoch's first step, less the others' median

    def build(self, var_list, lossy_indices):
        self.variables = list(var_list)
        self.sums = {i: self.opt.add_variable_from_reference(var_list[i], "auto_progress") for i in lossy_indices}
        if rounds.NAME in self.tta.candidates:
            self.local = rounds.LocalRounds(self.opt, var_list)

    def local_variables(self):
        return [] if self.local is None else self.local.outer_optimizer.variables

    def reset_rank_state(self):
        if self.local is not None:
            self.local.residual.assign(tf.zeros_like(self.local.residual))

    def running_local(self):
        return self.local is not None and self.local.running

    def end_step(self):
        if self.local is not None:
            self.local.end_step()

    def synchronize(self):
        if self.local is not None:
            self.local.synchronize()

    def accumulate(self, send):
        """What the step adds to the sums (in its commit), for a lossy candidate only (an exact one's eta is 1)."""
        if self.running in self.tta.lossy:
            for i, var in self.sums.items():
                if send[i] is not None:
                    var.assign_add(tf.cast(send[i], var.dtype))

    def _groups(self):
        return [g for g in self.opt._groups if g.lossy]

    def _residual_inputs(self):
        """Per lossy group and bucket: the rank's residuals of every algorithm, in input space (tensors)."""
        return [owed for g in self._groups() for owed in g.aggregator.owed()]

    def begin_window(self, running):
        """The start of an epoch that runs `running` (None: the schedule left "auto"): for a lossy one,
        sums zeroed and residuals noted; "diloco" started or, where it ran (or a backup of it is restored),
        stopped."""
        if self.local is not None:
            h = self.local_interval() if running == rounds.NAME else 0
            if self.local.running or self.local_restored:   # before stop's collective: an error, not a hang
                self.local.check_begin(self.tta.candidates.index(running) if running else -1, h, self.local_restored)
            if self.local_restored:
                self.local.running, self.local_restored = True, False
            if self.local.running:   # the steps since the last sync: the next epoch starts from the same weights
                self.local.synchronize()
            if running == rounds.NAME:
                self.local.start(h)
            else:   # the wrapped optimizer's state made the same on every rank again
                self.local.stop(self.opt.inner_optimizer.variables)
        self.running, self.start = running, None
        self.tta.left = self.tta.left or running is None   # the schedule left "auto": coming back is a change
        if running in self.tta.lossy:
            for var in self.sums.values():
                var.assign(tf.zeros(var.shape, var.dtype))
            self.start = self._residual_inputs()

    def _delivered_here(self):
        """This rank's (numerator, denominator) of the running candidate's eta (zeros for an exact one)."""
        local = np.zeros(2, np.float64)
        if self.start is not None:
            ends, k = self._residual_inputs(), 0
            for group in self._groups():
                sums = [tf.convert_to_tensor(self.sums[i]) for i in group.indices]
                for bucket in group.aggregator.buckets:
                    local += delivered(self.start[k], ends[k], fusion.flatten(sums, bucket))
                    k += 1
        return local

    def state(self):
        """What BackupAndRestore keeps: the measurements, the choice, a link measured again during the run,
        whether "diloco" ran (the wrapped optimizer's state is then per node)."""
        return {**self.tta.state(), "compute_s": self.compute_s, "overlapped": self.overlapped,
                "local_running": self.running_local(), "local_sync_s": self.local_sync_s,
                "steps": self.steps, "switch_s": self.switch_s,
                "link": self.link.as_list() if self.recalibrations and self.link is not None else None,
                "first_s": {"traced" if k else "untraced": v for k, v in self.first_s.items()}}

    def restore(self, state):
        """What state() kept; a value it does not hold as built (a rank may restore its latest backup, then
        its previous one). A link measured again: the candidates are timed again at the next choice."""
        self.tta.restore(state)
        built = {"compute_s": self.settings.compute_s, "overlapped": self.overlapped_at_start}
        for name, kind in (("compute_s", float), ("overlapped", float), ("steps", int), ("switch_s", float)):
            setattr(self, name, built.get(name) if state.get(name) is None else kind(state[name]))
        self.first_s = {k == "traced": float(v) for k, v in (state.get("first_s") or {}).items()}
        self.local_restored = bool(state.get("local_running"))
        self.local_sync_s = None if state.get("local_sync_s") is None else float(state["local_sync_s"])
        link = state.get("link")
        self.link, self.recalibrations = (LinkParams.from_list(link), 1) if link is not None else (
            self.settings.cost_params or self.opt.measurements.link, 0)
        self.running, self.start = None, None   # not the choice of the build the load made
        if self.local is not None:
            self.local.running = False   # rounds that ran before the backup: local_restored

    def measurements(self):
        """What auto measured that holds on another layout (JSON; an elastic reset carries it): this model's
        compute per step on these machines, the part of it a step hides, a trace's cost, each lossy
        candidate's measured efficiency, and an epoch's steps with the world size they were counted at.
        Not the link, the measured / predicted ratios, DiLoCo's sync or the choice: those belong to the
        layout, measured and made again on the new one."""
        return {"efficiency": dict(self.tta.efficiency), "compute_s": self.compute_s, "overlapped": self.overlapped,
                "first_s": {"traced" if k else "untraced": v for k, v in self.first_s.items()},
                "switch_s": self.switch_s, "steps": self.steps, "size": current_topology().size}

    def load_measurements(self, kept):
        """measurements() of another layout (the same on every rank): the next choice weighs the
        candidates with them on this layout's link, none of them kept (the rebuilt step is traced anew
        whichever runs). An epoch's steps scale with the world size: its samples are the same, split
        among the ranks in batches of the same size per rank (an elastic fit; not a fit given
        steps_per_epoch, whose next measured epoch corrects it)."""
        self.tta.efficiency = {k: float(v) for k, v in kept["efficiency"].items() if k in self.tta.lossy}
        if kept["compute_s"] is not None:
            self.compute_s = float(kept["compute_s"])
        self.overlapped = float(kept["overlapped"])
        self.first_s = {k == "traced": float(v) for k, v in kept["first_s"].items()}
        self.switch_s = None if kept["switch_s"] is None else float(kept["switch_s"])
        self.steps = None if kept["steps"] is None else max(1, round(kept["steps"] * kept["size"]
                                                                     / current_topology().size))
        self.tta.current = None   # the build's choice, made without them

    def agree(self):
        """True where some rank's traced step holds another candidate than the one chosen; ValueError
        on every rank where the ranks chose different candidates (one all-gather)."""
        aggs = [g.aggregator for g in self._groups()]
        mine = [int(a.active.numpy()) for a in aggs]
        stale = int(any(a.traced is not None and a.traced != i for a, i in zip(aggs, mine)))
        if self.local is not None:   # whether the step runs the node average of "diloco"
            stale = int(stale or (self.local.traced is not None and self.local.traced != self.local.running))
            mine += [int(self.local.running), int(self.local.interval)]
        rows = replicas.gathered(np.array([mine + [stale]], np.int64), "auto_agree")
        if any((row[:-1] != rows[0][:-1]).any() for row in rows):
            names = {r: [a.candidates[i] for a, i in zip(aggs, row)] + row[len(aggs):-1]
                     for r, row in enumerate(rows.tolist())}
            raise ValueError(f"algorithm 'auto': the ranks chose different collectives, by rank: {names}")
        return bool(rows[:, -1].any())

    # -- predictions and the choice ---------------------------------------------------------
    def communication_s(self, name, density):
        """Predicted seconds of a step's collectives with `name` on the compressible variables: the cost
        model's, times probed / predicted (_scale); for "diloco" rounds.communication_s, every variable."""
        if name == rounds.NAME:
            return self._local()[0]
        return sum(self._predicted(g, name, density) * self._scale(g, name, density) if g.lossy
                   else self._predicted(g, g.aggregator.candidates[0], density) for g in self.opt._groups)

    def _predicted(self, group, algorithm, density):
        topo, params, agg = current_topology(), self.link or LinkParams(), group.aggregator
        return sum(predict(algorithm, sum(b.sizes), topo.m, topo.n, density, params,
                           agg.algorithm_options.get(algorithm), b.shapes) for b in agg.buckets)

    def _scale(self, group, name, density):
        """probed / predicted seconds of `name` on the group, at `density` where it was timed there, else
        at the target density (1 unprobed). One ratio does not carry from one density to another: at the
        target, fixed costs per call dominate; at a warm-up's 0.25, bytes."""
        timed = self.probed_warmup.get(name, {})
        if density in timed:
            probed, at = timed[density], density
        elif self.probed and name in self.probed:
            probed, at = self.probed[name], self.opt.target_density
        else:
            return 1.0
        predicted = self._predicted(group, name, at)
        return probed / predicted if predicted > 0 else 1.0

    def _local(self):
        """(communication seconds per step, H) of "diloco" (rounds.communication_s, at the H it runs in its
        epoch); a sync as its last epoch measured it where one ran (the probe times a part of it)."""
        topo, times = current_topology(), self.opt.measurements.local
        h = self.local.interval if self.running == rounds.NAME else None
        if self.local_sync_s is not None and times is not None:
            times = (times[0], self.local_sync_s, 0.0)
        return rounds.communication_s(self.local.size, topo.m, topo.n, self.link or LinkParams(),
                                      self.compute_s or 0.0, times, h, self.steps)

    def local_interval(self):
        """The H "diloco" runs with: where probed, rounds.FIRST_INTERVAL until its syncs are measured."""
        unmeasured = self.local_sync_s is None and self.opt.measurements.local
        return rounds.FIRST_INTERVAL if unmeasured else self._local()[1]

    def step_s(self, name, density):
        """compute + communication less the measured ``overlapped`` part of the shorter (none for "diloco",
        whose node average waits for backprop); "diloco" is infinite until the compute is known (with it
        taken as 0 the rounds would be weighed on the link alone)."""
        if name == rounds.NAME and self.compute_s is None:
            return math.inf
        comm, compute = self.communication_s(name, density), self.compute_s or 0.0
        return compute + comm - (0.0 if name == rounds.NAME else self.overlapped * min(compute, comm))

    def horizon(self, epoch):
        """The epochs a choice at `epoch` is weighed over: to the end of the fit (opt.fit_epochs) while the
        schedule runs "auto"; just `epoch` where the end is not known."""
        end = self.opt.fit_epochs if self.opt.fit_epochs is not None and self.opt.fit_epochs > epoch else epoch + 1
        epochs = [epoch]
        while epochs[-1] + 1 < end and self.opt.plan.algorithm_at(epochs[-1] + 1) == "auto":
            epochs.append(epochs[-1] + 1)
        return epochs

    def per_epoch(self, epoch):
        """[{candidate: predicted seconds per step}, ...] over the horizon, each epoch at its density."""
        return [{c: self.step_s(c, self.opt.density_at(e)) for c in self.tta.candidates} for e in self.horizon(epoch)]

    def choose(self, epoch):
        """The model's choice over the horizon, the candidates timed again first where timed on another
        link than the current (a restored) one. A collective."""
        if self.probed and self.probed_on != self.link:
            self._probe()
        per, before = self.per_epoch(epoch), self.tta.current
        choice = self.tta.choose([(self.steps, p) for p in per], epoch, trace_s=self.switch_s)
        self.tta.log[-1].update(density=self.opt.density_at(epoch), horizon=len(per))
        if choice != before and current_topology().rank == 0:
            print(announcement(self.tta.log[-1], before), flush=True)
        return choice

    def end_epoch(self, epoch, measured_s, steps=None, first_s=None, traced=False, mean_s=None):
        """An epoch of ``running`` ended: on this rank its steps' median seconds (mean_s: their mean after
        the first), their number, the first one's seconds over the median (None: one step) and whether
        the epoch began with a new trace. The rounds' step is the mean (their syncs run in 1 step in H,
        which a median leaves out for H > 2). A trace costs what a traced epoch's first step takes over
        an untraced one's; all of it the means over the ranks (one allreduce)."""
        if self.running is None:
            return
        synced = self.local.synced if self.running == rounds.NAME else []
        if self.running == rounds.NAME:
            if mean_s is not None:
                measured_s = mean_s
            elif steps:   # a median alone: the syncs added
                measured_s += self.local.sync_s / steps
        totals = replicas.summed(np.concatenate([self._delivered_here(), [
            measured_s, steps or 0, first_s or 0.0, first_s is not None, sum(synced), len(synced)]]))
        num, den, measured, steps, first, firsts, sync_total, syncs = totals
        size = current_topology().size
        sync = float(sync_total / syncs) if syncs and self.opt.measurements.local else None   # not the probe's part
        eta = 1.0 + num / den if den > 0 else 1.0   # 1 for an exact candidate
        measured /= size
        if firsts == size:
            self.first_s[bool(traced)] = max(0.0, float(first / size))
            if True in self.first_s:
                self.switch_s = max(0.0, self.first_s[True] - self.first_s.get(False, 0.0))
        if steps:
            self.steps = int(round(steps / size))
        density = self.opt.density_at(epoch)
        comm = self.communication_s(self.running, density)
        if self.compute_s is None:   # first epoch: what the collectives do not explain is compute
            self.compute_s = max(0.0, measured - comm)
        elif self.opt.overlap and self.running != rounds.NAME and min(comm, self.compute_s) > 0:
            self.overlapped = float(np.clip((self.compute_s + comm - measured) / min(comm, self.compute_s), 0, 1))
        # "diloco": the drift test is against the prediction from the last epoch's syncs (a sync's own time
        # grows with the ranks' wait at it, no sign of a new link); the ratio kept, against this epoch's
        predicted = self.step_s(self.running, density)
        if sync is not None:
            self.local_sync_s = sync
        if self.tta.observe(self.running, measured, predicted, eta, None if self.running == rounds.NAME else density,
                            kept_s=self.step_s(self.running, density)):
            self.recalibrate()
            if sync is not None:   # measured on the new link
                self.local_sync_s = sync
        self.tta.log.append({"epoch": epoch, "ran": self.running, "measured_s": float(measured),
                             "efficiency": float(eta), "switch_s": self.switch_s})
        if self.running == rounds.NAME:
            self.tta.log[-1].update(sync_every=self.local.interval, sync_s=self.local_sync_s)
        self.running = None

    def recalibrate(self):
        """The link changed: measured again on every rank at this model's sizes, the candidates timed again."""
        largest = max(sum(b.sizes) for g in self.opt._groups for b in g.aggregator.buckets)
        self.link = costmodel.calibrate(current_topology(), **costmodel.sizes_for(largest))
        if self.probed:
            self._probe()
        self.tta.recalibrated()
        self.local_sync_s = None   # measured on the old link
        self.recalibrations += 1

    def _probe(self):
        """The candidates timed on self.link (from the cache where timed there before). A collective."""
        self.opt.measurements.probe(self.opt, self.variables, self.link)
        self.probed, self.probed_warmup = self.opt.measurements.probed, self.opt.measurements.probed_warmup
        self.probed_on = self.link


def announcement(decision, before):
    """The line rank 0 prints where auto's choice changes: the epoch, the change, the predicted times."""
    ranked = ", ".join(f"{c} {t:.4g}" for c, t in sorted(decision["predicted_s"].items(), key=lambda item: item[1]))
    return (f"tf_commlib auto: epoch {decision['epoch']}: {before or 'start'} -> {decision['choice']} "
            f"(predicted {decision['unit']}: {ranked})")


def delivered(r_start, r_end, sum_u):
    """tf_commlib.auto.decide.delivered_fraction in TensorFlow (no copy of a ResNet-50's 25M entries to
    numpy): (<r_start - r_end, sum_u>, ||sum_u||^2) as float64s."""
    s = tf.cast(sum_u, tf.float32)
    num = tf.reduce_sum((tf.cast(r_start, tf.float32) - tf.cast(r_end, tf.float32)) * s)
    return np.array([float(num.numpy()), float(tf.reduce_sum(s * s).numpy())], np.float64)
