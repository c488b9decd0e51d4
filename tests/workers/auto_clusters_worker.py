"""auto's choices on GPU clusters that cannot run here (tests/test_auto_clusters.py), in a process of its own:
a BERT-large-sized optimizer's state is about 9 GB, freed when the process ends. argv[1]: the JSON file
to write, {"model gbit": {"choices": [one per epoch], "decisions": [their seconds per step of progress]}}."""
import json
import sys
from unittest import mock

import keras
import numpy as np
import tensorflow as tf

from tests.test_auto_clusters import ALPHA_INTER, BERT_LARGE_STEP_S, INTRA, M, N, RESNET50_STEP_S, TABLE
from tf_commlib import alphabeta, diloco_sync, replicas
from tf_commlib.keras import Auto, DistributedOptimizer, auto_epoch, optimizer
from tf_commlib.topology import Topology


def bert_large_shapes(layers=24, hidden=1024, vocab=30522, positions=512):
    block = [(hidden, hidden)] * 4 + [(hidden, 4 * hidden), (4 * hidden, hidden), (hidden,), (hidden,), (4 * hidden,),
                                      (hidden,)]
    return [(vocab, hidden), (positions, hidden)] + block * layers


def choices(shapes, step_s, gbit, epochs=4):
    link = alphabeta.LinkParams(alpha_inter=ALPHA_INTER[gbit], beta_inter=8 / (gbit * 1e9), **INTRA)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                               auto=Auto(cost_params=link, compute_s=step_s, probe=False))
    opt.set_fit_epochs(90)
    opt.build([keras.Variable(np.zeros(s, np.float32)) for s in shapes])
    out = [opt.algorithm_at(0)]
    for epoch in range(1, epochs):   # DGC's warm-up epochs, then the target density
        opt.set_epoch(epoch)
        out.append(opt.algorithm_at(epoch))
    return {"choices": out, "decisions": [d["predicted_s"] for d in opt.auto_log if "choice" in d]}


def main(path):
    topo = Topology(m=M, n=N, rank=0, node=0, local=0, intra_ranks=tuple(range(N)),
                    inter_ranks=tuple(range(0, M * N, N)))
    for module in (optimizer, auto_epoch, diloco_sync):
        module.current_topology = lambda: topo   # one process seen as rank 0 of 4 nodes of 8 GPUs
    replicas.gathered = lambda rows, name: np.repeat(rows, M * N, axis=0)
    models = {"resnet50": ([tuple(v.shape) for v in keras.applications.ResNet50(weights=None).trainable_variables],
                           RESNET50_STEP_S),
              "bert_large": (bert_large_shapes(), BERT_LARGE_STEP_S)}
    real = tf.config.list_physical_devices
    out = {}
    with mock.patch.object(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"] if kind == "GPU" else real(kind)):
        for model, gbit, _ in TABLE:
            out[f"{model} {gbit}"] = choices(*models[model], gbit)
            keras.backend.clear_session()
    with open(path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
