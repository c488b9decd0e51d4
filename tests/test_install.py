"""Installing into a user's own TensorFlow: `pip install .` (not editable) into another virtualenv that
already has TensorFlow and Horovod builds both op libraries against that TensorFlow, with no network,
apt or Slurm, and a 2-rank step runs from the installed package; scripts/build_horovod.sh says what
it builds and which patches it applies (the Horovod of this environment carries them)."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tf_commlib.topology import FINALIZE_PATCH, horovod_survives_lost_peers

ROOT = Path(__file__).resolve().parents[1]
BUILD_HOROVOD = ROOT / "scripts" / "build_horovod.sh"

STEP = """
import hashlib, numpy as np, tensorflow as tf, tf_commlib, datacache
from tf_commlib import ops
topo = tf_commlib.init()
assert tf_commlib.__file__.startswith(PREFIX) and datacache.__file__.startswith(PREFIX), tf_commlib.__file__
agg = tf_commlib.GradientAggregator("hitopk", 0.5)
g = np.arange(8, dtype=np.float32) * (topo.rank + 1)
out = agg([tf.constant(g)])[0].numpy()
v, i = ops.mstopk(tf.constant(g), 2, seed=0)
print("rank", topo.rank, "of", topo.size, "sent", sorted(i.numpy().tolist()), "sum", float(out.sum()), flush=True)
"""


def _venv_with_the_users_tensorflow(path):
    """A new virtualenv that sees this interpreter's site-packages (TensorFlow, Horovod, numpy) after
    its own, as a user's environment that already has them."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "users_tensorflow.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path / "bin" / "python", site


def _source_copy(dest):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_pip_install_into_another_virtualenv_runs_a_two_rank_step(tmp_path):
    python, site = _venv_with_the_users_tensorflow(tmp_path / "venv")
    source = _source_copy(tmp_path / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
                              "--no-deps", str(source)], capture_output=True, text=True, timeout=1500, env=env)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    installed = site / "tf_commlib"
    assert list(installed.glob("_tf_commlib_ops*.so")) and (installed / "_build_info.json").exists()
    assert list((site / "datacache").glob("_datacache_ops*.so"))
    horovodrun = Path(sys.executable).parent / "horovodrun"
    run = subprocess.run([str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo", str(python), "-c",
                          f"PREFIX = {str(site)!r}\n" + STEP],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in (0, 1):
        # the summed gradient is (1 + 2) * arange(8); hitopk at density 0.5 sends half, the rest waits
        assert f"rank {rank} of 2 sent [6, 7]" in run.stdout, run.stdout[-3000:]


def test_build_horovod_says_what_it_builds(tmp_path):
    def plan(path_dirs, venv=Path(sys.executable).parents[1]):
        env = dict(os.environ, PATH=os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"]))
        env.pop("NVCC", None)
        return subprocess.run(["bash", str(BUILD_HOROVOD), "--dry-run", str(venv)], capture_output=True, text=True,
                              timeout=300, env=env)

    plain = plan([])
    assert plain.returncode == 0, plain.stderr
    assert "horovod: building with gloo\n" in plain.stdout
    assert "CPU TensorFlow: no GPU operations" in plain.stdout and "MPI left out" in plain.stdout
    patches = sorted(p.name for p in (ROOT / "third_party" / "horovod_patches").glob("*.patch"))
    assert FINALIZE_PATCH in patches and f"horovod: patches {' '.join(patches)}\n" in plain.stdout
    # and the Horovod built here has it:
    assert horovod_survives_lost_peers()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpicxx").write_text("#!/bin/sh\nexit 0\n")
    (fake / "mpicxx").chmod(0o755)
    assert "horovod: building with gloo mpi\n" in plan([fake]).stdout
    missing = plan([], venv=tmp_path / "nothing")
    assert missing.returncode == 2 and "no python in" in missing.stderr
