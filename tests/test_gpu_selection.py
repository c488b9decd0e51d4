"""One GPU per rank and the intra-node link per tensor: the selection logic, checked on a CPU machine
(no GPU is lent to this project's tests; docs/cluster.md says what has run on a GPU)."""
import importlib
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_commlib import primitives

topology = importlib.import_module("tf_commlib.topology")   # (tf_commlib.topology is also the function)

GPU = "/job:localhost/replica:0/task:0/device:GPU:1"


def fake(device, dtype=tf.float32, rank=1):
    return types.SimpleNamespace(device=device, dtype=dtype, shape=tf.TensorShape([8] * rank))


def test_one_gpu_per_local_rank():
    assert topology.gpu_for_rank(0, 2, 0) is None   # no GPU: nothing to pin
    assert [topology.gpu_for_rank(r, 4, 8) for r in range(4)] == [0, 1, 2, 3]
    assert [topology.gpu_for_rank(r, 4, 1) for r in range(4)] == [0] * 4   # one GPU visible per rank
    with pytest.raises(ValueError, match="pin_gpu: 4 ranks on this machine but 2 GPUs visible"):
        topology.gpu_for_rank(3, 4, 2)
    assert topology.pin_gpu(0, 1) is None and tf.config.list_physical_devices("GPU") == []
    with pytest.raises(ValueError, match="pin_gpu must be True or False"):
        topology.init(pin_gpu="yes")


@pytest.fixture
def shared_machine(monkeypatch):
    monkeypatch.setattr(primitives.shm, "available", lambda process_set: True)
    monkeypatch.delenv(primitives.INTRA_LINK_VAR, raising=False)


def test_host_tensors_take_shared_memory_and_gpu_tensors_horovod(shared_machine, monkeypatch):
    host = tf.constant(np.ones(8, np.float32))
    assert not primitives.on_gpu(host) and primitives.on_gpu(fake(GPU))
    assert primitives.intra_link(host, None) == "shm" and primitives.intra_link(fake(GPU), None) == "horovod"
    # a graph tensor not placed yet: a GPU where TensorFlow has one and Horovod reduces on it (NCCL)
    monkeypatch.setattr(primitives.hvd, "nccl_built", lambda: True)
    monkeypatch.setattr(primitives.tf.config, "list_logical_devices", lambda kind=None: ["GPU:0"])
    assert primitives.on_gpu(fake("")) and primitives.intra_link(fake(""), None) == "horovod"
    assert primitives._reducescatter_mode(fake(GPU), None) == "native"
    assert primitives._reducescatter_mode(host, None) == "shm"
    monkeypatch.setattr(primitives.hvd, "nccl_built", lambda: False)
    assert not primitives.on_gpu(fake("")) and primitives.intra_link(fake(""), None) == "shm"
    assert primitives._reducescatter_mode(fake(GPU), None) == "alltoall"   # no NCCL: not Gloo's own


def test_the_intra_link_can_be_overridden(shared_machine, monkeypatch):
    host = tf.constant(np.ones(8, np.float32))
    monkeypatch.setenv(primitives.INTRA_LINK_VAR, "horovod")
    assert primitives.intra_link(host, None) == "horovod"
    monkeypatch.setenv(primitives.INTRA_LINK_VAR, "shm")
    assert primitives.intra_link(fake(GPU), None) == "shm"
    monkeypatch.setattr(primitives.shm, "available", lambda process_set: False)   # ranks on other machines
    assert primitives.intra_link(host, None) == "horovod"
    monkeypatch.setenv(primitives.INTRA_LINK_VAR, "nccl")
    with pytest.raises(ValueError, match="TF_COMMLIB_INTRA_LINK must be auto, shm or horovod"):
        primitives.intra_link(host, None)


def test_xla_is_refused_before_the_first_step():
    import tf_commlib
    from tf_commlib.keras import DistributedOptimizer, default_callbacks

    tf_commlib.init()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="dense"), "mse", jit_compile=True)
    assert model.jit_compile is True
    with pytest.raises(ValueError, match="jit_compile=True.*no XLA kernels; compile with jit_compile=False"):
        model.fit(np.ones((8, 4), np.float32), np.ones((8, 2), np.float32), verbose=0, callbacks=default_callbacks())


def test_a_step_compiled_with_xla_raises_a_clear_error():
    """Without default_callbacks (a custom loop): the optimizer itself refuses to be traced into XLA."""
    import tf_commlib
    from tf_commlib.keras import DistributedOptimizer

    tf_commlib.init()
    var = keras.Variable(np.ones(4, np.float32))
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm="dense")
    opt.build([var])
    with pytest.raises(ValueError, match="compiled with XLA.*compile the model with jit_compile=False"):
        tf.function(lambda: opt.apply([tf.ones(4)], [var]), jit_compile=True)()
    tf.function(lambda: opt.apply([tf.ones(4)], [var]))()   # without XLA it steps
    np.testing.assert_allclose(var.numpy(), 0.9)
