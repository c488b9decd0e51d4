"""DataCache (Shi et al., MLSys'21, §4.1): a two-level cache of pre-processed samples for tf.data.

Level 1 copies the source files to a local directory on first read; level 2 keeps the
*pre-processed* samples in Redis (one server per node, the data set split across nodes), so that
from the second epoch, and in later runs, the input pipeline skips reading and decoding::

    import datacache
    cache = datacache.DataCache(local_dir="/local/ssd/cache")          # embedded Redis per node
    ds = datacache.cached_dataset(datacache.ImageFolderSource("/nfs/imagenet/train"),
                                  preprocess, cache, augment=augment)
    model.fit(ds.batch(256).prefetch(tf.data.AUTOTUNE), epochs=...)
    print(cache.stats())
"""
from datacache.cache import DataCache
from datacache.codec import Codec
from datacache.fingerprint import preprocess_fingerprint
from datacache.server import RedisServer
from datacache.sources import FlatFolderSource, ImageFolderSource, Source, TfdsSource, read_labels

__all__ = ["DataCache", "Source", "ImageFolderSource", "FlatFolderSource", "TfdsSource", "read_labels",
           "cached_dataset", "shard_range", "shard_indices", "shard_of", "node_shards", "node_indices",
           "RedisServer", "Codec", "preprocess_fingerprint", "DecodeResize"]


def __getattr__(name):
    # Lazy: `import datacache` (the warm command's --help, setup.py) does not import TensorFlow.
    if name == "cached_dataset":
        from datacache import dataset
        return dataset.cached_dataset
    if name in ("shard_range", "shard_indices", "shard_of", "node_shards", "node_indices"):
        from datacache import shards
        return getattr(shards, name)
    if name == "DecodeResize":
        from datacache.preprocess import DecodeResize
        return DecodeResize
    raise AttributeError(f"module 'datacache' has no attribute {name!r}")
