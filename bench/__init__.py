"""Benchmarks: plain scripts, not tests (see README.md). A package only so the type checker can
tell `bench/harness.py` from the `harness` package."""
