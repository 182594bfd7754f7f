"""Whether a starting trainer attaches to a rollout fleet that outlived its predecessor, or sweeps it (pure).

For rollouts that outlive verl's ``TaskRunner`` (``docs/fleet_ownership.md``). ``require_outliving_cluster`` is
checked by ``fleet.outlive.check_cluster`` when ``laminar.fleet.detached`` is on. ``decide_attach`` (taking a running
fleet's replicas over) is not called yet: a restarted trainer sweeps the replicas it finds after they drain and
adopts what they finished from the pool instead (``policy.adopt``).

Attaching is safe only when everything the fleet holds is a version the resumed trainer also has: the router and the
relays refuse a version at or below their newest, and a trainer resuming from checkpoint ``s`` publishes ``s`` (then
``s+1``, ...). A fleet that already saw ``t > s`` holds versions of a branch the restart throws away, under the numbers
the new branch will use, so its groups would mix two policies under one label. With ``trainer.save_freq=1`` the
checkpoint is written before each publication, so ``t <= s`` except after a crash between the save and the publish.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional


class FleetAction(str, Enum):
    CREATE = "create"  # no fleet is running: build one
    ATTACH = "attach"  # take the running fleet's replicas, relays, pool and router
    SWEEP = "sweep"  # end the running fleet (its work is lost), then build one


@dataclass(frozen=True)
class RunningFleet:
    """What the fleet's manifest says about it (``None`` for a field it does not know)."""

    newest_version: Optional[int]  # the newest version any relay or replica holds
    fingerprint: str  # model path, parallelism and replica shape it was built for
    live_replicas: int


@dataclass(frozen=True)
class AttachDecision:
    action: FleetAction
    reason: str
    republish: bool = True  # False: the fleet already holds the checkpoint's version (same bytes): no publication


NAMESPACE_KEY = "ray_kwargs.ray_init.namespace"
# one wording for the preflight row (before Ray starts) and the trainer's check (at set-up)
NO_NAMESPACE = "the rollout fleet cannot be found again: the job runs in a random Ray namespace"
NAMESPACE_FIX = (f"set +{NAMESPACE_KEY}=<a fixed name> "
                 "(e.g. laminar_${trainer.project_name}_${trainer.experiment_name})")


class FleetAttachError(ValueError):
    """The fleet cannot outlive the job as configured; the message says what to change."""


def require_outliving_cluster(cluster_outlives_job: bool, stable_namespace: bool) -> None:
    """A fleet outlives its job only in a cluster from ``ray start`` and is found again only in a fixed namespace."""
    if not cluster_outlives_job:
        raise FleetAttachError(
            "the rollout fleet cannot outlive this job: the job started its own Ray cluster, which ends with it; "
            "start one first (ray start --head) and connect to it (RAY_ADDRESS=auto, or "
            "+ray_kwargs.ray_init.address=auto), or set laminar.fleet.detached=false")
    if not stable_namespace:
        raise FleetAttachError(f"{NO_NAMESPACE}; {NAMESPACE_FIX}")


def decide_attach(resume_mode: str, checkpoint_step: Optional[int], fleet: Optional[RunningFleet],
                  fingerprint: str, cluster_outlives_job: bool, stable_namespace: bool) -> AttachDecision:
    """``resume_mode``: verl's ``trainer.resume_mode`` (``auto``, ``disable`` or ``resume_path``);
    ``checkpoint_step``: the step verl will resume from (``None``: it starts fresh); ``fingerprint``: this run's, to
    compare with the fleet's; ``cluster_outlives_job``: the Ray cluster came from ``ray start`` (not from this job's
    own ``ray.init``); ``stable_namespace``: ``ray_kwargs.ray_init.namespace`` is set (else a relaunch cannot see the
    fleet's named actors)."""
    require_outliving_cluster(cluster_outlives_job, stable_namespace)
    if fleet is None:
        return AttachDecision(FleetAction.CREATE, "no fleet of this experiment is running")
    if fleet.live_replicas < 1:
        return AttachDecision(FleetAction.SWEEP, "the running fleet has no live replica")
    if resume_mode == "disable" or checkpoint_step is None:
        return AttachDecision(FleetAction.SWEEP, "the trainer starts from scratch (no checkpoint to resume), so the "
                                                 "fleet's versions belong to another run")
    if fleet.fingerprint != fingerprint:
        return AttachDecision(FleetAction.SWEEP, f"the fleet was built for another configuration "
                                                 f"({fleet.fingerprint!r}, this run {fingerprint!r})")
    t, s = fleet.newest_version, int(checkpoint_step)
    if t is not None and t > s:
        return AttachDecision(FleetAction.SWEEP, f"the fleet holds version {t}, newer than the checkpoint's {s}: its "
                                                 "groups of versions above the checkpoint were generated by a branch "
                                                 "the restart discards (trainer.save_freq=1 keeps them in step)")
    return AttachDecision(FleetAction.ATTACH, f"the fleet's newest version ({t}) is at or below the checkpoint's ({s})",
                          republish=t != s)
