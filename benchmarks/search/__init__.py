"""Planner benchmark on simulated response surfaces (``python -m benchmarks.search``). SIMULATED."""
