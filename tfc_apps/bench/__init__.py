"""Benchmarks: ``python -m tfc_apps.bench topk|comm ...`` print a table, write a PNG plot, and
with ``--json`` print one JSON object per measurement."""
