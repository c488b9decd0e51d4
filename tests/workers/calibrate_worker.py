"""Runs costmodel.calibrate() on every rank and reports the numbers and the choices they give."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import tf_commlib  # noqa: E402
from _report import report  # noqa: E402
from tf_commlib import costmodel  # noqa: E402

topo = tf_commlib.init()
params = costmodel.calibrate(topo, sizes=(2**14, 2**17), repeats=3, compute_sizes=(2**16, 2**18))
sizes = [2**10, 2**16, 2**20, 2**24, 2**26]
report(topo.rank, {
    "m": topo.m, "n": topo.n,
    "params": params.as_list(),
    "curve": [list(row) for row in params.compute_curve],
    "choices": [costmodel.choose(d, topo.m, topo.n, 0.01, params) for d in sizes],
    "predicted": [costmodel.predict("hitopk", d, topo.m, topo.n, 0.01, params) for d in sizes],
})
