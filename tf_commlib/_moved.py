"""The applications left this package for ``tfc_apps``: an old command name says the new one and
exits non-zero; an old import raises ImportError with the new name."""
import sys

NEW = {"tf_commlib.train": "tfc_apps.train", "tf_commlib.cluster_launch": "tfc_apps.cluster_launch",
       "tf_commlib.apps": "tfc_apps", "tf_commlib.bench": "tfc_apps.bench"}


def moved(old):
    """Call at the top of an old module; ``old`` is its former name (``__name__`` is __main__ under -m)."""
    argv = list(getattr(sys, "orig_argv", []))
    target = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if target == old or target.startswith(old + "."):
        new = NEW[old] + target[len(old):]
        print(f"`python -m {target}` moved: run `python -m {new}`", file=sys.stderr)
        sys.exit(2)
    raise ImportError(f"{old} moved to {NEW[old]}: import that instead")
