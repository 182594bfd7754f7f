"""A checkpointing GRPO trainer process for the fault-tolerant runtime: killed, it restarts where it stopped.

Dataflow (one step):
    ledger.lease(k groups)  -> verl's GRPO advantages (reward standardised within the group)
                            -> verl's clipped policy loss (clip-higher) against the rollout log-probs,
                               one AdamW step on the FSDP2-sharded policy
                            -> verl checkpoint (``ft.verl_state``): verl's FSDPCheckpointManager writes model,
                               optimizer and RNG under global_step_N/actor, Laminar adds the trained-group list,
                               then verl's tracker file moves to N (atomic rename)
                            -> ledger.commit(step, groups)   (after the checkpoint, so a commit is never
                               ahead of what a restart would load)
                            -> publish the weights as version ``step`` to the master relay
Restart: the new process loads the newest verl checkpoint (model, AdamW moments, RNG), tells the ledger which
groups it trained (``TrainLedger.recover``: leased-but-untrained groups go back to the buffer), republishes
its version if the relay does not have it, and continues. Nothing is trained twice and nothing is lost.

The state, loss and checkpoints are verl's; the loop is this small one, not verl's ``TaskRunner``: verl's
TaskRunner owns the rollout replicas, so killing verl's trainer kills the rollouts with it (see
docs/fault_tolerance.md).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerSettings:
    model_dir: str
    ckpt_dir: str
    ledger_name: str
    relay_group: str
    namespace: Optional[str] = None
    groups_per_step: int = 2
    lr: float = 1e-5
    clip_low: float = 0.2
    clip_high: float = 0.28
    micro_batch: int = 4
    lease_timeout_s: float = 2.0
    threads: int = 1

    def __post_init__(self) -> None:
        if self.groups_per_step < 1 or self.micro_batch < 1:
            raise ValueError(f"groups_per_step={self.groups_per_step} and micro_batch={self.micro_batch} must be "
                             ">= 1")
        if not 0 < self.clip_low < 1 or self.clip_high <= 0:
            raise ValueError(f"clip_low={self.clip_low} must be in (0, 1) and clip_high={self.clip_high} > 0")


class CheckpointedTrainer:
    def __init__(self, settings: TrainerSettings) -> None:
        import torch

        from verl_laminar.ft.verl_state import VerlPolicyState

        self.s = settings
        torch.set_num_threads(settings.threads)
        self.state = VerlPolicyState(settings.model_dir, settings.ckpt_dir, settings.lr, settings.clip_low,
                                     settings.clip_high)
        self._engine: Any = None
        self.started_s = time.time()

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def trained(self) -> dict[str, int]:
        return self.state.trained

    # ---- plumbing ----
    def _ledger(self) -> Any:
        import ray

        return ray.get_actor(self.s.ledger_name, namespace=self.s.namespace)

    def _relay_engine(self) -> Any:
        if self._engine is None:
            from verl_laminar.relay.verl_backend import RelayCheckpointEngine

            self._engine = RelayCheckpointEngine(is_master=True, group_name=self.s.relay_group,
                                                 namespace=self.s.namespace, timeout_s=60.0)
        return self._engine

    def _weights(self):
        return self.state.full_weights()

    def publish(self, version: int) -> None:
        import asyncio

        engine = self._relay_engine()
        engine._last_version = max(engine._last_version, version - 1)
        asyncio.run(engine.send_weights(self._weights(), global_steps=version))

    def relay_newest(self) -> Optional[int]:
        import ray

        group = ray.get_actor(self.s.relay_group, namespace=self.s.namespace)
        master = ray.get(group.master.remote(), timeout=30)
        relay = ray.get_actor(ray.get(group.actor_name.remote(master), timeout=30), namespace=self.s.namespace)
        return ray.get(relay.newest.remote(), timeout=30)

    # ---- lifecycle ----
    def recover(self) -> dict:
        """Reconcile the ledger with this checkpoint and make sure its version is on the relays."""
        import ray

        out = ray.get(self._ledger().recover.remote(self.trained), timeout=60)
        # connect to the master relay now: a new process's first publish otherwise pays the connection
        # (6-8 s measured in the chaos run) inside its first training step, after recovery was declared
        self._relay_engine().connect()
        newest = self.relay_newest()
        if self.step > 0 and (newest is None or newest < self.step):
            self.publish(self.step)  # the previous process died between its checkpoint and its publish
            out["republished"] = self.step
        out["step"] = self.step
        return out

    def train_step(self, groups: list) -> dict:
        seqs = []  # (ids, response start, rollout log-probs, reward, group index)
        for gi, g in enumerate(groups):
            for t in sorted(g.trajectories, key=lambda t: t.key):
                p = t.payload
                seqs.append((list(p["prompt_ids"]) + list(p["token_ids"]), len(p["prompt_ids"]),
                             list(p["log_probs"]), float(p["reward"]), gi))
        return self.state.train_step(seqs, self.s.micro_batch)

    def run(self, max_steps: Optional[int] = None) -> int:
        """Train until ``max_steps`` steps exist or the ledger closes; returns the last step."""
        import ray

        from verl_laminar.buffer.experience import BufferClosed, BufferTimeout

        ledger = self._ledger()
        publish_s, n_here = None, 0  # the previous step's publish time; steps taken by this process
        while max_steps is None or self.step < max_steps:
            t_lease = time.time()
            try:
                groups = ray.get(ledger.lease.remote(self.s.groups_per_step, self.s.lease_timeout_s))
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, BufferTimeout):
                    continue
                if isinstance(e.cause, BufferClosed):
                    break
                raise
            t0 = time.time()
            info = self.train_step(groups)
            t1 = time.time()
            step = self.step + 1
            self.state.save(step, dict(self.trained, **{g.group_id: step for g in groups}))
            n_here += 1
            # where a step's time goes, so a slow window after a fault can be told from a short-response one
            timing = {"lease_wait_s": round(t0 - t_lease, 3), "train_s": round(t1 - t0, 3),
                      "checkpoint_s": round(time.time() - t1, 3), "prev_publish_s": publish_s,
                      "process_step": n_here}
            ray.get(ledger.commit.remote(step, [g.group_id for g in groups], info["tokens"],
                                         info["prompt_tokens"], timing))
            t2 = time.time()
            self.publish(step)
            publish_s = round(time.time() - t2, 3)
            logger.info("step %d: %d trajectories, %d tokens, loss %.4f, %.2f s", step, info["trajectories"],
                        info["tokens"], info["loss"], time.time() - t0)
        return self.step


class TrainerActor(CheckpointedTrainer):
    """Ray actor shell: one process; killing it (SIGKILL by PID) is the trainer-failure fault."""

    def pid(self) -> int:
        return os.getpid()
