"""``python -m datacache warm``: fill the cache before training.

Runs one epoch of ``cached_dataset`` over a shard without training, so the first training epoch
reads from memory. The cache must outlive this command: a Redis server given by ``--redis-url``
(or $DATACACHE_REDIS_URL, which keeps a password off the command line), and/or level 1 with
``--local-dir``. ``--shard i/m`` warms node i of m (the union of its ranks' shards in training).
"""
import argparse
import importlib
import json
import os
import sys
import time


def _shard(text):
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard must look like I/N, got {text!r}") from None
    return index, count


def _preprocess(args):
    if args.preprocess:
        module, _, attr = args.preprocess.partition(":")
        if not attr:
            raise SystemExit(f"--preprocess must look like package.module:function, got {args.preprocess!r}")
        return getattr(importlib.import_module(module), attr)
    from datacache.preprocess import DecodeResize
    return DecodeResize(args.size)


def warm(args):
    import datacache

    if not args.redis_url and not args.local_dir:
        raise SystemExit("warm needs a cache that outlives it: --redis-url URL (or $DATACACHE_REDIS_URL) "
                         "and/or --local-dir DIR")
    if args.tfds_split:
        import tensorflow_datasets as tfds
        source = datacache.TfdsSource(tfds.folder_dataset.ImageFolder(args.root), args.tfds_split)
    else:
        source = datacache.ImageFolderSource(args.root)
    cache = datacache.DataCache(args.redis_url or False, args.local_dir, read_batch=args.read_batch)
    try:
        ds = datacache.cached_dataset(source, _preprocess(args), cache, shard=args.shard, shuffle=False,
                                      preprocess_key=args.preprocess_key)
        start = time.perf_counter()
        n = sum(int(y.shape[0]) for _, y in ds.batch(256))
        seconds = time.perf_counter() - start
        cache.flush()
        stats = {k: v for k, v in cache.stats().items() if k != "epochs"}
    finally:
        cache.close()
    print(json.dumps(dict(stats, warmed=n, seconds=round(seconds, 3))))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m datacache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("warm", help="fill the cache for one shard of a data set")
    w.add_argument("root", help="ImageNet-layout folder (or a tfds ImageFolder root with --tfds-split)")
    w.add_argument("--tfds-split", help="read ROOT as tfds.folder_dataset.ImageFolder, this split")
    w.add_argument("--size", type=int, default=224, help="DecodeResize(size) as the preprocess (default 224)")
    w.add_argument("--preprocess", help="package.module:function to use as the preprocess instead")
    w.add_argument("--preprocess-key", help="names the preprocess configuration (as in training)")
    w.add_argument("--redis-url", default=os.environ.get("DATACACHE_REDIS_URL"),
                   help="Redis to fill (default $DATACACHE_REDIS_URL)")
    w.add_argument("--local-dir", help="level-1 directory to fill")
    w.add_argument("--shard", type=_shard, default=None, help="I/N: warm shard I of N (default: all)")
    w.add_argument("--read-batch", type=int, default=128)
    args = parser.parse_args(argv)
    return warm(args)


if __name__ == "__main__":
    sys.exit(main())
