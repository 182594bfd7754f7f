"""LaminarTrainer: verl's separate_async trainer without its global weight barrier.

Dataflow (verl's fit/step loop is unchanged; only hooks are overridden):
    init:   standalone replicas (verl) -> relay group + LaminarRouter replaces verl's balancer
            -> publish v0 to the master relay -> router.start(v0): each replica pulls v0
    rollout (asynchronously, per replica): router hands whole groups -> pinned generation -> TransferQueue
    step g: LaminarReplayBuffer.sample (complete, single-version groups) -> verl's PPO update
            -> on_step_end: publish version g to the master relay, router.on_publish(g); no abort, no
               resume: each replica pulls g when its own batch ends
            -> _compute_metrics: router events -> Ledger (one version per trajectory and group, nothing trained
               twice) -> laminar/* metrics through verl's tracker
            -> the same events, each publication and one step record -> the run's timeline file
               (verl_laminar.timeline, laminar.timeline.path; read by python -m verl_laminar.report)
    end:    _laminar_shutdown: every subsystem is a component, real or null (trainer.components); they stop in
            components.SHUTDOWN_ORDER
"""

from __future__ import annotations

import logging
import os
import time

import ray
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

from verl_laminar import metrics as lm
from verl_laminar import timeline as tl
from verl_laminar.config import prepare as settings
from verl_laminar.patches.verl_bugs import apply_verl_bug_patches
from verl_laminar.policy.accounting import Accounting
from verl_laminar.policy.adopt import ADOPTED_REPLICA
from verl_laminar.trainer import bound, procs, relays, until
from verl_laminar.trainer import components as parts
from verl_laminar.trainer.events import apply_router_events

logger = logging.getLogger(__name__)
apply_verl_bug_patches()  # our base, verl's separate_async, crashes at start-up without it (patches/README.md)
# the per-step Laminar summary is part of the run's record, as verl's own INFO lines are
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))
HEALTH_TIMEOUT_S = 60.0  # a router busy on a loaded host answers late; only a stop it reports ends the run


class RolloutsStopped(RuntimeError):
    """The router stopped (its cause in the message): no more samples will come."""


@register_trainer("laminar")
class LaminarTrainer(PPOTrainerSeparateAsync):
    def __init__(self, config: DictConfig) -> None:
        self.laminar = settings.prepare_config(config)
        from verl_laminar.preflight import checks

        if not checks.in_preflight():  # the preflight runs these itself, beside the construction of this class
            # what would break at the first refresh (bucket, relay memory, chain vs timeouts) fails here instead
            checks.start_checks(config, self.laminar)
        self.accounting = Accounting()
        self.router = None
        self.relay_group = None
        self._replicas: list = []
        self._files: parts.RunFiles | parts.NullRunFiles = parts.NullRunFiles()  # timeline + step file
        self.pool = None  # the partial-response pool's shards (laminar.pool.enabled; pool.shards.PoolShards)
        self._hang_watch: parts.Watch = parts.NullHangWatch()  # kills a replica that holds requests, streams nothing
        self._replacer: parts.Replacer = parts.NullReplacer()  # fleet.replacement.ReplacementLoop: one per dead one
        # replica failover, cumulative (laminar/ft/*): deaths, groups moved / lost, requests continued from the pool
        self._ft = {"failures": 0, "moved": 0, "parked": 0, "lost": 0, "continued": 0, "continued_tokens": 0}
        # laminar.fleet.detached: tokens generated while the previous trainer was down, and what was adopted
        self._fleet = {"tokens_while_down": 0, "adopted": 0, "adopted_tokens": 0, "adopted_trained": 0}
        self._fleet_beat: parts.Component = parts.NullComponent("fleet")  # laminar.fleet.detached: parts.FleetBeat
        self._components = parts.Components()  # every part, once they all exist (on_init_end)
        from verl_laminar.fleet.uids import StableUids

        self._uids = StableUids() if self.laminar.fleet.detached else None
        self._started_s, self._until, self._shut = time.monotonic(), None, False  # laminar.run_until
        super().__init__(config)

    # ---- construction ----
    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        if type(buffer) is not ReplayBufferAsync:
            raise TypeError(f"trainer.v1.sampler.custom_sampler gave {type(buffer).__name__}; Laminar samples through "
                            "LaminarReplayBuffer (complete, single-version groups); remove custom_sampler")
        from verl_laminar.buffer.replay import LaminarReplayBuffer

        sampler = self.config.trainer.v1.sampler
        k = self.laminar.buffer.max_staleness  # earliest deadline first, within the bound (trainer.bound)
        return LaminarReplayBuffer(
            trainer_mode=self.trainer_mode, trainer_config=self.config.trainer.v1.get(self.trainer_mode, {}),
            max_off_policy_threshold=None, max_off_policy_strategy=sampler.max_off_policy_strategy,
            sampler_kwargs=sampler.sampler_kwargs, refill_fn=self._add_prompts_to_generate,
            filter_groups_metric=buffer.filter_groups_metric,
            rollout_n=int(self.config.actor_rollout_ref.rollout.n), health=self._rollouts_run,
            planner=None if k is None else bound.BatchPlanner(lambda: self.router, k))

    def _rollouts_run(self) -> None:
        """Raise why the router stopped (a failed refresh, no replica left): the run ends with that cause."""
        router = getattr(self, "router", None)
        if router is None:
            return
        try:
            failure = ray.get(router.failure.remote(), timeout=HEALTH_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            logger.warning("laminar: the router did not answer a health check in %.0f s", HEALTH_TIMEOUT_S)
            return
        if failure is not None:
            raise RolloutsStopped(f"the rollout router stopped, so no more samples come: {failure}")

    def _setup(self) -> None:
        from verl_laminar.trainer import pool as lpool

        if self.laminar.fleet.detached:
            from verl_laminar.fleet import outlive

            outlive.check_cluster(self.config)  # raises, saying what to set, where the fleet cannot outlive the job
        self.pool = lpool.spawn_partial_pool(self.config, self.laminar)
        if self.laminar.fleet.detached:
            # a predecessor's replicas finish their requests (into the pool), then make room for this run's
            found = outlive.sweep(self.laminar.fleet.drain_timeout_s, self.pool)
            self._fleet["tokens_while_down"] = int(found.get("tokens_while_down", 0))
            self._fleet_beat = parts.FleetBeat(outlive.Heartbeat(outlive.open_manifest(),
                                                                 self.laminar.heartbeat.interval_s))
        with lpool.streaming_replicas(self.laminar, str(self.config.actor_rollout_ref.rollout.name)) as streaming:
            super()._setup()
        from verl_laminar.preflight import checks
        from verl_laminar.rollout.decode_profile import replica_b
        from verl_laminar.rollout.router_actor import spawn_router

        self.relay_group = relays.spawn_relays(self.actor_rollout_wg.workers[0], relay=self.laminar.relay,
                                                heartbeat=self.laminar.heartbeat, version_bytes=OmegaConf.select(
                                                    self.config, checks.EXPECTED_BYTES_KEY),
                                                replicas=self.standalone_server_manager.get_replicas())
        replicas = relays.replica_handles(self.standalone_server_manager.get_replicas())
        self._replicas = replicas
        kill = self.laminar.fault_injection.kill_replica
        if kill is not None and kill not in {r.replica_id for r in replicas}:
            raise ValueError(f"laminar.fault_injection.kill_replica={kill}: no such replica; the ranks are "
                             f"{sorted(r.replica_id for r in replicas)}")
        self._trainer_nodes: list[str] = []  # machines with a trainer rank: where a joining replica is lowered
        if procs.cpu_priority_on(self.laminar):
            self._trainer_nodes = procs.apply_cpu_priority(list(self.actor_rollout_wg.workers),
                                                           [r.server for r in replicas])["trainer_nodes"]
        gpb = settings.groups_per_batch(self.config, len(replicas))
        settings.check_warmup(self.config, len(replicas), gpb)
        repack = settings.repack_settings(self.laminar, lambda: replica_b(
            replicas[0].server, int(self.config.actor_rollout_ref.rollout.max_num_seqs)))
        self.router = spawn_router(replicas, gpb, relays=relays.replica_relays(self.relay_group, replicas, True),
                                   repack=repack, refresh=self.laminar.refresh_settings(),
                                   chain_relays=len(ray.get(self.relay_group.plan.remote()).relays),
                                   replacements=self.laminar.replace.max_replacements if self.laminar.replace.enabled
                                   else 0, max_staleness=self.laminar.buffer.max_staleness,
                                   batch_groups=int(self.config.data.train_batch_size))
        from verl_laminar.trainer.hang import ReplicaKiller, start_hang_watch
        from verl_laminar.trainer.replace import start_replacement

        self._killer = ReplicaKiller(replicas)
        self._hang_watch = start_hang_watch(self.laminar, self.router, self.pool, self._killer) or parts.NullHangWatch()
        from verl_laminar.trainer.faults import FaultInjector

        self._faults = FaultInjector(self.laminar, self.router, self.pool if streaming else None,
                                     lambda: list(self._replicas), int(self.config.actor_rollout_ref.rollout.n))
        self._replacer = start_replacement(self.laminar, list(self.standalone_server_manager.get_replicas()),
                                           self.router, self.relay_group, self._on_replica_join,
                                           self._killer) or parts.NullReplacer()
        default = self.standalone_server_manager.global_load_balancer
        # verl's separate_async and get_client read this attribute; from now on every client sees the router
        self.standalone_server_manager.global_load_balancer = self.router
        ray.kill(default)
        logger.info("laminar: %d standalone replicas, %d groups per replica batch, repack %s", len(replicas), gpb,
                    repack or "off")
        logger.info("laminar: replica failover on (a dead replica's groups move to a live replica of their version); "
                    "its requests continue from %s", "the partial-response pool" if streaming else "the prompt")

    def _on_replica_join(self, replica) -> None:
        """A replacement is about to take work (called from the replacement thread)."""
        self._replicas.append(replica)
        self._killer.track(replica)
        if procs.cpu_priority_on(self.laminar):
            procs.apply_cpu_priority([], [replica.server], self._trainer_nodes)

    def get_llm_client(self):
        from verl_laminar.rollout.client import LaminarLLMServerClient

        return self.standalone_server_manager.get_client(client_cls=LaminarLLMServerClient)

    # ---- laminar.fleet.detached: prompt uids a resumed run draws again (fleet.uids) ----
    def _fetch_one_gen_batch(self):
        batch = super()._fetch_one_gen_batch()
        if self._uids is not None:
            from tensordict import NonTensorData, NonTensorStack

            batch["uid"] = NonTensorStack(*[NonTensorData(u) for u in self._uids.take(len(batch["uid"]))])
        return batch

    def _save_checkpoint(self):
        super()._save_checkpoint()
        if self._uids is not None:  # with verl's dataloader state, which fixes the order the counter names
            self._uids.save(os.path.join(str(self.config.trainer.default_local_dir), f"global_step_{self.global_steps}"))

    def _reissue_inflight_prompts(self, partition_id: str = "train") -> int:
        """verl re-issues the checkpoint's pending and running prompts under their uids. With a detached fleet those
        uids are logged: the groups the pool holds whole are adopted only if a re-issue (or a later draw) names them,
        and a resumed run that adopted nothing can then be read from its log."""
        if self._uids is not None:
            import transfer_queue as tq

            items = (tq.kv_list(partition_id) or {}).get(partition_id, {})
            uids = sorted(k for k, tag in items.items()
                          if tag.get("is_prompt", False) and tag.get("status") in ("pending", "running"))
            logger.info("laminar.fleet: re-issuing the checkpoint's in-flight prompts %s", uids)
        return super()._reissue_inflight_prompts(partition_id)

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self._uids is not None and self.global_steps > 0:
            from verl_laminar.fleet.uids import StableUids

            trainer = self.config.trainer
            folder = (str(trainer.resume_from_path) if trainer.resume_mode == "resume_path" and trainer.resume_from_path
                      else os.path.join(str(trainer.default_local_dir), f"global_step_{self.global_steps}"))
            found = StableUids.load(folder)
            if found is None:
                logger.warning("laminar.fleet: %s has no prompt counter; this run's prompts get new uids, so what the "
                               "fleet generated for the earlier ones is generated again", folder)
            else:
                self._uids = found
                logger.info("laminar.fleet: prompt uids continue at %s-p%d", found.lineage, found.fetched)
        return out

    # ---- weights: publish once, each replica pulls ----
    def _publish(self, version: int) -> dict:
        backend = self.config.actor_rollout_ref.rollout.checkpoint_engine.backend
        out: dict = {}
        for result in ray.get(self.actor_rollout_wg.update_weights(global_steps=version, mode=backend)):
            out.update(result or {})
        self.accounting.throughput.publish(version, time.monotonic())
        # the publish returned: version ``version`` is on the master relay, replicas may pull it from now; flushed:
        # a trainer killed right after its publication (fault injection) keeps it
        self._files.write([tl.Publish(version, time.time())], flush=True)
        return out

    def _open_run_files(self, resumed: bool) -> None:
        path = tl.run_path(self.laminar.timeline.path, str(self.config.trainer.default_local_dir))
        self._files = parts.RunFiles.open(path, resumed, len(self._replicas))
        logger.info("laminar: timeline in %s (python -m verl_laminar.report reads it), step metrics in %s", path,
                    self._files.steps_path)

    def _shutdown_stack(self) -> parts.Components:
        """Every part, real or null, in the order _laminar_shutdown stops them backwards (SHUTDOWN_ORDER)."""
        return parts.shutdown_stack(
            pool=parts.NullComponent("pool") if self.pool is None else parts.Call("pool", self.pool.stop), fleet=self._fleet_beat,
            relays=parts.actor_stop("relays", self.relay_group, "shutdown"),
            router=parts.actor_stop("router", self.router, "close"), ledger=parts.Call("ledger", self._log_ledger),
            files=self._files, buffer=parts.Call("buffer", self.replay_buffer.experience.close),
            hang_watch=self._hang_watch, replacer=self._replacer)

    def _log_ledger(self) -> None:
        logger.info("laminar: ledger at the end %s (in flight: prompts still generating when training stopped)",
                    self.accounting.ledger.counts())

    def on_init_end(self) -> None:
        version = int(self.global_steps)
        self._open_run_files(resumed=version > 0)
        self._components = self._shutdown_stack()  # every part exists now: the run files are the last
        self._publish(version)
        versions = ray.get(self.router.start.remote(version))
        logger.info("laminar: every replica loaded version %d: %s", version, versions)
        self._until = until.start(self.laminar, [r.replica_id for r in self._replicas], version,
                                  self.total_training_steps, self._faults.plan, self._started_s)
        if getattr(self, "_restored_tq_prompt_count", 0):
            self._adopt_restored()

    def _adopt_restored(self) -> None:
        """Resumed from a verl checkpoint: its finished, untrained trajectories enter the ledger (verl
        re-issues the pending and running prompts itself, through the router)."""
        from transfer_queue import kv_list

        from verl_laminar.buffer.replay import restored_records

        items = (kv_list("train") or {}).get("train", {})
        records = restored_records(items, int(self.config.actor_rollout_ref.rollout.n), int(self.global_steps),
                                   time.monotonic())
        for rec in records:
            self.accounting.ledger.finish(rec)
        logger.info("laminar: resumed at step %d; %d finished trajectories restored from the checkpoint adopted",
                    self.global_steps, len(records))

    def on_train_begin(self) -> None:
        from verl_laminar.trainer.placement import check_placement

        check_placement(self.config, self.agent_loop_manager, self.reward_loop_manager,
                        {"router": self.router, "relay_group": self.relay_group})
        self._add_async_warmup_batches(OmegaConf.select(self.config, settings.WARMUP_KEY))

    def on_step_end(self) -> None:
        if self.prev_step_profile:
            self._stop_rollout_profiling()
        self._faults.land_armed()  # a replica fault armed after the previous step strikes before this publication
        self._pending_sync_metrics = self._publish(int(self.global_steps))
        ray.get(self.router.on_publish.remote(int(self.global_steps)))
        self._faults.strike(int(self.global_steps))  # laminar.fault_injection (testing only)

    # ---- waits and accounting ----
    def on_sample_begin(self) -> None:
        super().on_sample_begin()
        self.accounting.trainer_wait.begin("trainer", time.monotonic())

    def on_sample_end(self) -> None:
        super().on_sample_end()
        self.accounting.trainer_wait.end("trainer", time.monotonic())

    def _apply_router_events(self) -> dict:
        events = ray.get(self.router.drain_events.remote())  # rollout.events.RouterEvents
        apply_router_events(events, self.accounting, self._ft, self._fleet, self._files.timeline)
        return ray.get(self.router.snapshot.remote())

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        snap_router = self._apply_router_events()
        keys = sorted({k.rsplit("_", 1)[0] for k, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding")})
        trained = self.accounting.train_step(global_steps, keys)  # raises on unknown or twice-trained keys
        self._fleet["adopted_trained"] += sum(1 for r in trained if r.replica_id == ADOPTED_REPLICA)
        # the router measured the replicas' refresh time since the last step; fold it in as one interval
        self.accounting.rollout_wait.begin("replicas", 0.0)
        self.accounting.rollout_wait.end("replicas", snap_router["rollout_wait_s"])
        out = lm.snapshot_to_metrics(self.accounting.snapshot(global_steps, trained),
                                     histogram=self.laminar.metrics.staleness_histogram)
        stats = self.replay_buffer.experience.stats()
        out.update(lm.buffer_metrics(stats.ready_groups, stats.partial_groups, stats.duplicates,
                                     stats.discarded_groups))
        out[lm.INVARIANT_CHECKED] = float(self.replay_buffer.checked_trajectories)
        out.update(snap_router["repack"])
        out.update({lm.FT_REPLICA_FAILURES: float(self._ft["failures"]), lm.FT_GROUPS_MOVED: float(self._ft["moved"]),
                    lm.FT_GROUPS_LOST: float(self._ft["lost"]), lm.FT_GROUPS_PARKED: float(self._ft["parked"]),
                    lm.FT_POOL_CONTINUED: float(self._ft["continued"]),
                    lm.FT_POOL_CONTINUED_TOKENS: float(self._ft["continued_tokens"]),
                    lm.FLEET_TOKENS_WHILE_DOWN: float(self._fleet["tokens_while_down"]),
                    lm.FLEET_ADOPTED: float(self._fleet["adopted"]),
                    lm.FLEET_ADOPTED_TOKENS: float(self._fleet["adopted_tokens"]),
                    lm.FLEET_ADOPTED_TRAINED: float(self._fleet["adopted_trained"]),
                    lm.STALENESS_BOUND_WAIT: float(getattr(self.replay_buffer.planner, "wait_s", 0.0)),
                    lm.FT_HUNG_REPLICAS: float(len(self._hang_watch.hung)),
                    **self._replacement_metrics(),
                    lm.FT_LIVE_REPLICAS: float(len(snap_router["versions"]) - len(snap_router["dead"]))})
        lm.check_names(out)
        metrics.update(out)
        # flushed: a crashed run keeps every step it finished
        self._files.write([tl.Step(int(global_steps), time.time(), out[lm.TRAINER_WAIT], out[lm.ROLLOUT_WAIT],
                                   tuple(sorted(r.staleness for r in trained)),
                                   tuple(sorted(r.response_tokens for r in trained)))], flush=True)
        # every metric verl logs for this step, whatever trainer.logger holds
        self._files.write_step(int(global_steps), time.time(), metrics)
        logger.info("laminar step %d: staleness %s, replica versions %s, %d trajectories checked", global_steps,
                    sorted(r.staleness for r in trained), snap_router["versions"],
                    self.replay_buffer.checked_trajectories)
        if self._until is not None and until.ends_after(self._until, global_steps, trained,
                                                        self.accounting.replicas.current(), self._laminar_shutdown):
            self.total_training_steps = int(global_steps)  # verl's loop ends after this step, then on_train_end
        if global_steps >= self.total_training_steps:
            self._laminar_shutdown()  # verl's fit returns after the last step without on_train_end

    def _replacement_metrics(self) -> dict:
        records = self._replacer.snapshot()
        joined = [r for r in records if r.joined_s is not None]
        return {lm.FT_REPLACEMENTS: float(len(joined)),
                lm.FT_REPLACEMENTS_FAILED: float(sum(1 for r in records if r.error is not None)),
                lm.FT_REPLACEMENT_START_S: float(joined[-1].launch_s) if joined else 0.0}

    def on_train_end(self) -> None:
        super().on_train_end()
        self._laminar_shutdown()

    def _laminar_shutdown(self) -> None:
        if self._shut:  # an early end (laminar.run_until) runs it from the step, then verl's on_train_end
            return
        self._shut = True
        self._components.stop_all()  # components.SHUTDOWN_ORDER; a failed stop is raised after the rest
