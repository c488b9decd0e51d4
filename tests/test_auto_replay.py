"""Replays the decisions that ``auto`` logged in recorded runs: the DAWNBench script's auto_log.jsonl of a
bench tta run, each decision with its inputs (settings, the state before it, the predicted steps of the
epochs left, a trace's cost), the command, commit and each configuration's time to the target in the
file's first row.

* tests/data/auto_replay/: runs of the model (tf_commlib.auto.decide) on both image sets at 5, 25,
  100 Mbit/s and unshaped: the decision function makes every recorded choice again from its inputs,
  and after the first epoch the run ran what the configuration that reached the target fastest runs
  (except in LOSSES, named with what won).
* tests/data/auto_replay_before/: runs logged by the rules the model replaced (their inputs read as the
  same measurements; digits, 5 Mbit/s to unshaped, *_rules.jsonl): from those inputs the model chooses
  what the fastest configuration ran; and one where the rules chose a slower candidate."""
import json
import pathlib

import pytest

from tf_commlib.auto.decide import replay

DATA = pathlib.Path(__file__).resolve().parent / "data"
RUNS = sorted((DATA / "auto_replay").glob("*.jsonl"))
BEFORE = sorted((DATA / "auto_replay_before").glob("*_rules.jsonl"))


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# where the model's choice did not reach the target fastest: the photo patches unshaped (seed 0), where
# dense fp16 reached it in 3 epochs and the rounds (their steps counted as exact aggregation's, 1.2x
# dense's images/s) in 4: 65.4 s against 56.5 (the rules chose the rounds there too: 79.2 s against
# 79.0 over 3 seeds at 1f61902). What drift between nodes costs in steps is not measured.
LOSSES = {"patches_unshaped": ("dense_fp16", "diloco")}


def _fastest(meta):
    return {meta["fastest"]} if isinstance(meta["fastest"], str) else set(meta["fastest"])


def test_there_are_recorded_runs_on_both_image_sets_at_four_bandwidths():
    keys = {(m["dataset"], m["inter_mbit"]) for m in (_rows(p)[0] for p in RUNS)}
    assert keys == {(d, b) for d in ("digits", "patches") for b in (5, 25, 100, 0)}, sorted(keys)


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_every_recorded_choice_replays(path):
    meta, *rows = _rows(path)
    decisions = [r for r in rows if "choice" in r and "inputs" in r]
    assert decisions, f"{path.name} holds no decision with its inputs"
    assert [replay(d) for d in decisions] == [d["choice"] for d in decisions]
    ran = [r["ran"] for r in rows if "ran" in r]
    if path.stem in LOSSES:   # the loss as recorded: another configuration was the fastest
        assert (meta["fastest_config"], set(ran)) == (LOSSES[path.stem][0], {LOSSES[path.stem][1]})
        return
    # after the first epoch (whose step time has to be measured before the rounds can be weighed), the
    # run ran what the fastest configuration runs
    assert ran[1:] and set(ran[1:]) <= _fastest(meta), (ran, meta["fastest_config"], meta["tta_s"])


@pytest.mark.parametrize("path", BEFORE, ids=[p.stem for p in BEFORE])
def test_the_rules_logged_inputs_give_the_fastest_configurations_choice(path):
    meta, *rows = _rows(path)
    decisions = [r for r in rows if "choice" in r and "inputs" in r]
    assert decisions and all(replay(d) in _fastest(meta) for d in decisions)


def test_a_recorded_slower_choice_now_goes_to_the_fastest():
    """A run recorded while the rounds' time counted at 1.25x where they were not running (a handicap for
    an accuracy cost no epoch measured): at epoch 0 it chose PowerSGD (0.168 s a step of progress against
    the rounds' 0.145 x 1.25), which then needed 5 epochs and 1.28x the rounds' time to the target. From
    the same inputs the model chooses the rounds."""
    meta, *rows = _rows(DATA / "auto_replay_before" / "digits_25mbit_handicap.jsonl")
    first = next(r for r in rows if "choice" in r)
    assert first["choice"] == "powersgd" and meta["fastest"] == "diloco"
    assert replay(first) == "diloco"
