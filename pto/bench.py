"""Moved: `python -m tfc_apps.bench pto`."""
import sys

print("`python -m pto.bench` moved: run `python -m tfc_apps.bench pto`", file=sys.stderr)
sys.exit(2)
