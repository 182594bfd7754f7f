"""AReaL as its code runs: staleness-gated continuous generation, aborted at every weight update.

Dataflow (AReaL main, inclusionAI/AReaL; each mechanism is an ``ArealMechanics`` switch, sourced
where it is defined):

* dispatch -- a rollout controller keeps at most ``max_concurrent_rollouts`` groups running (one
  training batch of prompts by default) and admits a new one only while the staleness gate
  ``(max_head_offpolicyness + version + 1) * batch - (accepted + running)`` is positive; each
  admitted group goes to the next server in round-robin order, whatever that server's load, and
  holds its slot until its slowest sample is done.
* training -- the trainer takes the oldest finished batch, trains, and only then updates the
  weights: it stops submission, pauses *every* server (in-flight requests are aborted), gathers each
  FSDP-sharded tensor and broadcasts it bucket by bucket from trainer rank 0 over one NCCL group
  that holds every rollout GPU, resumes the servers, bumps the version and resumes submission.
* resubmission -- each aborted request's client sleeps in 0.5 s polls until submission resumes,
  then resends prompt + tokens so far to the same server, whose prefix cache the update flushed:
  the server re-prefills the whole context with the new weights (trajectories mix versions).

Staleness is measured from a trajectory's first token (``policy.staleness``), as for every system.
"""

from __future__ import annotations

import dataclasses as dc
import logging
import math
from dataclasses import dataclass
from typing import Optional

from verl_laminar.policy import chain
from verl_laminar.sim.costs import g2g_broadcast
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.systems.asynchronous import AsyncBase
from verl_laminar.sim.systems.base import Result, Setup

logger = logging.getLogger(__name__)

# Sources below cite AReaL main (github.com/inclusionAI/AReaL, commit 4aef98d8, 2026-05-21) by
# repository path and function, and SGLang (sgl-project/sglang) by path and class.


@dataclass(frozen=True)
class ArealMechanics:
    """What AReaL's code does, one switch per mechanism; defaults are AReaL's own defaults."""

    # Staleness gate, in training versions. areal/infra/staleness_manager.py
    # ``StalenessManager.get_capacity``: capacity = min(max_concurrent - running,
    # (max_staleness + version + 1) * consumer_batch_size - (accepted + running)), checked before
    # every submission (areal/infra/workflow_executor.py ``BatchTaskDispatcher._get_next_task_for_submission``).
    # The dataclass default of ``InferenceEngineConfig.max_head_offpolicyness`` (areal/api/cli_args.py)
    # is 0, which makes AReaL synchronous (nothing generates while the trainer trains); every
    # asynchronous math example AReaL ships sets 2 (19 of the 20 examples/math/*.yaml; boba_grpo.yaml
    # sets 4), so 2 is the default here and 0 is the ablation ``areal_ofp0``. None: no gate.
    staleness_bound: Optional[int] = 2
    # Concurrency cap in training batches of groups. ``InferenceEngineConfig.max_concurrent_rollouts``
    # "Defaults to consumer_batch_size" (areal/api/cli_args.py; areal/infra/controller/rollout_controller.py
    # ``RolloutController.initialize``: ``max_concurrent_rollouts or consumer_batch_size``); the
    # examples set it equal to the batch size (256 with batch 256). None: no cap.
    max_concurrent_batches: Optional[float] = 1.0
    # A group holds its slot until all its samples are done: a task is one group
    # (areal/infra/remote_inf_engine.py ``GroupedRolloutWorkflow.arun_episode`` gathers all
    # ``group_size`` episodes), and ``StalenessManager.on_rollout_accepted`` frees one slot per task.
    # Off: a slot per sequence (what this simulator modelled before).
    group_slots: bool = True
    # Load-blind round-robin placement: areal/infra/controller/rollout_controller.py
    # ``RolloutController._choose_worker`` (one worker per server replica) and
    # areal/infra/remote_inf_engine.py ``RemoteInfEngine.choose_server`` (only "round_robin" is
    # implemented). Off: the least-loaded server.
    round_robin: bool = True
    # Every server is paused for the whole transfer: areal/engine/fsdp_engine.py
    # ``FSDPEngine._update_weights_from_distributed`` calls ``pause_generation`` on all servers
    # (areal/infra/remote_inf_engine.py ``RemoteInfEngine.pause_generation`` ->
    # ``_run_request_on_all_servers``) before the first bucket and ``continue_generation`` after the
    # last. Off: servers keep decoding during the transfer and stop only for the swap
    # (``network.weight_load_fixed_s``).
    pause_all_during_update: bool = True
    # Trainer rank 0 sends every rollout GPU the full tensors: ``_update_bucket_weights_from_distributed_async``
    # broadcasts each full tensor (``_get_full_tensor`` -> ``DTensor.full_tensor``) with ``src=0``
    # over a group of world size generation world size + 1 (``_init_weight_update_from_distributed``;
    # areal/engine/sglang_remote.py ``SGLangBackend.build_init_weights_group_request``). None: follow
    # the shared ``network.g2g_full_weights`` (off by default, so every GPU-to-GPU system is priced
    # per shard alike; docs/simulator.md item 1d and tests/sim/test_systems_on_cpu.py keep it opt-in).
    full_weight_broadcast: Optional[bool] = None
    # Every trainer rank all-gathers each tensor before rank 0 broadcasts it (``_get_full_tensor``);
    # with ``weight_chunked_mem_mb`` buckets and one bucket pending (``_update_weights_from_distributed``,
    # "single-pending-bucket pipelining") the gather overlaps the previous bucket's broadcast.
    fsdp_gather: bool = True
    bucket_bytes: float = 1024 * 2**20  # areal/api/io_struct.py ``WeightUpdateMeta.weight_chunked_mem_mb`` = 1024
    # One HTTP request per bucket to every server (areal/infra/remote_inf_engine.py
    # ``_update_weights_from_distributed``, awaited per bucket) before the servers join its broadcast;
    # an aiohttp round trip plus the server's hand-off to its GPU workers -- assumption.
    bucket_rpc_s: float = 0.005
    # ``InferenceEngineConfig.pause_grace_period`` (areal/api/cli_args.py): sleep after
    # /pause_generation, 0 by default.
    pause_grace_period_s: float = 0.0
    # Aborted requests are resent by the client, prompt + tokens so far (``RemoteInfEngine.agenerate``:
    # ``req.input_ids += gen_result.output_tokens``), after polling ``workflow_executor.is_paused()``
    # every 0.5 s (``await asyncio.sleep(0.5)``): they come back on average half a poll after
    # submission resumes. 0: no poll.
    resume_poll_s: float = 0.5
    # The update flushes the servers' prefix cache, so each resent request re-prefills its whole
    # context: SGLang's /pause_generation aborts all requests (python/sglang/srt/managers/io_struct.py
    # ``PauseGenerationReqInput.mode`` = "abort", AReaL sends no mode) and
    # ``UpdateWeightsFromDistributedReqInput.flush_cache`` defaults to True (AReaL does not set it);
    # AReaL's vLLM server calls ``pause_generation(wait_for_inflight_requests=False, clear_cache=True)``
    # (areal/engine/vllm_ext/areal_vllm_server.py ``areal_pause_generation``, ``areal_update_weight_xccl``).
    # Off: a resent request hits its old-weight prefix and recomputes nothing.
    flush_prefix_cache: bool = True
    # The trainer's extra forward pass for the proximal log-probs before each update
    # (areal/trainer/rl_trainer.py ``PPOTrainer.train``: ``actor.compute_logp`` when
    # ``PPOActorConfig.should_compute_prox_logp()``). Off by AReaL's dataclass defaults
    # (``recompute_logprob`` and ``use_decoupled_loss`` False, areal/api/cli_args.py), on in 19 of
    # the 20 examples/math/*.yaml (both True): ablation ``areal_prox_logp``. Priced as verl's
    # old-log-prob pass (``systems.base.step_train_seconds``).
    prox_logp_pass: bool = False


DEFAULT_MECHANICS = ArealMechanics()


def update_seconds(model, tp: int, rollouts: int, trainer_gpus: int, p, m: ArealMechanics) -> float:
    """One weight update from the first bucket's gather to the last bucket's arrival.

    Per bucket of ``bucket_bytes``: the servers are told over HTTP, then rank 0 broadcasts it down
    NCCL's pipelined chain (``chain.t_star``, as ``costs.g2g_broadcast``) while every trainer rank
    gathers the next bucket; one bucket is in flight, so a bucket costs the slower of the two, and
    the first gather is exposed. Plus ``network.g2g_fixed_s`` once, as every GPU-to-GPU sync pays.
    """
    net = p.network
    w = model.weight_bytes
    full = net.g2g_full_weights if m.full_weight_broadcast is None else m.full_weight_broadcast
    bw = net.ib_bandwidth_per_gpu * net.nccl_efficiency
    n_b = max(1, math.ceil(w / m.bucket_bytes))
    if full:
        move_b = chain.t_star(rollouts * tp + 1, w / n_b, 1.0 / bw, net.nccl_hop_latency_s)
    else:
        move_b = chain.t_star(rollouts + 1, w / tp / n_b, 1.0 / bw, net.nccl_hop_latency_s)
    gather_b = 0.0
    if m.fsdp_gather and trainer_gpus > 1:
        gbw = bw if trainer_gpus > net.gpus_per_machine else p.device.nvlink_bandwidth
        gather_b = w / n_b * (trainer_gpus - 1) / trainer_gpus / gbw
    return net.g2g_fixed_s + gather_b + n_b * max(gather_b, m.bucket_rpc_s + move_b)


class AReaL(AsyncBase):
    def __init__(self, setup: Setup, mechanics: ArealMechanics = DEFAULT_MECHANICS, name: str = "areal"):
        super().__init__(setup)
        m = self.mech = mechanics
        self.name = name
        self.log_prob_pass = m.prox_logp_pass
        lay = setup.layout
        p = self.p
        if m.full_weight_broadcast is not None and m.full_weight_broadcast != p.network.g2g_full_weights:
            p = dc.replace(p, network=dc.replace(p.network, g2g_full_weights=m.full_weight_broadcast))
        self.bcast = g2g_broadcast(self.model, lay.tp, lay.rollouts, p)  # the broadcast alone
        self.update_s = m.pause_grace_period_s + update_seconds(self.model, lay.tp, lay.rollouts, lay.trainer_gpus,
                                                                self.p, m)
        if m.staleness_bound is None and m.max_concurrent_batches is None:
            raise ValueError("AReaL bounds submission by concurrency or staleness; give at least one")
        g = self.p.schedule.group_size
        self.max_running = None if m.max_concurrent_batches is None else \
            max(1, int(round(m.max_concurrent_batches * self.batch_groups)))
        self.running_groups = 0  # submitted groups with a sample not yet done (AReaL's rollout_stat.running)
        self.running_seqs = 0
        self.accepted = 0  # finished groups, consumed or not (rollout_stat.accepted)
        self._submit_paused = False  # between the end of training and the resume after the update
        self._rr = 0
        self._g = g
        # every submission: (t, version, accepted, running incl. the new group, rollout it went to)
        self.gate_log: list[tuple[float, int, int, float, int]] = []
        self.mixed = 0
        self._since = [0.0] * len(self.rollouts)  # when each rollout last resumed generating (trace)
        self.done_trajectories = 0
        self.stalls: list[tuple[float, float]] = []  # (publication time, rollout-seconds stalled by it)
        self.aborted: list[int] = []  # per update: servers that had requests to abort

    # -- dispatch ------------------------------------------------------------------------------------
    def capacity(self) -> int:
        """Groups the rollout controller may submit now (``StalenessManager.get_capacity``)."""
        g, m = self._g, self.mech
        running = self.running_groups if m.group_slots else self.running_seqs / g
        cap = math.inf if self.max_running is None else self.max_running - running
        if m.staleness_bound is not None:
            cap = min(cap, (m.staleness_bound + self.version + 1) * self.batch_groups - (self.accepted + running))
        return int(math.floor(cap + 1e-9))

    def _place(self) -> Rollout:
        if self.mech.round_robin:
            r = self.rollouts[self._rr]
            self._rr = (self._rr + 1) % len(self.rollouts)
            return r
        return min(self.rollouts, key=lambda x: (len(x.running) + len(x.waiting) + x.away, x.rid))

    def dispatch(self, t: float) -> None:
        if self._submit_paused or self.done():
            return
        by_rollout: dict[int, list] = {}
        for grp in self.next_groups(max(0, self.capacity())):
            r = self._place()
            self.running_groups += 1
            self.running_seqs += len(grp.seqs)
            running = self.running_groups if self.mech.group_slots else self.running_seqs / self._g
            self.gate_log.append((t, self.version, self.accepted, running, r.rid))
            if self.mech.round_robin:
                by_rollout.setdefault(r.rid, []).append(grp)
            else:  # the least-loaded choice must see each placement
                r.submit(self.take([grp], r, t), t)
        for rid, groups in by_rollout.items():
            r = self.rollouts[rid]
            r.submit(self.take(groups, r, t), t)

    def start(self, t: float) -> None:
        self.dispatch(t)

    def on_budget(self, t: float) -> None:
        self.dispatch(t)

    def on_seq_done(self, r, seq, t: float) -> None:
        self.mixed += seq.mixed
        self.done_trajectories += 1
        self.running_seqs -= 1
        if seq.group.left == 1:  # the group's last sample: its slot frees and it is accepted
            self.running_groups -= 1
            self.accepted += 1
        super().on_seq_done(r, seq, t)
        self.dispatch(t)

    # -- weight update -------------------------------------------------------------------------------
    def publish_cost(self, t: float) -> float:
        # the trainer runs the update itself (areal/trainer/rl_trainer.py ``PPOTrainer.train``:
        # ``actor.update_weights`` between ``rollout.pause()`` and ``rollout.resume()``)
        return self.update_s

    def on_train_end(self, t: float) -> None:
        self._submit_paused = True  # ``rollout.pause()`` right after ``ppo_update``
        if self.mech.pause_all_during_update:
            self._abort_all(t, self.version + 1, self.update_s)

    def on_publish(self, t: float) -> None:
        if not self.mech.pause_all_during_update:
            self._abort_all(t, self.version, self.p.network.weight_load_fixed_s)
        self._submit_paused = False  # ``rollout.resume()``
        self.dispatch(t)

    def _abort_all(self, t: float, version: int, pause_s: float) -> None:
        """Every server stops for ``pause_s``; its aborted requests return half a poll later."""
        stalled, aborted = 0.0, 0
        for r in self.rollouts:
            self.record(r.rid, "gen", self._since[r.rid], t)
            busy_until = max(r.t, t)  # a prefill already under way finishes first
            hold = pause_s
            if r.running or r.waiting:  # requests on this server are aborted; their clients poll
                hold += self.mech.resume_poll_s / 2.0
                aborted += 1
            if self.mech.flush_prefix_cache:
                r.interrupt(version, hold)
            else:
                r.interrupt_keep_cache(version, hold)
            stalled += r.t - busy_until
            self.record(r.rid, "interrupt", t, r.t)
            self._since[r.rid] = r.t
        self.stalls.append((t, stalled))
        self.aborted.append(aborted)

    def finish(self) -> Result:
        a, b = self.meter.window()
        lost = sum(x for t, x in self.stalls if a < t <= b)
        res = self.meter.result(self.name, self.setup, events=self.engine.events,
                                interrupt_frac=lost / max((b - a) * len(self.rollouts), 1e-9))
        res.staleness["mixed_version_frac"] = round(self.mixed / max(self.done_trajectories, 1), 4)
        res.trace = self.trace
        logger.debug("%s: update %.2f s (broadcast %.2f s), interrupt_frac %.3f", self.name, self.update_s, self.bcast,
                     res.interrupt_frac)
        return res
