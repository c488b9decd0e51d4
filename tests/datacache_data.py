"""The images, the uncached reference and the Redis key listing of the DataCache tests (its fixtures
are in conftest.py)."""
import hashlib
import os

import numpy as np
import tensorflow as tf

N_CLASSES, PER_CLASS = 3, 14   # 42 images, half JPEG and half PNG


def write_folder(root, n_classes=N_CLASSES, per_class=PER_CLASS, size=32, extra=None):
    """sklearn digits upscaled to size x size RGB, each made unique by a corner block."""
    from sklearn.datasets import load_digits

    images = load_digits().images
    for c in range(n_classes):
        os.makedirs(os.path.join(root, f"class_{c}"), exist_ok=True)
        for j in range(per_class):
            k = c * per_class + j
            x = tf.image.resize(tf.constant(images[k][..., None] * 15.0), (size, size))
            x = tf.tile(tf.cast(tf.clip_by_value(x, 0, 255), tf.uint8), [1, 1, 3]).numpy()
            x[:4, :4, :] = 3 * k
            data = tf.io.encode_jpeg(x, quality=95) if k % 2 else tf.io.encode_png(x)
            tf.io.write_file(os.path.join(root, f"class_{c}", f"img{k:03d}.{'jpg' if k % 2 else 'png'}"), data)
    return root


def digest(array):
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()


def keys_of(client):
    return sorted(client.scan_iter(match=b"dc:*"))


class Reference:
    """The uncached pipeline, sample by sample: index of every value, by its bytes."""

    def __init__(self, source, preprocess):
        self.values = [preprocess(tf.io.read_file(source.path(i))).numpy() for i in range(len(source))]
        self.index = {digest(v): i for i, v in enumerate(self.values)}
        assert len(self.index) == len(source), "test images must be distinct"
        self.labels = source.labels

    def epoch(self, ds):
        """The sample indices of one epoch, in order; every value bit-equal to its reference."""
        out = []
        for xs, ys in ds.batch(16):
            for x, y in zip(xs.numpy(), ys.numpy()):
                i = self.index[digest(x)]   # a KeyError is a wrong value
                assert y == self.labels[i]
                out.append(i)
        return out
