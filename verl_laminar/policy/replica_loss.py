"""A rollout replica died under the dispatcher: where its open prompt groups go (pure).

Used by the router that serves verl's replicas (``rollout.router``). verl's vLLM server answers a request only
when it ends, so nothing of a dead replica's in-progress responses survives it: a group that moves restarts
its unfinished requests from the prompt, on a live replica serving the group's version, so the group keeps
one version. A group no live replica can continue at its version is lost: its requests fail with
``ReplicaLost`` and verl's failed-group path clears it and refills the batch with a new prompt.

The decision is ``failover.plan_failover``. With a replacement replica on its way (``laminar.replace``), a group
no live replica serves at its version is parked instead: it waits for the replacement, which loads the group's
version from its relay before it takes anything else. Without one, it is lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Optional

from verl_laminar.policy.dispatch import DispatchState, RoutingError, mark_dead, move_group
from verl_laminar.policy.failover import Health, OrphanGroup, ReplicaView, plan_failover


class ReplicaLost(RoutingError):
    """A request's group was on a replica that died, and no live replica serves the group's version."""


@dataclass(frozen=True)
class ReplicaLoss:
    replica_id: int
    moved: tuple[tuple[str, int], ...]  # (group, live replica on the same version)
    lost: tuple[str, ...]  # groups with no live replica on their version
    complete: tuple[str, ...] = ()  # every response already generated: nothing of them needs a replica
    parked: tuple[str, ...] = ()  # groups that wait for the replacement to load ``parked_version``
    parked_version: Optional[int] = None


def fail_replica(state: DispatchState, replica_id: int, group_sizes: Mapping[str, int],
                 started_s: Mapping[str, float], load: Mapping[int, int], now_s: float,
                 complete: Collection[str] = (), park: bool = False) -> tuple[DispatchState, ReplicaLoss]:
    """Mark ``replica_id`` dead and move each of its open groups to the least loaded live replica serving the
    group's version (a refreshing replica is about to change version and takes none). Lost groups stay pinned
    to the dead replica, where ``route`` refuses them, until their requests fail and ``finish_group`` ends
    them. Groups in ``complete`` had every response generated before the death (they are still open while
    their rewards are computed and they are stored): they are neither moved nor lost, and stay pinned until
    ``finish_group``; losing them would discard trajectories that verl goes on to train. ``park``: a replacement
    replica is on its way, so the groups that would be lost are parked for it (they stay pinned to the dead
    replica, like lost ones, until the caller moves them). Marking a replica dead twice is an error: the caller
    checks ``alive`` first."""
    dead = state.replica(replica_id)
    if not dead.alive:
        raise RoutingError(f"replica {replica_id} is already dead")
    state = mark_dead(state, replica_id)
    done = tuple(sorted(g for g in dead.open_groups if g in complete))
    orphans = [OrphanGroup(g, state.pins[g].version, int(group_sizes.get(g, 1)), float(started_s.get(g, now_s)))
               for g in sorted(dead.open_groups) if g not in complete]
    views = [ReplicaView(r.replica_id, r.version,
                         Health.ALIVE if r.alive and r.refreshing_to is None else Health.DEAD,
                         int(load.get(r.replica_id, 0)))
             for r in state.replicas]
    # a dead replica served one version, so the plan parks at most one (the caller confirms the relays hold it)
    plan = plan_failover(orphans, views, now_s, relay_versions=[dead.version] if park else (),
                         max_age_s=float("inf") if park else 0.0)
    for group, target in plan.moves:
        state = move_group(state, group, target)
    parked = tuple(sorted(g for _, gs in plan.replacements for g in gs))
    return state, ReplicaLoss(replica_id, plan.moves, tuple(sorted(plan.regenerate)), done, parked,
                              dead.version if parked else None)
