"""The learning rate of the DAWNBench script: linear warm-up over the first epochs, then linear
decay to 0 at the last epoch, in epochs (the steps per epoch change with the stage's batch)."""
import keras
import numpy as np
import tensorflow as tf

PEAK_PER_256 = {"sgd": 0.1, "lars": 0.9, "lamb": 0.004}   # scaled by global batch / 256


@keras.saving.register_keras_serializable(package="tf_commlib")
class StagedLinear(keras.optimizers.schedules.LearningRateSchedule):
    """stage_steps[i] steps per epoch for stage_epochs[i] epochs, one stage after the other."""

    def __init__(self, peak, warmup_epochs, stage_epochs, stage_steps):
        self.peak, self.warmup_epochs = float(peak), float(warmup_epochs)
        self.stage_epochs, self.stage_steps = list(stage_epochs), list(stage_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float64)
        epochs = np.asarray(self.stage_epochs, np.float64)
        steps = np.asarray(self.stage_steps, np.float64)
        starts = np.concatenate([[0.0], np.cumsum(epochs * steps)[:-1]])
        first = np.concatenate([[0.0], np.cumsum(epochs)[:-1]])
        stage = tf.reduce_sum(tf.cast(step >= starts[1:], tf.int32))
        epoch = tf.gather(first, stage) + (step - tf.gather(starts, stage)) / tf.gather(steps, stage)
        total = float(epochs.sum())
        warm = min(self.warmup_epochs, total)
        up = epoch / warm if warm > 0 else tf.constant(1.0, tf.float64)
        down = (total - epoch) / max(total - warm, 1e-9)
        lr = self.peak * tf.clip_by_value(tf.minimum(up, down), 0.0, 1.0)
        return tf.cast(lr, tf.float32)

    def get_config(self):
        return {"peak": self.peak, "warmup_epochs": self.warmup_epochs,
                "stage_epochs": self.stage_epochs, "stage_steps": self.stage_steps}
