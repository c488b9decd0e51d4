"""Input pipelines of the DAWNBench script: an ImageNet-layout folder through DataCache (the
deterministic decode + resize is cached, augmentation runs after it, anew every epoch), a tfds
builder with a manual download, or synthetic data. Every rank runs the same number of steps."""
import functools
import sys

import numpy as np
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
VAL_IN_MEMORY = 256 << 20   # a rank's share of the validation set (uint8) up to this is kept in memory


def without_autotune_thread(ds):
    """tf.data's autotuning runs a model thread per iterator whose timed wait (a period that grows
    to a minute) the iterator's destruction waits out: fit's teardown took 4-41 s at the end of some
    epochs here (epoch by epoch, a new iterator each). Parallelism and buffers then stay at their
    defaults (one call per core)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def normalize(x):
    return tf.cast(x, tf.float32) / 127.5 - 1.0


def augment(x, seed):
    """Random horizontal flip and a random crop of the image padded by 1/8 (uint8 in, float out),
    stateless: drawn from seed (shape [2]) alone, so any run that gives a sample the same seed (a
    resumed one too) augments it the same way."""
    size = tf.shape(x)[:2]
    pad = size[0] // 8
    flip, crop = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    x = tf.image.stateless_random_flip_left_right(x, flip)
    x = tf.pad(x, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
    x = tf.image.stateless_random_crop(x, tf.concat([size, tf.shape(x)[2:]], 0), crop)
    return normalize(x)


def flat_val(data, dest, labels_name="val_labels.txt"):
    """An ImageNet-style copy of the ImageNet-layout folder ``data``: DEST/train/ as it is and the
    images of val/CLASS/ in one flat folder DEST/val/, labelled by DEST/``labels_name`` (``NAME
    CLASS`` per line, the --val-labels format). For tests and demos (digits); image names must be
    unique across classes. Returns the labels file's path."""
    import os
    import shutil

    from datacache.sources import class_folders

    os.makedirs(os.path.join(dest, "val"))
    shutil.copytree(os.path.join(data, "train"), os.path.join(dest, "train"))
    lines = []
    for name in class_folders(os.path.join(data, "val")):
        for f in sorted(os.listdir(os.path.join(data, "val", name))):
            if os.path.exists(os.path.join(dest, "val", f)):
                raise ValueError(f"flat_val: {f!r} is in two classes of {data!r}/val")
            shutil.copy2(os.path.join(data, "val", name, f), os.path.join(dest, "val", f))
            lines.append(f"{f} {name}\n")
    labels = os.path.join(dest, labels_name)
    with open(labels, "w") as out:
        out.writelines(lines)
    return labels


class Data:
    """Datasets for one run (or several: nothing in it depends on the model)."""

    def __init__(self, args, topo):
        self.args, self.topo = args, topo
        self.cache = None
        self._preprocess, self._val = {}, {}   # by resolution: built once, not every epoch
        if args.synthetic:
            self.num_classes, self.train_size = args.num_classes, None
        elif args.data:
            import datacache

            self.train_src = datacache.ImageFolderSource(f"{args.data}/train")
            if getattr(args, "val_labels", None):   # ImageNet's flat validation folder and its labels
                self.val_src = datacache.FlatFolderSource(f"{args.data}/val", args.val_labels,
                                                          self.train_src.class_names, argument="--val-labels")
            else:
                self.val_src = datacache.ImageFolderSource(f"{args.data}/val",
                                                           class_names=self.train_src.class_names)
            self.num_classes, self.train_size = len(self.train_src.class_names), len(self.train_src)
            if not args.no_datacache:
                self.cache = datacache.DataCache(redis_url=args.redis_url, local_dir=args.cache_dir,
                                                progress=sys.stdout.isatty())
        else:
            import tensorflow_datasets as tfds

            self.builder = tfds.builder(args.tfds)
            self.builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(manual_dir=args.manual_dir))
            self.num_classes = self.builder.info.features["label"].num_classes
            self.train_size = self.builder.info.splits["train"].num_examples

    def steps(self, stage):
        """Steps per epoch: the smallest shard's full batches (the same on every rank)."""
        if self.train_size is None:
            return self.args.steps_per_epoch
        steps = self.train_size // self.topo.size // stage.batch
        if steps < 1:
            raise ValueError(f"--stages: batch {stage.batch} per rank is larger than a rank's share "
                             f"({self.train_size // self.topo.size} images) of the training set")
        return min(steps, self.args.steps_per_epoch or steps)

    def _onehot(self, x, y):
        return x, tf.one_hot(tf.reshape(tf.cast(y, tf.int32), []), self.num_classes)

    def train(self, stage, epoch, epochs=1):
        """Epochs epoch .. epoch + epochs - 1 of a stage as one data set of epochs * steps(stage)
        batches, for one model.fit over them (one iterator: no data set, iterator and pipeline
        start-up per epoch). Epoch k's order and augmentation follow from (--seed, k, rank) alone,
        so a run resumed at epoch k sees what an uninterrupted one sees there."""
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs!r}")
        res, steps = stage.resolution, self.steps(stage)
        per_epoch = steps * stage.batch
        if self.args.synthetic:
            ds = self._synthetic(res, per_epoch).repeat(epochs)
        elif self.args.data:
            import datacache

            ds = datacache.cached_dataset(
                self.train_src, self.preprocess(res), False if self.cache is None else self.cache,
                shard=(self.topo.rank, self.topo.size), shuffle=True, seed=self.args.seed,
                first_epoch=epoch + 1, global_shuffle=self.args.global_shuffle, shard_seed=self.args.seed,
                samples_per_epoch=per_epoch).repeat(epochs)
        else:
            ds = functools.reduce(lambda a, b: a.concatenate(b), [
                self._tfds("train", res, self.args.seed * 100003 + k).take(per_epoch)
                for k in range(epoch, epoch + epochs)])
        return self._batches(ds, stage, epoch, per_epoch)

    def _batches(self, ds, stage, epoch, per_epoch, part=None):
        """Augmented (not synthetic data), one-hot, batched; ``part``: another augmentation stream (the
        rest of an epoch, whose positions start again at 0)."""
        res = stage.resolution
        if not self.args.synthetic:
            # the sample's seed: (--seed, rank) -- another random stream per rank -- folded with its
            # epoch and its position in the epoch
            stream = tf.constant([self.args.seed, self.topo.rank], tf.int64)
            if part is not None:
                stream = tf.random.experimental.stateless_fold_in(stream, part)

            def augmented(p, xy):
                seed = tf.random.experimental.stateless_fold_in(stream, epoch + p // per_epoch)
                return augment(xy[0], tf.random.experimental.stateless_fold_in(seed, p % per_epoch)), xy[1]

            ds = ds.enumerate().map(augmented, AUTOTUNE)
        ds = ds.map(lambda x, y: self._onehot(tf.ensure_shape(x, [res, res, 3]), y), AUTOTUNE)
        ds = ds.batch(stage.batch, drop_remainder=True)
        return without_autotune_thread(ds.prefetch(AUTOTUNE))

    def steps_left(self, stage, done):
        """--elastic: this layout's steps for the rest of an epoch of which earlier layouts read the
        ``done`` parts ((ranks, samples each) pairs, the first the epoch's first layout): what the
        epoch's first layout would have read in all (steps(stage) at its size), less what was read,
        split among the ranks now, and no more than the samples left (--data) allow."""
        read = sum(count * samples for count, samples in done)
        first = done[0][0] if done else self.topo.size
        steps_then = (self.args.steps_per_epoch if self.train_size is None else
                      min(self.train_size // first // stage.batch, self.args.steps_per_epoch or self.train_size))
        owed = max(steps_then * stage.batch * first - read, 0)
        if self.train_size is not None:
            owed = min(owed, self.train_size - read)
        return owed // self.topo.size // stage.batch

    def rest(self, stage, epoch, done):
        """--elastic: the rest of epoch ``epoch`` (0-based) of a stage after the ``done`` parts (see
        steps_left), steps_left batches: through DataCache, this rank's shard of the samples no part
        read (datacache.cached_dataset's done=), so the epoch reads every sample once whatever the
        layouts; synthetic data: random batches."""
        steps = self.steps_left(stage, done)
        per_epoch = steps * stage.batch
        if steps < 1:
            raise ValueError(f"the rest of epoch {epoch + 1} after {done} has no full batch of {stage.batch} "
                             f"on {self.topo.size} ranks")
        if self.args.synthetic:
            ds = self._synthetic(stage.resolution, per_epoch)
        else:
            import datacache

            ds = datacache.cached_dataset(
                self.train_src, self.preprocess(stage.resolution), False if self.cache is None else self.cache,
                shard=(self.topo.rank, self.topo.size), shuffle=True, seed=self.args.seed, first_epoch=epoch + 1,
                global_shuffle=self.args.global_shuffle, shard_seed=self.args.seed, samples_per_epoch=per_epoch,
                done=[tuple(part) for part in done])
        return self._batches(ds, stage, epoch, per_epoch, part=len(done)), steps

    def shard_seed(self, epoch_seed):
        """The tfds path's shard: fixed (drawn from --seed) or, with --global-shuffle, drawn anew from
        the epoch's seed (one data set per epoch, concatenated)."""
        return epoch_seed if self.args.global_shuffle and epoch_seed is not None else self.args.seed

    def preprocess(self, res):
        import datacache

        return self._preprocess.setdefault(res, datacache.DecodeResize(res))

    def val(self, stage, batch=256):
        """This rank's share of the validation set (None for synthetic data), built once per resolution."""
        res = stage.resolution
        if self.args.synthetic:
            return None
        if res not in self._val:
            if self.args.data:
                import datacache

                ds = datacache.cached_dataset(
                    self.val_src, self.preprocess(res), False if self.cache is None else self.cache,
                    shard=(self.topo.rank, self.topo.size), shuffle=False, shard_seed=self.args.seed)
                n = len(self.val_src)
            else:
                ds = self._tfds("validation", res, None)
                n = self.builder.info.splits["validation"].num_examples
            if -(-n // self.topo.size) * res * res * 3 <= VAL_IN_MEMORY:
                ds = ds.cache()   # later evaluations from memory: no pipeline start-up each epoch
            ds = ds.map(lambda x, y: (tf.ensure_shape(normalize(x), [res, res, 3]), tf.reshape(y, [])), AUTOTUNE)
            self._val[res] = without_autotune_thread(ds.batch(batch).prefetch(AUTOTUNE))
        return self._val[res]

    def _synthetic(self, res, n):
        rng = np.random.default_rng([self.args.seed, self.topo.rank])
        x = rng.integers(0, 256, (min(n, 64), res, res, 3), dtype=np.uint8)
        y = rng.integers(0, self.num_classes, min(n, 64)).astype(np.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().take(n).map(
            lambda x, y: (normalize(x), y), AUTOTUNE)

    def _tfds(self, split, res, seed):
        """This rank's shard of a tfds split: the same random sample of the split as DataCache's
        shards (datacache.shard_of: every rank reads every record, decodes only its own)."""
        import datacache
        import tensorflow_datasets as tfds

        ds = self.builder.as_dataset(split=split, as_supervised=True, shuffle_files=False,
                                     decoders={"image": tfds.decode.SkipDecoding()})
        ds = datacache.shard_of(ds, self.builder.info.splits[split].num_examples,
                                (self.topo.rank, self.topo.size), self.shard_seed(seed))
        if seed is not None:
            ds = ds.shuffle(10_000, seed=seed)
        return ds.map(lambda x, y: (tf.cast(tf.round(tf.clip_by_value(tf.image.resize(
            tf.io.decode_image(x, 3, expand_animations=False), (res, res)), 0, 255)), tf.uint8), y), AUTOTUNE)

    def stats_line(self):
        """DataCache's hits / misses / fallbacks summed over the ranks (None without DataCache)."""
        if self.cache is None:
            return None
        from tf_commlib import primitives

        s = self.cache.stats()
        keys = ("hits", "misses", "fallbacks", "source_bytes")
        total = primitives.allreduce(tf.constant([float(s.get(k) or 0) for k in keys], tf.float64), self.topo.world,
                            average=False).numpy()
        return "datacache (all ranks): " + ", ".join(f"{k} {int(v)}" for k, v in zip(keys, total))

    def close(self):
        if self.cache is not None:
            self.cache.close()
