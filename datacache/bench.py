"""Moved: `python -m tfc_apps.bench datacache`."""
import sys

print("`python -m datacache.bench` moved: run `python -m tfc_apps.bench datacache`", file=sys.stderr)
sys.exit(2)
