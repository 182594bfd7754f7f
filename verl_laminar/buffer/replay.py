"""verl's async replay buffer, sampling through Laminar's ExperienceBuffer.

Dataflow (trainer process, inside ``sample(partition_id="train")``):
    poll TransferQueue tags (verl's _sync_metadata_from_transfer_queue)
      -> failed prompt groups: cleared and refilled (as verl), discarded in the ExperienceBuffer
      -> newly finished prompt groups: one Trajectory per session; its version = single_version of every
         output's min/max_global_steps label (the per-sample check: a mixed trajectory raises), and the
         ExperienceBuffer checks one version per group
      -> ExperienceBuffer.take(batch_size): complete groups, first completed first
    -> verl's _materialize_batch of those groups
verl's own staleness eviction (``max_off_policy_threshold``) is not used: Laminar measures n - j instead.
Validation sampling is verl's unchanged.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Callable, Optional

from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from verl_laminar.buffer import POLL_S
from verl_laminar.buffer.experience import BufferTimeout, ExperienceBuffer, Trajectory
from verl_laminar.policy.accounting import InvariantViolation, single_version

logger = logging.getLogger(__name__)

Planner = Callable[[int, list, list, int], Optional[list]]  # (step, ready (group, version), dropped, size) -> groups
HEALTH_EVERY_S = 5.0  # how often a wait for samples asks whether the rollout side still runs


def trajectories_of_group(uid: str, partition: dict[str, dict], rollout_n: Optional[int] = None) -> list[Trajectory]:
    """One Trajectory per session of a finished prompt group, from its TransferQueue tags.

    Keys are ``{uid}_{session}_{index}``; every output of a session must carry one version label.
    """
    labels: dict[str, list] = defaultdict(list)
    prefix = f"{uid}_"
    for key, tag in partition.items():
        if not key.startswith(prefix):
            continue
        parts = key.split("_")
        if len(parts) != 3 or parts[0] != uid:
            continue
        labels[f"{parts[0]}_{parts[1]}"] += [tag.get("min_global_steps"), tag.get("max_global_steps")]
    size = len(labels)
    if rollout_n is not None and size != rollout_n:
        raise InvariantViolation(f"finished group {uid!r} has {size} sessions in TransferQueue, expected "
                                 f"rollout.n={rollout_n}")
    return [Trajectory(key=k, group_id=uid, group_size=size, version=single_version(k, v), payload=None)
            for k, v in sorted(labels.items())]


def restored_records(partition: dict[str, dict], rollout_n: Optional[int], n_now: int, t: float) -> list:
    """The finished groups of a TransferQueue partition restored from a verl checkpoint, as ledger records.

    verl's resume keeps finished trajectories (and re-issues pending/running prompts); this process's router
    never saw them start, so the ledger adopts them here or training them would count as an unknown
    trajectory. Each keeps its generating version from its tags; its replica is unknown (-1) and it counts
    as finished at ``n_now``, the restored step."""
    from verl_laminar.policy.accounting import TrajectoryRecord

    out = []
    for uid, tag in sorted(partition.items()):
        if not tag.get("is_prompt") or tag.get("status") != "finished":
            continue
        for traj in trajectories_of_group(uid, partition, rollout_n):
            outs = [partition[k] for k in sorted(partition) if k.startswith(traj.key + "_")]
            prompt = int(outs[-1].get("prompt_len") or 0)
            response = int(outs[-1].get("response_len") or 0)
            out.append(TrajectoryRecord(traj.key, uid, -1, traj.version, t, t, prompt, response,
                                        max(n_now, traj.version)))
    return out




class LaminarReplayBuffer(ReplayBufferAsync):
    def __init__(self, *args: Any, rollout_n: Optional[int] = None, health: Optional[Callable[[], None]] = None,
                 planner: Optional[Planner] = None, **kwargs: Any) -> None:
        kwargs.setdefault("poll_interval", POLL_S)
        super().__init__(*args, **kwargs)
        self.rollout_n = rollout_n
        self._health, self._health_at = health, float("-inf")
        self.experience = ExperienceBuffer()
        self._fed: set[str] = set()
        self.planner = planner  # laminar.buffer.max_staleness: which complete groups a step trains (trainer.bound)
        self._dropped: list[str] = []  # failed groups not yet told to the planner
        self.checked_trajectories = 0

    def _sync_metadata_from_transfer_queue(self) -> None:
        # Every wait for samples (training, validation, verl's and ours) polls here. A rollout side that stopped
        # (the router after a failed refresh) produces nothing more, so ``health`` raises its cause in the trainer
        # rather than leaving the wait to hang.
        if self._health is not None and time.monotonic() - self._health_at >= HEALTH_EVERY_S:
            self._health_at = time.monotonic()
            self._health()
        super()._sync_metadata_from_transfer_queue()

    def _feed(self, partition_id: str) -> int:
        """Move newly terminal groups of one poll into the ExperienceBuffer; returns failed groups refilled."""
        failed = set(self.failure_keys[partition_id])
        if failed:
            self._clear_groups(partition_id, failed)
            for uid in failed:
                self.experience.discard_group(uid, "rollout failure")
                self._dropped.append(uid)
            logger.warning("%d prompt groups failed; refilling as many prompts", len(failed))
        partition = self.partitions[partition_id]
        for uid in sorted(self.finished_keys[partition_id] - self._fed):
            trajs = trajectories_of_group(uid, partition, self.rollout_n)
            if not trajs:
                raise InvariantViolation(f"prompt group {uid!r} is finished but has no trajectory in TransferQueue")
            for t in trajs:
                self.experience.put(t)
            self.checked_trajectories += len(trajs)
            self._fed.add(uid)
        return len(failed)

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        if partition_id != "train":
            return super().sample(global_steps, partition_id, batch_size)
        while True:
            self._sync_metadata_from_transfer_queue()
            refill = self._feed(partition_id)
            if refill and self.refill_fn is not None:
                self.refill_fn(refill)
            try:
                if self.planner is None:
                    groups = self.experience.take(batch_size, timeout=0 if refill else self.poll_interval)
                else:
                    groups = self._planned(global_steps, batch_size, 0 if refill else self.poll_interval)
                break
            except BufferTimeout:
                continue
        uids = [g.group_id for g in groups]
        return self._materialize_batch(partition_id, uids, dict(self.partitions[partition_id])), {}

    def _planned(self, step: int, batch_size: int, wait_s: float) -> list:
        """The batch the staleness bound chose (earliest deadline first), or BufferTimeout to poll again."""
        ready = self.experience.ready()
        chosen = None
        if len(ready) >= batch_size:
            chosen, self._dropped = self.planner(step, ready, self._dropped, batch_size), []
        if chosen is None:
            time.sleep(wait_s)
            raise BufferTimeout(f"{len(ready)} complete groups; step {step} waits for its batch")
        return self.experience.take_ids(chosen)
