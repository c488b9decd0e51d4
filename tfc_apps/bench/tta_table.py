"""bench tta's results: a run's summary, ratios to the baseline, medians over seeds, the verdict and
`best:` lines, the tables, the JSON lines and the plot of top-1 against wall-clock time."""
import json
import statistics

BASELINE = "dense_fp16"


def summarize(rows, config, inter_mbit, link, target, seed=0):
    """One run's JSON object (contract: config, inter_mbit, tta_s, final_top1, samples_per_s,
    inter_mb_per_step, baseline)."""
    rates = sorted(r["images_per_s"] for r in (rows[1:] or rows))
    reached = next((r for r in rows if r["top1"] is not None and r["top1"] >= target), None)
    return {"config": config, "inter_mbit": inter_mbit, "seed": seed, "link": link, "target_top1": target,
            "tta_s": None if reached is None else reached["wall_s"],
            "tta_epoch": None if reached is None else reached["epoch"],
            "final_top1": rows[-1]["top1"], "best_top1": max(r["top1"] for r in rows),
            "samples_per_s": rates[len(rates) // 2],
            "inter_mb_per_step": rows[-1]["inter_bytes_per_step"] / 1e6,
            "intra_mb_per_step": rows[-1]["intra_bytes_per_step"] / 1e6,
            "wall_s": rows[-1]["wall_s"], "train_s": sum(r["epoch_s"] for r in rows),
            "eval_s": sum(r["eval_s"] for r in rows), "other_s": sum(r["other_s"] for r in rows),
            "epochs": [{"epoch": r["epoch"], "wall_s": r["wall_s"], "top1": r["top1"], "loss": r["loss"]}
                       for r in rows],
            "baseline": config == BASELINE}


def add_ratios(results):
    """tta_vs_baseline: a run's time to target over the baseline's at its bandwidth and seed (None where
    either never reached it)."""
    for r in results:
        base = next((b for b in results if b["inter_mbit"] == r["inter_mbit"] and b.get("seed") == r.get("seed")
                     and b["baseline"]), None)
        ok = base is not None and base["tta_s"] and r["tta_s"] is not None
        r["tta_vs_baseline"] = r["tta_s"] / base["tta_s"] if ok else None
        r["speed_vs_baseline"] = r["samples_per_s"] / base["samples_per_s"] if base else None


def _median(values):
    """The median, None counting as never (larger than any value); None if the median is never."""
    ordered = sorted(values, key=lambda v: (v is None, v or 0))
    mid = ordered[(len(ordered) - 1) // 2:len(ordered) // 2 + 1]
    return None if None in mid else statistics.fmean(mid)


def medians(results):
    """One row per (bandwidth, configuration): a single run as it is; K runs (--repeats) as the
    medians over their seeds of time to target, its epoch, final top-1, samples/s and wall time, the
    ratios to the baseline being those of the medians (as the verdict states them); `runs` counts
    the runs and `tta_each_s` lists their times (each run's own ratio stays in its JSON object)."""
    groups = {}
    for r in results:
        groups.setdefault((r["inter_mbit"], r["config"]), []).append(r)
    out = []
    for runs in groups.values():
        row = dict(runs[0], runs=len(runs), tta_each_s=[r["tta_s"] for r in runs])
        if len(runs) > 1:
            row.pop("epochs", None)
            for key in ("tta_s", "tta_epoch", "final_top1", "samples_per_s", "inter_mb_per_step", "wall_s"):
                row[key] = _median([r.get(key) for r in runs])
        out.append(row)
    for row in (r for r in out if r["runs"] > 1):
        base = next((b for b in out if b["inter_mbit"] == row["inter_mbit"] and b["baseline"]), None)
        row["tta_vs_baseline"] = row["tta_s"] / base["tta_s"] if base and base["tta_s"] and row["tta_s"] else None
        row["speed_vs_baseline"] = row["samples_per_s"] / base["samples_per_s"] if base else None
    return out


def verdict(runs):
    """Which configuration reached the target first at one bandwidth, and by how much (runs: one row
    per configuration, from medians())."""
    reached = sorted((r for r in runs if r["tta_s"] is not None), key=lambda r: r["tta_s"])
    if not reached:
        return "no configuration reached the target: raise --epochs or lower --target"
    best, base = reached[0], next((r for r in runs if r["baseline"]), None)
    if base is None:
        return f"fastest to target: {best['config']} ({best['tta_s']:.0f} s); the baseline {BASELINE} did not run"
    if base["tta_s"] is None:
        return f"{best['config']} won: {best['tta_s']:.0f} s; the baseline {BASELINE} never reached the target"
    if best["baseline"]:
        second = reached[1] if len(reached) > 1 else None
        tail = (f"; the best compressed or other configuration, {second['config']}, needed "
                f"{second['tta_s'] / base['tta_s']:.2f}x its time") if second else ""
        return f"the baseline {BASELINE} won ({base['tta_s']:.0f} s): compression lost here{tail}"
    return (f"{best['config']} won: {best['tta_s']:.0f} s, {best['tta_s'] / base['tta_s']:.2f}x the baseline's "
            f"{base['tta_s']:.0f} s ({base['tta_s'] / best['tta_s']:.2f}x faster)")


def best_line(runs):
    """What a user who changes nothing gets at one bandwidth: ``auto`` against the fastest
    configuration to target (runs: one row per configuration, from medians()); None without auto."""
    auto = next((r for r in runs if r["config"] == "auto"), None)
    if auto is None:
        return None
    reached = sorted((r for r in runs if r["tta_s"] is not None), key=lambda r: r["tta_s"])
    if not reached:
        return "best: no configuration reached the target"
    best = reached[0]
    if auto["tta_s"] is None:
        return f"best: {best['config']} ({best['tta_s']:.0f} s); auto never reached the target"
    if best is auto or best["tta_s"] == auto["tta_s"]:
        return f"best: auto ({auto['tta_s']:.0f} s) was the fastest configuration"
    return (f"best: {best['config']} ({best['tta_s']:.0f} s); auto {auto['tta_s']:.0f} s, "
            f"{auto['tta_s'] / best['tta_s']:.2f}x the fastest")


def add_auto_vs_best(rows):
    """auto_vs_best on auto's rows: its time to target over the fastest configuration's at its
    bandwidth and seed (None where auto or every configuration never reached it)."""
    for r in (r for r in rows if r["config"] == "auto"):
        same = [b["tta_s"] for b in rows if b["inter_mbit"] == r["inter_mbit"] and b.get("seed") == r.get("seed")
                and b["tta_s"] is not None]
        r["auto_vs_best"] = r["tta_s"] / min(same) if same and r["tta_s"] is not None else None


def json_lines(results):
    """One JSON object per run (its epochs left out: they are in OUT/tta.json)."""
    return "\n".join(json.dumps({k: v for k, v in r.items() if k != "epochs"}) for r in results)


def fmt(v, spec, none="never"):
    return none if v is None else format(v, spec)


def tables(results, target):
    rows, out = medians(results), []
    seeds_run = max(r["runs"] for r in rows)
    repeated = seeds_run > 1
    for mbit in dict.fromkeys(r["inter_mbit"] for r in rows):
        runs = [r for r in rows if r["inter_mbit"] == mbit]
        out.append(f"inter-node {'unshaped' if mbit == 0 else f'{mbit} Mbit/s'} ({runs[0]['link']}); "
                   f"time to top-1 >= {target}" + (f"; medians of {seeds_run} seeds" if repeated else ""))
        out.append(f"{'config':>11} {'tta s':>7} {'vs base':>7} {'epoch':>5} {'final top1':>10} {'samples/s':>9} "
                   f"{'vs base':>7} {'inter MB/step':>13} {'wall s':>7}" + ("  tta s of each seed" if repeated else ""))
        for r in runs:
            epoch = r["tta_epoch"]
            epoch = "-" if epoch is None else f"{epoch:.0f}" if epoch == int(epoch) else f"{epoch:.1f}"
            out.append(f"{r['config']:>11} {fmt(r['tta_s'], '7.1f'):>7} {fmt(r['tta_vs_baseline'], '7.2f', '-'):>7} "
                       f"{epoch:>5} "
                       f"{r['final_top1']:10.4f} {r['samples_per_s']:9.1f} "
                       f"{fmt(r['speed_vs_baseline'], '7.2f', '-'):>7} {r['inter_mb_per_step']:13.3f} "
                       f"{r['wall_s']:7.1f}" + (f"  {' '.join(fmt(t, '.1f') for t in r['tta_each_s'])}"
                                                if repeated else ""))
        out.append(verdict(runs))
        if best_line(runs):
            out.append(best_line(runs))
        measured = {r["config"]: r["calibration_s"] for r in runs if r.get("calibration_s") is not None}
        for config, seconds in measured.items():
            out.append(f"{config}'s calibration (link, compute, candidates; once per cluster, before its runs): "
                       f"{seconds:.1f} s")
        out.append("")
    return "\n".join(out)


def plot(results, target, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bands = list(dict.fromkeys(r["inter_mbit"] for r in results))
    fig, axes = plt.subplots(1, len(bands), figsize=(5.2 * len(bands), 4.4), squeeze=False)
    colors = {c: f"C{i}" for i, c in enumerate(dict.fromkeys(r["config"] for r in results))}
    for ax, mbit in zip(axes[0], bands):
        labelled = set()
        for r in (r for r in results if r["inter_mbit"] == mbit):   # with --repeats: a line per seed
            label = None if r["config"] in labelled else r["config"] + (" (baseline)" if r["baseline"] else "")
            labelled.add(r["config"])
            ax.plot([e["wall_s"] for e in r["epochs"]], [e["top1"] for e in r["epochs"]], marker="o",
                    color=colors[r["config"]], lw=2.2 if r["baseline"] else 1.2, label=label)
        ax.axhline(target, color="gray", ls="--", lw=0.8)
        ax.set_title("unshaped" if mbit == 0 else f"inter-node {mbit} Mbit/s", fontsize=10)
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("validation top-1")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
