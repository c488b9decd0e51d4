"""The decision of DistributedOptimizer(algorithm="auto"): which candidate the next epoch runs, as one
pure function of what the run measured (no TensorFlow, no Horovod). The model (docs/collectives.md):

    t_c(e) = rho_c * p_c(e)                          seconds per step of candidate c in epoch e
    eta'_c = eta_c where eta_c < guard, else 1        its progress per step, exact aggregation's = 1
    T(s)   = sum_e S_e * t_s(e)(e) / eta'_s(e)        a sequence s of candidates over the epochs left
             + tau * (changes of candidate in s, the first one from the running candidate)
             + tau * (candidates s enters that have not run yet: the trace back where a trial loses)
    choice = the first candidate of the s with the least T; within NOISE of the least T, the running
             candidate, else the earliest (measurements cannot tell such candidates apart)

* p_c(e): the cost model's step (tf_commlib.keras.auto_epoch: compute + c's collectives on the
  calibrated link, scaled to their probed time, less the part overlap hides) at epoch e's density;
* rho_c: measured / predicted step of c's last epoch; for a candidate that has not run, that of the
  last candidate that did (what the cost model leaves out for all alike), 1 before any epoch;
* eta_c: the part of exact aggregation's progress a lossy candidate's updates make, measured over its
  last epoch (delivered_fraction: with error feedback it applies sum(u) + r_start - r_end, so
  eta = <sum(sent), sum(u)> / ||sum(u)||^2); 1 for an exact candidate, for the DiLoCo rounds (``rounds``:
  each sync delivers all of its pseudo-gradient) and for a candidate that has not run (it is tried where
  it is predicted fastest, then judged on what it did). Over one epoch eta is a lower bound (the residual
  a compressor builds up in its first 1/density steps is progress deferred, not lost), so it counts only
  below ``guard`` (GUARD);
* S_e: the steps of an epoch (the last measured epoch's); tau: the seconds of a new trace of the step
  (a traced epoch's first step less an untraced one's). Before they are measured (the first epoch) T is
  the mean of t_c / eta'_c over the epochs left: every candidate pays the first trace alike.

A short run (few steps left) cannot earn back a trace, so the running candidate stays; a long one tries
a candidate predicted to save more than two traces over it. ``observe`` records an epoch and says
whether a candidate's measured / predicted ratio moved by more than ``drift`` since its last epoch at
that density: the link changed, so it is measured again (``recalibrated`` forgets the ratios).
"""
import math

# bench tta (digits, 4 ranks): hitopk's eta measured 0.44-0.80 over its epochs while it reached the target
# in as many epochs as dense; a compressor with eta below this keeps most of the sum in its residual
GUARD = 0.3
# the epoch medians of one candidate's steps within one bench tta run (digits, 2x2, 5 Mbit/s to unshaped,
# the rounds after their first epoch): 0.92-1.07 of their median; predictions closer than this are a tie
NOISE = 0.07


class TimeToAccuracy:
    """The choice among ``candidates`` (collective names, from the one preferred in a tie), of which ``lossy``
    are lossy and ``rounds`` are the DiLoCo rounds; all ranks make it from the same (allreduced) numbers."""

    def __init__(self, candidates, lossy, drift=1.5, guard=GUARD, rounds=(), noise=NOISE):
        if not candidates:
            raise ValueError("candidates must name at least one collective")
        self.candidates, self.lossy, self.rounds = tuple(candidates), frozenset(lossy), frozenset(rounds)
        self.drift, self.guard, self.noise = float(drift), float(guard), float(noise)
        self.ratio, self.efficiency = {}, {}   # name -> measured/predicted step, name -> eta
        self.density = {}   # name -> the density of its last epoch (a ratio compares only at one)
        self.current = self.last = None   # the last choice, the last candidate measured
        self.left = False   # the schedule left the choice since it was made: a return to it is a change
        self.log = []   # one dict per decision and per measured epoch

    def seconds_per_progress(self, name, predicted_s):
        """t_c / eta'_c: predicted seconds per step of exact aggregation's progress."""
        eta = self.efficiency.get(name, 1.0)
        if eta <= 0:
            return math.inf
        return predicted_s * self.ratio.get(name, self.ratio.get(self.last, 1.0)) / (1.0 if eta >= self.guard else eta)

    def kept(self):
        """The running candidate: the last choice, unless the schedule left it (None)."""
        return None if self.left else self.current

    def settings(self):
        """What the choice is made with besides the measurements (JSON values): replay's ``settings``."""
        return {"candidates": list(self.candidates), "lossy": sorted(self.lossy), "drift": self.drift,
                "guard": self.guard, "rounds": sorted(self.rounds), "noise": self.noise}

    def choose(self, plan, epoch=None, trace_s=None):
        """The candidate to run next. plan = [(steps, {candidate: predicted seconds per step}), ...], one
        per epoch left (steps None: not measured yet); trace_s: tau (None: not measured yet)."""
        missing = sorted({c for c in self.candidates for _, times in plan if c not in times})
        if not plan or missing:
            raise ValueError(f"plan must hold an epoch with a predicted time for every candidate; missing {missing}")
        inputs = {"settings": self.settings(), "state": self.state(),
                  "plan": [[steps, dict(times)] for steps, times in plan], "trace_s": trace_s}
        measured = trace_s is not None and all(steps for steps, _ in plan)
        weight = self.sequences(plan, float(trace_s)) if measured else {
            c: sum(self.seconds_per_progress(c, times[c]) for _, times in plan) / len(plan) for c in self.candidates}
        tied = [c for c in self.candidates if weight[c] <= (1 + self.noise) * min(weight.values())]
        best = self.kept() if self.kept() in tied else tied[0]
        self.current, self.left = best, False
        self.log.append({"epoch": epoch, "choice": best, "predicted_s": weight,
                         "unit": "s over the epochs left" if measured else "s per step of progress", "inputs": inputs})
        return best

    def sequences(self, plan, trace_s):
        """{candidate: T of the cheapest sequence over plan's epochs that starts with it} (a dynamic
        program over epochs and candidates, from the last epoch back)."""
        def enter(c):   # a change to c: its trace, and the trace back where it has not run yet
            return trace_s * (1 if c in self.ratio else 2)

        rest = {c: 0.0 for c in self.candidates}   # the cheapest rest after an epoch that runs c
        for steps, times in reversed(plan):
            rest = {c: steps * self.seconds_per_progress(c, times[c]) +
                    min([rest[c]] + [enter(o) + rest[o] for o in self.candidates if o != c]) for c in self.candidates}
        return {c: rest[c] + (0.0 if c == self.kept() else enter(c)) for c in self.candidates}

    def observe(self, name, measured_s, predicted_s, efficiency=None, density=None, kept_s=None):
        """Records an epoch of ``name``: its median measured step seconds, the prediction for it, (lossy)
        its measured eta and its density; True where its measured / predicted ratio moved by more than
        ``drift`` since its last epoch at this density (the link changed). kept_s: the prediction the
        kept ratio is against, where the epoch's measurements changed it (default predicted_s)."""
        if name not in self.candidates:
            raise ValueError(f"{name!r} is not a candidate ({self.candidates})")
        if not (measured_s > 0 and predicted_s > 0 and math.isfinite(measured_s) and math.isfinite(predicted_s)):
            return False
        ratio, before = measured_s / predicted_s, self.ratio.get(name)
        comparable = before is not None and self.density.get(name) == density
        kept = measured_s / kept_s if kept_s is not None and 0 < kept_s < math.inf else ratio
        self.ratio[name], self.last, self.density[name] = float(kept), name, density
        if efficiency is not None and name in self.lossy and math.isfinite(efficiency):
            self.efficiency[name] = min(1.0, float(efficiency))
        return comparable and max(ratio / before, before / ratio) > self.drift

    def recalibrated(self):
        """The link was measured again: the measured / predicted ratios no longer apply."""
        self.ratio.clear()
        self.last = None

    def state(self):
        return {"ratio": dict(self.ratio), "efficiency": dict(self.efficiency), "density": dict(self.density),
                "current": self.current, "last": self.last, "left": self.left}

    def restore(self, state):
        known = lambda key, names: {k: v for k, v in (state.get(key) or {}).items() if k in names}
        self.ratio = {k: float(v) for k, v in known("ratio", self.candidates).items()}
        self.efficiency = {k: float(v) for k, v in known("efficiency", self.lossy).items()}
        self.density = known("density", self.candidates)
        self.current, self.last = (state.get(k) if state.get(k) in self.candidates else None for k in ("current", "last"))
        self.left = bool(state.get("left", False))


def replay(decision):
    """The choice that a logged decision's inputs give (a row of DistributedOptimizer.auto_log with
    "choice", whose "inputs" hold the settings, the state before it and the predictions). A row logged by
    the rules this model replaced (inputs "predicted" and "switch_s") is read as the same measurements."""
    inputs = decision["inputs"]
    settings = {k: v for k, v in inputs["settings"].items() if k in ("drift", "guard", "rounds", "noise")}
    tta = TimeToAccuracy(inputs["settings"]["candidates"], inputs["settings"]["lossy"], **settings)
    tta.restore(inputs["state"])
    plan = inputs["plan"] or [[None, inputs["predicted"]]]
    return tta.choose([(steps, times) for steps, times in plan], decision.get("epoch"),
                      trace_s=inputs.get("trace_s", inputs.get("switch_s")))


def delivered_fraction(r_start, r_end, sum_u):
    """(numerator, denominator) of eta = 1 + <r_start - r_end, sum_u> / ||sum_u||^2 for sequences of
    numbers (one bucket, one rank): add them over buckets and ranks, then eta = 1 + num / den."""
    s = [float(x) for x in sum_u]
    num = math.fsum((float(a) - float(b)) * x for a, b, x in zip(r_start, r_end, s))
    return num, math.fsum(x * x for x in s)
