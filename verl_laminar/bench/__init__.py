"""Benchmarks: ``python -m verl_laminar.bench.<name>``."""
