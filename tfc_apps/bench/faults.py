"""Fault injection on the emulated 2x2 cluster: what a failure costs, in figures::

    python -m tfc_apps.bench faults [--runs 2] [--cases kill link redis disk] [--seed 0] [--json]
    python -m tfc_apps.bench faults --quick      # one run of each, fewer epochs (about 3 minutes)
    python -m tfc_apps.bench faults --cases lost back --runs 3   # elastic: a node lost, a node back

The elastic cases (lost, back) run on Horovod's elastic driver with two local host names, not in the
emulated cluster: tfc_apps.bench.faults_elastic says what they measure.

Each run injects one fault into a small training job (tfc_apps.train on digits, hitopk + mstopk,
4 ranks as 2 nodes x 2, per-rank checkpoints; the Redis case runs the DAWNBench script on the digits
as JPEGs, whose input goes through DataCache), drawn from a seeded RNG:

  kill   a random rank SIGKILLs itself as a random step begins (epoch >= 2; TF_COMMLIB_TEST_FAIL_AT)
  link   a random node's end of the inter-node link (its veth, in its namespace) is set down for
         --link-down-s seconds after a random epoch, then up again
  redis  a random node's embedded redis-server (DataCache level 2) is SIGKILLed during a random
         epoch >= 2; training must read the source meanwhile and lose nothing
  disk   a random rank's checkpoint directory is a tmpfs that is shrunk to what it holds after a
         random epoch (ENOSPC at its next checkpoint); without root, RLIMIT_FSIZE on that rank (EFBIG)

and measures: how long until every rank exited after the first one died (or, for a job that
recovered, its delay against an uninterrupted run), what was left (processes, /dev/shm names,
redis-servers and their keys), and whether the final weights (sha256) equal those of an
uninterrupted run of the same epochs: the job's own weights when it recovered, else those of a run
resumed from its checkpoints (after the fault is removed: the link up, the disk freed). Every job
runs through tfc_apps.local_run (a timeout that kills all ranks). The table goes to stdout (--json:
one object per run) and, with the uninterrupted references, to OUT/faults.json.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import time
import uuid

from tfc_apps.bench import faults_elastic

CASES = ("kill", "link", "redis", "disk")   # on the emulated cluster; the default
TRAIN_BATCH = 16


def parser():
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench faults", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=2, help="runs of each case")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES + faults_elastic.CASES)
    p.add_argument("--quick", action="store_true",
                   help="one run of each case, at most 3 epochs, a link cut of at most 5 s")
    p.add_argument("--epochs", type=int, default=4, help="epochs of every job")
    p.add_argument("--link-down-s", type=float, default=10.0, help="how long a cut link stays down")
    p.add_argument("--inter-mbit", type=int, default=25, help="shaped inter-node link")
    p.add_argument("--exit-timeout", type=float, default=60.0,
                   help="every rank must have exited this many seconds after the first died")
    p.add_argument("--job-timeout", type=float, default=400.0, help="a job's ranks are killed after this")
    p.add_argument("--seed", type=int, default=0, help="seed of the faults' ranks, nodes and times")
    p.add_argument("--out", default="bench_out", help="folder for faults.json (and the jobs' files)")
    p.add_argument("--json", action="store_true", help="print one JSON object per run instead of the table")
    p.add_argument("--elastic-configs", nargs="+", default=list(faults_elastic.CONFIGS),
                   choices=list(faults_elastic.CONFIGS), help="lost/back: the training configurations")
    p.add_argument("--elastic-epochs", type=int, default=8, help="lost/back: epochs of every job")
    p.add_argument("--commit-every", type=int, default=10, help="lost/back: steps between commits")
    p.add_argument("--gloo-timeout-s", type=int, default=None,
                   help="lost/back: HOROVOD_GLOO_TIMEOUT_SECONDS of the jobs (default: Horovod's, 30)")
    return p


def train_steps(size):
    """Steps per epoch of tfc_apps.train on `size` ranks (tfc_apps.digits' split and shards)."""
    from sklearn.datasets import load_digits

    n = load_digits().target.size
    return -(-((n - n // 5) // size) // TRAIN_BATCH)


class Bench:
    def __init__(self, args, prefix, link, shaped):
        self.args, self.prefix, self.link_desc, self.shaped = args, prefix, link, shaped
        self.m, self.n = 2, 2
        self.size = self.m * self.n
        self.rng = random.Random(args.seed)
        self.reference = {}   # workload -> (sha256, wall s)
        self.reference_stats = {}   # the uninterrupted DAWNBench run's DataCache counters
        self.out = os.path.abspath(args.out)
        self.jobs = os.path.join(self.out, "faults_jobs")
        os.makedirs(self.jobs, exist_ok=True)
        self._digits = None

    # -- jobs ---------------------------------------------------------------------------------
    def job(self, argv, env=None, fault=None):
        """Runs argv on the ranks; fault(proc, watcher, run_id) runs in a thread meanwhile and
        returns a dict merged into the result. Returns rc, log, wall_s, first_death, end, what was
        left over, and the fault's dict."""
        import threading

        from tfc_apps import local_run
        from tfc_apps.bench import fault_tools as ft

        run_id, shm_before = uuid.uuid4().hex, ft.shm_names()
        t0 = time.time()
        proc = local_run.start(argv, launcher=self.prefix, env={ft.MARK: run_id, "CUDA_VISIBLE_DEVICES": "",
                                                                **(env or {})}, cwd=self.out)
        watcher, found = ft.Watcher(proc), {}
        thread = None
        if fault:
            thread = threading.Thread(target=lambda: found.update(fault(proc, watcher, run_id) or {}), daemon=True)
            thread.start()
        try:
            log, rc = local_run.wait(proc, self.args.job_timeout), proc.returncode
        except local_run.JobTimeout as e:
            log, rc = e.log + f"\n(job timed out after {self.args.job_timeout} s)", "timeout"
        end = time.time()
        watcher.stop()
        if thread:
            thread.join(timeout=self.args.link_down_s + 30)
        return {"rc": rc, "log": log, "wall_s": end - t0, "first_death": watcher.first_death, "end": end,
                **ft.left_over(run_id, shm_before, list(watcher.ranks)), "fault": found}

    def train_argv(self, tag, extra=()):
        d = os.path.join(self.jobs, tag)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d, ["-m", "tfc_apps.train", "--algorithm", "hitopk", "--epochs", self.args.epochs, "--warmup", "1",
                   "--deterministic",
                   "--ckpt-dir", os.path.join(d, "ckpt"), "--json", os.path.join(d, "summary.json"), *extra]

    def dawn_argv(self, tag):
        if self._digits is None:
            from tfc_apps.digits import write_image_folder

            self._digits = write_image_folder(os.path.join(self.jobs, "digits"), size=32)
        d = os.path.join(self.jobs, tag)
        shutil.rmtree(d, ignore_errors=True)
        return d, ["-m", "tfc_apps.dawnbench", "--data", self._digits, "--model", "small", "--stages",
                   f"16:{self.args.epochs}:16", "--schedule", "0:hitopk", "--density", "0.05", "--optimizer", "sgd",
                   "--lr", "0.05", "--warmup-epochs", "1", "--label-smoothing", "0", "--breakdown-steps", "0",
                   "--deterministic", "--log-dir", d]

    @staticmethod
    def train_digest(d):
        """(sha256, first epoch run) of a tfc_apps.train job's summary, or (None, None)."""
        try:
            with open(os.path.join(d, "summary.json")) as f:
                s = json.load(f)
            return s["weights"]["sha256"], s["epochs"][0]["epoch"]
        except (OSError, ValueError, KeyError, IndexError):
            return None, None

    @staticmethod
    def dawn_digest(log):
        found = re.findall(r"weights identical on all \d+ ranks: sha256 ([0-9a-f]{64})", log)
        return found[-1] if found else None

    def references(self):
        """The uninterrupted runs the faulted ones are compared with, one per workload needed."""
        if {"kill", "link", "disk"} & set(self.args.cases):
            d, argv = self.train_argv("reference_train")
            r = self.job(argv)
            self.reference["train"] = (self.train_digest(d)[0], r["wall_s"])
            self._check_reference("train", r)
        if "redis" in self.args.cases:
            d, argv = self.dawn_argv("reference_dawnbench")
            r = self.job(argv)
            self.reference["dawnbench"] = (self.dawn_digest(r["log"]), r["wall_s"])
            self.reference_stats = _datacache_stats(r["log"])
            self._check_reference("dawnbench", r)

    def _check_reference(self, name, r):
        if r["rc"] != 0 or self.reference[name][0] is None:
            raise SystemExit(f"bench faults: the uninterrupted {name} run failed (exit {r['rc']}):\n{r['log'][-4000:]}")
        print(f"# uninterrupted {name}: {r['wall_s']:.1f} s, sha256 {self.reference[name][0][:16]}",
              file=sys.stderr, flush=True)

    # -- the outcome of a run -----------------------------------------------------------------
    def row(self, case, run, fault, r, workload, digest=None, resumed=None, resume_epoch=None, detail=""):
        ref_digest, ref_wall = self.reference[workload]
        died = r["first_death"] is not None and r["rc"] != 0
        if digest is None and resumed is not None:
            digest = resumed
        return {"case": case, "run": run, "fault": fault,
                "outcome": (f"ranks exited, status {r['rc']}" if r["rc"] != 0 else "recovered"),
                "exit_s": (r["end"] - r["first_death"]) if died else None,
                "delay_s": None if r["rc"] != 0 else r["wall_s"] - ref_wall,
                "wall_s": r["wall_s"], "processes_left": r["processes_left"], "shm_left": r["shm_left"],
                "redis_servers_left": r["redis_servers_left"], "redis_keys_left": r["redis_keys_left"],
                "redis_dirs_left": r["redis_dirs_left"],
                "resume_epoch": resume_epoch, "digest": digest, "reference_digest": ref_digest,
                "equal": digest is not None and digest == ref_digest, "detail": detail}

    def resume(self, d, argv):
        """Runs the same job again on the checkpoints the faulted one left; (sha256, epoch it resumed at)."""
        summary = os.path.join(d, "summary.json")
        if os.path.exists(summary):   # rank 0 may have finished the faulted job: only the resumed run's counts
            os.remove(summary)
        r = self.job(argv)
        digest, first = self.train_digest(d)
        if r["rc"] != 0:
            print(f"# the resumed run failed (exit {r['rc']}):\n{r['log'][-3000:]}", file=sys.stderr)
        return digest, None if first is None else first - 1

    # -- the cases ----------------------------------------------------------------------------
    def kill(self, run):
        steps = train_steps(self.size)
        rank, epoch, batch = self.rng.randrange(self.size), self.rng.randint(2, self.args.epochs), self.rng.randrange(steps)
        fault = f"SIGKILL rank {rank} at epoch {epoch} step {batch} (global step {(epoch - 1) * steps + batch})"
        d, argv = self.train_argv(f"kill{run}")
        r = self.job(argv, env={"TF_COMMLIB_TEST_FAIL_AT": f"{rank}:{epoch}:-9:{batch}"})
        stamp = re.search(r"TF_COMMLIB_TEST_FAIL_AT\) at t=([\d.]+)", r["log"])
        if stamp and r["rc"] != 0:
            r["first_death"] = float(stamp.group(1))   # the kill itself, not when the watcher saw it
        detail = "" if stamp else "the rank did not reach the step"
        digest, resume_epoch = self.resume(d, argv)
        return self.row("kill", run, fault, r, "train", resumed=digest, resume_epoch=resume_epoch, detail=detail)

    def link(self, run):
        from tfc_apps.bench import fault_tools as ft

        node, after = self.rng.randrange(self.m), self.rng.randint(1, self.args.epochs - 1)
        secs = self.args.link_down_s
        fault = f"link of node {node} down {secs:g} s after epoch {after}"
        if not self.shaped:
            return {"case": "link", "run": run, "fault": fault, "outcome": f"not run: {self.link_desc}"}
        ns, iface = ft.node_link(node)
        d, argv = self.train_argv(f"link{run}")
        ckpt = os.path.join(d, "ckpt")

        def cut(proc, watcher, run_id):
            if not ft.wait_for(lambda: min(ft.saved_epochs(ckpt, self.size)) >= after, proc, self.args.job_timeout):
                return {"injected": False}
            ft.set_link(ns, iface, False)
            t = time.time()
            try:
                time.sleep(secs)
            finally:
                ft.set_link(ns, iface, True)
            return {"injected": True, "t": t}

        try:
            r = self.job(argv, fault=cut)
        finally:
            if not ft.link_is_up(ns, iface):
                ft.set_link(ns, iface, True)
        detail = f"{ns}/{iface}" + ("" if r["fault"].get("injected") else ", not injected (the job ended first)")
        if r["rc"] == 0:
            return self.row("link", run, fault, r, "train", digest=self.train_digest(d)[0], detail=detail)
        digest, resume_epoch = self.resume(d, argv)
        return self.row("link", run, fault, r, "train", resumed=digest, resume_epoch=resume_epoch, detail=detail)

    def redis(self, run):
        from tfc_apps.bench import fault_tools as ft

        node, epoch, frac = self.rng.randrange(self.m), self.rng.randint(2, self.args.epochs), self.rng.uniform(0.1, 0.5)
        fault = f"SIGKILL redis-server of node {node} after {frac:.0%} of its epoch-{epoch} reads"
        d, argv = self.dawn_argv(f"redis{run}")

        def kill(proc, watcher, run_id):
            # The input pipeline runs ahead of training (one repeated dataset, prefetched), so the kill
            # is timed by the reads the server has served, not by the epochs trained. Epoch 1 misses
            # (and fills the server); from epoch 2 on each epoch's training reads are hits, about
            # `per_epoch` of them on a node (the uninterrupted run's hits per epoch and node).
            per_epoch = self.reference_stats.get("hits", 0) / max(self.args.epochs - 1, 1) / self.m
            client = None

            def due():
                nonlocal client
                if client is None:
                    servers = ft.redis_servers(run_id, node)
                    client = ft.redis_client(servers[0]) if servers else None
                    return False
                state = ft.redis_reads(client)
                return state is not None and state[2] > 0 and state[2] >= (epoch - 2 + frac) * per_epoch

            if not ft.wait_for(due, proc, self.args.job_timeout, period=0.005):
                return {"killed": 0}
            keys, reads, hits = ft.redis_reads(client) or (0, 0, 0)
            killed = sum(ft.kill(p) for p in ft.redis_servers(run_id, node))
            return {"killed": killed, "keys": keys, "reads": reads, "hits": hits, "per_epoch": round(per_epoch)}

        r = self.job(argv, fault=kill)
        stats, ref = _datacache_stats(r["log"]), self.reference_stats
        f = r["fault"]
        detail = (f"{f.get('killed', 0)} server(s) killed after {f.get('hits', '?')} hits ({f.get('per_epoch', '?')} "
                  f"per epoch) and {f.get('reads', '?')} reads of {f.get('keys', '?')} keys; "
                  + (", ".join(f"{k} {v}" for k, v in stats.items()) if stats else "no datacache stats"))
        row = self.row("redis", run, fault, r, "dawnbench", digest=self.dawn_digest(r["log"]), detail=detail)
        # what the dead server cost: reads that fell back to the source while it was down, and the
        # misses of the restarted (empty) server beyond the uninterrupted run's
        row["fallbacks"] = stats.get("fallbacks")
        row["extra_misses"] = (stats["misses"] - ref["misses"]) if "misses" in stats and "misses" in ref else None
        return row

    def disk(self, run):
        from tfc_apps.bench import fault_tools as ft

        # not at the last epoch's checkpoint: the other ranks would finish and delete their backups
        rank, after = self.rng.randrange(self.size), self.rng.randint(1, self.args.epochs - 2)
        how = "tmpfs" if os.geteuid() == 0 and shutil.which("mount") else "rlimit"
        fault = (f"rank {rank}'s checkpoint disk full after epoch {after} "
                 + ("(tmpfs shrunk: ENOSPC)" if how == "tmpfs" else "(RLIMIT_FSIZE: EFBIG)"))
        d, argv = self.train_argv(f"disk{run}")
        ckpt = os.path.join(d, "ckpt")
        fs = ft.Tmpfs(os.path.join(ckpt, f"rank{rank}")) if how == "tmpfs" else None

        def fill(proc, watcher, run_id):
            if not ft.wait_for(lambda: ft.saved_epochs(ckpt, self.size)[rank] >= after, proc, self.args.job_timeout):
                return {"filled": False}
            if fs:
                return {"filled": True, "size": fs.fill()}
            pid = watcher.pid_of(rank)
            if pid:
                ft.limit_file_size(pid, 64 << 10)
            return {"filled": bool(pid)}

        try:
            r = self.job(argv, fault=fill)
        finally:
            if fs:
                fs.release()   # the operator frees the disk before resuming
        error = re.search(r"(OSError|RuntimeError)[^\n]*(No space left on device|File too large)[^\n]*", r["log"])
        detail = error.group(0)[:120] if error else "no ENOSPC/EFBIG in the log"
        digest, resume_epoch = self.resume(d, argv)
        return self.row("disk", run, fault, r, "train", resumed=digest, resume_epoch=resume_epoch, detail=detail)


def _datacache_stats(log):
    """{counter: value} of the DAWNBench script's 'datacache (all ranks): ...' line, or {}."""
    found = re.findall(r"datacache \(all ranks\): (.*)", log)
    return {k: int(v) for k, v in re.findall(r"(\w+) (-?\d+)", found[-1])} if found else {}


COLUMNS = ("case", "run", "fault", "outcome", "exit s", "delay s", "procs left", "/dev/shm left",
           "redis left", "resumed at", "= uninterrupted")


def cells(row):
    fmt = lambda v: "-" if v is None else f"{v:.1f}"   # noqa: E731
    if "wall_s" not in row:   # not run
        return [row["case"], str(row["run"]), row["fault"], row["outcome"]] + ["-"] * 7
    return [row["case"], str(row["run"]), row["fault"], row["outcome"], fmt(row["exit_s"]), fmt(row["delay_s"]),
            str(len(row["processes_left"])), str(len(row["shm_left"])),
            f"{row['redis_servers_left']} srv/{row['redis_keys_left']} keys",
            "-" if row["resume_epoch"] is None else f"epoch {row['resume_epoch']}",
            "yes" if row["equal"] else "NO"]


def table(rows):
    body = [list(COLUMNS)] + [cells(r) for r in rows]
    widths = [max(len(line[j]) for line in body) for j in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body)


def main(argv):
    p = parser()
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.epochs, args.link_down_s = 1, min(args.epochs, 3), min(args.link_down_s, 5.0)
    if args.runs < 1 or args.epochs < 3:
        p.error("--runs must be >= 1 and --epochs >= 3 (a fault after epoch 1, a checkpoint before the last)")
    if not 0 < args.link_down_s <= 120 or args.exit_timeout <= 0 or args.job_timeout <= 0 or args.inter_mbit < 1:
        p.error("--link-down-s must be in (0, 120], --exit-timeout, --job-timeout and --inter-mbit positive")
    if args.elastic_epochs < 5 or args.commit_every < 1:
        p.error("--elastic-epochs must be >= 5 (a kill in epoch 3 or later, 2 epochs after it) and --commit-every >= 1")

    def stop(signum, frame):   # SIGTERM (timeout(1), a CI runner): unwind, so the ranks die, the link
        raise SystemExit(128 + signum)   # comes up, the tmpfs goes and the emulated cluster comes down

    signal.signal(signal.SIGTERM, stop)
    os.makedirs(args.out, exist_ok=True)
    rows, result = [], {"seed": args.seed, "epochs": args.epochs, "exit_timeout_s": args.exit_timeout}
    elastic = [c for c in faults_elastic.CASES if c in args.cases]
    args.cases = [c for c in args.cases if c in CASES]
    if args.cases:
        rows, more = emulated_runs(args)
        result.update(more)
    if elastic:
        result["elastic_runs"], result["elastic"] = faults_elastic.run_all(args, elastic)
    with open(os.path.join(args.out, "faults.json"), "w") as f:
        json.dump(result, f, indent=1)
    if args.json:
        for r in rows + result.get("elastic_runs", []):
            print(json.dumps(r))
    else:
        if rows:
            print(f"fault injection, 2x2 ranks, {result['link']}, {args.epochs} epochs per job, seed {args.seed}")
            print(table(rows))
        if elastic:
            print(f"elastic: 4 ranks on 2 local host names, {args.elastic_epochs} epochs per job, a commit every "
                  f"{args.commit_every} steps, seeds {args.seed}..{args.seed + args.runs - 1}, Gloo timeout "
                  f"{args.gloo_timeout_s or 'Horovod default (30 s)'}")
            print(faults_elastic.table(result["elastic_runs"] + result["elastic"]))
    bad = [r for r in rows if "wall_s" in r and not (
        r["equal"] and not r["shm_left"] and not r["processes_left"] and not r["redis_servers_left"]
        and not r["redis_dirs_left"]
        and (r["exit_s"] is None or r["exit_s"] <= args.exit_timeout))]
    bad += [r for r in result.get("elastic_runs", []) if "top1" not in r]
    if bad:
        print(f"bench faults: {len(bad)} run(s) broke an invariant (weights = uninterrupted, nothing left, "
              f"every rank out within {args.exit_timeout:g} s; elastic: the job went on)", file=sys.stderr)
    return 1 if bad else 0


def emulated_runs(args):
    """The cases on the emulated 2x2 cluster: (rows, {link, reference})."""
    from tfc_apps import emulated

    rows = []
    with emulated.launcher(2, 2, args.inter_mbit) as (prefix, link):
        shaped = "NOT shaped" not in link
        print(f"# {link}", file=sys.stderr, flush=True)
        bench = Bench(args, prefix, link, shaped)
        bench.references()
        for run in range(args.runs):
            for case in args.cases:
                row = getattr(bench, case)(run)
                rows.append(row)
                print(f"# {case} {run}: {row['fault']}: {row['outcome']} ({json.dumps(cells(row)[4:])}, "
                      f"{row.get('detail', '')})", file=sys.stderr, flush=True)
    return rows, {"link": link, "reference": {k: {"sha256": v[0], "wall_s": v[1]} for k, v in bench.reference.items()},
                  "runs": rows}
