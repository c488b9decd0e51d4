"""`python -m tfc_apps.bench tta`: time to accuracy against the baseline (dense fp16, overlapped).
The arithmetic of the table from given epoch rows, the refusal of bad arguments, and a --quick run
of the real benchmark (4 ranks, unshaped) whose table and JSON must have their shape."""
import json
import os
import subprocess
import sys

import pytest

from tfc_apps import local_run
from tfc_apps.bench import tta, tta_table


def rows(top1s, epoch_s=10.0, rate=100.0, inter=1e6):
    out, wall = [], 0.0
    for i, t in enumerate(top1s):
        wall += epoch_s + 1.0
        out.append({"epoch": i + 1, "top1": t, "loss": 1.0, "wall_s": wall, "epoch_s": epoch_s, "eval_s": 0.5,
                    "other_s": 0.5, "images_per_s": rate * (0.5 if i == 0 else 1.0),
                    "inter_bytes_per_step": inter, "intra_bytes_per_step": 2 * inter})
    return out


def test_time_to_target_is_the_first_epoch_that_reaches_it():
    r = tta_table.summarize(rows([0.5, 0.91, 0.88, 0.95]), "hitopk", 25, "link", 0.9)
    assert r["tta_s"] == 22.0 and r["tta_epoch"] == 2
    assert r["final_top1"] == 0.95 and r["best_top1"] == 0.95
    assert r["samples_per_s"] == 100.0   # the median after the first epoch (tracing)
    assert r["inter_mb_per_step"] == 1.0 and r["baseline"] is False
    assert r["train_s"] == 40.0 and r["eval_s"] == 2.0 and r["other_s"] == 2.0
    never = tta_table.summarize(rows([0.5, 0.6]), "powersgd", 25, "link", 0.9)
    assert never["tta_s"] is None and never["tta_epoch"] is None


def test_ratios_and_verdict_per_bandwidth():
    results = [tta_table.summarize(rows(t, epoch_s=e), c, mbit, "link", 0.9)
               for mbit, c, t, e in [(25, "dense_fp16", [0.5, 0.92], 10.0), (25, "hitopk", [0.91, 0.93], 4.0),
                                     (0, "dense_fp16", [0.91, 0.95], 3.0), (0, "hitopk", [0.5, 0.91], 4.0),
                                     (0, "powersgd", [0.5, 0.6], 2.0)]]
    tta_table.add_ratios(results)
    by = {(r["inter_mbit"], r["config"]): r for r in results}
    assert by[25, "hitopk"]["tta_vs_baseline"] == pytest.approx(5.0 / 22.0)
    assert by[25, "dense_fp16"]["tta_vs_baseline"] == 1.0
    assert by[0, "powersgd"]["tta_vs_baseline"] is None
    assert "hitopk won" in tta_table.verdict([r for r in results if r["inter_mbit"] == 25])
    lost = tta_table.verdict([r for r in results if r["inter_mbit"] == 0])
    assert "baseline dense_fp16 won" in lost and "compression lost" in lost and "hitopk" in lost
    table = tta_table.tables(results, 0.9)
    assert table.count("time to top-1 >= 0.9") == 2 and "never" in table
    lines = [json.loads(line) for line in tta_table.json_lines(results).splitlines()]
    assert len(lines) == 5 and all("epochs" not in r for r in lines)
    for key in ("config", "inter_mbit", "tta_s", "final_top1", "samples_per_s", "inter_mb_per_step", "baseline"):
        assert all(key in r for r in lines), key


def test_each_configuration_is_the_dawnbench_run_it_names(tmp_path, registry):
    """What each configuration trains with, through the DAWNBench script's own parser: the baseline is
    dense fp16 overlapped, fp32 waits for backprop, hitopk is DGC at density 0.01 with its momentum
    kept where v was sent (no momentum factor masking: the sent values add up to momentum SGD's)."""
    from tfc_apps.dawnbench import config as dawnbench_config

    for split in ("train", "val"):
        (tmp_path / split).mkdir()

    def parse(argv):
        args = tta.resolve(tta.parser().parse_args(argv))
        args.data = str(tmp_path)
        return args, {c: dawnbench_config.parse(tta.dawnbench_argv(args, c, os.path.join("mbit25", c)))
                      for c in tta.CONFIGS}

    args, parsed = parse([])   # auto_settings' copies are registered where its command line is parsed
    assert parsed[tta.BASELINE].compression == "fp16" and not parsed[tta.BASELINE].no_overlap
    assert parsed["dense_fp32"].no_overlap and parsed["dense_fp32"].compression == "none"
    hitopk = parsed["hitopk"]
    assert (hitopk.schedule_map, hitopk.density, hitopk.selector) == ({0: "hitopk"}, 0.01, "mstopk")
    assert hitopk.no_momentum_masking and hitopk.dgc_warmup == 2
    auto = parsed["auto"]   # where it runs hitopk: the same DGC settings; the link measured once per bandwidth
    assert auto.calibration_cache == os.path.join("mbit25", "calibration.json")
    assert all(parsed[c].calibration_cache is None for c in tta.CONFIGS if not c.startswith("auto"))
    # named candidates (no rounds); the harder settings are registered copies, on every rank that parses
    assert parsed["auto_per_step"].auto_candidates == ["hitopk", "powersgd"] and parsed["auto"].auto_candidates is None
    assert parsed["auto_settings"].auto_candidates == ["hitopk", "hitopk_density_scale_0.1", "powersgd",
                                                       "powersgd_rank_1"]
    assert all(parsed[c].calibrate and parsed[c].density == 0.01 for c in ("auto_per_step", "auto_settings"))
    assert (auto.density, auto.selector, auto.dgc_warmup, auto.no_momentum_masking) == (0.01, "mstopk", 2, True)
    assert not any(parsed[c].no_momentum_masking for c in tta.CONFIGS if c not in ("hitopk", "hitopk_0.001") and
                   not c.startswith("auto"))
    harder = parsed["hitopk_0.001"]   # hitopk's settings at a tenth of its density
    assert (harder.density, harder.dgc_warmup, harder.no_momentum_masking) == (0.001, 2, True)
    assert parsed["powersgd_r1"].powersgd_rank == 1 and parsed["powersgd"].powersgd_rank is None
    assert parsed["auto"].calibrate and all(p.stage_list[0].batch == args.batch == 8 for p in parsed.values())
    # DiLoCo's exchange under the next interval's steps, except where the name says every rank waits for it
    waits = parsed["diloco_h8_int4_no_overlap"]
    assert (waits.diloco, waits.inter_compression, waits.no_overlap) == (8, "int4", True)
    overlapped = [c for c in tta.CONFIGS if c.startswith("diloco") and c != "diloco_h8_int4_no_overlap"]
    assert overlapped and not any(parsed[c].no_overlap for c in overlapped)
    # the DGC warm-up leaves the last epoch at density 0.01: --quick's 2 epochs warm up 1
    _, quick = parse(["--quick"])
    assert quick["hitopk"].dgc_warmup == quick["auto"].dgc_warmup == 1
    _, one = parse(["--epochs", "1"])
    assert one["hitopk"].dgc_warmup == 0


def test_the_dataset_is_written_once_as_an_image_folder(tmp_path, monkeypatch):
    """--dataset patches: the photo patches as OUT/patches32 (train/ and val/, 10 class folders), written
    once and then reused; the digits stay the default."""
    import datacache

    monkeypatch.setattr(tta, "PATCHES_PER_CLASS", (3, 2))
    writes = []
    write = tta.DATASETS["patches"]
    monkeypatch.setitem(tta.DATASETS, "patches", lambda root: writes.append(root) or write(root))
    assert tta.resolve(tta.parser().parse_args([])).dataset == "digits"
    root = tta.default_data(str(tmp_path), "patches")
    assert root == str(tmp_path / "patches32") and writes == [root]
    train, val = (datacache.ImageFolderSource(f"{root}/{split}") for split in ("train", "val"))
    assert train.class_names == [f"class_{c:02d}" for c in range(10)] and (len(train), len(val)) == (30, 20)
    assert tta.default_data(str(tmp_path), "patches") == root and writes == [root]   # not written again


@pytest.mark.parametrize("argv, message", [
    (["--inter-mbit", "-1"], "--inter-mbit must be"),
    (["--target", "1.5"], "--target must be"),
    (["--epochs", "0"], "--epochs must be"),
    (["--repeats", "0"], "--repeats must be"),
    (["--configs", "hitopk", "hitopk"], "--configs: each value once"),
    (["--inter-mbit", "0", "0"], "--inter-mbit: each value once"),
    (["--configs", "nope"], "invalid choice"),
    (["--data", "/nonexistent"], "--data"),
    (["--data", "/tmp", "--dataset", "patches"], "--dataset patches writes"),
    (["--dataset", "imagenet"], "invalid choice"),
])
def test_bad_arguments_are_refused_naming_them(argv, message):
    p = subprocess.run([sys.executable, "-m", "tfc_apps.bench", "tta", *argv], capture_output=True, text=True,
                       env=local_run.job_env(), timeout=120)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_quick_run_prints_one_table_per_bandwidth_with_monotone_time_and_medians_of_seeds(tmp_path):
    """One quick run with --repeats 2 of the baseline and hitopk: each seed's configurations one
    after the other, a table of medians per bandwidth (the configurations' own arguments are
    test_each_configuration_is_the_dawnbench_run_it_names')."""
    out = tmp_path / "tta"
    configs = ["dense_fp16", "hitopk"]
    rc, log = local_run.run(["-m", "tfc_apps.bench", "tta", "--quick", "--repeats", "2", "--seed", "3",
                             "--configs", *configs, "--out", str(out)], timeout=900, check=False)
    assert rc == 0, log[-4000:]
    results = json.loads((out / "tta.json").read_text())
    assert [(r["inter_mbit"], r["config"], r["seed"]) for r in results] == [(0, c, s) for s in (3, 4) for c in configs]
    assert [r["baseline"] for r in results] == [True, False] * 2
    assert all((out / "mbit0" / f"{c}_seed{s}" / "metrics.jsonl").exists() for s in (3, 4) for c in configs)
    for r in results:
        walls = [e["wall_s"] for e in r["epochs"]]
        assert len(walls) == 2 and 0 < walls[0] < walls[1], r
        assert r["tta_s"] is None or r["tta_s"] in walls
        assert 0.0 <= r["final_top1"] <= 1.0 and r["samples_per_s"] > 0
    by = {(r["config"], r["seed"]): r for r in results}
    # what goes between nodes: hitopk at density 0.01 sends far less than dense in 16 bits
    assert by["hitopk", 3]["inter_mb_per_step"] < by["dense_fp16", 3]["inter_mb_per_step"] / 10
    # another seed: other initial weights, data order and augmentation, so another trajectory
    assert by["dense_fp16", 3]["epochs"][0]["loss"] != by["dense_fp16", 4]["epochs"][0]["loss"]
    assert all(by["dense_fp16", s]["tta_vs_baseline"] in (None, 1.0) for s in (3, 4))
    table = [line for line in log.splitlines() if line.strip()]
    head = next(i for i, line in enumerate(table) if line.startswith("inter-node unshaped"))
    assert "medians of 2 seeds" in table[head] and table[head + 1].endswith("tta s of each seed")
    assert table[head + 1].split()[:3] == ["config", "tta", "s"]
    assert [line.split()[0] for line in table[head + 2:head + 4]] == configs
    assert any(w in table[head + 4] for w in ("won", "no configuration reached"))
    assert (out / "tta.png").stat().st_size > 10_000


def test_repeats_give_medians_over_seeds_and_ratios_to_the_same_seed():
    # 3 seeds; each run's ratio is to the same seed's baseline; a seed that never reaches the target
    # counts as slower than any that does
    spec = {("dense_fp16", 0): ([0.5, 0.92], 10.0), ("dense_fp16", 1): ([0.5, 0.5, 0.92], 10.0),
            ("dense_fp16", 2): ([0.5, 0.92], 12.0),
            ("auto", 0): ([0.5, 0.5, 0.91], 10.0), ("auto", 1): ([0.5, 0.91], 10.0), ("auto", 2): ([0.5, 0.6], 9.0),
            ("powersgd", 0): ([0.5, 0.6], 1.0), ("powersgd", 1): ([0.5, 0.6], 1.0), ("powersgd", 2): ([0.95], 1.0)}
    results = [tta_table.summarize(rows(t, epoch_s=e), c, 0, "link", 0.9, seed) for (c, seed), (t, e) in spec.items()]
    tta_table.add_ratios(results)
    by = {(r["config"], r["seed"]): r for r in results}
    assert by["auto", 1]["tta_vs_baseline"] == pytest.approx(22.0 / 33.0)   # seed 1's baseline: 3 epochs
    med = {r["config"]: r for r in tta_table.medians(results)}
    assert med["dense_fp16"]["runs"] == 3 and med["dense_fp16"]["tta_each_s"] == [22.0, 33.0, 26.0]
    assert med["dense_fp16"]["tta_s"] == 26.0 and med["dense_fp16"]["tta_vs_baseline"] == 1.0
    # auto: 33, 22, never -> median 33, against the baseline's median 26 (the verdict's ratio too)
    assert med["auto"]["tta_s"] == 33.0 and med["auto"]["tta_vs_baseline"] == pytest.approx(33.0 / 26.0)
    assert med["auto"]["tta_epoch"] == 3 and med["powersgd"]["tta_s"] is None   # never, never, 2 s
    assert med["dense_fp16"]["final_top1"] == 0.92 and "epochs" not in med["auto"]
    assert tta_table._median([1.0, 3.0]) == 2.0 and tta_table._median([1.0, None]) is None and tta_table._median([2.0]) == 2.0
    table = tta_table.tables(results, 0.9)
    assert "medians of 3 seeds" in table and "22.0 33.0 26.0" in table and "33.0 22.0 never" in table
    assert "the baseline dense_fp16 won (26 s)" in table and "auto, needed 1.27x its time" in table
    # one seed: the rows are the runs themselves, the table as without --repeats
    single = [r for r in results if r["seed"] == 0]
    assert [r["tta_s"] for r in tta_table.medians(single)] == [r["tta_s"] for r in single]
    assert "seeds" not in tta_table.tables(single, 0.9)


def test_best_line_puts_auto_against_the_fastest_configuration():
    spec = {(25, "dense_fp16"): ([0.5, 0.92], 10.0), (25, "hitopk"): ([0.91], 8.0), (25, "auto"): ([0.5, 0.91], 6.0),
            (0, "dense_fp16"): ([0.91], 3.0), (0, "auto"): ([0.91], 2.0),
            (5, "dense_fp16"): ([0.91], 30.0), (5, "auto"): ([0.5, 0.6], 9.0)}
    results = [tta_table.summarize(rows(t, epoch_s=e), c, mbit, "link", 0.9) for (mbit, c), (t, e) in spec.items()]
    tta_table.add_ratios(results)
    tta_table.add_auto_vs_best(results)
    by = {(r["inter_mbit"], r["config"]): r for r in results}
    assert by[25, "auto"]["auto_vs_best"] == pytest.approx(14.0 / 9.0)   # epochs take epoch_s + 1 s and by[0, "auto"]["auto_vs_best"] == 1.0
    assert by[5, "auto"]["auto_vs_best"] is None and "auto_vs_best" not in by[25, "hitopk"]
    lines = {mbit: tta_table.best_line([r for r in results if r["inter_mbit"] == mbit]) for mbit in (25, 0, 5)}
    assert lines[25] == "best: hitopk (9 s); auto 14 s, 1.56x the fastest"
    assert lines[0] == "best: auto (3 s) was the fastest configuration"
    assert lines[5] == "best: dense_fp16 (31 s); auto never reached the target"
    assert tta_table.best_line([by[25, "dense_fp16"]]) is None
    table = tta_table.tables(results, 0.9)
    assert table.count("best: ") == 3 and "auto 14 s, 1.56x the fastest" in table
    assert "auto's calibration" not in table
    by[25, "auto"]["calibration_s"] = 12.34   # measured once per bandwidth, before the runs: said apart
    assert "auto's calibration (link, compute, candidates; once per cluster, before its runs): 12.3 s" \
        in tta_table.tables(results, 0.9).split("inter-node unshaped")[0]
    args = tta.parser().parse_args([])
    tta.resolve(args)
    assert args.inter_mbit == [5, 25, 100, 0]
