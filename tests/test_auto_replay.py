"""Replays the decisions that ``auto`` logged in recorded runs (tests/data/auto_replay/*.jsonl: the
DAWNBench script's auto_log.jsonl of a bench tta run, its command and commit in the file's first row):
the decision function (tf_commlib.auto.decide) makes every recorded choice again from the inputs
logged with it, and the runs' choices are those of the configuration that reached the target fastest
in them (the DiLoCo rounds at these bandwidths: docs/benchmarks.md)."""
import json
import pathlib

import pytest

from tf_commlib.auto.decide import replay

DATA = pathlib.Path(__file__).resolve().parent / "data" / "auto_replay"
RUNS = sorted(DATA.glob("*.jsonl"))


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_there_are_recorded_runs():
    assert len(RUNS) >= 2, RUNS


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_every_recorded_choice_replays(path):
    meta, *rows = _rows(path)
    decisions = [r for r in rows if "choice" in r and "inputs" in r]
    assert decisions, f"{path.name} holds no decision with its inputs"
    assert [replay(d) for d in decisions] == [d["choice"] for d in decisions]
    ran = [r["ran"] for r in rows if "ran" in r]
    fastest = meta["fastest"]
    # after the first epoch (whose step time has to be measured before the rounds can be weighed), the
    # run ran what the fastest configuration runs
    assert ran[1:] and set(ran[1:]) == {fastest}, (ran, fastest)


def test_a_recorded_slower_choice_now_goes_to_the_fastest():
    """A run recorded while the rounds' time counted at 1.25x where they were not running (a handicap for
    an accuracy cost no epoch measured): at epoch 0 it chose PowerSGD (0.168 s a step of progress against
    the rounds' 0.145 x 1.25), which then needed 5 epochs and 1.28x the rounds' time to the target. From
    the same inputs, with the rounds' steps counted as exact aggregation's, the decision is the rounds."""
    meta, *rows = _rows(DATA.parent / "auto_replay_before" / "digits_25mbit_handicap.jsonl")
    first = next(r for r in rows if "choice" in r)
    assert first["choice"] == "powersgd" and meta["fastest"] == "diloco"
    settings = first["inputs"]["settings"]
    settings["rounds"] = sorted(settings.pop("handicap"))   # the candidates that carried a handicap
    assert replay(first) == "diloco"
