"""Benchmarks: ``python -m tf_commlib.bench topk|comm ...`` print a table, write a PNG plot, and
with ``--json`` print one JSON object per measurement."""
