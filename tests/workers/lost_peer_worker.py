"""A rank of an elastic job that runs nothing but Horovod's allreduce over the global set: no process set
and no tf_commlib (tests/test_elastic.py). With Horovod's response cache off (HOROVOD_CACHE_CAPACITY=0)
every cycle of Horovod's background loop is a gather to rank 0 and a broadcast from it. When the ranks of
the host without rank 0 die, the other rank on rank 0's host (rank 1) waits on rank 0's broadcast before
anything it sends or receives in that cycle touches a dead rank, and learns of the loss only when rank 0's
connections close. Only the step's own allreduce (a ring through the dead ranks) would show rank 1 the
loss itself; a step every STEP_S seconds keeps that a small part of the time.

Each process appends to $HVD_TEST_OUT/events.jsonl: its start (rank, Horovod host name), its first step
at each world size, and each reset (the world size Horovod started again with). It steps until it has
run STEPS_AFTER_RESET steps after a reset (or for MAX_S seconds), then reports its rank and world size."""
import os
import time

from tests.workers.elastic_worker import event

STEPS_AFTER_RESET, MAX_S, STEP_S = 20, 300, 0.05


def main():
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from horovod.common.elastic import State
    from horovod.tensorflow.elastic import run

    from tests.workers._report import report

    class Resets(State):
        """No values to carry (nothing sent but the resets' count, kept per rank)."""

        def __init__(self):
            super().__init__(bcast_object=None, get_rank=hvd.rank)   # no commit: no host update to send
            self.resets = 0

        def save(self):
            pass

        def restore(self):
            pass

        def sync(self):
            pass

        def reset(self):
            self.resets += 1
            event(kind="reset", rank=hvd.rank(), size=hvd.size())

    hvd.init()
    event(kind="start", rank=hvd.rank(), host=os.environ.get("HOROVOD_HOSTNAME"))
    start = time.monotonic()

    @run
    def train(state):
        event(kind="step", rank=hvd.rank(), size=hvd.size())
        steps = 0
        while time.monotonic() - start < MAX_S and not (state.resets and steps >= STEPS_AFTER_RESET):
            total = hvd.allreduce(tf.ones([1]), op=hvd.Sum, name="lost_peer_step")
            assert float(total.numpy()[0]) == hvd.size(), total
            steps += 1
            time.sleep(STEP_S)
        return hvd.rank(), hvd.size()

    rank, size = train(Resets())
    report(rank, {"rank": rank, "size": size})


if __name__ == "__main__":
    main()
