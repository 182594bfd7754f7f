"""Laminar's rollout fleet glue: the group router, per-replica refresh, the pinned client, the agent loop.

Import the pieces from their modules; this package imports nothing heavy.
"""
