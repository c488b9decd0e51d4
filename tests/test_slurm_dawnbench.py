"""scripts/slurm/dawnbench.sbatch under a real single-node Slurm (tests/slurm_cluster.py): the
DAWNBench script's scaled digits configuration (sklearn digits as an ImageNet-layout JPEG folder, two
short progressive-resizing stages, the small model, 4 ranks as 2x2, hitopk then 2dtar with LARS and
DataCache) runs to completion as a batch job and leaves nothing behind."""
import sys

import numpy as np

from tests import hvdrun
from tests.test_slurm import ENV, _assert_clean, _log

DAWNBENCH = hvdrun.ROOT / "scripts" / "slurm" / "dawnbench.sbatch"


def write_digits_folder(root, size=32):
    """sklearn digits upscaled to size x size RGB JPEGs in root/{train,val}/<class>/ (1/5 to val)."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    data = load_digits()
    images = tf.image.resize((data.images / 16.0)[..., None], (size, size)).numpy()
    order = np.random.default_rng(0).permutation(len(data.target))
    for i, k in enumerate(order):
        split = "val" if i < len(order) // 5 else "train"
        folder = root / split / f"c{data.target[k]}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = tf.image.grayscale_to_rgb(tf.constant(np.uint8(np.clip(images[k], 0, 1) * 255)))
        (folder / f"{k}.jpg").write_bytes(tf.io.encode_jpeg(pixels).numpy())


def test_dawnbench_job_completes(slurm, tmp_path):
    data = tmp_path / "digits"
    write_digits_folder(data)
    d = tmp_path / "job"
    d.mkdir()
    args = ["--data", data, "--model", "small", "--stages", "32:1:32,48:1:32", "--schedule", "0:hitopk,1:2dtar",
            "--optimizer", "lars", "--topology", "2x2", "--log-dir", d / "log", "--ckpt-dir", d / "ckpt"]
    job = slurm.submit(DAWNBENCH, *args, sbatch=["-n4", "--overcommit", "--gpus-per-task=0"],
                       env=dict(ENV, TF_COMMLIB_ROOT=str(hvdrun.ROOT), TF_COMMLIB_PYTHON=sys.executable),
                       chdir=d)
    info = slurm.wait(job)
    log = _log(d, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert "4 ranks on" in (d / "job.out").read_text(), log
    for rank in range(4):
        assert (d / f"slurm-{job}.rank{rank}.out").exists(), log
    assert any(p.is_file() and p.stat().st_size for p in (d / "log").rglob("*")), "no log written\n" + log
    _assert_clean(job)
