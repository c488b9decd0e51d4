"""bench e2e's exposed-communication columns and target line, computed from given phase numbers (no
timing), its command line, and the profiling twin of a GradientAggregator it times."""
import math

import numpy as np
import pytest

from tfc_apps.bench import e2e


def row(config, step_s, fwd_bwd, update, aggregation, images_per_s=10.0, resolution=64, threshold=1 << 20):
    phases = {"input": 0.001, "forward_backward": fwd_bwd, "optimizer": update, "aggregation": aggregation}
    return {"resolution": resolution, "config": config, "fusion_threshold_bytes": threshold, "buckets": 3,
            "step_s": step_s, "images_per_s": images_per_s, **phases, **e2e.exposure(step_s, phases)}


def test_exposure_from_phase_numbers():
    out = e2e.exposure(1.0, {"forward_backward": 0.5, "optimizer": 0.1, "aggregation": 0.8})
    assert out["compute_s"] == pytest.approx(0.6)
    assert out["comm_s"] == pytest.approx(0.8)
    assert out["exposed_comm_s"] == pytest.approx(0.4)            # 1.0 - 0.6
    assert out["overlap_ratio"] == pytest.approx(1.0 / 0.8)       # the longer one is comm
    # compute the longer one; a step shorter than compute (noise) gives a negative exposure
    out = e2e.exposure(0.9, {"forward_backward": 0.9, "optimizer": 0.1, "aggregation": 0.2})
    assert out["exposed_comm_s"] == pytest.approx(-0.1) and out["overlap_ratio"] == pytest.approx(0.9)
    # no breakdown: NaN, not a number that looks measured
    out = e2e.exposure(1.0, {})
    assert all(math.isnan(out[k]) for k in ("compute_s", "comm_s", "exposed_comm_s", "overlap_ratio"))


def test_table_rows_ratios_within_resolution_and_threshold():
    rows = [row("dense_fp32", 2.0, 0.5, 0.1, 1.2, images_per_s=16.0),
            row("dense_fp16", 1.0, 0.5, 0.1, 0.6, images_per_s=32.0),
            row("hitopk@0.01", 0.8, 0.5, 0.1, 0.2, images_per_s=40.0),
            row("dense_fp16", 1.0, 0.5, 0.1, 0.6, images_per_s=20.0, threshold=64 << 20)]
    shown = e2e.table_rows(rows)
    assert [r["vs_old"] for r in shown[:3]] == [1.0, 2.0, 2.5]
    assert [r["vs_base"] for r in shown[:3]] == [0.5, 1.0, 1.25]
    assert shown[3]["vs_base"] == 1.0 and math.isnan(shown[3]["vs_old"])   # no dense_fp32 at 64 MB
    assert shown[1]["exposed_ms"] == pytest.approx(400.0) and shown[1]["compute_ms"] == pytest.approx(600.0)
    assert shown[1]["step_ms"] == pytest.approx(1000.0) and shown[3]["threshold_mb"] == 64.0
    text = e2e.table({"layout": "2x2", "batch": 8, "model": "small", "shaped_mbit": 100, "rows": rows}, "link")
    header = text.splitlines()[1].split()
    for column in ("compute", "comm", "exposed", "step/max", "vs", "dense_fp16", "buckets"):
        assert column in header
    assert len([line for line in text.splitlines() if "hitopk@0.01" in line]) == 1


def test_ratios_against_the_median_of_repeated_baseline_rows():
    rows = [row("dense_fp16", 1.0, 0.5, 0.1, 0.6, images_per_s=v) for v in (10.0, 40.0, 20.0)]
    rows.append(row("hitopk@0.01", 0.8, 0.5, 0.1, 0.2, images_per_s=30.0))
    shown = e2e.table_rows(rows)
    assert shown[3]["vs_base"] == pytest.approx(1.5)   # 30 / median(10, 40, 20), not the first or last run
    assert [r["vs_base"] for r in shown[:3]] == pytest.approx([0.5, 2.0, 1.0])
    assert e2e.medians(rows, (64, 1 << 20)) == {"dense_fp16": 20.0, "hitopk@0.01": 30.0}
    assert e2e.medians(rows, (96, 1 << 20)) == {}


def test_target_line_judged_only_at_100_mbit():
    met = row("dense_fp16", 1.10, 0.9, 0.1, 0.5)           # 1.10 / max(1.0, 0.5) = 1.10 <= 1.15
    missed = row("dense_fp16", 1.50, 0.9, 0.1, 0.5, resolution=96)
    other = row("hitopk@0.01", 9.0, 0.9, 0.1, 0.5)
    lines = e2e.target_lines([met, missed, other], 100)
    assert len(lines) == 2 and lines[0].endswith(": met") and lines[1].endswith(": NOT met")
    assert "1.100" in lines[0] and "1.500" in lines[1]
    assert all("not judged" in line for line in e2e.target_lines([met], 500))
    assert all("not judged" in line for line in e2e.target_lines([met], None))
    assert "no breakdown" in e2e.target_lines([row("dense_fp16", 1.0, math.nan, 0.1, 0.5)], 100)[0]


def test_target_judges_the_median_of_repeated_rows():
    rows = [row("dense_fp16", step, 0.9, 0.1, 0.5) for step in (1.40, 1.10, 1.12)]   # ratios 1.40 1.10 1.12
    lines = e2e.target_lines(rows + [row("dense_fp16", 1.30, 0.9, 0.1, 0.5, resolution=96)], 100)
    assert len(lines) == 5 and "median" not in "".join(lines[:4])   # one per row, then one per group
    assert "64px" in lines[4] and "median of 3 rows" in lines[4] and "1.120" in lines[4]
    assert lines[4].endswith(": met")
    two = e2e.target_lines(rows[:1] + [row("dense_fp16", 1.20, 0.9, 0.1, 0.5)], 100)
    assert "1.300" in two[-1] and two[-1].endswith(": NOT met")   # even count: mean of the middle two
    assert "not judged" in e2e.target_lines(rows, 25)[-1]


def test_configs_and_command_line():
    for name in ("dense", "2dtar", "hitopk@0.001", "hitopk@0.01"):   # the original names still run
        assert name in e2e.CONFIGS
    assert e2e.CONFIGS["dense_fp32"] == ("dense", 1.0, "none", False)
    assert e2e.CONFIGS["dense_fp16"] == ("dense", 1.0, "fp16", True)
    assert e2e.CONFIGS["hitopk@0.01_no_overlap"][3] is False and e2e.CONFIGS["powersgd"][0] == "powersgd"
    args = e2e.parser().parse_args(["--fusion-threshold-bytes", "262144", "1048576"])
    assert args.fusion_threshold_bytes == [262144, 1048576] and args.configs == e2e.DEFAULT_CONFIGS
    assert e2e.parser().parse_args([]).fusion_threshold_bytes is None
    with pytest.raises(SystemExit):
        e2e.main(["--fusion-threshold-bytes", "-1"])
    from tf_commlib.aggregator import check_config
    from tf_commlib.collectives import with_compression
    for algorithm, density, compression, _ in e2e.CONFIGS.values():
        check_config(algorithm, density, "mstopk")
        with_compression(None, compression)


def test_aggregator_twin_has_the_configuration_and_fresh_state():
    from tf_commlib.aggregator import ExecutionSettings, GradientAggregator
    from tf_commlib.collectives import with_compression
    from tf_commlib.topology import Topology

    topo = Topology(m=2, n=2, rank=0, node=0, local=0, intra_ranks=(0, 1), inter_ranks=(0, 2))
    agg = GradientAggregator(["hitopk", "2dtar"], density=0.05, fusion_threshold_bytes=400, topology=topo,
                             seed=3, algorithm_options=with_compression(None, "fp16"),
                             execution=ExecutionSettings(overlap=False))
    agg.build([((30, 4), np.float32), None, ((50,), np.float32)])
    agg.set_density(0.2)
    agg.set_algorithm("2dtar")
    for var in agg.residual_variables():
        var.assign(np.ones(var.shape, np.float32))
    twin = agg.twin()
    assert twin.buckets == agg.buckets and len(agg.buckets) == 2
    assert twin.candidates == agg.candidates and twin.selector == agg.selector and twin.seed == 3
    assert twin.algorithm_options == agg.algorithm_options and twin.algorithm_options["2dtar"]["compression"] == "fp16"
    assert twin.execution.overlap is False and twin.fusion_threshold_bytes == 400 and twin.topo is topo
    assert float(twin.density.numpy()) == 0.2 and int(twin.active.numpy()) == 1
    assert sorted(twin.residuals) == sorted(agg.residuals)
    for key, var in twin.residuals.items():
        assert var is not agg.residuals[key] and not np.any(var.numpy())


def test_doc_commands_parse():
    """Every `bench e2e` command the docs show parses with e2e's parser (its --configs are choices)."""
    import shlex

    from tests.test_docs import doc_commands

    shown = [cmd for cmd, _ in doc_commands() if cmd.startswith("python -m tfc_apps.bench e2e")]
    assert len(shown) >= 3
    for cmd in shown:
        e2e.parser().parse_args(shlex.split(cmd)[4:])


def test_default_threshold_splits_the_small_model_into_several_buckets():
    """The exact collectives' bucket size (chosen with bench e2e, docs/training.md) is
    GradientAggregator's default and DistributedOptimizer's for an exact algorithm, and the DAWNBench
    'small' model (1.65 MB in its sparse group) gets several buckets at it, so it can overlap; with
    64 MB (the lossy collectives' size) it has one."""
    import inspect

    import keras
    import tensorflow as tf

    from tf_commlib import fusion
    from tf_commlib.aggregator import GradientAggregator
    from tf_commlib.keras import DistributedOptimizer
    from tf_commlib.keras.policy import default_dense_layers
    from tfc_apps.dawnbench import models

    default = inspect.signature(GradientAggregator.__init__).parameters["fusion_threshold_bytes"].default
    assert default == fusion.DEFAULT_THRESHOLD_BYTES and type(default) is int
    for algorithm in ("dense", "2dtar"):
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), algorithm=algorithm)
        assert opt.fusion_threshold_bytes == fusion.DEFAULT_THRESHOLD_BYTES
    model = models.build("small", 1000)
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in model.trainable_variables if not default_dense_layers(v)]
    assert len(fusion.plan(specs, fusion.LOSSY_THRESHOLD_BYTES)) == 1
    buckets = fusion.plan(specs, fusion.DEFAULT_THRESHOLD_BYTES)
    assert len(buckets) >= 3
    assert all(sum(b.sizes) * 4 <= fusion.DEFAULT_THRESHOLD_BYTES or len(b.sizes) == 1 for b in buckets)
    assert fusion.largest_bucket(specs, fusion.DEFAULT_THRESHOLD_BYTES) == max(sum(b.sizes) for b in buckets)
    assert fusion.largest_bucket(specs, fusion.LOSSY_THRESHOLD_BYTES) == sum(s.shape.num_elements() for s in specs)
    assert fusion.largest_bucket([], 1 << 20) == 1
    # a lossy collective's default size fitted to the model: the small model keeps the 1 MB layout,
    # ResNet-50's compressible gradients (about 97 MB) get buckets of a quarter of them
    assert fusion.bucket_threshold(fusion.LOSSY_THRESHOLD_BYTES, specs) == fusion.DEFAULT_THRESHOLD_BYTES
    resnet = [tf.TensorSpec(v.shape, v.dtype) for v in models.build("resnet50", 1000).trainable_variables
              if not default_dense_layers(v)]
    total = sum(s.shape.num_elements() * 4 for s in resnet)
    assert 90 << 20 < total < 100 << 20
    assert fusion.bucket_threshold(fusion.LOSSY_THRESHOLD_BYTES, resnet) == total // 4
    assert fusion.bucket_threshold(fusion.DEFAULT_THRESHOLD_BYTES, resnet) == fusion.DEFAULT_THRESHOLD_BYTES
