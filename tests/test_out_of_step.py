"""Ranks out of step or configured differently raise a clear error on every rank."""

import numpy as np
import pytest

from tf_commlib import consistency


def _rows(**changes):
    """Four ranks' consistency rows, equal but for {field: [value by rank]}."""
    rows = np.tile(np.array([5, 11, 22, 33, 44, 0, np.float64(0.01).view(np.int64), 0], np.int64), (4, 1))
    for field, values in changes.items():
        rows[:, consistency.FIELDS.index(field)] = values
    return rows


def test_equal_rows_pass():
    assert consistency.describe(_rows(), ["hitopk"]) == ""


@pytest.mark.parametrize("changes,expected", [
    (dict(step=[5, 6, 5, 5]), "step differs by rank: [5, 6, 5, 5]"),
    ({"density": np.array([0.01, 0.02, 0.01, 0.01]).view(np.int64)}, "density differs by rank: [0.01, 0.02, 0.01, 0.01]"),
    ({"active algorithm": [0, 1, 0, 0]}, "active algorithm differs by rank: ['hitopk', '2dtar', 'hitopk', 'hitopk']"),
    ({"algorithm candidates": [1, 2, 1, 1]}, "algorithm candidates differ by rank"),
    ({"gradient dtypes": [1, 1, 2, 1]}, "gradient dtypes differ by rank"),
    ({"state owner": [0, 1, 1, 1]}, "restored from another rank's checkpoint"),
])
def test_describe_names_what_differs(changes, expected):
    message = consistency.describe(_rows(**changes), ["hitopk", "2dtar"])
    assert expected in message and message.startswith("ranks are out of step or configured differently")
    assert "shapes or dtypes" not in message


def test_out_of_step_and_mismatched_ranks_fail_on_every_rank(shared):
    reports = shared("2x2", "consistency")
    for r in reports:
        # rank 1 skipped step 2: every rank fails at the next call, eagerly and in a tf.function
        assert "step differs by rank: [2, 3, 2, 2]" in r["skip_eager"], r["skip_eager"]
        assert "step differs by rank: [2, 3, 2, 2]" in r["skip_graph"], r["skip_graph"]
        assert "density differs by rank: [0.01, 0.02, 0.01, 0.01]" in r["density"], r["density"]
        assert "algorithm candidates differ" in r["algorithm"], r["algorithm"]
        assert "shapes or dtypes" not in r["algorithm"]
        # check_consistency=False still checks the first call: a dtype mismatch fails, never hangs
        assert "gradient dtypes differ" in r["dtype_unchecked"], r["dtype_unchecked"]
        assert "gradient dtypes differ" in r["dtype_unchecked_graph"], r["dtype_unchecked_graph"]
        assert r["after_ok"]
    assert "this rank's: ['naive_ag']" in reports[3]["algorithm"]

