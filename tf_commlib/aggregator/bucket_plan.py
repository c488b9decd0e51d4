"""A GradientAggregator's buckets: the fusion plan of its gradient list (tf_commlib.fusion.plan),
fixed at the first call, and the one walk over a step's buckets that every aggregation runs."""
import tensorflow as tf

from tf_commlib import fusion, overlap


class BucketPlan:
    """Gradients fused into flat buckets per dtype of at most ``threshold_bytes``, packed in
    backprop order (bucket 0 holds the last layers). ``buckets`` is None until ``build``.
    ``timeline`` (a tf_commlib.overlap.Timeline or None) records when bucket i's aggregation
    starts, under the key ("bucket", ``timeline_tag``, i)."""

    def __init__(self, threshold_bytes, timeline=None, timeline_tag=0):
        self.threshold_bytes = int(threshold_bytes)
        self.timeline, self.timeline_tag = timeline, timeline_tag
        self.buckets = None
        self.shapes = None   # the (shape, dtype) list the plan was built for (None for absent gradients)

    def build(self, shapes_dtypes):
        """Plans the buckets for gradients of these (shape, dtype) (None for absent ones); True the
        first time, False (nothing done) once planned."""
        if self.buckets is not None:
            return False
        self.shapes = list(shapes_dtypes)
        specs = [None if s is None else tf.TensorSpec(s[0], s[1]) for s in self.shapes]
        self.buckets = fusion.plan(specs, self.threshold_bytes)
        return True

    def check_unchanged(self, grads):
        """ValueError unless grads fuse into the planned buckets."""
        if fusion.plan(grads, self.threshold_bytes) != self.buckets:
            raise ValueError("the gradient list changed shape since the first call; "
                             "create a new GradientAggregator for a new model")

    def walk(self, grads, finished):
        """Yields (i, bucket, flat gradients of the bucket) for every bucket in order. Inside
        tf.function, the ops the caller adds for a bucket before asking for the next one are taken
        out of the program-order chain of stateful ops (tf_commlib.overlap.run_independently), so a
        bucket's aggregation depends only on its own gradients and on the bucket before it: the
        caller appends each bucket's results (a tensor or a list of them) to ``finished``, and
        bucket i + 1 starts once bucket i's exist (overlap.after: one bucket's collectives in flight)."""
        for i, bucket in enumerate(self.buckets):
            since = overlap.op_count()
            flat = overlap.after(fusion.flatten(grads, bucket), finished[-1] if finished else None)
            if self.timeline is not None:
                flat = self.timeline.stamp(("bucket", self.timeline_tag, i), flat)
            yield i, bucket, flat
            overlap.run_independently(since)
