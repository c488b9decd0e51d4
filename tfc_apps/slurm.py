"""Runs a command as the Horovod (Gloo) ranks of a Slurm job, without ssh (scripts/slurm/*.sbatch).

    python -m tfc_apps.slurm [--output PATTERN] -- CMD ARGS...     # in a batch script

In the batch step it starts Horovod's rendezvous server on the job's first node, bound to that
node's address, then ``srun --kill-on-bad-exit=1 --distribution=block`` one task per rank: node-major
ranks, so tf_commlib.init() finds the nodes x tasks-per-node layout. Each task (this module again,
with --task) sets the HOROVOD_* variables of its slot from SLURM_PROCID/LOCALID/NODEID and runs CMD.
Each rank writes to its own file (srun --output PATTERN, %t = rank, appended across requeues).
The exit status is the first failing rank's, else srun's: failing ranks are ordered by when they
began to exit (slurm_env.exit_notice_at_exit, so a rank that Horovod stopped because another failed
comes after it; a rank killed by a signal is noted by its task as soon as it ends), then by when
their status arrived.
On SIGTERM (scancel, preemption, requeue) every rank is stopped; a rank that failed or was stopped
has the /dev/shm files of its job step removed.
"""
import argparse
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

from tf_commlib import slurm_env
from tfc_apps.launch_env import BoundRendezvousServer, iface_towards, rank_env, source_address

EXIT_SCOPE = "tf_commlib_exit"     # rendezvous scope where each task PUTs its rank's exit status
EXITING_SCOPE = "tf_commlib_exiting"   # ... and where each rank PUTs as it begins to exit
GRACE_S = 10.0                      # a task SIGKILLs its rank this long after forwarding SIGTERM
PLAN_VAR = "TF_COMMLIB_SLURM_PLAN"  # "ADDR:PORT;host1:4,host2:4" from the batch step to its tasks
SHM_TAG_VAR = "TF_COMMLIB_SHM_TAG"  # tf_commlib.shm.TAG_VAR (not imported: it loads TensorFlow)


def _log(msg):
    print(f"tfc_apps.slurm: {msg}", file=sys.stderr, flush=True)


def _status(returncode):
    return 128 - returncode if returncode < 0 else returncode


def job_hosts(env):
    """[(node name, tasks on it)] of the job, in Slurm's node order."""
    names = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], check=True,
                           capture_output=True, text=True).stdout.split()
    counts = slurm_env.tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ",".join("1" * len(names))))
    if len(counts) != len(names):
        raise ValueError(f"SLURM_TASKS_PER_NODE={env.get('SLURM_TASKS_PER_NODE')} does not match the "
                         f"nodes {names}")
    return list(zip(names, counts))


def node_address(name):
    """The IPv4 address Slurm reaches node `name` at (its NodeAddr; the name when scontrol has none)."""
    out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True).stdout
    match = re.search(r"\bNodeAddr=(\S+)", out)
    return socket.gethostbyname(match.group(1) if match else name)


def server_address(hosts):
    """The first node's address that every node of the job reaches: its NodeAddr, or, when that is a
    loopback address and another node is elsewhere, this node's source address towards that one."""
    addr = node_address(hosts[0][0])
    others = [a for a in (node_address(h) for h, _ in hosts[1:]) if not a.startswith("127.")]
    return source_address(others[0]) if addr.startswith("127.") and others else addr


def launch(args, command):
    env = os.environ
    if not env.get("SLURM_JOB_ID"):
        sys.exit("tfc_apps.slurm: not in a Slurm job (no SLURM_JOB_ID); submit it with sbatch")
    hosts = job_hosts(env)
    ntasks = sum(c for _, c in hosts)
    slots = get_host_assignments([HostInfo(h, c) for h, c in hosts], ntasks)
    addr = args.addr or server_address(hosts)
    server = BoundRendezvousServer(addr, args.verbose)
    port = server.start()
    server.init(slots)
    plan = f"{addr}:{port};" + ",".join(f"{h}:{c}" for h, c in hosts)
    srun = ["srun", "--kill-on-bad-exit=1", "--distribution=block", f"--ntasks={ntasks}", "--export=ALL",
            "--open-mode=append", f"--output={args.output}", *args.srun_arg,
            sys.executable, "-m", "tfc_apps.slurm", "--task", "--", *command]
    _log(f"job {env['SLURM_JOB_ID']} (restart {env.get('SLURM_RESTART_COUNT', 0)}): {ntasks} ranks on "
         f"{plan.split(';')[1]}, rendezvous {addr}:{port}, rank output {args.output}")
    stop = []
    proc = subprocess.Popen(srun, env=dict(env, **{PLAN_VAR: plan}), stdin=subprocess.DEVNULL)

    def forward(signum, frame):
        stop.append(signum)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    try:
        rc = _status(proc.wait())
    finally:
        exits, exiting = server.scope(EXIT_SCOPE), list(server.scope(EXITING_SCOPE))
        server.stop()
    failed = [(int(rank), int(code)) for rank, code in exits.items() if int(code)]
    failed.sort(key=lambda f: exiting.index(str(f[0])) if str(f[0]) in exiting else len(exiting))
    if failed:
        _log(f"rank {failed[0][0]} failed first, with exit status {failed[0][1]} (ranks that exited "
             f"non-zero, in order: {failed}; began to exit: {exiting}); srun exited with {rc}")
        return failed[0][1]
    if rc == 0 and len(exits) != ntasks:
        _log(f"srun succeeded but only ranks {sorted(map(int, exits))} reported an exit status")
        return 1
    return rc or (128 + stop[0] if stop else 0)


def report_exit(addr, port, rank, code):
    req = urllib.request.Request(f"http://{addr}:{port}/{EXIT_SCOPE}/{rank}", data=str(code).encode(),
                                 method="PUT")
    try:
        urllib.request.urlopen(req, timeout=5).close()
    except OSError as e:
        _log(f"rank {rank} could not report its exit status {code} to {addr}:{port}: {e}")


def task(command):
    """One srun task: the rank's HOROVOD_* variables, then CMD; forwards SIGTERM/SIGINT to it."""
    env = os.environ
    server, hosts = env[PLAN_VAR].split(";")
    addr, port = server.rsplit(":", 1)
    hosts = [(h, int(c)) for h, c in (x.rsplit(":", 1) for x in hosts.split(","))]
    size, counts = slurm_env.step_layout(env)
    if counts != [c for _, c in hosts]:
        sys.exit(f"tfc_apps.slurm: srun placed {counts} tasks on the nodes, the job has {hosts}")
    rank = int(env["SLURM_PROCID"])
    slot = get_host_assignments([HostInfo(h, c) for h, c in hosts], size)[rank]
    tag = f"j{env['SLURM_JOB_ID']}s{env.get('SLURM_STEP_ID', '0')}"
    child_env = dict(env, **rank_env(slot, addr, port, env.get("HOROVOD_GLOO_IFACE") or iface_towards(addr)),
                     PYTHONUNBUFFERED="1", **{SHM_TAG_VAR: tag})
    child_env[slurm_env.EXIT_NOTICE_VAR] = f"http://{addr}:{port}/{EXITING_SCOPE}/{rank}"
    child_env.pop(PLAN_VAR)
    proc = subprocess.Popen(command, env=child_env)
    deadline = []

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signum)
            deadline.append(time.monotonic() + GRACE_S)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    while proc.poll() is None:
        if deadline and time.monotonic() > deadline[0]:
            proc.kill()
        time.sleep(0.02)
    code = _status(proc.returncode)
    if code and not deadline:   # it died on its own (a signal skips its atexit notice): notify now
        slurm_env.exit_notice(child_env[slurm_env.EXIT_NOTICE_VAR])
    if code:   # the step is failing: remove what this node's ranks left in /dev/shm
        for path in glob.glob(f"/dev/shm/tfcl_{tag}_*"):
            try:
                os.unlink(path)
            except OSError:
                pass
    report_exit(addr, port, rank, code)
    return code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="python -m tfc_apps.slurm", description=__doc__.split("\n")[0])
    ap.add_argument("--output", default=os.environ.get("TF_COMMLIB_SLURM_OUTPUT", "slurm-%j.rank%t.out"),
                    help="srun --output pattern of each rank's file (%%j job id, %%t rank)")
    ap.add_argument("--addr", default=None, help="rendezvous address (default: the first node's)")
    ap.add_argument("--srun-arg", action="append", default=[], help="extra srun option (repeatable)")
    ap.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        ap.error("no command given (put it after --)")
    return task(command) if args.task else launch(args, command)


if __name__ == "__main__":
    sys.exit(main())
