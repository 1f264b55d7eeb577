"""Benchmarks of the planner, each run from the repository's root as `python -m bench.NAME`."""
