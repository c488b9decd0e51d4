"""Where the samples come from: a folder of images in the ImageNet layout, a flat folder of images
with a labels file (ImageNet's validation set), or a tfds ImageFolder.

A source is a list of files with a label each. Sample ``i`` is the i-th file in sorted order (class
folders sorted by name, files sorted by path inside each), its label the index of its class folder
in ``class_names``, as Keras' ``image_dataset_from_directory`` and tfds number them. The fingerprint
covers the class names and every file's path, label, size and modification time, so a changed data
set never reads the cache entries of the old one.
"""
import hashlib
import os
import re
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")   # JPEG, PNG


@runtime_checkable
class Source(Protocol):
    """What ``cached_dataset`` and the level-1 copy read of a source: sample i is the file
    ``path(i)`` (= ``root`` joined with ``files[i]``) of ``sizes[i]`` bytes, modified at ``mtimes[i]``
    (ns), with label ``labels[i]`` (an index into ``class_names``). ``fingerprint()`` changes whenever
    any of that changes (cache keys include it); ``check(i, data)`` raises ValueError for bytes that
    are not a sample (read from the source, never from the cache). ImageFolderSource and TfdsSource
    are the two shipped; any object with these members works."""

    root: str
    files: Sequence[str]
    class_names: Sequence[str]
    labels: np.ndarray
    sizes: np.ndarray
    mtimes: np.ndarray

    def __len__(self) -> int: ...

    def path(self, i: int) -> str: ...

    def fingerprint(self) -> str: ...

    def check(self, i: int, data: bytes) -> None: ...


MEMBERS = ("root", "files", "class_names", "labels", "sizes", "mtimes", "__len__", "path", "fingerprint", "check")


def missing_members(source):
    """The members of the Source protocol that ``source`` lacks (empty: it is a Source)."""
    methods = ("__len__", "path", "fingerprint", "check")
    return [name for name in MEMBERS
            if not hasattr(source, name) or (name in methods and not callable(getattr(source, name)))]


class ImageFolderSource:
    """``root/<class>/**/<image>.jpg|.jpeg|.png``; any other (non-hidden) file is an error."""

    def __init__(self, root, class_names=None):
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path, got {type(root).__name__}")
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise ValueError(f"root {self.root!r} is not a directory")
        found = class_folders(self.root)
        self.class_names = list(class_names) if class_names is not None else found
        files, labels, sizes, mtimes = [], [], [], []
        for label, name in enumerate(self.class_names):
            if name not in found:
                continue   # a class of another split (tfds names classes over all splits)
            for rel, st in _images(self.root, name):
                files.append(rel)
                labels.append(label)
                sizes.append(st.st_size)
                mtimes.append(st.st_mtime_ns)
        if not files:
            raise ValueError(f"root {self.root!r} holds no images: expected root/<class>/<image> "
                             f"with extensions {', '.join(IMAGE_EXTENSIONS)}")
        self.files = files
        self.labels = np.asarray(labels, np.int32)
        self.sizes = np.asarray(sizes, np.int64)
        self.mtimes = np.asarray(mtimes, np.int64)
        self._fingerprint = None

    def __len__(self):
        return len(self.files)

    def __repr__(self):
        return f"{type(self).__name__}({self.root!r}: {len(self)} images, {len(self.class_names)} classes)"

    def path(self, i):
        return os.path.join(self.root, self.files[i])

    def fingerprint(self):
        if self._fingerprint is None:
            h = hashlib.sha256("\0".join(self.class_names).encode() + b"\1")
            for rel, label, size, mtime in zip(self.files, self.labels, self.sizes, self.mtimes):
                h.update(f"{rel}\0{label}\0{size}\0{mtime}\1".encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def check(self, i, data):
        """Raises ValueError when the bytes of sample i are neither JPEG nor PNG."""
        if not data.startswith(_MAGIC):
            raise ValueError(f"source: {self.path(i)} is not a JPEG or PNG image "
                             f"(it starts with {bytes(data[:8])!r})")


def class_folders(root):
    """The class names of an ImageNet-layout folder: its non-hidden subfolders, sorted."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


SOLUTION_HEADER = "ImageId,PredictionString"   # the first line of ImageNet's LOC_val_solution.csv


def read_labels(labels_file, class_names=None, argument="labels"):
    """The labels file of a flat folder: ({name: class index} in the file's order, class names).

    One line per image, ``NAME LABEL`` (whitespace between) or ``NAME,LABEL``; blank lines and lines
    starting with ``#`` are skipped, and so is a first line ``ImageId,PredictionString``. After a
    comma only the first word counts, so ImageNet's ``LOC_val_solution.csv``
    (``ILSVRC2012_val_00008726,n02119789 255 142 454 329 ...``: the synset, then boxes) reads as it is.
    NAME is a file name in the folder, with or without its extension. LABEL is a class name of
    ``class_names`` (a synset such as ``n01440764``) or, if it is none of them, an integer index
    into ``class_names`` (0-based). class_names=None: the file's distinct labels, sorted, are the
    classes (returned as the class names). Errors are ValueErrors that start with ``argument`` and
    the file, and give the line."""
    where = f"{argument} {os.fspath(labels_file)!r}"
    if not os.path.isfile(labels_file):
        raise ValueError(f"{where}: no such file")
    rows = []
    with open(labels_file, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#") or (not rows and line.replace(" ", "") == SOLUTION_HEADER):
                continue
            name, sep, rest = line.partition(",")
            if not sep:
                name, rest = (line.split(None, 1) + [""])[:2]
            name, words = name.strip(), rest.split()
            if not name or not words:
                raise ValueError(f"{where}: line {number}: {line!r} is not NAME LABEL or NAME,LABEL")
            if "/" in name or os.sep in name:
                raise ValueError(f"{where}: line {number}: {name!r} is a path; the folder is flat, "
                                 "give file names")
            rows.append((number, name, words[0]))
    if not rows:
        raise ValueError(f"{where}: no labels in the file")
    if class_names is None:
        class_names = sorted({label for _, _, label in rows})
    index = {name: i for i, name in enumerate(class_names)}
    out, lines = {}, {}
    for number, name, label in rows:
        if label in index:
            value = index[label]
        elif re.fullmatch(r"\d+", label) and int(label) < len(class_names):
            value = int(label)
        else:
            shown = ", ".join(list(class_names)[:5]) + (", ..." if len(class_names) > 5 else "")
            raise ValueError(f"{where}: line {number}: unknown class {label!r} (neither one of the "
                             f"{len(class_names)} class names: {shown}, nor an index 0..{len(class_names) - 1})")
        if name in out:
            raise ValueError(f"{where}: line {number}: {name!r} is labelled twice (first on line {lines[name]})")
        out[name], lines[name] = value, number
    return out, list(class_names)


def flat_folder_labels(root, labels_file, class_names=None, argument="labels"):
    """(files, labels, class names) of a flat folder of images labelled by ``labels_file``
    (``read_labels``): the image file names sorted, each with its class index. Every image must
    have a label and every label an image; a subfolder or a file that is not an image (other than the labels file itself)
    is an error, as in ImageFolderSource."""
    root = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root):
        raise ValueError(f"root {root!r} is not a directory")
    labels, class_names = read_labels(labels_file, class_names, argument)
    where = f"{argument} {os.fspath(labels_file)!r}"
    itself = os.path.abspath(os.fspath(labels_file))
    files, folders = [], []
    for e in os.scandir(root):
        if e.name.startswith(".") or os.path.abspath(e.path) == itself:
            continue
        if e.is_dir():
            folders.append(e.name)
        elif os.path.splitext(e.name)[1].lower() not in IMAGE_EXTENSIONS:
            raise ValueError(f"root {root!r}: unsupported image format {e.path!r}; a flat folder holds "
                             f"{', '.join(IMAGE_EXTENSIONS)} files")
        else:
            files.append(e.name)
    if folders:
        raise ValueError(f"root {root!r} holds folders ({', '.join(sorted(folders)[:3])}): with {argument} "
                         "it must be one flat folder of images (class folders need no labels file)")
    by_stem = {}
    for name in files:
        by_stem.setdefault(os.path.splitext(name)[0], []).append(name)
    names = set(files)
    label_of, named_by = {}, {}
    for name, label in labels.items():
        if name in names:
            file = name
        elif len(by_stem.get(name, ())) == 1:
            file = by_stem[name][0]
        elif name in by_stem:
            raise ValueError(f"{where}: {name!r} is ambiguous: {', '.join(sorted(by_stem[name]))} in {root!r}")
        else:
            raise ValueError(f"{where}: label without image: {name!r} is not in {root!r}")
        if file in label_of:
            raise ValueError(f"{where}: {file!r} is labelled twice (as {named_by[file]!r} and {name!r})")
        label_of[file], named_by[file] = label, name
    unlabelled = sorted(names - set(label_of))
    if unlabelled:
        raise ValueError(f"{where}: image without label: {len(unlabelled)} image(s) of {root!r} have no line, "
                         f"e.g. {', '.join(unlabelled[:3])}")
    files = sorted(label_of)
    return files, [label_of[f] for f in files], class_names


class FlatFolderSource(ImageFolderSource):
    """``root/<image>.jpg|.jpeg|.png`` (one flat folder, as ImageNet's validation set), labelled by
    ``labels_file`` (see ``read_labels``: ``NAME LABEL``, ``NAME,LABEL`` or ImageNet's
    ``LOC_val_solution.csv``). Sample i is the i-th file name in sorted order. ``class_names``: the
    training set's (``ImageFolderSource(train).class_names``), so labels index the same classes;
    ``argument`` starts every error message (e.g. the command-line flag that gave the file)."""

    def __init__(self, root, labels_file, class_names=None, argument="labels_file"):
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path, got {type(root).__name__}")
        if not isinstance(labels_file, (str, os.PathLike)):
            raise TypeError(f"{argument} must be a path, got {type(labels_file).__name__}")
        self.root = os.path.abspath(os.fspath(root))
        files, labels, self.class_names = flat_folder_labels(self.root, labels_file, class_names, argument)
        self.labels_file = os.path.abspath(os.fspath(labels_file))
        stats = [os.stat(os.path.join(self.root, f)) for f in files]
        self.files = files
        self.labels = np.asarray(labels, np.int32)
        self.sizes = np.asarray([st.st_size for st in stats], np.int64)
        self.mtimes = np.asarray([st.st_mtime_ns for st in stats], np.int64)
        self._fingerprint = None


def _images(root, class_name):
    """(relative path, stat) of the images under root/class_name, sorted by path."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, class_name), followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in filenames:
            if f.startswith("."):
                continue
            path = os.path.join(dirpath, f)
            if os.path.splitext(f)[1].lower() not in IMAGE_EXTENSIONS:
                raise ValueError(f"root {root!r}: unsupported image format {path!r}; "
                                 f"ImageFolderSource reads {', '.join(IMAGE_EXTENSIONS)}")
            out.append((os.path.relpath(path, root), os.stat(path)))
    return sorted(out, key=lambda item: item[0])


class TfdsSource(ImageFolderSource):
    """The files of one split of a ``tfds.folder_dataset.ImageFolder`` builder, labelled with the
    builder's class names (``builder.info.features['label'].names``), so labels match tfds'."""

    def __init__(self, builder, split="train"):
        import tensorflow_datasets as tfds

        if not isinstance(builder, tfds.folder_dataset.ImageFolder):
            raise TypeError("builder must be a tfds.folder_dataset.ImageFolder (a builder reading "
                            f"image files), got {type(builder).__name__}")
        if split not in builder.info.splits:
            raise ValueError(f"split {split!r} is not one of {sorted(builder.info.splits)}")
        super().__init__(os.path.join(builder.data_dir, split),
                         class_names=builder.info.features["label"].names)
        self.split = split
