"""DataCache's sharding: shards as random class-balanced samples, fixed or drawn anew every epoch,
of any tf.data data set; `datacache warm` filling exactly a node's part; two nodes of two ranks
under horovodrun, one server per node."""
import numpy as np
import pytest
import tensorflow as tf

import datacache
from datacache import DataCache, DecodeResize, RedisServer, cached_dataset
from tests import hvdrun
from tests.datacache_data import N_CLASSES, keys_of


def test_warm_command_fills_a_server(source, ref16, tmp_path, monkeypatch):
    from datacache.cli import main

    n = len(source)
    server = RedisServer(maxmemory="64mb")
    try:
        monkeypatch.setenv("DATACACHE_REDIS_URL", server.url(with_password=True))
        assert main(["warm", source.root, "--size", "16", "--local-dir", str(tmp_path), "--shard", "0/2"]) == 0
        assert main(["warm", source.root, "--size", "16", "--local-dir", str(tmp_path), "--shard", "1/2"]) == 0
        with DataCache(server.url(with_password=True), str(tmp_path), progress=False) as cache:
            assert sorted(ref16.epoch(cached_dataset(source, DecodeResize(16), cache))) == list(range(n))
            first = cache.stats()["epochs"][0]
            assert (first["hits"], first["source_bytes"]) == (n, 0)
    finally:
        server.stop()


@pytest.mark.parametrize("nodes, per_node, seed", [(2, 4, 3), (3, 2, 0)], ids=["2x4", "3x2"])
def test_warm_fills_exactly_what_the_ranks_of_a_node_read(source, tmp_path, nodes, per_node, seed):
    """warm --node I/M --ranks-per-node n --seed S stores the union of the shards that the node's
    ranks (node-major) read in training (cached_dataset's own _Shard, with the source's labels and
    shard_seed S), no key more; those ranks' first epoch then misses nothing."""
    from datacache.cli import main
    from datacache.shards import _Shard

    n, size = len(source), nodes * per_node
    server = RedisServer(maxmemory="64mb")
    try:
        url = server.url(with_password=True)
        with DataCache(url, progress=False) as cache:
            covered = []
            for node in range(nodes):
                cache.redis.flushdb()
                assert main(["warm", source.root, "--size", "16", "--redis-url", url, "--node", f"{node}/{nodes}",
                             "--ranks-per-node", str(per_node), "--seed", str(seed)]) == 0
                keys = {int(k.rsplit(b":", 1)[1]) for k in keys_of(cache.redis)}
                ranks = range(node * per_node, (node + 1) * per_node)
                reads = [_Shard(n, r, size, seed, False, True, 0, source.labels).indices(1) for r in ranks]
                assert sorted(keys) == sorted(np.concatenate(reads).tolist())
                assert sorted(keys) == datacache.node_indices(n, node, nodes, per_node, seed, source.labels).tolist()
                covered += sorted(keys)
            assert sorted(covered) == list(range(n))   # the nodes' parts: the data set, once
            for rank in ranks:   # the last node's: every sample a hit
                ds = cached_dataset(source, DecodeResize(16), cache, shard=(rank, size), shard_seed=seed, seed=1)
                got = [int(y) for _, y in ds]
                assert len(got) == len(reads[rank - ranks[0]])
            hits = [(e["hits"], e["misses"], e["size"]) for e in cache.stats()["epochs"]]
            assert hits == [(len(r), 0, len(r)) for r in reads], hits
    finally:
        server.stop()


def test_warm_seed_and_layout_matter(source, tmp_path, capsys):
    """--shard I/N is --node I/N with one rank per node; a node of 4 ranks warmed as --shard 0/2
    (one rank's shard of 2) holds other samples, and so does another seed; bad layouts are named."""
    from datacache.cli import main

    n = len(source)
    server = RedisServer(maxmemory="64mb")
    try:
        url = server.url(with_password=True)
        with DataCache(url, progress=False) as cache:
            got = {}
            for name, args in (("shard", ["--shard", "1/2"]), ("node", ["--node", "1/2"]),
                               ("node4", ["--node", "1/2", "--ranks-per-node", "4"]),
                               ("seed", ["--node", "1/2", "--seed", "5"])):
                cache.redis.flushdb()
                assert main(["warm", source.root, "--size", "16", "--redis-url", url, *args]) == 0
                got[name] = sorted(int(k.rsplit(b":", 1)[1]) for k in keys_of(cache.redis))
            assert got["shard"] == got["node"] == datacache.shard_indices(n, 1, 2, 0, source.labels).tolist()
            assert got["node4"] == datacache.node_indices(n, 1, 2, 4, 0, source.labels).tolist() != got["node"]
            assert got["seed"] != got["node"] and len(got["seed"]) == len(got["node"])
    finally:
        server.stop()
    for args, message in [
        (["--node", "2/2"], "--node 2/2: need 0 <= I < N"),
        (["--node", "x"], "--node must look like I/N"),
        (["--ranks-per-node", "0"], "--ranks-per-node must be an integer >= 1"),
        (["--seed", "-1"], "--seed must be an integer >= 0 or 'none'"),
        (["--node", "0/2", "--shard", "0/2"], "give --node or --shard, not both"),
        (["--node", "0/11", "--ranks-per-node", "4"], "44 ranks in all, more than the 42 samples"),
        (["--labels", str(tmp_path / "none.txt")], "--labels '"),
        (["--classes", str(tmp_path / "none")], "--classes"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["warm", source.root, "--local-dir", str(tmp_path), *args])
        assert message in (str(e.value.code) + capsys.readouterr().err), args


def test_two_nodes_two_ranks_each(source, ref16, tmp_path):
    """2x2 under horovodrun: one server per node, each holding exactly its node's part."""
    n = len(source)
    reports = hvdrun.run("datacache_worker.py", 4, tmp_path, args=[source.root], topology="2x2", timeout=180)
    per_rank = []
    for rank, r in enumerate(reports):
        epochs = [[ref16.index[h] for h in e] for e in r["epochs"]]
        assert all(sorted(e) == sorted(epochs[0]) for e in epochs) and len(set(epochs[0])) == len(epochs[0])
        per_rank.append(sorted(epochs[0]))
        assert r["owns_server"] == (rank % 2 == 0) and r["hits"] == [0, len(epochs[0])]
    assert sorted(sum(per_rank, [])) == list(range(n))
    for node in range(2):
        part = sorted(per_rank[2 * node] + per_rank[2 * node + 1])
        assert part == sorted(sum((datacache.shard_indices(n, r, 4, 0, source.labels).tolist()
                                   for r in (2 * node, 2 * node + 1)), []))
        assert reports[2 * node]["keys"] == reports[2 * node + 1]["keys"] == part


def test_shards_are_random_samples_of_a_class_sorted_source():
    """A source listed class by class (ImageFolderSource's order) cut into shards: every shard holds
    every class in proportion, not the two or three classes of a contiguous range."""
    sizes = np.array([130, 90, 101, 99, 100, 100, 100, 97, 103, 80])
    labels = np.repeat(np.arange(10), sizes)   # 1000 samples, class-sorted, unequal classes
    for count in (2, 3, 4, 8):
        for seed in (0, 1):
            shards = [datacache.shard_indices(len(labels), i, count, seed, labels) for i in range(count)]
            assert sorted(np.concatenate(shards).tolist()) == list(range(len(labels)))
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
            per_class = np.array([np.bincount(labels[s], minlength=10) for s in shards])
            assert np.all(np.abs(per_class - sizes / count) <= 1), (count, per_class)
            # without labels: a random sample (every class present), not a contiguous range
            plain = datacache.shard_indices(len(labels), 0, count, seed)
            assert set(labels[plain].tolist()) == set(range(10))
    assert datacache.shard_indices(1000, 1, 4, 7).tolist() != datacache.shard_indices(1000, 1, 4, 0).tolist()
    contiguous = datacache.shard_indices(len(labels), 0, 4, seed=None)
    assert contiguous.tolist() == list(range(250))   # seed=None: the source's own order


def test_pipeline_shards_fixed_or_drawn_every_epoch(source, ref16):
    """Through cached_dataset (cached without Redis, and uncached): a shard holds every class, is the
    same every epoch (global_shuffle=False) or drawn anew (True); the shards of one epoch cover the
    data set exactly once either way; both paths yield the same order."""
    n, count = len(source), 3
    with DataCache(redis_url=False, progress=False, read_batch=8) as cache:
        fixed = [cached_dataset(source, DecodeResize(16), cache, shard=(i, count), seed=i) for i in range(count)]
        drawn = [cached_dataset(source, DecodeResize(16), cache, shard=(i, count), seed=i, global_shuffle=True)
                 for i in range(count)]
        epochs_fixed = [[ref16.epoch(ds) for ds in fixed] for _ in range(2)]
        epochs_drawn = [[ref16.epoch(ds) for ds in drawn] for _ in range(2)]
        uncached = cached_dataset(source, DecodeResize(16), False, shard=(1, count), seed=1)
        assert ref16.epoch(uncached) == epochs_fixed[0][1]   # same order, cached or not
    for shards in epochs_fixed + epochs_drawn:
        assert sorted(sum(shards, [])) == list(range(n))
        for s in shards:
            assert set(source.labels[s].tolist()) == set(range(N_CLASSES))
    assert [sorted(s) for s in epochs_fixed[0]] == [sorted(s) for s in epochs_fixed[1]]
    assert epochs_fixed[0] != epochs_fixed[1]   # reshuffled inside the shard
    assert [sorted(s) for s in epochs_drawn[0]] != [sorted(s) for s in epochs_drawn[1]]
    with pytest.raises(ValueError, match="shard_seed"):
        cached_dataset(source, DecodeResize(8), False, shard_seed=-1)
    with pytest.raises(ValueError, match="shard_seed"):
        cached_dataset(source, DecodeResize(8), False, shard_seed=None, global_shuffle=True)
    with pytest.raises(ValueError, match="global_shuffle"):
        cached_dataset(source, DecodeResize(8), False, global_shuffle="yes")
    # first_epoch: a data set built to start at epoch 2 (a resumed run's) yields what one built at
    # epoch 1 yielded second, cached or not, fixed or drawn shards
    with DataCache(redis_url=False, progress=False, read_batch=8) as cache:
        assert ref16.epoch(cached_dataset(source, DecodeResize(16), cache, shard=(0, count), seed=0,
                                          first_epoch=2)) == epochs_fixed[1][0]
        assert ref16.epoch(cached_dataset(source, DecodeResize(16), cache, shard=(2, count), seed=2,
                                          global_shuffle=True, first_epoch=2)) == epochs_drawn[1][2]
    assert ref16.epoch(cached_dataset(source, DecodeResize(16), False, shard=(1, count), seed=1,
                                      first_epoch=2)) == epochs_fixed[1][1]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="first_epoch"):
            cached_dataset(source, DecodeResize(8), False, first_epoch=bad)
    # samples_per_epoch: the first of each epoch's order, from the shard, other ones every epoch
    part = set(sorted(epochs_fixed[0][0]))
    with DataCache(redis_url=False, progress=False, read_batch=4) as cache:
        ds = cached_dataset(source, DecodeResize(16), cache, shard=(0, count), seed=0, samples_per_epoch=5)
        assert ds.cardinality() == 5
        firsts = [ref16.epoch(ds) for _ in range(3)]
    assert all(len(e) == len(set(e)) == 5 and set(e) <= part for e in firsts) and firsts[0] != firsts[1]
    for bad in (0, len(part) + 1, 2.5):
        with pytest.raises(ValueError, match="samples_per_epoch"):
            cached_dataset(source, DecodeResize(8), False, shard=(0, count), samples_per_epoch=bad)


def test_shard_of_any_dataset():
    n, count = 50, 4
    for seed in (0, 3):
        parts = [[int(v) for v in datacache.shard_of(tf.data.Dataset.range(n), n, (i, count), seed)]
                 for i in range(count)]
        assert parts == [datacache.shard_indices(n, i, count, seed).tolist() for i in range(count)]
        assert sorted(sum(parts, [])) == list(range(n))
    pairs = tf.data.Dataset.from_tensor_slices((np.arange(10), np.arange(10) * 2))
    assert [(int(a), int(b)) for a, b in datacache.shard_of(pairs, 10, (1, 2))] == \
        [(int(i), 2 * int(i)) for i in datacache.shard_indices(10, 1, 2)]


@pytest.mark.parametrize("global_shuffle", [False, True], ids=["fixed", "drawn"])
def test_an_epoch_resumed_on_other_layouts_reads_every_sample_once(source, ref16, global_shuffle):
    """done=: an elastic job read epoch 2 on 4 ranks (3 samples each), lost 2 of them (the next 2 ranks
    read 2 each), then went on with 3 ranks to the epoch's end. What the 4 ranks read is what the plain
    data sets yield first; with the later parts, every sample of the data set was read exactly once."""
    n, kw = len(source), dict(first_epoch=2, global_shuffle=global_shuffle)

    def reads(cache, count, done=(), take=None):
        return [ref16.epoch(cached_dataset(source, DecodeResize(16), cache, shard=(i, count), seed=5, done=done,
                                           samples_per_epoch=take, **kw)) for i in range(count)]

    with DataCache(redis_url=False, progress=False, read_batch=4) as cache:
        plain = reads(cache, 4)
        first = [r[:3] for r in plain]
        second = reads(cache, 2, done=[(4, 3)], take=2)
        rest = reads(cache, 3, done=[(4, 3), (2, 2)])
        assert reads(False, 3, done=[(4, 3), (2, 2)]) == rest   # the same, cached or not
    assert all(len(r) == 2 for r in second)
    read = sum(first + second + rest, [])
    assert sorted(read) == list(range(n))   # nothing skipped, nothing twice
    assert max(len(r) for r in rest) - min(len(r) for r in rest) <= 1
    with DataCache(redis_url=False, progress=False, read_batch=4) as cache:
        twice = cached_dataset(source, DecodeResize(16), cache, shard=(0, 2), seed=5, done=[(4, 3)], **kw)
        assert ref16.epoch(twice) == reads(cache, 2, done=[(4, 3)])[0]
        with pytest.raises(Exception, match="yields epoch 2 once"):
            ref16.epoch(twice)   # a second iteration would be epoch 3: another data set's
    for bad in ([(0, 1)], [(2, -1)], [(2, 1.5)], "4,3", [(2,)]):
        with pytest.raises(ValueError, match="done"):
            cached_dataset(source, DecodeResize(8), False, shard=(0, 2), seed=5, done=bad)
    with pytest.raises(ValueError, match="done: .* reads more"):
        cached_dataset(source, DecodeResize(8), False, shard=(0, 2), seed=5, done=[(2, n)])
    with pytest.raises(ValueError, match="done= needs a seed"):   # the parts' orders are replayed from it
        cached_dataset(source, DecodeResize(8), False, shard=(0, 2), done=[(4, 3)])
