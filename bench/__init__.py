"""Benchmarks: run each as a module (`python -m bench.journal`), not a test; see README.md."""
