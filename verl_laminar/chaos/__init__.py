"""Chaos benchmark for the fault-tolerant runtime (``python -m verl_laminar.chaos``)."""
