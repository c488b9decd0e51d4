"""Timing, table and plot helpers shared by the benchmarks."""
import json

from tf_commlib.timing import median_time  # noqa: F401  (re-exported for the benchmarks)


def print_table(rows, columns, out):
    """rows: list of dicts; columns: list of (key, header, format)."""
    widths = [max(len(h), *(len(fmt.format(r[k])) for r in rows)) for k, h, fmt in columns]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)), file=out)
    for r in rows:
        print("  ".join(fmt.format(r[k]).rjust(w) for (k, _, fmt), w in zip(columns, widths)), file=out)


def print_json(rows, keys, out):
    for r in rows:
        print(json.dumps({k: r[k] for k in keys}), file=out)


def loglog_plot(series, xlabel, ylabel, title, path):
    """series: {label: (xs, ys)}; writes a log-log PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
