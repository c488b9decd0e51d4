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
        self.origin = None

    def resume(self, epoch, step, epochs_per_step):
        """From the optimizer's step ``step`` on, the run is at ``epoch`` (a float) and each step adds
        ``epochs_per_step``: --elastic, where a reset changes the steps an epoch takes. Kept in a
        variable, so that a step function traced before reads the new origin."""
        value = [float(epoch), float(step), float(epochs_per_step)]
        if self.origin is None:
            self.origin = tf.Variable(value, dtype=tf.float64, trainable=False, name="lr_origin")
        else:
            self.origin.assign(value)

    def __call__(self, step):
        step = tf.cast(step, tf.float64)
        epochs = np.asarray(self.stage_epochs, np.float64)
        total = float(epochs.sum())
        if self.origin is not None:
            epoch = self.origin[0] + (step - self.origin[1]) * self.origin[2]
        else:
            steps = np.asarray(self.stage_steps, np.float64)
            starts = np.concatenate([[0.0], np.cumsum(epochs * steps)[:-1]])
            first = np.concatenate([[0.0], np.cumsum(epochs)[:-1]])
            stage = tf.reduce_sum(tf.cast(step >= starts[1:], tf.int32))
            epoch = tf.gather(first, stage) + (step - tf.gather(starts, stage)) / tf.gather(steps, stage)
        warm = min(self.warmup_epochs, total)
        up = epoch / warm if warm > 0 else tf.constant(1.0, tf.float64)
        down = (total - epoch) / max(total - warm, 1e-9)
        lr = self.peak * tf.clip_by_value(tf.minimum(up, down), 0.0, 1.0)
        return tf.cast(lr, tf.float32)

    def get_config(self):
        return {"peak": self.peak, "warmup_epochs": self.warmup_epochs,
                "stage_epochs": self.stage_epochs, "stage_steps": self.stage_steps}
