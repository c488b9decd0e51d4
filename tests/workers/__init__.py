"""Worker modules that tests/hvdrun.py runs on every rank: ``python -m tests.workers.<name>``."""
