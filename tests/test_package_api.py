"""What a newcomer types first: the names the README documents, reachable from a bare import."""
import subprocess
import sys


def test_documented_names_from_a_bare_import():
    code = ("import numpy as np, tf_commlib\n"
            "v, i = tf_commlib.ops.mstopk(np.arange(10, dtype=np.float32), 3, seed=0)\n"
            "assert sorted(i.numpy().tolist()) == [7, 8, 9], i\n"
            "assert tf_commlib.keras.DistributedOptimizer and tf_commlib.GradientAggregator\n"
            "assert 'hitopk' in tf_commlib.collectives.ALGORITHMS\n"
            "try:\n    tf_commlib.no_such_name\nexcept AttributeError as e:\n    print('ok', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok module 'tf_commlib' has no attribute 'no_such_name'" in proc.stdout


def test_bench_lists_every_benchmark():
    proc = subprocess.run([sys.executable, "-m", "tfc_apps.bench", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("topk", "comm", "convergence", "e2e", "datacache", "pto"):
        assert name in proc.stdout
