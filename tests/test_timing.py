"""timing.Timer.interleaved (bench comm, tfc_apps.bench.pto): every function runs once per round, in rotated
order, and the result is the median over rounds of the slowest rank's time (here one rank)."""
import numpy as np

from tf_commlib.timing import Timer


class OneRank(Timer):
    def __init__(self):
        super().__init__(topo=None)
        self.barriers = 0

    def barrier(self):
        self.barriers += 1

    def max_over_ranks(self, times):
        return np.asarray(times, np.float64)


def test_interleaved_rotates_order_and_takes_medians(monkeypatch):
    order, clock = [], [0.0]
    cost = {"a": [5, 1, 1, 1], "b": [5, 2, 2, 9], "c": [5, 3, 3, 3]}   # seconds, per call of each

    def fn(name):
        def run():
            order.append(name)
            clock[0] += cost[name][sum(o == name for o in order) - 1]
        return run

    monkeypatch.setattr("tf_commlib.timing.time.perf_counter", lambda: clock[0])
    timer = OneRank()
    result = timer.interleaved({n: fn(n) for n in "abc"}, repeats=3, warmup=1)
    assert order == list("abc" "bca" "cab" "abc")
    assert timer.barriers == 12
    assert result == {"a": 1.0, "b": 2.0, "c": 3.0}   # warm-up (5 s) dropped; b's one slow run (9 s) is not the median
