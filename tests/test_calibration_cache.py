"""Calibration is paid once per cluster: costmodel.cached_calibration writes the measured link
parameters, reuses them for the same layout, hosts and arguments, and measures again on request, for
another cluster, or where the file is unreadable (with a warning naming it)."""
import json
import os
import stat

import pytest

import tf_commlib
from tf_commlib import costmodel
from tf_commlib.alphabeta import LinkParams

SIZES = costmodel.sizes_for(2**16)   # calibrate's smallest sizes: seconds on one rank


@pytest.fixture(scope="module")
def topo():
    return tf_commlib.init()


def _counting(monkeypatch):
    calls = []
    real = costmodel.calibrate

    def counted(topo, **kwargs):
        calls.append(kwargs)
        return real(topo, **kwargs)

    monkeypatch.setattr(costmodel, "calibrate", counted)
    return calls


def test_measured_once_then_read_back(topo, tmp_path, monkeypatch):
    calls, path = _counting(monkeypatch), tmp_path / "ckpt" / "calibration.json"
    first, how = costmodel.cached_calibration(topo, str(path), **SIZES)
    assert how == "measured" and len(calls) == 1 and path.exists()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and not list(path.parent.glob(".calibration-*"))
    again, how = costmodel.cached_calibration(topo, str(path), **SIZES)
    assert how == "cached" and len(calls) == 1 and again == first and again.compute_curve == first.compute_curve
    _, how = costmodel.cached_calibration(topo, str(path), remeasure=True, **SIZES)
    assert how == "measured" and len(calls) == 2


def test_another_cluster_or_settings_are_measured_again(topo, tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setattr(costmodel, "calibrate", lambda topo, **kw: LinkParams(beta_inter=1e-6))
    costmodel.cached_calibration(topo, str(path), **SIZES)
    saved = json.loads(path.read_text())
    assert saved["key"]["layout"] == [topo.m, topo.n] and len(saved["key"]["hosts"]) == 64
    for change in ({"layout": [2, 2]}, {"hosts": "0" * 64}, {"tensorflow": "2.0.0"}):
        path.write_text(json.dumps({**saved, "key": {**saved["key"], **change}}))
        monkeypatch.setattr(costmodel, "calibrate", lambda topo, **kw: LinkParams(beta_inter=2e-6))
        params, how = costmodel.cached_calibration(topo, str(path), **SIZES)
        assert how == "measured" and params.beta_inter == 2e-6, change
    _, how = costmodel.cached_calibration(topo, str(path), sizes=(2**19, 2**21))   # other arguments
    assert how == "measured"


@pytest.mark.parametrize("text", ["{not json", json.dumps({"key": {}, "params": [1.0, 2.0]}),
                                  json.dumps({"params": [float("nan")] * 8}), json.dumps([1, 2, 3])])
def test_an_unreadable_cache_warns_and_measures_again(topo, tmp_path, monkeypatch, text):
    path = tmp_path / "calibration.json"
    path.write_text(text)
    monkeypatch.setattr(costmodel, "calibrate", lambda topo, **kw: LinkParams(beta_inter=3e-6))
    with pytest.warns(UserWarning, match=f"calibration cache {path} is unreadable"):
        params, how = costmodel.cached_calibration(topo, str(path), **SIZES)
    assert how == "measured" and params.beta_inter == 3e-6
    assert costmodel.cached_calibration(topo, str(path), **SIZES)[1] == "cached"   # rewritten


def test_bad_arguments_are_refused(topo):
    with pytest.raises(ValueError, match="path must be a file path"):
        costmodel.cached_calibration(topo, None)
    with pytest.raises(ValueError, match="remeasure must be True or False"):
        costmodel.cached_calibration(topo, "/tmp/x.json", remeasure="yes")
