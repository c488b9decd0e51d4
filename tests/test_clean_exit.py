"""A fault-free run exits 0 on every rank whatever order the ranks finish in: with node 1
slower, its last intra-node (shared-memory) exchanges run after node 0 has shut Horovod down."""
from tests import hvdrun


def test_slow_node_finishes_after_the_other_shut_down(tmp_path):
    # eager hitopk: node 1's intra-node all-gathers each wait 2 s, so node 0 exits first
    reports = hvdrun.run("exit_worker.py", 4, tmp_path, args=["hitopk", "eager", "2"], topology="2x2",
                         timeout=300)
    assert [r["ok"] for r in reports] == [True] * 4
