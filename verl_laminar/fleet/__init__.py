"""The rollout fleet: components that keep the replicas serving (replacement of dead replicas so far).

Each component takes narrow callables (what it may ask and do), never a host object whose fields it reads, so
the same component runs under verl's trainer and in tests with fakes.
"""
