"""The real data set of the main job: sklearn's 8x8 digits (1797 images, shipped with sklearn),
upscaled to 16x16, split 80/20 with a fixed seed, the training part sharded over the ranks."""
import numpy as np
import tensorflow as tf


def load(rank=0, size=1, seed=0):
    """Returns (x_train shard, y_train shard), (x_test, y_test) as float32 NHWC in [0, 1] / int32."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]
    x = tf.image.resize(x, (16, 16), method="bilinear").numpy()
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_test = len(y) // 5
    x_test, y_test, x_train, y_train = x[:n_test], y[:n_test], x[n_test:], y[n_test:]
    per = len(y_train) // size  # equal shards: every rank runs the same number of steps
    shard = slice(rank * per, (rank + 1) * per)
    return (x_train[shard], y_train[shard]), (x_test, y_test)


def small_cnn(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((16, 16, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
