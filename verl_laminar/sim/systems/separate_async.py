"""verl's ``separate_async`` trainer as verl 0.9.1's code runs it: continuous generation, every replica aborted
and resumed at each weight sync (what the CPU benchmark measures as ``separate_async``).

Read from verl's installed sources:

* generation never waits for a step: the trainer keeps ``num_warmup_batches`` batches of prompts ahead of the one
  it trains (``trainer/ppo/v1/trainer_base.py`` ``_add_async_warmup_batches``; ``trainer.v1.separate_async.
  num_warmup_batches``, default 1) and refills what it samples, so about ``1 + num_warmup_batches`` batches of
  groups are in the system; the trainer takes the first complete groups (``ReplayBufferAsync``);
* placement: verl's global load balancer sends each request to the server with the fewest in flight;
* at every weight sync (``trainer.v1.separate_async.parameter_sync_step``, 1 in the benchmark) the trainer's
  ``CheckpointEngineManager.update_weights`` (``checkpoint_engine/base.py``) aborts every replica's unfinished
  requests and saves them for partial rollout, releases the KV cache, loads the new weights, restores the cache and
  resumes: each saved request re-prefills prompt + tokens so far with the new weights (trajectories mix versions);
* the trainer recomputes the old log-probs before each update (``_compute_old_log_prob``).

These are AReaL's mechanisms with other settings (``areal.ArealMechanics``): no staleness gate (verl drops groups
older than ``max_off_policy_threshold`` = 8 steps, which the benchmark never reaches), a concurrency cap of
``1 + num_warmup_batches`` batches, least-loaded placement, every server paused, the prefix cache flushed, aborted
requests resumed at once (no client poll), and the old-log-prob pass. Two approximations: verl admits a whole batch
of prompts when the trainer samples one, where the cap here frees a group's slot when the group completes; and a
CPU machine prices the sync as one weight load (``CpuProfile.weight_load_s``), as ``OneStepOff`` does.

``one_step_off.OneStepOff`` is the stricter schedule this replaces for ``separate_async``: a barrier at every step
(batch k+1 generated whole while batch k trains), which verl's trainer does not have.
"""

from __future__ import annotations

import dataclasses as dc

from verl_laminar.sim.systems.areal import AReaL, ArealMechanics
from verl_laminar.sim.systems.base import Setup

NUM_WARMUP_BATCHES = 1  # trainer.v1.separate_async.num_warmup_batches (verl's default; the benchmark keeps it)

VERL_SEPARATE_ASYNC = ArealMechanics(
    staleness_bound=None, max_concurrent_batches=1.0 + NUM_WARMUP_BATCHES, group_slots=True, round_robin=False,
    pause_all_during_update=True, resume_poll_s=0.0, flush_prefix_cache=True, prox_logp_pass=True)


class SeparateAsync(AReaL):
    def __init__(self, setup: Setup, num_warmup_batches: float = NUM_WARMUP_BATCHES):
        mech = dc.replace(VERL_SEPARATE_ASYNC, max_concurrent_batches=1.0 + float(num_warmup_batches))
        super().__init__(setup, mech, name="separate_async")
        cpu = self.p.cpu
        if cpu is not None:  # one machine: the sync is a load from the local relay, as OneStepOff prices it
            self.update_s = cpu.weight_load_s
