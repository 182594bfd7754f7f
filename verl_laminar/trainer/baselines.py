"""verl's separate_async (one-step-off) trainer as a baseline on hosts where verl has no weight transport.

verl 0.9.1 moves weights to standalone rollout replicas through a checkpoint engine (nccl, hccl, nixl, mooncake):
none runs on the CPU platform. ``checkpoint_engine.backend=laminar`` (our relays) can carry them, but its relay
group is started by the Laminar trainer. ``trainer.v1.trainer_mode=separate_async_relays`` is verl's
``PPOTrainerSeparateAsync`` unchanged (its global abort / weight sync / resume every step) with that group
started after verl's set-up, and the CPU priorities the Laminar trainer uses (rollouts at nice 19: the CPU stand-in
for separate trainer and rollout devices), so the two differ only in what the benchmark compares.
"""

from __future__ import annotations

import logging

import ray
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

from verl_laminar.trainer import procs, relays

logger = logging.getLogger(__name__)
TRAINER_NAME = "separate_async_relays"


@register_trainer(TRAINER_NAME)
class SeparateAsyncWithRelays(PPOTrainerSeparateAsync):
    relay_group = None

    def _setup(self) -> None:
        super()._setup()
        replicas = self.standalone_server_manager.get_replicas()
        # before on_init_end: verl's first weight sync (step 0) goes through the relays
        self.relay_group = relays.spawn_relays(self.actor_rollout_wg.workers[0], replicas=replicas)
        from verl_laminar.platform.cpu import cpu_platform_requested

        if cpu_platform_requested():
            handles = relays.replica_handles(replicas)
            procs.apply_cpu_priority(list(self.actor_rollout_wg.workers), [r.server for r in handles])
        logger.info("separate_async with relays: %d standalone replicas", len(replicas))

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        if global_steps >= self.total_training_steps:
            self._shutdown_relays()  # verl's fit returns after the last step without on_train_end

    def on_train_end(self) -> None:
        super().on_train_end()
        self._shutdown_relays()

    def _shutdown_relays(self) -> None:
        if self.relay_group is not None:
            ray.get(self.relay_group.shutdown.remote())  # frees the relays' host-memory stores
            self.relay_group = None
