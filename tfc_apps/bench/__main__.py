import importlib
import sys

BENCHMARKS = ("topk", "comm", "convergence", "e2e", "datacache", "pto", "tta", "faults")
USAGE = f"usage: python -m tfc_apps.bench {{{','.join(BENCHMARKS)}}} [options]  (-h after the name for its options)"


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}\n{USAGE}", file=sys.stderr)
        return 2
    return importlib.import_module(f"tfc_apps.bench.{name}").main(rest)


sys.exit(main(sys.argv[1:]))
