"""Reward functions and the fault-tolerance boundary that runs them."""
