"""The router as a named Ray actor: a thin shell over ``rollout.router.LaminarRouter`` that exposes only its
external API.

Its own module so that agent-loop workers, which only look the router up by name, do not import the router. The
router's other public methods are the narrow host protocols its own components call in-process (refresh, repack,
failover: ``commit``, ``state``, ``retarget``, ``pump``...); through the shell no other process can reach them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from verl_laminar.policy.timeouts import RefreshSettings

if TYPE_CHECKING:
    from verl_laminar.rollout.books import ReplicaHandles
    from verl_laminar.rollout.router import RepackSettings

ROUTER_NAME = "laminar_router"

# name -> whether LaminarRouter's method is a coroutine (the shell awaits it on the actor's event loop)
TRAINER_API = {"start": True, "on_publish": True, "close": True, "drain_events": False, "snapshot": False,
               "versions": False, "failure": False, "plan_batch": False}
AGENT_LOOP_API = {"assign_group": True, "adopt_group": True, "acquire_pinned": True, "release_server": True,
                  "migrated": True, "trajectory_finished": True, "finish_group": True, "report_violation": True,
                  "replica_failed": True, "replica_misbehaved": True, "continued_from_pool": False}
FLEET_API = {"add_replica": False, "replacement_failed": False, "dead_replicas": False, "open_groups_on": False,
             "movable_groups_on": False, "busy_replicas": False, "inflight_on": False, "total_inflight": False}
# verl's RequestLoadBalancer protocol (rollout.balancer): verl's own code calls these on its global balancer
VERL_BALANCER_API = {"acquire_server": True, "require_acquire_fields": False, "require_release_fields": False,
                     "add_servers": False, "remove_servers": False, "get_all_servers": False, "get_status": False,
                     "clear_sticky_cache": False, "get_total_inflight": False}
EXTERNAL_API = {**TRAINER_API, **AGENT_LOOP_API, **FLEET_API, **VERL_BALANCER_API}


def _forward(name: str, is_async: bool) -> Callable:
    if is_async:
        async def call(self, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self._router, name)(*args, **kwargs)
    else:
        def call(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self._router, name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


class RouterShell:
    """Holds the router; forwards each method of ``EXTERNAL_API`` and nothing else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from verl_laminar.rollout.router import LaminarRouter

        self._router = LaminarRouter(*args, **kwargs)


for _name, _is_async in EXTERNAL_API.items():
    setattr(RouterShell, _name, _forward(_name, _is_async))


def spawn_router(replicas: Sequence[ReplicaHandles], groups_per_batch: int, relays: Optional[dict] = None,
                 max_concurrency: int = 10_000, name: str = ROUTER_NAME,
                 repack: Optional[RepackSettings] = None, refresh: Optional[RefreshSettings] = None,
                 chain_relays: int = 1, replacements: int = 0, max_staleness: Optional[int] = None,
                 batch_groups: Optional[int] = None) -> Any:
    """The Ray actor: each unassigned group holds one pending call, so concurrency must exceed the queue.

    ``refresh`` (``LaminarConfig.refresh_settings``) and ``chain_relays`` (the relay chain's length, master
    included) set the refresh deadlines; the defaults suit one machine. ``replacements``: how many dead replicas
    the fleet will replace (``laminar.replace``), so that losing every replica waits for one instead of failing.
    ``max_staleness``: ``laminar.buffer.max_staleness`` (None: measured, not bounded); ``batch_groups``: the
    groups each training step takes (``data.train_batch_size``), which the bound's admission counts in."""
    import ray

    from verl_laminar.fleet.helpers import here

    # beside the trainer's loop (hard affinity to this node: it needs no CPU, so it always fits): a 0-CPU actor lands on any node otherwise, and a chaos
    # run lost its router with the rollout machine it had landed on
    return ray.remote(RouterShell).options(name=name, max_concurrency=max_concurrency, num_cpus=0,
                                           scheduling_strategy=here(soft=False)).remote(
        replicas, groups_per_batch, relays=relays, repack=repack, refresh=refresh, chain_relays=chain_relays,
        replacements=replacements, max_staleness=max_staleness, batch_groups=batch_groups)
