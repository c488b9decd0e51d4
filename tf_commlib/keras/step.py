"""One step's aggregation in a DistributedOptimizer: DGC's local clipping and momentum
correction, each variable group through its aggregator's collectives (or, in an epoch of auto's
"diloco", every variable averaged inside the node: tf_commlib.auto.rounds), and the commit that writes
what the step changed (DGC momentum, the residuals, momentum masking, auto's sums) only once every
rank's step is known to be applied."""
import math

import keras
import tensorflow as tf

from tf_commlib import internals, ops
from tf_commlib.collectives.interface import plain_python
from tf_commlib.overlap import after_all
from tf_commlib.topology import topology as current_topology


def _zero_at(variable, flat_indices):
    """DGC's momentum factor masking: the variable set to 0 at these flat indices, in place."""
    ops.zero_at(variable.value if isinstance(variable, keras.Variable) else variable, flat_indices)


@plain_python
def aggregate(opt, grads):
    """(update, commit) of DistributedOptimizer.aggregate for `opt` (built) and its gradients."""
    if not tf.executing_eagerly() and internals.in_xla_context():
        raise ValueError("DistributedOptimizer cannot run in a step compiled with XLA (jit_compile=True; "
                         "Keras' default jit_compile='auto' is XLA on a GPU): Horovod's and tf_commlib's ops "
                         "have no XLA kernels; compile the model with jit_compile=False")
    grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
    if opt.timeline is not None:
        grads = [opt.timeline.stamp(("gradient", i), g) for i, g in enumerate(grads)]
    if not opt.overlap:   # every group and bucket waits for the whole of backprop
        grads = after_all(grads)
    dgc, masking = opt.dgc, opt.dgc.momentum_correction and opt.dgc.momentum_masking
    if dgc.local_clip_norm:
        present = [g for g in grads if g is not None]
        clipped, _ = tf.clip_by_global_norm(
            present, dgc.local_clip_norm / math.sqrt(current_topology().size))
        it = iter(clipped)
        grads = [None if g is None else next(it) for g in grads]
    send, velocities = list(grads), {}
    if dgc.momentum_correction:
        for i, g in enumerate(grads):
            if g is not None:
                velocities[i] = opt.m * tf.convert_to_tensor(opt.velocities[i]) + g
                send[i] = opt.m * velocities[i] + g if opt.nesterov else velocities[i]
    local = opt.auto_epochs.local if opt.auto_epochs is not None else None
    if local is not None:
        local.traced = local.running
    if local is not None and local.running:   # auto's "diloco": the node's mean, no collective between nodes

        def commit():
            for i, u in velocities.items():
                opt.velocities[i].assign(u)
        return local.average(send), commit
    if opt._sharded is not None:   # update: this rank's slice of every bucket
        update, reduced, sent = opt._sharded.reduce_scatter(send)

        def commit():
            for i, u in velocities.items():
                opt.velocities[i].assign(u)
            reduced()
            if masking:
                for i, where in sent.items():
                    _zero_at(opt.velocities[i], where)
        return update, commit
    update, commits, masked = list(send), [], []
    for group in opt._groups:
        aggregated, sent, commit = group.aggregator.aggregate_deferred(
            [send[i] for i in group.indices], step=opt.iterations, sent="indices")
        commits.append(commit)
        for i, g, where in zip(group.indices, aggregated, sent):
            update[i] = g
            if group.lossy and where is not None and masking:
                masked.append((i, where))

    def commit():
        for i, u in velocities.items():
            opt.velocities[i].assign(u)
        for c in commits:
            c()
        for i, where in masked:
            _zero_at(opt.velocities[i], where)
        if opt.auto_epochs is not None:
            opt.auto_epochs.accumulate(send)

    return update, commit
