import sys

USAGE = "usage: python -m tf_commlib.bench {topk} [options]  (-h after the name for its options)"


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "topk":
        from tf_commlib.bench import topk
        return topk.main(rest)
    print(f"unknown benchmark {name!r}\n{USAGE}", file=sys.stderr)
    return 2


sys.exit(main(sys.argv[1:]))
