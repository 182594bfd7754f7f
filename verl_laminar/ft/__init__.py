"""Fault tolerance: the runtime that survives rollout, relay, pool and trainer deaths, and its trainer."""
