"""DataCache against a real redis-server: exact epochs, bit-equal values, the local level, resolutions
and augmentation, sources (ImageFolderSource, TFDS, any object with the Source protocol), bad arguments."""
import os

import numpy as np
import pytest
import tensorflow as tf

import datacache
from datacache import DataCache, DecodeResize, ImageFolderSource, cached_dataset
from tests.datacache_data import Reference, keys_of, write_folder


def test_epochs_exact_bit_equal_and_level1(source, ref16, tmp_path):
    n = len(source)
    local = str(tmp_path / "local")
    with DataCache(local_dir=local, progress=False, read_batch=8) as cache:
        ds = cached_dataset(source, DecodeResize(16), cache, seed=3)
        x_spec, y_spec = ds.element_spec   # static shapes: what a Keras model needs
        assert x_spec.shape == (16, 16, 3) and y_spec.shape == () and y_spec.dtype == tf.int32
        epochs = [ref16.epoch(ds) for _ in range(3)]
        for e in epochs:
            assert sorted(e) == list(range(n))
        assert epochs[0] != epochs[1] != epochs[2]   # reshuffled every epoch
        assert ref16.epoch(cached_dataset(source, DecodeResize(16), cache, seed=3)) == epochs[0]  # seeded
        s = cache.stats()
        first, second, third = s["epochs"][:3]
        assert (first["misses"], first["hits"], second["hits"], third["hits"]) == (n, 0, n, n)
        assert first["source_bytes"] == int(source.sizes.sum()) - int(source.sizes[0])  # the probe copied #0
        assert second["source_bytes"] == third["source_bytes"] == 0
        assert s["redis_keys"] == n and s["redis_bytes"] > 0 and s["fallbacks"] == 0
        # Shards cover the data set exactly once, each the shard_indices sample of the data set.
        shards = [ref16.epoch(cached_dataset(source, DecodeResize(16), cache, shard=(i, 3))) for i in range(3)]
        assert sorted(sum(shards, [])) == list(range(n))
        assert [sorted(s) for s in shards] == [datacache.shard_indices(n, i, 3, 0, source.labels).tolist() for i in range(3)]
    # A second run (new cache, no Redis): level 1 serves every file, 0 bytes from the source.
    with DataCache(redis_url=False, local_dir=local, progress=False) as cache:
        assert sorted(ref16.epoch(cached_dataset(source, DecodeResize(16), cache))) == list(range(n))
        first = cache.stats()["epochs"][0]
        assert first["source_bytes"] == 0 and first["local_bytes"] == int(source.sizes.sum())


def test_resolutions_do_not_collide_and_augment_is_random(source, ref16):
    n = len(source)
    ref24 = Reference(source, DecodeResize(24))

    def scaled(data, scale=1.0):   # same shape and dtype: only the preprocess key tells them apart
        return tf.cast(DecodeResize(16)(data), tf.float32) * scale

    with DataCache(progress=False) as cache:
        for ref, prep in ((ref16, DecodeResize(16)), (ref24, DecodeResize(24))):
            for _ in range(2):
                assert sorted(ref.epoch(cached_dataset(source, prep, cache))) == list(range(n))
        a = cached_dataset(source, lambda d: scaled(d, 1.0), cache, shuffle=False)
        b = cached_dataset(source, lambda d: scaled(d, 2.0), cache, shuffle=False)
        for _ in range(2):
            xa = np.concatenate([x.numpy() for x, _ in a.batch(64)])
            xb = np.concatenate([x.numpy() for x, _ in b.batch(64)])
            np.testing.assert_array_equal(xb, 2 * xa)
        np.testing.assert_array_equal(xa, np.stack(ref16.values).astype(np.float32))
        prefixes = {k.rsplit(b":", 1)[0] for k in keys_of(cache.redis)}
        assert len(prefixes) == 4 and cache.stats()["redis_keys"] == 4 * n
        hits = {}
        for e in cache.stats()["epochs"]:
            hits.setdefault(e["dataset"], []).append(e["hits"])
        assert list(hits.values()) == [[0, n]] * 4   # no dataset read another's entries

        def noise(x):
            return tf.cast(x, tf.float32) + tf.random.uniform(tf.shape(x), 0, 0.5)
        aug = cached_dataset(source, DecodeResize(16), cache, shuffle=False, augment=noise)
        e1, e2 = (np.concatenate([x.numpy() for x, _ in aug.batch(64)]) for _ in range(2))
        assert e1.shape == (n, 16, 16, 3) and not np.array_equal(e1, e2)
        base = np.stack(ref16.values).astype(np.float32)
        np.testing.assert_array_equal(np.floor(e1), base)   # noise on top of the cached value
        np.testing.assert_array_equal(np.floor(e2), base)


def test_bad_arguments(tmp_path, source):
    with pytest.raises(ValueError, match="root"):
        ImageFolderSource(tmp_path / "missing")
    (tmp_path / "empty" / "class_a").mkdir(parents=True)
    with pytest.raises(ValueError, match="root .* holds no images"):
        ImageFolderSource(tmp_path / "empty")
    bmp = tmp_path / "bmp" / "class_a"
    bmp.mkdir(parents=True)
    (bmp / "a.bmp").write_bytes(b"BM")
    with pytest.raises(ValueError, match="unsupported image format .*a.bmp"):
        ImageFolderSource(tmp_path / "bmp")
    fake = tmp_path / "fake" / "class_a"
    fake.mkdir(parents=True)
    (fake / "a.jpg").write_bytes(b"GIF89a not really")
    with pytest.raises(ValueError, match="not a JPEG or PNG"):
        cached_dataset(ImageFolderSource(tmp_path / "fake"), DecodeResize(8), DataCache(redis_url=False))
    for shard in [(3, 3), (0, 10_000), "0/2", (-1, 2)]:
        with pytest.raises(ValueError, match="shard"):
            cached_dataset(source, DecodeResize(8), False, shard=shard)
    with pytest.raises(TypeError, match="preprocess"):
        cached_dataset(source, "resize", False)
    with pytest.raises(TypeError, match="cache"):
        cached_dataset(source, DecodeResize(8), "redis://")
    with pytest.raises(ValueError, match="maxmemory"):
        DataCache(maxmemory="lots")
    with pytest.raises(ValueError, match="eviction"):
        DataCache(eviction="sometimes")
    with pytest.raises(ValueError, match="redis_url"):
        DataCache(redis_url="http://localhost")
    # Varying shapes: decode without resize over images of two sizes.
    mixed = write_folder(str(tmp_path / "mixed"), n_classes=1, per_class=4)
    write_folder(str(tmp_path / "mixed2"), n_classes=1, per_class=4, size=40)
    os.rename(tmp_path / "mixed2" / "class_0", tmp_path / "mixed" / "class_1")
    with DataCache(redis_url=False) as cache:
        ds = cached_dataset(mixed, lambda d: tf.io.decode_image(d, 3, expand_animations=False), cache,
                            shuffle=False)
        with pytest.raises(tf.errors.OpError, match="preprocess returned shape"):
            list(ds)


def test_tfds_image_folder(tmp_path):
    import tensorflow_datasets as tfds

    write_folder(str(tmp_path / "train"), n_classes=3, per_class=4)
    write_folder(str(tmp_path / "test"), n_classes=2, per_class=2)
    builder = tfds.folder_dataset.ImageFolder(str(tmp_path))
    want = {os.path.basename(ex["image/filename"].numpy().decode()): int(ex["label"])
            for ex in builder.as_dataset(split="train", decoders={"image": tfds.decode.SkipDecoding()})}
    src = datacache.TfdsSource(builder, "train")
    ref = Reference(src, DecodeResize(16))
    assert {os.path.basename(f): int(lab) for f, lab in zip(src.files, src.labels)} == want
    with DataCache(progress=False) as cache:
        ds = cached_dataset(builder, DecodeResize(16), cache)   # the builder itself is a source
        assert sorted(ref.epoch(ds)) == list(range(12)) == sorted(ref.epoch(ds))
        assert cache.stats()["epochs"][1]["hits"] == 12
    with pytest.raises(ValueError, match="split"):
        datacache.TfdsSource(builder, "validation")


class ListSource:
    """A source of our own, not derived from ImageFolderSource: files listed in reverse order of
    the folder's, with the folder's labels (the datacache.Source protocol, nothing else)."""

    def __init__(self, folder_source):
        order = list(range(len(folder_source)))[::-1]
        self.root, self.class_names = folder_source.root, folder_source.class_names
        self.files = [folder_source.files[i] for i in order]
        self.labels, self.sizes, self.mtimes = (a[order] for a in (folder_source.labels, folder_source.sizes,
                                                                      folder_source.mtimes))
        self.order = order

    def __len__(self):
        return len(self.files)

    def path(self, i):
        return os.path.join(self.root, self.files[i])

    def fingerprint(self):
        return "list-source-" + ",".join(self.files)

    def check(self, i, data):
        if not data.startswith((b"\xff\xd8\xff", b"\x89PNG")):
            raise ValueError("not a JPEG or PNG")


def test_any_object_with_the_source_protocol_is_a_source(source, ref16, tmp_path):
    mine = ListSource(source)
    assert isinstance(mine, datacache.Source) and not isinstance(mine, ImageFolderSource)
    with DataCache(redis_url=False, local_dir=str(tmp_path / "local"), progress=False) as cache:
        got = ref16.epoch(cached_dataset(mine, DecodeResize(16), cache, shuffle=False, shard_seed=None))
    assert got == mine.order   # sample i of ListSource is file order[i] of the folder, bit for bit

    class NoFingerprint(ListSource):
        fingerprint = None

    broken = ListSource(source)
    del broken.mtimes
    for bad, lacks in ((broken, "mtimes"), (NoFingerprint(source), "fingerprint")):
        with pytest.raises(TypeError, match=f"source: .* lacks {lacks} of the datacache.sources.Source protocol"):
            cached_dataset(bad, DecodeResize(16), None)
