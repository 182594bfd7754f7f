"""The router as a named Ray actor (``rollout.router.LaminarRouter`` in a ``ray.remote`` shell).

Its own module so that agent-loop workers, which only look the router up by name, do not import the router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from verl_laminar.policy.timeouts import RefreshSettings

if TYPE_CHECKING:
    from verl_laminar.rollout.books import ReplicaHandles
    from verl_laminar.rollout.router import RepackSettings

ROUTER_NAME = "laminar_router"


def spawn_router(replicas: Sequence[ReplicaHandles], groups_per_batch: int, relays: Optional[dict] = None,
                 max_concurrency: int = 10_000, name: str = ROUTER_NAME,
                 repack: Optional[RepackSettings] = None, refresh: Optional[RefreshSettings] = None,
                 chain_relays: int = 1, replacements: int = 0) -> Any:
    """The Ray actor shell: each unassigned group holds one pending call, so concurrency must exceed the queue.

    ``refresh`` (``RefreshSettings.from_laminar``) and ``chain_relays`` (the relay chain's length, master
    included) set the refresh deadlines; the defaults suit one machine. ``replacements``: how many dead replicas
    the fleet will replace (``laminar.replace``), so that losing every replica waits for one instead of failing."""
    import ray

    from verl_laminar.rollout.router import LaminarRouter

    return ray.remote(LaminarRouter).options(name=name, max_concurrency=max_concurrency, num_cpus=0).remote(
        replicas, groups_per_batch, relays=relays, repack=repack, refresh=refresh, chain_relays=chain_relays,
        replacements=replacements)
