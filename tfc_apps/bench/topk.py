"""Top-k selection benchmark like shi2021 Fig. 6: time vs size for every registered selector
(tf_commlib.ops.SELECTORS), the exact ``tf.math.top_k``, and a one-pass reference
(``reduce_max(abs(x))``), with recall."""
import argparse
import functools
import os
import sys

import numpy as np
import tensorflow as tf

from tf_commlib import ops
from tfc_apps.bench.common import loglog_plot, median_time, print_json, print_table

DEFAULT_SIZES = [2**18, 2**20, 2**22, 2**24, 25_000_000, 2**26, 2**27]


def methods(k, seed=1):
    """Every registered selector (tf_commlib.ops.SELECTORS, seeded ones with `seed`, stepped ones at
    step 0), then the references."""
    sel = {name: functools.partial(ops.bound_selector(name, seed=seed, step=0), k=k) for name in ops.SELECTORS}
    sel["tf_topk"] = lambda x: tf.math.top_k(tf.abs(x), k)
    sel["one_pass"] = lambda x: tf.reduce_max(tf.abs(x))
    return sel


def selected_values(name, result, x):
    """x at the selected indices (a selector's values may be an encoding of them: qrgc's mean)."""
    if name == "one_pass":
        return None
    return tf.gather(x, result.indices if name == "tf_topk" else result[1])


def run(sizes, density, repeats, dist, seed=0):
    rows = []
    rng = np.random.default_rng(seed)
    for size in sizes:
        data = rng.standard_normal(size, dtype=np.float32) if dist == "gaussian" else \
            rng.standard_cauchy(size).astype(np.float32)
        x = tf.constant(data)
        k = max(1, int(density * size))
        exact = float(np.sum(np.sort(data.astype(np.float64) ** 2)[-k:]))
        for name, fn in methods(k).items():
            t = median_time(lambda: tf.nest.map_structure(lambda v: v.numpy(), fn(x)), repeats)
            vals = selected_values(name, fn(x), x)
            recall = None if vals is None else \
                float(np.sum(vals.numpy().astype(np.float64) ** 2) / exact)
            rows.append({"size": size, "k": k, "method": name, "median_s": t, "recall": recall})
        del x, data
    one = {r["size"]: r["median_s"] for r in rows if r["method"] == "one_pass"}
    top = {r["size"]: r["median_s"] for r in rows if r["method"] == "tf_topk"}
    for r in rows:
        r["x_one_pass"] = r["median_s"] / one[r["size"]]
        r["topk_speedup"] = top[r["size"]] / r["median_s"]
    return rows


def main(argv):
    p = argparse.ArgumentParser(prog="python -m tfc_apps.bench topk", description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    p.add_argument("--density", type=float, default=0.001)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per point (median)")
    p.add_argument("--dist", choices=["gaussian", "cauchy"], default="gaussian")
    p.add_argument("--out", default="bench_out", help="folder for the PNG plot")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of the table")
    args = p.parse_args(argv)
    rows = run(args.sizes, args.density, args.repeats, args.dist)
    if args.json:
        print_json(rows, ["size", "k", "method", "median_s", "recall"], sys.stdout)
    else:
        fmt_recall = [dict(r, recall="-" if r["recall"] is None else f"{r['recall']:.4f}") for r in rows]
        print_table(fmt_recall, [("size", "size", "{}"), ("k", "k", "{}"), ("method", "method", "{}"),
                                 ("median_s", "seconds", "{:.5f}"), ("x_one_pass", "x one pass", "{:.2f}"),
                                 ("topk_speedup", "tf.top_k / this", "{:.2f}"), ("recall", "recall", "{}")],
                    sys.stdout)
    os.makedirs(args.out, exist_ok=True)
    series = {}
    for r in rows:
        xs, ys = series.setdefault(r["method"], ([], []))
        xs.append(r["size"])
        ys.append(r["median_s"])
    path = os.path.join(args.out, "topk.png")
    loglog_plot(series, "tensor size (elements)", "seconds (median)",
                f"top-k selection, density {args.density}, {os.cpu_count()} CPU cores", path)
    print(f"plot: {path}", file=sys.stderr)
    return 0
