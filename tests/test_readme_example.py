"""The README's example is code a user copies: it runs as written (one process, digits data) and
trains, with the settings it shows."""
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

SETUP = """
import keras
from tfc_apps import digits

(x, y), (x_test, y_test) = digits.load(0, 1, 0)
model = digits.small_cnn(0)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
"""

CHECK = """
from tf_commlib.keras import DistributedOptimizer as _DO
assert isinstance(opt, _DO) and opt.inner_optimizer.momentum == 0.0 and opt.m == 0.9
assert opt.algorithm == "auto" and opt.schedule == {0: "auto"}
model.compile(opt, loss, metrics=["accuracy"], jit_compile=False)
model.fit(x, y, epochs=3, batch_size=32, verbose=0, callbacks=default_callbacks())
accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
print("accuracy", accuracy)
assert accuracy > 0.8, accuracy
assert [row["choice"] for row in opt.auto_epochs.tta.log if "choice" in row] != []
"""

# the collective by hand that the README names after the example
RECIPE = """
from tf_commlib.keras import DGC
opt = DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), algorithm="hitopk",
                           density=0.01, dgc=DGC(warmup=2, momentum_masking=False), schedule={0: "hitopk", 13: "2dtar"})
assert opt.algorithm_at(0) == "hitopk" and opt.algorithm_at(13) == "2dtar"
assert opt.density_at(0) == 0.25 and opt.density_at(2) == 0.01 and not opt.dgc.momentum_masking
"""


DILOCO_CHECK = """
assert opt.sync_every == 8 and opt.inter_compression == "qsgd8" and opt.overlap
import numpy as np
accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), -1) == y_test))
print("accuracy", accuracy, "steps", int(opt.steps_done.numpy()))
assert accuracy > 0.5 and int(opt.synced_at.numpy()) == int(opt.steps_done.numpy()) > 0, accuracy
"""


def example_code(path=README, heading="## Example"):
    match = re.search(heading + r"\n\n```python\n(.*?)```", path.read_text(), re.S)
    assert match, f"{path.name} has no {heading} python block"
    return match.group(1)


def test_the_readme_example_runs_and_trains():
    code = example_code()
    assert "DistributedOptimizer(" in code and "model.fit(" in code
    recipe = 'algorithm="hitopk",\ndensity=0.01, dgc=DGC(warmup=2, momentum_masking=False), schedule={0: "hitopk", 13: "2dtar"}'
    assert recipe in README.read_text()
    proc = subprocess.run([sys.executable, "-c", SETUP + code + CHECK + RECIPE], capture_output=True, text=True,
                          timeout=600, cwd=README.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accuracy" in proc.stdout


def test_the_diloco_example_runs_and_trains():
    """docs/diloco.md's example on one process (one node: the syncs are local; tests/test_diloco.py
    runs DiLoCo on 2x2 and 1x4)."""
    code = example_code(README.parent / "docs" / "diloco.md", "## Use")
    assert "DiLoCo(" in code and "model.fit(" in code
    code = code.replace("model.fit(x, y,", "model.fit(x, y, epochs=3, batch_size=32, verbose=0,")
    proc = subprocess.run([sys.executable, "-c", SETUP + code + DILOCO_CHECK], capture_output=True, text=True,
                          timeout=600, cwd=README.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accuracy" in proc.stdout
