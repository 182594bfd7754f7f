"""The ledger of verl internals Laminar depends on without a seam: the private (or undocumented) methods our
subclasses override and the attributes we set on verl objects. Unlike the patches (``patches/README.md``'s first
tables) these change nothing for a run without ``+laminar=enabled``; but a verl release that renames one breaks
Laminar, so each is pinned by ``tests/foundation/test_verl_overrides_on_cpu.py``: the method exists on verl's class
with these parameters (Ray's ``_ray_*`` tracing parameters aside), our override takes them, and an attribute is set
by verl's own class. A test also fails on an override of a private verl method that is missing here.

Pure data (no verl import), so the ledger reads anywhere; ``patches/README.md`` lists the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Override:
    owner: str  # "verl.module:Class" whose member we override or set
    name: str
    # "verl_laminar.module:Class" (a method override; "module:factory()" for a class a factory builds) or
    # "verl_laminar.module" (where an attribute is set)
    ours: str
    why: str
    params: Optional[tuple[str, ...]] = None  # a method's parameters in verl, self first; None: an attribute


TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"
SEPARATE_ASYNC = "verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync"
LAMINAR_TRAINER = "verl_laminar.trainer.laminar_trainer:LaminarTrainer"
BASELINE_TRAINER = "verl_laminar.trainer.baselines:SeparateAsyncWithRelays"
AGENT_LOOP = "verl_laminar.rollout.agent_loop:LaminarAgentLoopWorker"
CLIENT = "verl.workers.rollout.llm_server:LLMServerClient"
OUR_CLIENT = "verl_laminar.rollout.client:LaminarLLMServerClient"
SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer"
REPLICA = "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica"
STREAMING = "verl_laminar.rollout.streaming_server"

LEDGER: tuple[Override, ...] = (
    # the trainer (verl's separate_async trainer minus its barrier)
    Override(TRAINER_BASE, "_build_replay_buffer", LAMINAR_TRAINER,
             "swaps in LaminarReplayBuffer (complete single-version groups); refuses a custom sampler", ("self",)),
    Override(SEPARATE_ASYNC, "_setup", LAMINAR_TRAINER,
             "builds the router, relays, pool, fleet and fault tooling around verl's set-up", ("self",)),
    Override(SEPARATE_ASYNC, "_setup", BASELINE_TRAINER, "the relay baseline's relays", ("self",)),
    Override(TRAINER_BASE, "_fetch_one_gen_batch", LAMINAR_TRAINER,
             "stable prompt uids with a detached fleet (fleet/uids.py)", ("self",)),
    Override(TRAINER_BASE, "_save_checkpoint", LAMINAR_TRAINER, "saves the prompt-uid counter beside verl's state",
             ("self",)),
    Override(TRAINER_BASE, "_load_checkpoint", LAMINAR_TRAINER, "restores the prompt-uid counter", ("self",)),
    Override(TRAINER_BASE, "_reissue_inflight_prompts", LAMINAR_TRAINER,
             "logs the uids a resume re-issues (adoption from the pool is read from them)", ("self", "partition_id")),
    Override(TRAINER_BASE, "_compute_metrics", LAMINAR_TRAINER,
             "the ledger check, laminar/* metrics, the timeline and the step file",
             ("self", "batch", "metrics", "timing_raw", "global_steps", "epoch")),
    Override(TRAINER_BASE, "_compute_metrics", BASELINE_TRAINER, "the relay baseline ends its relays after the last step",
             ("self", "batch", "metrics", "timing_raw", "global_steps", "epoch")),
    Override("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer", "_sync_metadata_from_transfer_queue",
             "verl_laminar.buffer.replay:LaminarReplayBuffer", "every wait for samples polls the rollout side's health (a stopped router raises its cause)", ("self",)),
    # the agent loop and its client
    Override("verl.experimental.agent_loop.agent_loop:AgentLoopManager", "_init_agent_loop_workers",
             "verl_laminar.rollout.agent_loop:LaminarAgentLoopManager",
             "the workers on the TaskRunner's node, off rollout machines (laminar.helpers)", ("self",)),
    Override("verl.experimental.reward_loop.reward_loop:RewardLoopManager", "_init_reward_loop_workers",
             "verl_laminar.fleet.helpers:reward_manager_class()",
             "the workers on the TaskRunner's node, off rollout machines (laminar.helpers)", ("self",)),
    Override("verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ", "_run_prompt", AGENT_LOOP,
             "a group pinned to one replica and version; adoption from the pool after a restart",
             ("self", "prompt", "sampling_params", "trajectory", "trace")),
    Override("verl.experimental.agent_loop.agent_loop:AgentLoopWorker", "_run_agent_loop", AGENT_LOOP,
             "each session's task knows its session id (rollout/client.py)",
             ("self", "sampling_params", "trajectory", "agent_name", "trace", "kwargs")),
    Override("verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ", "_agent_loop_postprocess", AGENT_LOOP,
             "checks each trajectory against its group's pin (one replica, one version)",
             ("self", "output", "validate", "kwargs")),
    Override("verl.experimental.agent_loop.tool_agent_loop:ToolAgentLoop", "_handle_generating_state",
             "verl_laminar.rollout.guided_tool_agent_loop:GuidedToolAgentLoop",
             "the toy tool task's guided first turn", ("self", "agent_data", "sampling_params", "ignore_termination")),
    Override(CLIENT, "_acquire_server", OUR_CLIENT, "the replica pinned to the request's group, not verl's balancer's pick",
             ("self", "request_id", "extra")),
    Override(CLIENT, "_release_server", OUR_CLIENT, "releases under the vLLM request id the router tracks",
             ("self", "server_id", "request_id")),
    Override(CLIENT, "_vllm_request_id", OUR_CLIENT, "the vLLM request id the client set (the router and the pool key on it)",
             ("self", "request_id")),
    # the vLLM server and replica (the partial-response pool's streaming server)
    Override(SERVER, "run_server", f"{STREAMING}:streaming_server_class()",
             "wraps the engine so every response streams into the pool", ("self", "args")),
    Override(SERVER, "abort_request", f"{STREAMING}:streaming_server_class()",
             "aborts through vLLM's AsyncLLM.abort(internal=True) where verl's call fails (patches/README.md)",
             ("self", "request_id", "reset_prefix_cache")),
    Override(SERVER, "generate", f"{STREAMING}:streaming_server_class()", "labels each output with its weight version",
             ("self", "prompt_ids", "sampling_params", "request_id", "image_data", "video_data", "audio_data",
              "mm_processor_kwargs", "priority", "kv_transfer_params")),
    Override(REPLICA, "init_standalone", f"{STREAMING}:replica_class_for()",
             "a detached fleet's replicas outlive the trainer (fleet/outlive.py)", ("self",)),
    # attributes set on verl objects
    Override("verl.workers.rollout.llm_server:LLMServerManager", "rollout_replica_class", "verl_laminar.trainer.pool",
             "the streaming replica class; verl reads it only if it is not set (no config seam)"),
    Override("verl.workers.rollout.llm_server:LLMServerManager", "global_load_balancer",
             "verl_laminar.trainer.laminar_trainer",
             "the Laminar router takes the place of verl's balancer (rollout/router_actor.py)"),
    Override(REPLICA, "server_class", STREAMING, "the streaming server class (detached with a detached fleet)"),
    Override(SERVER, "engine", STREAMING, "the vLLM engine wrapped by StreamingEngine"),
    Override("verl.workers.rollout.replica:RolloutReplica", "rollout_mode", "verl_laminar.fleet.outlive",
             "a detached replica's mode, set as verl's init_standalone would"),
    Override("verl.workers.rollout.replica:RolloutReplica", "resource_pool", "verl_laminar.fleet.outlive",
             "a detached replica's placement groups (detached=True)"),
    Override("verl.workers.rollout.replica:RolloutReplica", "workers", "verl_laminar.fleet.outlive",
             "the detached replica's worker group"),
)
