"""A ready-made preprocess: decode a JPEG/PNG file and resize it to size x size, as uint8.

Its ``config()`` names it in the cache key, so ``DecodeResize(96)`` and ``DecodeResize(128)`` (the
DAWNBench stages) never read each other's entries. Scale to float and augment after the cache.
"""
import tensorflow as tf


class DecodeResize:
    def __init__(self, size, channels=3, method="bilinear"):
        h, w = (size, size) if isinstance(size, int) else size
        if int(h) < 1 or int(w) < 1:
            raise ValueError(f"size must be positive, got {size!r}")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels!r}")
        self.size, self.channels, self.method = (int(h), int(w)), channels, method

    def config(self):
        return {"size": list(self.size), "channels": self.channels, "method": self.method}

    def __call__(self, data):
        image = tf.io.decode_image(data, channels=self.channels, expand_animations=False)
        image = tf.image.resize(image, self.size, method=self.method)
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
