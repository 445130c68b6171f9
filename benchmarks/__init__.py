"""Repeatable measurements of stepfork_otel; run them all with ``python benchmarks/run.py``."""
