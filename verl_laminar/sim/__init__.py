"""Discrete-event simulator of Laminar and its baselines at 64-1,024 GPUs (see docs/simulator.md)."""
