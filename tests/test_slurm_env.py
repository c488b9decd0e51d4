"""tf_commlib.slurm_env: the rank layout of an srun step from SLURM_* variables (no Slurm needed),
which tf_commlib.init() uses when Horovod's variables are absent (an MPI build under srun --mpi=pmix)."""
import pytest

from tf_commlib import slurm_env


def _task(rank, node, local, ntasks, per_node):
    return {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local),
            "SLURM_NTASKS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
            "SLURM_STEP_TASKS_PER_NODE": per_node}


@pytest.mark.parametrize("spec, counts", [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]),
                                          ("8,4(x2)", [8, 4, 4])])
def test_tasks_per_node(spec, counts):
    assert slurm_env.tasks_per_node(spec) == counts


@pytest.mark.parametrize("spec", ["", "2(3)", "x", "2,,2", "-1"])
def test_tasks_per_node_rejects_malformed(spec):
    with pytest.raises(ValueError, match="tasks-per-node"):
        slurm_env.tasks_per_node(spec)


def test_step_layout_node_major():
    # 3 nodes x 2 tasks, block distribution: rank = node * 2 + local on every task
    for rank in range(6):
        env = _task(rank, rank // 2, rank % 2, 6, "2(x3)")
        assert slurm_env.step_layout(env) == (6, [2, 2, 2])


def test_step_layout_outside_a_step():
    assert slurm_env.step_layout({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0"}) is None


def test_step_layout_rejects_cyclic_ranks():
    # srun --distribution=cyclic: rank 1 is task 0 of node 1, not node-major
    with pytest.raises(ValueError, match="node-major"):
        slurm_env.step_layout(_task(1, 1, 0, 4, "2(x2)"))


def test_step_layout_rejects_inconsistent_counts():
    with pytest.raises(ValueError, match="does not add up"):
        slurm_env.step_layout(_task(0, 0, 0, 5, "2(x2)"))


def test_step_layout_rejects_job_count_in_a_smaller_step():
    env = dict(_task(0, 0, 0, 2, "2"), SLURM_STEP_NUM_TASKS="1")
    with pytest.raises(ValueError, match="SLURM_STEP_NUM_TASKS"):
        slurm_env.step_layout(env)
