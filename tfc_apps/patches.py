"""A second real image set that ships with the installed packages: 10 classes of patches of
photographs (sklearn's china.jpg and flower.jpg, matplotlib's grace_hopper.jpg), class = the region
of a photo a patch comes from (each photo cut into a grid), written as an ImageNet-layout folder
with classes in sorted folders. Unlike the digits (8x8 drawings), a class is a texture seen at
random positions, scales and flips, so a model must generalise to patches it has not seen."""
import os

import numpy as np
import tensorflow as tf

# (file, rows, cols): 2x2 + 2x2 + 2x1 regions = 10 classes
PHOTOS = (("sklearn", "china.jpg", 2, 2), ("sklearn", "flower.jpg", 2, 2), ("matplotlib", "grace_hopper.jpg", 2, 1))


def _photo(package, name):
    if package == "sklearn":
        from sklearn.datasets import load_sample_image
        return load_sample_image(name)
    import matplotlib.cbook
    with matplotlib.cbook.get_sample_data(name) as f:
        return tf.io.decode_jpeg(f.read(), 3).numpy()


def regions():
    """The 10 class regions, uint8 HxWx3 each, in class order."""
    out = []
    for package, name, rows, cols in PHOTOS:
        img = _photo(package, name)
        h, w = img.shape[0] // rows, img.shape[1] // cols
        out += [img[r * h:(r + 1) * h, c * w:(c + 1) * w] for r in range(rows) for c in range(cols)]
    return out


def write_patch_folder(root, size=32, train_per_class=300, val_per_class=60, seed=0):
    """root/{train,val}/<class>/<i>.jpg: random square crops (a quarter to all of the region's
    shorter side), random flips, resized to size x size. Returns root."""
    rng = np.random.default_rng(seed)
    for c, region in enumerate(regions()):
        for split, count in (("train", train_per_class), ("val", val_per_class)):
            folder = os.path.join(root, split, f"class_{c:02d}")
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                side = int(rng.uniform(0.25, 1.0) * min(region.shape[:2]))
                y, x = (int(rng.integers(0, d - side + 1)) for d in region.shape[:2])
                patch = region[y:y + side, x:x + side]
                if rng.random() < 0.5:
                    patch = patch[:, ::-1]
                patch = tf.cast(tf.round(tf.image.resize(patch, (size, size), antialias=True)), tf.uint8)
                tf.io.write_file(os.path.join(folder, f"{i:04d}.jpg"), tf.io.encode_jpeg(patch, quality=90))
    return root
