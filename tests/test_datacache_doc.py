"""docs/datacache.md's example is code a user copies: it runs as written (one process, the embedded
redis-server, the test images instead of ImageNet, a small model), its augment gets one uint8
sample and returns one float sample, and the second epoch reads every sample from Redis."""
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "datacache.md"

SETUP = """
import keras
model = keras.Sequential([keras.Input((224, 224, 3)), keras.layers.AveragePooling2D(16), keras.layers.Flatten(),
                          keras.layers.Dense(10)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
"""

CHECK = """
import numpy as np
assert ds.element_spec[0].shape == (224, 224, 3) and ds.element_spec[0].dtype == tf.float32
stats = cache.stats()
n = len(datacache.ImageFolderSource(ROOT))
assert [(e["hits"], e["misses"]) for e in stats["epochs"]] == [(0, n), (n, 0)], stats["epochs"]
a, b = (np.stack([x.numpy() for x, _ in ds]) for _ in range(2))
assert a.min() >= -1 and a.max() <= 1 and not np.array_equal(a, b)   # augmented anew every epoch
print("example ok")
"""


def example_code():
    match = re.search(r"```python\n(import tensorflow as tf\nimport datacache\n.*?)```", DOC.read_text(), re.S)
    assert match, "docs/datacache.md has no example block starting with import tensorflow / import datacache"
    return match.group(1)


def test_the_datacache_example_runs(tmp_path):
    from tests.datacache_data import write_folder

    root = write_folder(str(tmp_path / "images"))
    code = example_code()
    for text, replacement in (("/nfs/imagenet/train", root), ("/local/ssd/dc", str(tmp_path / "dc")),
                              ("epochs=90", "epochs=2, verbose=0")):
        assert code.count(text) == 1, text
        code = code.replace(text, replacement)
    assert "def random_flip_crop(x):" in code and "augment=random_flip_crop" in code
    proc = subprocess.run([sys.executable, "-c", f"ROOT = {root!r}\n" + SETUP + code + CHECK], capture_output=True,
                          text=True, timeout=600, cwd=DOC.parent.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "example ok" in proc.stdout
