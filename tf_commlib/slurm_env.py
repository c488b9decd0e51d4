"""The rank layout of a Slurm job step, from the variables srun gives each task.

srun numbers tasks node-major with ``--distribution=block``: the tasks of node 0 come first. Each
task sees SLURM_PROCID (its rank), SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS (the step's tasks, as
SLURM_STEP_NUM_TASKS) and SLURM_STEP_TASKS_PER_NODE (``4``, ``2(x3)`` or ``2(x3),1``).

A rank that tfc_apps.slurm started also tells the launcher when it begins to exit
(exit_notice_at_exit): a failing rank makes Horovod stop on the other ranks, which then fail too and
may finish exiting first, so the launcher orders failures by when each rank began to exit.
"""
import atexit
import os
import re
import urllib.request

EXIT_NOTICE_VAR = "TF_COMMLIB_EXIT_NOTICE"   # URL a rank PUTs to as it begins to exit
_notice_registered = []


def tasks_per_node(spec):
    """'2(x3),1' -> [2, 2, 2, 1]"""
    counts = []
    for part in str(spec).split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError(f"Slurm tasks-per-node list must look like '4' or '2(x3),1', got {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def step_layout(env=None):
    """(size, tasks on each node) of the srun step this process is a task of, or None outside one.
    Raises ValueError when the task's SLURM_PROCID/LOCALID/NODEID are not node-major."""
    env = os.environ if env is None else env
    if not env.get("SLURM_NTASKS") or not env.get("SLURM_STEP_TASKS_PER_NODE"):
        return None
    size, counts = int(env["SLURM_NTASKS"]), tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
    if int(env.get("SLURM_STEP_NUM_TASKS") or size) != size:
        raise ValueError(f"SLURM_NTASKS={size} but SLURM_STEP_NUM_TASKS={env['SLURM_STEP_NUM_TASKS']}: "
                         "a task of an srun step sees its step's task count in both")
    if sum(counts) != size:
        raise ValueError(f"SLURM_STEP_TASKS_PER_NODE={env['SLURM_STEP_TASKS_PER_NODE']} does not add up "
                         f"to SLURM_NTASKS={size}")
    rank, node, local = (int(env.get(k, -1)) for k in ("SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID"))
    if not (0 <= node < len(counts) and 0 <= local < counts[node] and rank == sum(counts[:node]) + local):
        raise ValueError(f"Slurm task {rank} is task {local} of node {node} with tasks per node {counts}: "
                         "tf_commlib needs node-major ranks (srun --distribution=block)")
    return size, counts


def exit_notice(url):
    """PUT to the launcher's URL: this rank begins to exit (a repeated notice keeps its first place)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"1", method="PUT"), timeout=5).close()
    except OSError:
        pass   # the launcher then orders this rank by its exit status report


def exit_notice_at_exit():
    """Called right after hvd.init(): at exit, before Horovod's own shutdown handler (atexit runs
    handlers in reverse order) stops the other ranks, PUT to $TF_COMMLIB_EXIT_NOTICE (if set)."""
    url = os.environ.get(EXIT_NOTICE_VAR)
    if url and not _notice_registered:
        _notice_registered.append(url)
        atexit.register(exit_notice, url)
