"""Benchmarks: ``python -m benchmarks.launch`` and ``python -m benchmarks.compare``."""
