"""Starts Horovod (Gloo) ranks on the cluster emulated by scripts/emulate_cluster.sh, or on this machine.

    python -m tfc_apps.cluster_launch [--np-per-node N] [--timeout S] -- CMD ARGS...
    python -m tfc_apps.cluster_launch --local M [--np-per-node N] -- CMD ARGS...
    python -m tfc_apps.cluster_launch [--local M] --check-link     # intra vs inter bandwidth

Like ``horovodrun --gloo`` without ssh: Horovod's own RendezvousServer (bound to the bridge
address, which every namespace reaches) and get_host_assignments, then N ranks per node started
with ``ip netns exec tfc-nodeI env HOROVOD_...=... CMD``. Ranks are node-major (rank = node*N +
local) and Horovod's local/cross ranks describe the M x N layout, so tf_commlib.init() finds it
without TF_COMMLIB_TOPOLOGY. ``--local M`` runs the same layout on 127.0.0.1 without namespaces.
Output lines are prefixed ``[rank]<stdout>:`` as horovodrun does; the exit code of the first rank
to fail is returned (124 on timeout) and the remaining ranks are killed. It starts ranks on this
machine only: on real hosts use ``horovodrun -H`` or, under Slurm, ``python -m tfc_apps.slurm``
(docs/cluster.md).
"""
import argparse
import os
import signal
import subprocess
import sys
import time

from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
from horovod.runner.common.util.safe_shell_exec import prefix_connection
from horovod.runner.util.threads import in_thread

from tfc_apps.launch_env import BoundRendezvousServer, rank_env
from tfc_apps.local_run import stop_groups

STATE = os.environ.get("TF_COMMLIB_CLUSTER_STATE", "/run/tf_commlib_cluster.env")
GRACE_S = 3.0


def read_state(path=STATE):
    """The KEY=VALUE lines written by `emulate_cluster.sh up`."""
    if not os.path.exists(path):
        sys.exit(f"cluster_launch: no emulated cluster ({path} missing); run "
                 "`sudo scripts/emulate_cluster.sh up M N --inter-mbit X` or use --local M")
    lines = (ln.strip() for ln in open(path))
    return dict(ln.split("=", 1) for ln in lines if ln and not ln.startswith("#"))


def plan(args):
    """(nodes, server address, rate) where nodes[i] = (hostname, netns or None, iface)."""
    if args.local:
        return [(f"node{i}", None, "lo") for i in range(args.local)], "127.0.0.1", None
    if os.geteuid() != 0:
        sys.exit("cluster_launch: `ip netns exec` needs root; run as root or use --local M")
    st = read_state(args.state)
    nodes = [(st[f"NODE{i}_NS"], st[f"NODE{i}_NS"], st[f"NODE{i}_IFACE"]) for i in range(int(st["M"]))]
    args.np_per_node = args.np_per_node or int(st["N"])
    return nodes, st["BRIDGE_ADDR"], st["INTER_MBIT"]


def launch(args, command):
    nodes, server_ip, mbit = plan(args)
    n = args.np_per_node or 1
    slots = get_host_assignments([HostInfo(host, n) for host, _, _ in nodes], len(nodes) * n)
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    rendezvous = BoundRendezvousServer(server_ip, args.verbose)
    port = rendezvous.start()
    rendezvous.init(slots)
    procs, readers, first = [], [], None
    exits = []   # (time, rank, returncode) as each rank exits: a dead rank's peers fail soon after it,
    # often within one poll, so the first failure is the first to exit, not the lowest rank to have failed

    def reap(rank, p):
        p.wait()
        exits.append((time.monotonic(), rank, p.returncode))
    try:
        for slot in slots:
            _, netns, iface = nodes[slot.cross_rank]
            hvd_env = rank_env(slot, server_ip, port, iface)
            env = dict(os.environ, PYTHONUNBUFFERED="1", TF_COMMLIB_INTER_MBIT=str(mbit or ""))
            env.pop("TF_COMMLIB_TOPOLOGY", None)   # the layout must come from Horovod's ranks
            env_args = ["env"] + [f"{k}={v}" for k, v in hvd_env.items()]
            cmd = (["ip", "netns", "exec", netns] if netns else []) + env_args + command
            if args.verbose:
                print(" ".join(cmd), flush=True)
            p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
            procs.append(p)
            for stream, name, dst in ((p.stdout, "stdout", sys.stdout), (p.stderr, "stderr", sys.stderr)):
                readers.append(in_thread(prefix_connection, (stream, dst, name, slot.rank, False)))
            in_thread(reap, (slot.rank, p))
        deadline = time.monotonic() + args.timeout if args.timeout else None
        while first is None:
            done = sorted(exits)
            failed = [(r, rc) for _, r, rc in done if rc != 0]   # in the order they exited
            if failed:
                rank, rc = failed[0]
                first = 128 - rc if rc < 0 else rc
                print(f"cluster_launch: rank {rank} exited with status {rc}; terminating the other ranks",
                      file=sys.stderr, flush=True)
            elif len(done) == len(procs):
                first = 0
            elif stop:
                first = 128 + stop[0]
                print(f"cluster_launch: got signal {stop[0]}; terminating all ranks",
                      file=sys.stderr, flush=True)
            elif deadline and time.monotonic() > deadline:
                first = 124
                print(f"cluster_launch: timed out after {args.timeout}s; killing all ranks",
                      file=sys.stderr, flush=True)
            else:
                time.sleep(0.05)
    finally:
        stop_groups(procs, grace=GRACE_S)   # SIGTERM each rank's process group, SIGKILL after GRACE_S
        for t in readers:
            t.join(timeout=2)
        rendezvous.stop()
    return first


def link_worker(mbytes, iters):
    """Times allreduces of `mbytes` MB inside node 0 and across nodes (local index 0); rank 0 prints."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import tf_commlib
    topo = tf_commlib.init()
    x = tf.ones([mbytes * (1 << 20) // 4], tf.float32)

    def timed(pset, ranks, member, tag):
        hvd.allreduce(tf.zeros([1]), name=f"barrier_{tag}")   # the other ranks stay idle meanwhile
        if not member or len(ranks) < 2:
            return None
        hvd.allreduce(x, op=hvd.Sum, process_set=pset, name=f"warm_{tag}")
        t = time.perf_counter()
        for i in range(iters):
            hvd.allreduce(x, op=hvd.Sum, process_set=pset, name=f"{tag}_{i}")
        k, dt = len(ranks), (time.perf_counter() - t) / iters
        return 2 * (k - 1) / k * x.shape[0] * 4 * 8 / dt / 1e6   # ring bus bandwidth, Mbit/s

    intra = timed(topo.intra, topo.intra_ranks, topo.node == 0, "intra")
    inter = timed(topo.inter, topo.inter_ranks, topo.local == 0, "inter")
    hvd.allreduce(tf.zeros([1]), name="barrier_end")
    if topo.rank == 0:
        fmt = lambda bw: "n/a" if bw is None else f"{bw:.1f} Mbit/s"   # noqa: E731
        mbit = os.environ.get("TF_COMMLIB_INTER_MBIT")
        shaped = f"shaped at {mbit} Mbit/s" if mbit else "unshaped (--local)"
        print(f"check-link {topo.m}x{topo.n}: intra-node {fmt(intra)} (ranks {list(topo.intra_ranks)}), "
              f"inter-node {fmt(inter)} (ranks {list(topo.inter_ranks)}), link {shaped} "
              f"[{mbytes} MB allreduce x{iters}]", flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="python -m tfc_apps.cluster_launch",
                                 description=__doc__.split("\n")[0],
                                 epilog="On real hosts: horovodrun -np N -H host1:8,host2:8 --gloo CMD, or "
                                        "python -m tfc_apps.slurm -- CMD under Slurm (docs/cluster.md).")
    ap.add_argument("--np-per-node", type=int, default=None,
                    help="ranks per node (default: N of the cluster; 1 with --local)")
    ap.add_argument("--local", type=int, metavar="M", help="M emulated nodes on 127.0.0.1, no namespaces")
    ap.add_argument("--timeout", type=float, default=0, help="kill all ranks after this many seconds")
    ap.add_argument("--state", default=STATE, help="state file written by emulate_cluster.sh")
    ap.add_argument("--check-link", action="store_true", help="measure intra- vs inter-node bandwidth")
    ap.add_argument("--mbytes", type=int, default=8, help="--check-link message size in MB")
    ap.add_argument("--iters", type=int, default=3, help="--check-link timed iterations")
    ap.add_argument("--link-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv[:split])
    if (args.local is not None and args.local < 1) or (args.np_per_node is not None and args.np_per_node < 1):
        ap.error("--local and --np-per-node must be at least 1")
    command = argv[split + 1:]
    if args.link_worker:
        return link_worker(args.mbytes, args.iters) or 0
    if args.check_link:
        command = [sys.executable, "-m", "tfc_apps.cluster_launch", "--link-worker",
                   "--mbytes", str(args.mbytes), "--iters", str(args.iters)]
    if not command:
        ap.error("no command given (put it after --) and no --check-link")
    return launch(args, command)


if __name__ == "__main__":
    sys.exit(main())
