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


def small_resnet(seed=0):
    """The DAWNBench script's small residual network (three residual blocks, batch norm) on the 16x16
    grey digits."""
    from tfc_apps.dawnbench import models

    return models.build("small", 10, seed, channels=1)


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


def write_image_folder(root, size=32, seed=0, val_fraction=0.2):
    """Writes the digits as an ImageNet-layout JPEG folder, root/{train,val}/<digit>/<i>.jpg (RGB,
    upscaled to size x size), for the DataCache and DAWNBench tests and demos. Returns root."""
    import os

    from sklearn.datasets import load_digits

    data = load_digits()
    x = tf.image.resize((data.images / 16.0 * 255.0)[..., None], (size, size), method="bilinear")
    x = tf.cast(tf.clip_by_value(tf.round(tf.image.grayscale_to_rgb(x)), 0, 255), tf.uint8).numpy()
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = int(len(x) * val_fraction)
    for split, part in (("val", order[:n_val]), ("train", order[n_val:])):
        for i in part:
            folder = os.path.join(root, split, str(int(data.target[i])))
            os.makedirs(folder, exist_ok=True)
            tf.io.write_file(os.path.join(folder, f"{i:04d}.jpg"), tf.io.encode_jpeg(x[i], quality=95))
    return root
