"""bench faults' elastic rows: a node lost, and a node back, in a ``tfc_apps.train --elastic`` job::

    python -m tfc_apps.bench faults --cases lost back --runs 3 [--elastic-configs dense_fp16 auto]

Each run starts an elastic horovodrun job on this machine (tfc_apps.elastic_local: ``localhost`` and this
machine's name, 2 slots each; Horovod's driver cannot start ranks in the emulated cluster's namespaces
without ssh), 4 ranks as 2x2 (the layout follows the live hosts), --elastic-epochs epochs of the digits'
small residual network (``tfc_apps.train --model resnet``),
a commit every --commit-every steps, seed --seed + run, Gloo's timeout --gloo-timeout-s (a survivor
whose peer died may wait that long in a receive). Mid-epoch (a random epoch and fraction of it,
from the seed) the second host leaves the discovery script's list and its two ranks are SIGKILLed:

  lost   the job ends on the two survivors
  back   the host is listed again 2 s after the survivors' restart (rank 0's "2 ranks as 1x2" line); its
         new ranks join at the next commit

and measures: seconds from the kill until the survivors' first step, the steps lost (steps rank 0 ran
that the rollback undid), for "back" the seconds from the host's listing until the first step on 4 ranks,
and the final top-1 against the same job uninterrupted (same seed, no kill). The rows give each run and
the medians over the runs.
"""
import json
import os
import random
import shutil
import statistics
import sys
import time

CONFIGS = {"dense_fp16": ["--algorithm", "dense", "--compression", "fp16"],   # the baseline
           "auto": ["--algorithm", "auto"]}                                    # the default
CASES = ("lost", "back")
ROW_NAMES = {"lost": "node lost", "back": "node back"}
RELIST_AFTER_S = 2.0   # "back": the host is listed again this long after the survivors' restart line


def _argv(args, config, seed, summary):
    return ["-m", "tfc_apps.train", "--elastic", "--model", "resnet", *CONFIGS[config], "--epochs", str(args.elastic_epochs),
            "--commit-every", str(args.commit_every), "--seed", str(seed), "--json", summary]


def _summary(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class ElasticBench:
    def __init__(self, args):
        self.args = args
        self.jobs = os.path.join(os.path.abspath(args.out), "faults_jobs", "elastic")
        os.makedirs(self.jobs, exist_ok=True)
        self.rng = random.Random(args.seed)
        self.references = {}   # (config, seed) -> (summary, wall s)

    def job(self, tag, config, seed, fault=None):
        """The job, with fault(job) run while it trains (it returns a dict); (summary or None, exit status,
        wall s, the fault's dict, the log's tail)."""
        from tfc_apps.elastic_local import ElasticJob

        work = os.path.join(self.jobs, tag)
        shutil.rmtree(work, ignore_errors=True)
        summary = os.path.join(work, "summary.json")
        os.makedirs(work)
        t0 = time.time()
        env = {} if self.args.gloo_timeout_s is None else {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(self.args.gloo_timeout_s)}
        job = ElasticJob(work, _argv(self.args, config, seed, summary), env=env)
        found = {}
        try:
            if fault:
                found = fault(job)
            rc = job.finish(self.args.job_timeout)
        except TimeoutError as e:
            rc, found = "timeout", {**found, "error": str(e)[:200]}
        finally:
            job.stop()
        return _summary(summary) if rc == 0 else None, rc, time.time() - t0, found, job.log(3000)

    def reference(self, config, seed):
        """(summary, wall s) of the job uninterrupted, once per configuration and seed."""
        if (config, seed) not in self.references:
            got, rc, wall, _, log = self.job(f"{config}_reference{seed}", config, seed)
            if got is None:
                raise SystemExit(f"bench faults: the uninterrupted elastic {config} run failed (exit {rc}):\n{log}")
            self.references[config, seed] = got, wall
        return self.references[config, seed]

    def run(self, config, case, run):
        seed = self.args.seed + run
        epoch, frac = self.rng.randint(2, max(2, self.args.elastic_epochs - 3)), self.rng.uniform(0.2, 0.8)
        ref, ref_wall = self.reference(config, seed)

        def fault(job):
            timeout = self.args.job_timeout
            job.wait_for(f"epoch {epoch - 1}'s end", lambda: job.line(f"epoch {epoch - 1:3d} "), timeout)
            began = time.time()
            job.wait_for(f"epoch {epoch}'s end", lambda: job.line(f"epoch {epoch:3d} "), timeout)
            ended = time.time()
            time.sleep(frac * (ended - began))   # into the next epoch, by the last one's length
            killed = job.drop_second_host()
            out = {"killed": killed}
            if case == "back":
                job.wait_for("the survivors' restart", lambda: job.line("2 ranks as 1x2"), timeout)
                time.sleep(RELIST_AFTER_S)
                out["listed"] = job.list_both()
            return out

        got, rc, wall, found, log = self.job(f"{config}_{case}{run}", config, seed, fault)
        row = {"case": ROW_NAMES[case], "config": config, "run": run, "seed": seed,
               "fault": f"SIGKILL the second host's 2 ranks {frac:.0%} into epoch {epoch + 1}",
               "rc": rc, "wall_s": wall, "reference_wall_s": ref_wall,
               "reference_top1": ref["epochs"][-1]["test_accuracy"]}
        if got is None:
            print(f"# elastic {config} {case} {run} failed (exit {rc}): {found.get('error', '')}\n{log}",
                  file=sys.stderr, flush=True)
            return {**row, "outcome": f"failed, status {rc}"}
        restarts = got["restarts"]
        after_kill = [r for r in restarts if r["started"] > found["killed"] and r["m"] * r["n"] == 2
                      and r["first_step"] is not None]
        rejoined = [r for r in restarts if "listed" in found and r["started"] > found["listed"]
                    and r["m"] * r["n"] == 4 and r["first_step"] is not None]   # not a join at the last commit
        top1 = got["epochs"][-1]["test_accuracy"]
        return {**row, "outcome": "went on" if after_kill else "no restart on 2 ranks",
                "step_again_s": after_kill[0]["first_step"] - found["killed"] if after_kill else None,
                "steps_lost": got["steps_run"] - got["steps"],
                "commit_every": self.args.commit_every,
                "rejoin_s": rejoined[0]["first_step"] - found["listed"] if rejoined else None,
                "top1": top1, "top1_delta": top1 - row["reference_top1"],
                "layouts": [[r["epoch"], r["offset"], r["m"], r["n"]] for r in restarts]}


def medians(rows):
    """One row per (case, config): the medians of its runs' figures (the runs that went on)."""
    out = []
    for case in ROW_NAMES.values():
        for config in CONFIGS:
            runs = [r for r in rows if r["case"] == case and r["config"] == config and "top1" in r]
            if not runs:
                continue

            def med(key):
                values = [r[key] for r in runs if r.get(key) is not None]
                return statistics.median(values) if values else None

            out.append({"case": case, "config": config, "runs": len(runs), "step_again_s": med("step_again_s"),
                        "steps_lost": med("steps_lost"), "rejoin_s": med("rejoin_s"), "top1": med("top1"),
                        "reference_top1": med("reference_top1"), "top1_delta": med("top1_delta")})
    return out


COLUMNS = ("row", "config", "run", "survivors step again s", "steps lost", "rejoined s", "top-1", "uninterrupted",
           "top-1 - uninterrupted")


def table(rows):
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)   # noqa: E731
    body = [list(COLUMNS)]
    for r in rows:
        body.append([r["case"], r["config"], str(r.get("run", f"median of {r.get('runs')}")),
                     fmt(r.get("step_again_s")), fmt(r.get("steps_lost"), "{:g}"), fmt(r.get("rejoin_s")),
                     fmt(r.get("top1"), "{:.4f}"), fmt(r.get("reference_top1"), "{:.4f}"),
                     fmt(r.get("top1_delta"), "{:+.4f}")]
                    if "top1" in r or "runs" in r else [r["case"], r["config"], str(r["run"]), r["outcome"]] +
                    ["-"] * 5)
    widths = [max(len(line[j]) for line in body) for j in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body)


def run_all(args, cases):
    """The elastic runs of `cases` (a subset of CASES): (rows of every run, median rows)."""
    bench, rows = ElasticBench(args), []
    for run in range(args.runs):
        for config in args.elastic_configs:
            for case in cases:
                row = bench.run(config, case, run)
                rows.append(row)
                print(f"# {row['case']} {config} {run}: {json.dumps({k: v for k, v in row.items() if k != 'layouts'})}",
                      file=sys.stderr, flush=True)
    return rows, medians(rows)
