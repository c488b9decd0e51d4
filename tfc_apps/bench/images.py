"""A synthetic ImageNet-layout folder of real JPEG files for the DataCache benchmark.

Each image is smooth random colour (a small random grid upscaled with bicubic interpolation) plus
noise, width and height drawn from [min_px, max_px], saved as JPEG (quality 90) by Pillow: about as
costly to decode as a photo of that size. A folder is reused when its ``.complete`` manifest matches.
"""
import json
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def _write(job):
    path, seed, min_px, max_px = job
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = (int(v) for v in rng.integers(min_px, max_px + 1, size=2))
    grid = rng.integers(0, 256, size=(rng.integers(4, 12), rng.integers(4, 12), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(grid).resize((w, h), Image.BICUBIC), np.int16)
    noisy = np.clip(base + rng.normal(0, 6, size=base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(path, "JPEG", quality=90)
    return os.path.getsize(path)


def write_imagenet_folder(root, images, classes=10, min_px=300, max_px=500, seed=0, workers=None):
    """Writes ``images`` JPEG files into ``root/nXXXXXXXX/`` class folders; returns their total bytes."""
    manifest = os.path.join(root, ".complete")
    params = {"images": images, "classes": classes, "min_px": min_px, "max_px": max_px, "seed": seed}
    if os.path.exists(manifest):
        with open(manifest) as f:
            done = json.load(f)
        if done["params"] == params:
            return done["bytes"]
        raise ValueError(f"{root} holds another benchmark folder ({done['params']}); remove it or pick --data")
    jobs = []
    for i in range(images):
        folder = os.path.join(root, f"n{i % classes:08d}")
        os.makedirs(folder, exist_ok=True)
        jobs.append((os.path.join(folder, f"img_{i:06d}.JPEG"), seed * 1_000_003 + i, min_px, max_px))
    with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
        total = sum(pool.map(_write, jobs, chunksize=64))
    with open(manifest, "w") as f:
        json.dump({"params": params, "bytes": total}, f)
    return total
