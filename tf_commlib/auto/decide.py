"""What DistributedOptimizer(algorithm="auto") runs each epoch: the candidate with the least
predicted time to accuracy, from measured step times and measured progress.

A candidate's time to an accuracy is (the steps it needs) x (its seconds per step):

* seconds per step: the cost model's prediction for the model's buckets on the calibrated link
  (collectives.predict; compute plus communication, less the part of the shorter that a step hides)
  times the ratio measured / predicted of the candidate's last epoch (before it ran: the ratio of the
  last candidate that did, which carries what the model leaves out for every candidate alike; 1 at
  first);
* steps: those that exact aggregation needs, over the candidate's efficiency ``eta``: the part of
  exact aggregation's progress that its updates make. Over an epoch of W steps, exact
  aggregation applies sum(u) (u: what enters the collective each step); a lossy collective with
  error feedback applies sum(sent) = sum(u) + r_0 - r_W (r: its residual), so
  eta = <sum(sent), sum(u)> / ||sum(u)||^2 = 1 + <r_0 - r_W, sum(u)> / ||sum(u)||^2, summed over the
  ranks. An exact collective has eta = 1; a lossy one is taken at 1 until it has run an epoch
  (optimism: it gets tried once it is predicted fastest, then judged on what it did). Measured over
  an epoch, eta is a lower bound: the residual a lossy collective builds up in its first ~1/density
  steps is progress deferred, not lost, and the small entries it defers are mostly noise; in
  `bench tta` hitopk measured 0.44-0.80 while it reached the target accuracy in as many epochs as
  dense. So eta counts as a guard: at or above ``guard`` (default 0.3) the candidate is taken to
  progress as exact aggregation does; below it, its time is divided by eta (a compressor that
  keeps most of the sum in its residual, e.g. a density far too low, is not chosen). Settings of one
  collective (``families``, e.g. hitopk at two densities, PowerSGD at two ranks) are told apart by
  eta measured at the target density: one counts at its eta over the family's best (bench tta: hitopk at
  density 0.001 0.63-0.65 against 0.88-0.89 at 0.01, PowerSGD at rank 1 0.83-0.84 against 0.94 at rank 4,
  each as slow or slower to the target), and a harder setting is tried only once the one before it has run
  an epoch at the target density (it is cheaper by construction, so optimism would always try it first),
  unless that one is not tried at all (not within the margin below).

A change of candidate traces the step again (seconds of compile time, ``switch_s``, measured as a
traced epoch's first step less its median): given each epoch of the horizon, ``choose`` takes the
first candidate of the cheapest sequence over it, each change costing ``switch_s`` (a dynamic
program over epochs and candidates), so a cheaper candidate for a few epochs (e.g. during DGC's
warm-up) is run only where it saves more than the traces it costs. Before a trace is measured a
change is taken to cost more than any saving: the candidate cheapest over the whole horizon.
``choose`` keeps the running candidate unless another one (its sequence, with the trace) is
predicted at most ``switch`` times the running one's time over the horizon, and
tries a lossy candidate that has not run yet only where its prediction is at most ``margin`` times
the fastest exact one's (a wrong try costs an epoch and a new trace of the step), or where it is
predicted no slower than the fastest exact one over the run and within ``margin`` once the run has
settled (e.g. after DGC's warm-up): ``choose`` would move to it then anyway, and starting on it
spares the step a second trace.
``observe`` records an epoch and says whether the measured / predicted ratio of a candidate moved
by more than ``drift`` since its last epoch: the link changed, calibrate again (``recalibrated``
forgets the ratios).
"""
import math


class TimeToAccuracy:
    """The choice among ``candidates`` (collective names, ties going to the earlier one), of which
    ``lossy`` are lossy; all ranks make it from the same (allreduced) measurements. ``rounds``: candidates
    that are no exact aggregation and whose efficiency no epoch measures (the DiLoCo rounds): their steps
    count as exact aggregation's (bench tta: the rounds at H = 8 reached the target in as many epochs as
    dense fp16, and in fewer than PowerSGD); like a lossy candidate they are tried only within the margin
    of the fastest exact one, and they are no baseline for trying a lossy candidate.
    ``families``: tuples of lossy candidates that are settings of one collective, from the one that sends
    the most to the one that sends the least."""

    def __init__(self, candidates, lossy, switch=0.9, drift=1.5, min_efficiency=0.05, guard=0.3, margin=1.0,
                 rounds=(), families=None):
        if not candidates:
            raise ValueError("candidates must name at least one collective")
        self.candidates, self.lossy = tuple(candidates), frozenset(lossy)
        self.switch, self.drift, self.min_efficiency = float(switch), float(drift), float(min_efficiency)
        self.guard, self.margin = float(guard), float(margin)
        self.rounds = frozenset(rounds)
        self.families = None   # None: not known yet (AutoEpochs sets them from the buckets)
        if families is not None:
            self.set_families(families)
        self.ratio, self.efficiency = {}, {}   # name -> measured/predicted step, name -> eta
        self.settled_efficiency = {}   # name -> eta of its last epoch at the target density
        self.settled_target = None     # that target density (at_target)
        self.current = self.last = None   # the last choice, the last candidate measured
        self.left = False   # the schedule left the choice since it was made: a return to it is a change
        self.log = []   # one dict per decision: epoch, choice, predicted time per step of progress

    def set_families(self, families):
        """families (see the class); ValueError for a name that is not a lossy candidate or is in two."""
        families = tuple(tuple(f) for f in families if len(f) > 1)
        named = [c for f in families for c in f]
        if any(c not in self.lossy for c in named) or len(set(named)) != len(named):
            raise ValueError(f"families must hold distinct lossy candidates ({sorted(self.lossy)}), got {families!r}")
        self.families = families

    def _family(self, name):
        return next((f for f in self.families or () if name in f), (name,))

    def relative_efficiency(self, name):
        """name's eta at the target density over its family's best (1 where either is unmeasured)."""
        own, settled = self.settled_efficiency.get(name), self.settled_efficiency
        best = max((settled[c] for c in self._family(name) if c in settled), default=None)
        return 1.0 if own is None or not best else min(1.0, own / best)

    def waiting(self, untried=frozenset()):
        """The harder settings whose setting before them has not run an epoch at the target density, unless
        that one is itself kept out as ``untried`` (not within the margin; then the harder one is weighed as a
        lone candidate would be)."""
        out = set()
        for family in self.families or ():
            for before, name in zip(family, family[1:]):
                if before not in self.settled_efficiency and (before not in untried or before in out):
                    out.add(name)
        return out

    def at_target(self, density):
        """The settled efficiencies hold for one target density (AdaptiveDensity may move it): another clears them."""
        if self.settled_target is not None and density != self.settled_target:
            self.settled_efficiency = {}
        self.settled_target = density

    def kept(self):
        """The running candidate: the last choice, unless the schedule left it (None)."""
        return None if self.left else self.current

    def seconds_per_progress(self, name, predicted_s):
        """Predicted seconds per step of exact aggregation's progress (time to accuracy / steps of exact)."""
        ratio = self.ratio.get(name, self.ratio.get(self.last, 1.0))
        eta = self.efficiency.get(name, 1.0)
        return predicted_s * ratio / (self.relative_efficiency(name) if eta >= self.guard else eta)

    def settings(self):
        """What the choice is made with besides the measurements (JSON values): replay's ``settings``."""
        return {"candidates": list(self.candidates), "lossy": sorted(self.lossy), "switch": self.switch,
                "drift": self.drift, "min_efficiency": self.min_efficiency, "guard": self.guard,
                "margin": self.margin, "rounds": sorted(self.rounds),
                "families": None if self.families is None else [list(f) for f in self.families]}

    def choose(self, predicted, epoch=None, settled=None, plan=None, switch_s=None):
        """The candidate to run next; predicted = {candidate: predicted seconds per step} (over the
        run), settled = the same where the run has settled (its last epochs' density; default
        predicted). plan = [(steps, {candidate: predicted seconds per step}), ...], one per epoch
        of the horizon, and switch_s = the seconds a change of candidate costs (None: unknown, no
        change within the horizon): where given, the candidates are weighed by the cheapest
        sequence over those epochs (plan_seconds) instead of by predicted."""
        missing = [c for c in self.candidates if c not in predicted or (settled is not None and c not in settled)
                   or any(c not in times for _, times in plan or ())]
        if missing:
            raise ValueError(f"predicted has no time for {missing}")
        cost = {c: self.seconds_per_progress(c, predicted[c]) for c in self.candidates}
        later = cost if settled is None else {c: self.seconds_per_progress(c, settled[c]) for c in self.candidates}
        exact = [c for c in self.candidates if c not in self.lossy and c not in self.rounds]
        now, then = (min((t[e] for e in exact), default=math.inf) for t in (cost, later))

        def tried_later(c):   # no slower over the run, within the margin once settled: start on it
            return settled is not None and cost[c] <= now and later[c] <= self.margin * then

        # a candidate that is not exact aggregation (lossy, or the rounds) and has not run is tried only
        # where predicted within the margin of the fastest exact one
        untried = {c for c in self.lossy | self.rounds if c not in self.ratio and exact and
                   cost[c] > self.margin * now and not tried_later(c)}
        untried |= self.waiting(untried)
        allowed = [c for c in self.candidates if c not in untried or c == self.current]
        weight = cost if not plan else self.plan_seconds(plan, allowed, switch_s)
        best = min(allowed, key=lambda c: (weight[c], self.candidates.index(c)))
        if self.kept() in weight:   # against staying on the running candidate (the whole horizon)
            stay = cost[self.kept()] if not plan else sum(
                steps * self.seconds_per_progress(self.kept(), times[self.kept()]) for steps, times in plan)
            if weight[best] > self.switch * stay:
                best = self.kept()
        inputs = {"settings": self.settings(), "state": self.state(), "predicted": dict(predicted),
                  "settled": None if settled is None else dict(settled),
                  "plan": None if not plan else [[steps, dict(times)] for steps, times in plan], "switch_s": switch_s}
        self.current, self.left = best, False
        self.log.append({"epoch": epoch, "choice": best, "seconds_per_progress": cost, "inputs": inputs})
        if plan:
            self.log[-1].update(plan_s=weight, switch_s=switch_s)
        return best

    def plan_seconds(self, plan, allowed, switch_s=None):
        """{candidate: predicted seconds of the horizon's progress where the next epoch runs it}: the
        cheapest sequence of ``allowed`` candidates over plan's epochs (steps x seconds per progress
        each), every change costing switch_s, also from the running candidate to another (None: no
        change after the next epoch, and a change to it costs nothing)."""
        change = math.inf if switch_s is None else float(switch_s)
        running = self.kept() if self.kept() in allowed else None
        # the cheapest rest of the horizon after the epoch, running c in it: entered by a change, or
        # the running candidate not left yet (stay)
        entered, stay = {c: 0.0 for c in allowed}, 0.0
        for steps, times in reversed(plan):
            cheapest = min(entered.values())
            if running is not None:
                stay = steps * self.seconds_per_progress(running, times[running]) + min(stay, change + cheapest)
            entered = {c: steps * self.seconds_per_progress(c, times[c]) + min(entered[c], change + cheapest)
                       for c in allowed}
        start = 0.0 if switch_s is None or running is None else change   # none running: every candidate alike
        out = {c: entered[c] + (start if c != self.current else 0.0) for c in allowed}
        if running is not None:
            out[running] = stay
        return out

    def observe(self, name, measured_s, predicted_s, efficiency=None, comparable=True, kept_s=None, settled=True):
        """Records an epoch of `name`: its median measured step seconds, the prediction for it and
        (lossy) its measured efficiency (settled: measured at the target density, e.g. not in a DGC
        warm-up: what tells a family's settings apart); True where the measured / predicted ratio moved by more
        than ``drift`` since the candidate's last epoch (the link changed). comparable=False: that
        epoch ran another setting (e.g. a DGC warm-up density), so a moved ratio says nothing of the link.
        kept_s: the prediction the kept ratio is against, where the epoch's measurements changed it
        (default predicted_s)."""
        if name not in self.candidates:
            raise ValueError(f"{name!r} is not a candidate ({self.candidates})")
        if not (measured_s > 0 and predicted_s > 0 and math.isfinite(measured_s) and math.isfinite(predicted_s)):
            return False
        ratio, before = measured_s / predicted_s, self.ratio.get(name)
        kept = measured_s / kept_s if kept_s is not None and 0 < kept_s < math.inf else ratio
        self.ratio[name], self.last = float(kept), name
        if efficiency is not None and name in self.lossy and math.isfinite(efficiency):
            self.efficiency[name] = min(1.0, max(self.min_efficiency, float(efficiency)))
            if settled:
                self.settled_efficiency[name] = self.efficiency[name]
        return comparable and before is not None and max(ratio / before, before / ratio) > self.drift

    def recalibrated(self):
        """The link was measured again: the measured / predicted ratios no longer apply."""
        self.ratio.clear()
        self.last = None

    def state(self):
        return {"ratio": dict(self.ratio), "efficiency": dict(self.efficiency),
                "settled_efficiency": dict(self.settled_efficiency), "settled_target": self.settled_target,
                "current": self.current,
                "last": self.last, "left": self.left}

    def restore(self, state):
        self.ratio = {k: float(v) for k, v in state.get("ratio", {}).items() if k in self.candidates}
        self.efficiency = {k: float(v) for k, v in state.get("efficiency", {}).items() if k in self.lossy}
        self.settled_efficiency = {k: float(v) for k, v in (state.get("settled_efficiency") or {}).items()
                                   if k in self.lossy}
        self.settled_target = state.get("settled_target")
        self.current, self.last = (state.get(k) if state.get(k) in self.candidates else None
                                   for k in ("current", "last"))
        self.left = bool(state.get("left", False))


def replay(decision):
    """The choice that a logged decision's inputs give (a row of DistributedOptimizer.auto_log with
    "choice", whose "inputs" hold the settings, the state before it and the predictions)."""
    inputs = decision["inputs"]
    settings = dict(inputs["settings"])
    tta = TimeToAccuracy(settings.pop("candidates"), settings.pop("lossy"), **settings)
    tta.restore(inputs["state"])
    plan = None if not inputs["plan"] else [(steps, times) for steps, times in inputs["plan"]]
    return tta.choose(inputs["predicted"], decision.get("epoch"), settled=inputs["settled"], plan=plan,
                      switch_s=inputs["switch_s"])


def delivered_fraction(r_start, r_end, sum_u):
    """(numerator, denominator) of eta = 1 + <r_start - r_end, sum_u> / ||sum_u||^2 for sequences of
    numbers (one bucket, one rank): add them over buckets and ranks, then eta = 1 + num / den."""
    s = [float(x) for x in sum_u]
    num = math.fsum((float(a) - float(b)) * x for a, b, x in zip(r_start, r_end, s))
    return num, math.fsum(x * x for x in s)
