"""What DistributedOptimizer(algorithm="auto") measures and decides by, apart from Keras (tf_commlib.keras
imports this package, never the reverse):

* measure: the link's calibration (cached per cluster) and each candidate's aggregation timed on it;
* decide: TimeToAccuracy, the choice from those measurements, pure Python (no TensorFlow, no Horovod);
* rounds: the DiLoCo rounds as a candidate (local steps inside the nodes, a sync across them every H),
  and interval, the H that a measured step, exchange and sync give.

tf_commlib.keras.auto_epoch (AutoEpochs) turns an optimizer's buckets and measured epochs into the
inputs of the decision.
"""
