"""The rank layout of a Slurm job step, from the variables srun gives each task.

srun numbers tasks node-major with ``--distribution=block``: the tasks of node 0 come first. Each
task sees SLURM_PROCID (its rank), SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_TASKS and
SLURM_STEP_TASKS_PER_NODE (``4``, ``2(x3)`` or ``2(x3),1``).
"""
import os
import re


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
    if not env.get("SLURM_STEP_NUM_TASKS") or not env.get("SLURM_STEP_TASKS_PER_NODE"):
        return None
    size, counts = int(env["SLURM_STEP_NUM_TASKS"]), tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
    if sum(counts) != size:
        raise ValueError(f"SLURM_STEP_TASKS_PER_NODE={env['SLURM_STEP_TASKS_PER_NODE']} does not add up "
                         f"to SLURM_STEP_NUM_TASKS={size}")
    rank, node, local = (int(env.get(k, -1)) for k in ("SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID"))
    if not (0 <= node < len(counts) and 0 <= local < counts[node] and rank == sum(counts[:node]) + local):
        raise ValueError(f"Slurm task {rank} is task {local} of node {node} with tasks per node {counts}: "
                         "tf_commlib needs node-major ranks (srun --distribution=block)")
    return size, counts
