"""verl's TransferQueue agent-loop worker with Laminar's group pinning and per-trajectory accounting.

Dataflow, per prompt group (uid):
    _run_prompt: with a detached fleet, pool.claim_group(uid, n): the whole responses a killed predecessor's replicas
              finished -> router.adopt_group (answered from the pool, policy.adopt); else
              router.assign_group(uid, n) (waits while every replica's batch is full or refreshing)
              -> GROUP_PIN = the assignment -> verl's _run_prompt (n sessions, every turn through the pinned
                 LaminarLLMServerClient) -> finally router.finish_group(uid) (may end the replica's batch)
    _agent_loop_postprocess (per session): check every output's version labels against the pin, tell the
              router the trajectory finished (it answers n, the trainer's latest version), then verl's
              postprocess writes the outputs and tags to TransferQueue.
A label mismatch is reported to the router (the trainer turns it into an error) and fails the group.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional
from uuid import uuid4

import ray
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.policy.adopt import asks_the_pool
from verl_laminar.rollout.client import ADOPTED, GROUP_PIN, SESSION, check_label
from verl_laminar.rollout.pool_client import pool_enabled
from verl_laminar.rollout.router_actor import ROUTER_NAME

logger = logging.getLogger(__name__)
# a group adopted from the pool, or generated again, is part of the run's record, as the trainer's lines
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))

_START_S: dict[str, float] = {}  # uid -> when its group got a replica (per worker process)


class LaminarAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    _laminar_router_handle = None
    _laminar_pool_handle = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Without an __init__ of its own, a subclass of a Ray actor's plain class fails inside the base's
        # zero-argument super() once Ray builds the actor (Ray 2.60); defining it keeps the chain intact.
        super().__init__(*args, **kwargs)

    def _laminar_router(self) -> Any:
        if self._laminar_router_handle is None:
            self._laminar_router_handle = ray.get_actor(ROUTER_NAME)
        return self._laminar_router_handle

    async def _claim(self, uid: str, n: int, prompt: dict) -> Optional[dict]:
        """With a detached fleet (``laminar.fleet.detached``), a re-issued group whose whole responses the pool holds
        (its predecessor's replica finished them while the trainer was down) is adopted; None: generate it."""
        fleet = OmegaConf.select(self.config, "laminar.fleet")
        if not asks_the_pool(fleet, pool_enabled(self.config), prompt.get("agent_name")):
            return None
        if self._laminar_pool_handle is None:
            from verl_laminar.pool.shards import find_shards

            self._laminar_pool_handle = find_shards()
        return await self._laminar_pool_handle.of(uid).claim_group.remote(uid, n)  # the shard of the group

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        uid, validate = prompt["uid"], bool(trajectory["validate"])
        cfg = self.config.actor_rollout_ref.rollout
        n = int(prompt.get("__rollout_n__", cfg.val_kwargs.n if validate else cfg.n))
        router = self._laminar_router()
        claim = None if validate else await self._claim(uid, n, prompt)
        if claim is not None and claim["version"] is None:
            logger.info("group %s: the pool held %d pieces of it, not its whole responses at one version; generated "
                        "again", uid, claim["dropped"])
            claim = None
        pin = None if claim is None else await router.adopt_group.remote(uid, n, claim["version"])
        if pin is not None:
            logger.info("group %s: %d responses (%d tokens) adopted from the pool at version %d", uid, n,
                        claim["tokens"], claim["version"])
        else:
            if claim is not None:  # laminar.buffer.max_staleness (policy.bound)
                logger.info("group %s: the pool's responses of version %d are older than the staleness bound "
                            "allows; generated again", uid, claim["version"])
                claim = None
            pin = await router.assign_group.remote(uid, n, validate)
        _START_S[uid] = time.monotonic()
        token = GROUP_PIN.set(pin)
        adopted = ADOPTED.set(None if claim is None else dict(enumerate(claim["keys"])))
        try:
            await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)
        finally:
            ADOPTED.reset(adopted)
            GROUP_PIN.reset(token)
            _START_S.pop(uid, None)
            await router.finish_group.remote(uid)

    async def _run_agent_loop(self, *args: Any, **kwargs: Any) -> Any:
        # each session runs in its own task: its generate calls know their session and turn (rollout.client)
        SESSION.set([int(kwargs.get("session_id", 0)), 0])
        return await super()._run_agent_loop(*args, **kwargs)

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> Any:
        pin = GROUP_PIN.get()
        uid, session_id = kwargs["uid"], kwargs["session_id"]
        key = f"{uid}_{session_id}"
        outputs = output if isinstance(output, list) else [output]
        router = self._laminar_router()
        if pin is None or pin.group_id != uid:
            raise InvariantViolation(f"trajectory {key!r} finished outside its group's pin ({pin})")
        try:
            for out in outputs:
                check_label(pin, out, f"trajectory {key!r}")
        except InvariantViolation as e:
            await router.report_violation.remote(str(e))
            raise
        if outputs:
            last = outputs[-1]
            await router.trajectory_finished.remote(key, uid, len(last.prompt_ids), len(last.response_ids),
                                                    _START_S.get(uid))
        return await super()._agent_loop_postprocess(output, validate, **kwargs)


class LaminarAgentLoopManager(AgentLoopManagerTQ):
    """Selected by ``actor_rollout_ref.rollout.agent.agent_loop_manager_class``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # AgentLoopManagerTQ.__init__ sets its own worker class; ours must win before the workers start
        self.agent_loop_workers_class = ray.remote(LaminarAgentLoopWorker)

    async def _init_agent_loop_workers(self) -> None:
        from verl_laminar.fleet import helpers

        if not helpers.on_task_runner(self.config):  # laminar.helpers=spread: verl's round-robin over every node
            return await super()._init_agent_loop_workers()
        strategy = helpers.here()  # built in the TaskRunner: its node, off the rollout machines
        self.agent_loop_workers = [
            self.agent_loop_workers_class.options(name=f"agent_loop_worker_{rank}_{uuid4().hex[:8]}",
                                                  scheduling_strategy=strategy)
            .remote(self.config, self.llm_client, self.teacher_client, self.reward_loop_worker_handles)
            for rank in range(int(self.rollout_config.agent.num_workers))]
