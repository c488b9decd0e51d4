"""A flat folder of images with a labels file (ImageNet's validation layout): datacache's
FlatFolderSource and the DAWNBench script's --val-labels, against the class-folder layout of the
same images (digits written as JPEGs, their val/ flattened)."""
import os

import numpy as np
import pytest

import datacache
from datacache import FlatFolderSource, ImageFolderSource, read_labels
from tests.datacache_data import digest


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """(class-folder root, flat root, its labels file 'NAME CLASS')."""
    from tfc_apps.dawnbench.data import flat_val
    from tfc_apps.digits import write_image_folder

    tmp = tmp_path_factory.mktemp("flat")
    root = write_image_folder(str(tmp / "digits"), size=16, val_fraction=0.1)
    labels = flat_val(root, str(tmp / "flat"))
    return root, str(tmp / "flat"), labels


def by_name(source):
    return {os.path.basename(f): int(y) for f, y in zip(source.files, source.labels)}


def test_flat_labels_equal_the_class_folder_labels_in_every_form(digits, tmp_path):
    root, flat, labels = digits
    classes = ImageFolderSource(f"{root}/train").class_names
    want = by_name(ImageFolderSource(f"{root}/val", classes))
    assert len(want) > 100 and len(set(want.values())) == 10
    lines = [line.split() for line in open(labels)]
    forms = {   # the same labels as the other accepted forms
        "space.txt": [f"{n} {c}" for n, c in lines],
        "comma_no_extension.csv": [f"{n.removesuffix('.jpg')},{c}" for n, c in lines],
        "solution.csv": ["ImageId,PredictionString"]
                        + [f"{n.removesuffix('.jpg')},{c} 1 2 30 31 {c} 4 5 20 21" for n, c in lines],
        "index_tab_comments.txt": ["# NAME<TAB>index into the sorted classes", ""]
                                  + [f"{n}\t{classes.index(c)}" for n, c in lines],
    }
    prints = set()
    for name, text in forms.items():
        (tmp_path / name).write_text("\n".join(text) + "\n")
        source = FlatFolderSource(f"{flat}/val", tmp_path / name, classes)
        assert by_name(source) == want, name
        assert source.files == sorted(want) and source.class_names == classes
        prints.add(source.fingerprint())
    assert len(prints) == 1   # same files, same labels: the same cache entries
    swapped = [f"{n} {int(c) ^ 1}" for n, c in lines]
    (tmp_path / "swapped.txt").write_text("\n".join(swapped))
    assert FlatFolderSource(f"{flat}/val", tmp_path / "swapped.txt", classes).fingerprint() not in prints


def test_a_label_is_a_class_name_before_it_is_an_index(tmp_path):
    (tmp_path / "l.txt").write_text("a.jpg n02\nb.jpg 0\nc.jpg n01\nd,1\n")
    labels, classes = read_labels(tmp_path / "l.txt", ["n01", "n02"])
    assert labels == {"a.jpg": 1, "b.jpg": 0, "c.jpg": 0, "d": 1} and classes == ["n01", "n02"]
    (tmp_path / "m.txt").write_text("a 3\nb 10\n")   # class names that are numbers are names first
    assert read_labels(tmp_path / "m.txt", ["10", "3", "7"])[0] == {"a": 1, "b": 0}
    assert read_labels(tmp_path / "m.txt")[1] == ["10", "3"]   # no class names: the file's, sorted


@pytest.mark.parametrize("text, message", [
    (None, "--val-labels '{labels}': no such file"),
    ("0000.jpg 7\n0001.jpg n99\n", "--val-labels '{labels}': line 2: unknown class 'n99'"),
    ("0000.jpg 10\n", "line 1: unknown class '10' (neither one of the 10 class names"),
    ("0000.jpg\n", "line 1: '0000.jpg' is not NAME LABEL or NAME,LABEL"),
    ("0000.jpg 1\n0000.jpg 2\n", "line 2: '0000.jpg' is labelled twice (first on line 1)"),
    ("0000 1\n0000.jpg 2\n", "'0000.jpg' is labelled twice (as '0000' and '0000.jpg')"),
    ("val/0000.jpg 1\n", "line 1: 'val/0000.jpg' is a path"),
    ("", "no labels in the file"),
    ("0000.jpg 1\n0001 1\n0002 1\nnosuch.jpg 2\n", "label without image: 'nosuch.jpg' is not in"),
    ("0000.jpg 1\n0001.jpg 2\n", "image without label: 1 image(s) of"),
])
def test_bad_labels_files_are_named(tmp_path, text, message):
    val = tmp_path / "val"
    val.mkdir()
    for name in ("0000.jpg", "0001.jpg", "0002.jpg"):
        (val / name).write_bytes(b"\xff\xd8\xff")
    labels = tmp_path / "labels.txt"
    if text is not None:
        labels.write_text(text)
    with pytest.raises(ValueError) as e:
        FlatFolderSource(val, labels, [str(c) for c in range(10)], argument="--val-labels")
    assert message.format(labels=labels) in str(e.value)
    assert str(e.value).startswith("--val-labels '")


def test_class_folders_with_a_labels_file_are_refused(digits):
    root, _, labels = digits
    with pytest.raises(ValueError, match="holds folders .* with --val-labels it must be one flat folder"):
        FlatFolderSource(f"{root}/val", labels, argument="--val-labels")


def test_dawnbench_arguments(digits, capsys, tmp_path):
    from tfc_apps.dawnbench import config

    root, flat, labels = digits
    args = config.parse(["--data", flat, "--val-labels", labels, "--stages", "32:1:32"])
    assert args.val_labels == labels
    (tmp_path / "bad.txt").write_text("0000.jpg nosuch\n")
    for argv, message in [
        (["--data", flat, "--val-labels", str(tmp_path / "none.txt")], "--val-labels '"),
        (["--data", flat, "--val-labels", str(tmp_path / "bad.txt")], "unknown class 'nosuch'"),
        (["--data", flat], "val/ holds images, not class folders: give --val-labels FILE"),
        (["--data", root, "--val-labels", labels], "with --val-labels it must be one flat folder"),
        (["--synthetic", "--val-labels", labels], "--val-labels labels the flat val/ folder of --data DIR"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            config.parse(argv)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err, argv


def test_dawnbench_validation_set_is_the_same(digits):
    """Data.val (uncached) of the flat folder yields the images and labels of the class folders."""
    import types

    from tfc_apps.dawnbench import config
    from tfc_apps.dawnbench.data import Data

    root, flat, labels = digits
    got = []
    for argv in (["--data", root], ["--data", flat, "--val-labels", labels]):
        args = config.parse([*argv, "--no-datacache", "--stages", "32:1:8"])
        data = Data(args, types.SimpleNamespace(rank=0, size=1))
        pairs = [(digest(x), int(y)) for xs, ys in data.val(args.stage_list[0]) for x, y in zip(xs.numpy(), ys.numpy())]
        got.append(sorted(pairs))
    assert got[0] == got[1] and len(got[0]) == len(datacache.ImageFolderSource(f"{root}/val"))
    assert np.unique([y for _, y in got[0]]).tolist() == list(range(10))


def test_warm_a_flat_validation_folder_for_training(digits):
    """datacache warm --labels FILE --classes TRAIN fills the entries the DAWNBench script's
    validation set of a node then reads (FlatFolderSource with the train/ classes, --seed shards)."""
    from datacache import DataCache, DecodeResize, RedisServer, cached_dataset
    from datacache.cli import main

    root, flat, labels = digits
    server = RedisServer(maxmemory="64mb")
    try:
        url = server.url(with_password=True)
        assert main(["warm", f"{flat}/val", "--labels", labels, "--classes", f"{flat}/train", "--size", "16",
                     "--redis-url", url, "--node", "1/2", "--ranks-per-node", "2", "--seed", "4"]) == 0
        val = FlatFolderSource(f"{flat}/val", labels, ImageFolderSource(f"{flat}/train").class_names)
        with DataCache(url, progress=False) as cache:
            for rank in (2, 3):
                list(cached_dataset(val, DecodeResize(16), cache, shard=(rank, 4), shuffle=False, shard_seed=4))
            assert [(e["misses"], e["hits"] > 0) for e in cache.stats()["epochs"]] == [(0, True)] * 2
            assert cache.stats()["redis_keys"] == sum(e["hits"] for e in cache.stats()["epochs"])
    finally:
        server.stop()
