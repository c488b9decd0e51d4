"""The check that every rank runs the same aggregation at the same step.

Each checked call all-gathers one row of int64 per rank: the step, fingerprints of the gradients'
shapes and dtypes, of the algorithm candidates and of the selector/op, the active algorithm and the
density. Any difference raises ValueError on every rank, saying which of them differ and how, so
a rank that skipped a step, changed its density or runs another algorithm stops the job at once
instead of pairing its collectives with another step's (or hanging on mismatched buffers).
"""
import zlib

import numpy as np
import tensorflow as tf

from tf_commlib import link_bytes
from tf_commlib import primitives

FIELDS = ("step", "gradient shapes", "gradient dtypes", "algorithm candidates", "selector/op",
          "active algorithm", "density", "state owner")   # the order of a row
STATE_HINT = ("the per-rank state (residuals, DGC momentum) was restored from another rank's "
              "checkpoint; save and restore it per rank (tf_commlib.keras.BackupAndRestore, or a "
              "checkpoint path per rank), or call reset_rank_state() to start it from zero")


def _crc(value):
    return zlib.crc32(repr(value).encode()) & 0x7FFFFFFF


def readable(grads, candidates, selector, op):
    """{field: value} of the fields known when tracing, in FIELDS order."""
    return {"gradient shapes": [None if g is None else tuple(g.shape) for g in grads],
            "gradient dtypes": [None if g is None else g.dtype.name for g in grads],
            "algorithm candidates": list(candidates), "selector/op": (selector, op)}


def static_fingerprints(mine):
    """The fingerprints of readable()'s fields, in FIELDS order."""
    return tuple(_crc(mine[f]) for f in FIELDS if f in mine)


def describe(rows, candidates, mine=None):
    """'' when every rank's row is the same, else what differs (one clause per field); ``mine``:
    {field: this rank's readable value} for the fields that travel as fingerprints."""
    rows = np.asarray(rows, np.int64)
    clauses = []
    for f, name in enumerate(FIELDS):
        col = rows[:, f]
        if name == "state owner":
            if col.any():
                owners = [None if v == 0 else int(v) - 1 for v in col]
                clauses.append(f"{STATE_HINT} (the rank whose state each rank holds, None = its own: {owners})")
            continue
        if (col == col[0]).all():
            continue
        if name == "density":
            values = col.view(np.float64).tolist()
        elif name == "active algorithm" and (rows[:, 3] == rows[0, 3]).all():
            values = [candidates[i] if 0 <= i < len(candidates) else int(i) for i in col]
        elif name in ("step", "active algorithm"):
            values = col.tolist()
        else:
            values = [f"fingerprint {v:x}" for v in col]
        here = f" (this rank's: {mine[name]})" if mine and name in mine else ""
        clauses.append(f"{name} differ{'' if name.endswith('s') else 's'} by rank: {values}{here}")
    if not clauses:
        return ""
    return ("ranks are out of step or configured differently (every rank must run the same "
            "aggregation at the same step): " + "; ".join(clauses))


def check(world, step, static, active, density, candidates, foreign_owner=0, mine=None):
    """All-gathers this rank's row over `world` and raises ValueError where ranks differ (eagerly
    a ValueError; in a graph the op fails with the same message). ``foreign_owner``: 0, or 1 + the
    rank whose per-rank state this rank holds."""
    row = tf.stack([tf.cast(step, tf.int64), *[tf.constant(v, tf.int64) for v in static],
                    tf.cast(active, tf.int64),
                    tf.bitcast(tf.cast(density, tf.float64), tf.int64),
                    tf.cast(foreign_owner, tf.int64)])
    with link_bytes.not_counted():   # control traffic, not the collective's bytes
        rows = primitives.allgather(row[None], world)
    if tf.executing_eagerly():
        message = describe(rows.numpy(), candidates, mine)
        if message:
            raise ValueError(message)
        return rows

    def raise_if_different(r):
        message = describe(r, candidates, mine)
        if message:
            raise ValueError(message)
        return np.int64(0)

    done = tf.numpy_function(raise_if_different, [rows], tf.int64, stateful=True)
    with tf.control_dependencies([done]):
        return tf.identity(rows)
