"""Shared by the checkpoint workers: the small model they train, and how."""
import keras
import numpy as np

from tfc_apps import digits
from tf_commlib.keras import Selection, DistributedOptimizer, default_callbacks


def build(**optimizer_kwargs):
    model = digits.small_cnn(seed=1)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="hitopk",
                               density=0.05, **optimizer_kwargs, selection=Selection(seed=5))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model


def fit(model, x, y, epochs, initial_epoch=0, extra=()):
    model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, callbacks=default_callbacks() + list(extra))


def weights(model):
    return np.concatenate([w.numpy().ravel() for w in model.weights]).tolist()


class Interrupt(keras.callbacks.Callback):
    """Raises RuntimeError("interrupted") at the end of epoch `stop` - 1."""

    def __init__(self, stop):
        super().__init__()
        self.stop = stop

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.stop - 1:
            raise RuntimeError("interrupted")
