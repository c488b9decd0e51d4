"""Where the samples come from: a folder of images in the ImageNet layout, or a tfds ImageFolder.

A source is a list of files with a label each. Sample ``i`` is the i-th file in sorted order (class
folders sorted by name, files sorted by path inside each), its label the index of its class folder
in ``class_names``, as Keras' ``image_dataset_from_directory`` and tfds number them. The fingerprint
covers the class names and every file's path, size and modification time, so a changed data set
never reads the cache entries of the old one.
"""
import hashlib
import os
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
        found = sorted(e.name for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith("."))
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
