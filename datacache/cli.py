"""``python -m datacache warm``: fill the cache before training.

Runs one epoch of ``cached_dataset`` over what a node will read, without training, so the first
training epoch reads from memory. The cache must outlive this command: a Redis server given by
``--redis-url`` (or $DATACACHE_REDIS_URL, which keeps a password off the command line), and/or
level 1 with ``--local-dir``.

What a node reads: ``--node I/M --ranks-per-node n`` is node I of M nodes, each running n ranks
numbered node-major (node I runs ranks I*n .. I*n+n-1 of M*n, as Horovod numbers them); warm reads
exactly the shards of those ranks, each cut as training cuts it (``cached_dataset(shard=(rank,
M*n), shard_seed=--seed)``, the source's labels included). ``--seed`` must be the training's shard
seed: the DAWNBench script's ``--seed``, ``cached_dataset``'s ``shard_seed`` (default 0 in both).
``--shard I/N`` is ``--node I/N``; with the default ``--ranks-per-node 1`` that is the shard one
rank I of N reads. Neither: the whole data set.
"""
import argparse
import importlib
import json
import os
import sys
import time


def _fraction(flag):
    def parse(text):
        try:
            index, count = (int(v) for v in text.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must look like I/N, got {text!r}") from None
        if not 0 <= index < count:
            raise argparse.ArgumentTypeError(f"{flag} {text}: need 0 <= I < N")
        return index, count
    return parse


_shard = _fraction("--shard")


def _positive(flag):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer >= 1, got {text!r}")
        return value
    return parse


def _seed(text):
    if text.lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--seed must be an integer >= 0 or 'none', got {text!r}")
    return value


def _preprocess(args):
    if args.preprocess:
        module, _, attr = args.preprocess.partition(":")
        if not attr:
            raise SystemExit(f"--preprocess must look like package.module:function, got {args.preprocess!r}")
        return getattr(importlib.import_module(module), attr)
    from datacache.preprocess import DecodeResize
    return DecodeResize(args.size)


def _source(args):
    import datacache
    from datacache.sources import class_folders

    class_names = None
    if args.classes:
        if not os.path.isdir(args.classes):
            raise SystemExit(f"--classes {args.classes!r} is not a directory")
        class_names = class_folders(args.classes)
    try:
        if args.tfds_split:
            if args.labels or args.classes:
                raise SystemExit("--tfds-split reads the builder's own labels: leave out --labels and --classes")
            import tensorflow_datasets as tfds
            return datacache.TfdsSource(tfds.folder_dataset.ImageFolder(args.root), args.tfds_split)
        if args.labels:
            return datacache.FlatFolderSource(args.root, args.labels, class_names, argument="--labels")
        return datacache.ImageFolderSource(args.root, class_names)
    except ValueError as e:
        raise SystemExit(f"warm: {e}") from None


def warm_shards(args, n):
    """The (rank, size) shards warm reads for ``args`` over n samples: every rank of the node."""
    from datacache.shards import node_shards

    if args.node and args.shard:
        raise SystemExit("give --node or --shard, not both (--shard I/N is --node I/N)")
    node, nodes = args.node or args.shard or (0, 1)
    shards = node_shards(node, nodes, args.ranks_per_node)
    if shards[0][1] > n:
        raise SystemExit(f"--node/--shard {node}/{nodes} with --ranks-per-node {args.ranks_per_node}: "
                         f"{shards[0][1]} ranks in all, more than the {n} samples of {args.root!r}")
    return shards


def warm(args):
    import datacache

    if not args.redis_url and not args.local_dir:
        raise SystemExit("warm needs a cache that outlives it: --redis-url URL (or $DATACACHE_REDIS_URL) "
                         "and/or --local-dir DIR")
    source = _source(args)
    shards = warm_shards(args, len(source))
    cache = datacache.DataCache(args.redis_url or False, args.local_dir, read_batch=args.read_batch)
    try:
        preprocess = _preprocess(args)
        ds = None
        for shard in shards:   # each rank's shard exactly as training cuts it
            part = datacache.cached_dataset(source, preprocess, cache, shard=shard, shuffle=False,
                                            shard_seed=args.seed, preprocess_key=args.preprocess_key)
            ds = part if ds is None else ds.concatenate(part)
        start = time.perf_counter()
        n = sum(int(y.shape[0]) for _, y in ds.batch(256))
        seconds = time.perf_counter() - start
        cache.flush()
        stats = {k: v for k, v in cache.stats().items() if k != "epochs"}
    finally:
        cache.close()
    print(json.dumps(dict(stats, warmed=n, ranks=[r for r, _ in shards], seconds=round(seconds, 3))))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m datacache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("warm", help="fill the cache for what one node reads")
    w.add_argument("root", help="ImageNet-layout folder (a flat folder with --labels; a tfds ImageFolder root "
                                "with --tfds-split)")
    w.add_argument("--tfds-split", help="read ROOT as tfds.folder_dataset.ImageFolder, this split")
    w.add_argument("--labels", help="ROOT is one flat folder of images labelled by this file (NAME LABEL, "
                                    "NAME,LABEL or ImageNet's LOC_val_solution.csv; as the DAWNBench "
                                    "script's --val-labels)")
    w.add_argument("--classes", help="the class names are the class folders of this folder (the training "
                                     "set's, as training labels a validation folder; default: ROOT's)")
    w.add_argument("--size", type=int, default=224, help="DecodeResize(size) as the preprocess (default 224)")
    w.add_argument("--preprocess", help="package.module:function to use as the preprocess instead")
    w.add_argument("--preprocess-key", help="names the preprocess configuration (as in training)")
    w.add_argument("--redis-url", default=os.environ.get("DATACACHE_REDIS_URL"),
                   help="Redis to fill (default $DATACACHE_REDIS_URL)")
    w.add_argument("--local-dir", help="level-1 directory to fill")
    w.add_argument("--node", type=_fraction("--node"), default=None,
                   help="I/M: warm what node I of M nodes reads (its --ranks-per-node ranks, node-major)")
    w.add_argument("--ranks-per-node", type=_positive("--ranks-per-node"), default=1,
                   help="ranks on each node in training (default 1)")
    w.add_argument("--shard", type=_shard, default=None,
                   help="I/N: the same as --node I/N (with --ranks-per-node 1: the shard rank I of N reads)")
    w.add_argument("--seed", type=_seed, default=0,
                   help="the training's shard seed (the DAWNBench script's --seed, cached_dataset's "
                        "shard_seed; default 0; 'none': contiguous shards)")
    w.add_argument("--read-batch", type=int, default=128)
    args = parser.parse_args(argv)
    return warm(args)


if __name__ == "__main__":
    sys.exit(main())
