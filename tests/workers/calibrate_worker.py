"""Runs costmodel.calibrate() on every rank and reports the numbers and the choices they give."""
import tf_commlib
from tests.workers._report import report
from tf_commlib import collectives, costmodel

topo = tf_commlib.init()
params = costmodel.calibrate(topo, sizes=(2**14, 2**17), repeats=3, compute_sizes=(2**16, 2**18))
sizes = [2**10, 2**16, 2**20, 2**24, 2**26]
report(topo.rank, {
    "m": topo.m, "n": topo.n,
    "params": params.as_list(),
    "curve": [list(row) for row in params.compute_curve],
    "choices": [collectives.choose(d, topo.m, topo.n, 0.01, params) for d in sizes],
    "predicted": [collectives.predict("hitopk", d, topo.m, topo.n, 0.01, params) for d in sizes],
})
