# Shared settings of the DAPO-Math recipes (sourced by the run_*.sh scripts, not run directly).
#
# The paper's math task in verl 0.9.1 keys: GRPO with clip-higher (0.2 / 0.28), token-mean loss, the DAPO reward
# manager with an overlong buffer, prompts up to 2K tokens, responses up to 16K, 512 prompts x 16 responses per
# step, 16 mini-batch updates per step (ppo_mini_batch_size 32 prompts). Every value below is a shell variable
# with the paper's value as default; override any of them from the environment.
#
# Callers set MODEL_SIZE (7b, 32b, 72b) and VARIANT (sync, separate_async, laminar) before sourcing, and pass their
# own arguments through "$@" (e.g. `--cfg job` prints the composed config without running).
# LAMINAR_PREFLIGHT=1 runs `python -m verl_laminar.preflight` on the same overrides instead of training.

set -euo pipefail

: "${VARIANT:?set VARIANT to sync, separate_async or laminar}"
: "${MODEL_SIZE:?set MODEL_SIZE to 7b, 32b or 72b}"

# ---- per-model defaults: one place, so a recipe and its baselines always use the same GPUs ----
# TRAIN_NODES/ROLLOUT_NODES: the asynchronous variants' split; the sync baseline runs on their sum.
# GEN_TP: GPUs per vLLM rollout (tensor parallel); SP_SIZE: Ulysses sequence parallel in training;
# OFFLOAD: FSDP parameter/optimizer offload to host memory.
case "$MODEL_SIZE" in
    7b)  # 64 GPUs, the paper's 7B setting for the staleness study
        : "${MODEL_PATH:=Qwen/Qwen2.5-7B}" "${TRAIN_NODES:=4}" "${ROLLOUT_NODES:=4}"
        : "${GEN_TP:=1}" "${SP_SIZE:=2}" "${OFFLOAD:=False}" ;;
    32b) # 128 GPUs: 64 trainer GPUs and 16 rollouts of 4 GPUs, the paper's 32B repack setting
        : "${MODEL_PATH:=Qwen/Qwen2.5-32B}" "${TRAIN_NODES:=8}" "${ROLLOUT_NODES:=8}"
        : "${GEN_TP:=4}" "${SP_SIZE:=8}" "${OFFLOAD:=True}" ;;
    72b) # 1,024 GPUs (128 machines of 8), the paper's largest scale
        : "${MODEL_PATH:=Qwen/Qwen2.5-72B}" "${TRAIN_NODES:=64}" "${ROLLOUT_NODES:=64}"
        : "${GEN_TP:=8}" "${SP_SIZE:=8}" "${OFFLOAD:=True}" ;;
    *)
        echo "unknown MODEL_SIZE=$MODEL_SIZE: use 7b, 32b or 72b" >&2
        exit 2 ;;
esac

# ---- task: math (this directory) or tool_calling (recipes/tool_calling/, same settings plus multi-turn tools) ----
TASK=${TASK:-math}
case "$TASK" in
    math) : "${DATA_DIR:=$HOME/data/dapo_math}" ;;          # recipes/dapo_math/prepare_data.py writes these
    tool_calling) : "${DATA_DIR:=$HOME/data/tool_math}" ;;  # recipes/tool_calling/prepare_data.py writes these
    *) echo "unknown TASK=$TASK: use math or tool_calling" >&2; exit 2 ;;
esac
RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ---- data ----
TRAIN_FILE=${TRAIN_FILE:-"$DATA_DIR/dapo-math-17k.parquet"}
VAL_FILE=${VAL_FILE:-"$DATA_DIR/aime-2024.parquet"}

# ---- paper settings ----
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2048}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-16384}
TRAIN_PROMPTS=${TRAIN_PROMPTS:-512}
N_RESPONSES=${N_RESPONSES:-16}
MINI_BATCH_UPDATES=${MINI_BATCH_UPDATES:-16}
CLIP_RATIO_LOW=${CLIP_RATIO_LOW:-0.2}
CLIP_RATIO_HIGH=${CLIP_RATIO_HIGH:-0.28}
LR=${LR:-1e-6}
# DAPO's overlong shaping: responses longer than MAX_RESPONSE_LENGTH - OVERLONG_BUFFER are penalised linearly.
OVERLONG_BUFFER=${OVERLONG_BUFFER:-4096}
OVERLONG_PENALTY=${OVERLONG_PENALTY:-1.0}

# ---- placement ----
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
# The synchronous baseline colocates training and generation on all nodes; the asynchronous variants split them.
NNODES=${NNODES:-$((TRAIN_NODES + ROLLOUT_NODES))}

# ---- performance knobs (do not change the algorithm) ----
ACTOR_MAX_TOKENS_PER_GPU=${ACTOR_MAX_TOKENS_PER_GPU:-$(((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH) * 2 / SP_SIZE))}
LOGPROB_MAX_TOKENS_PER_GPU=${LOGPROB_MAX_TOKENS_PER_GPU:-$(((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH) * 3 / SP_SIZE))}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.85}
PROJECT_NAME=${PROJECT_NAME:-laminar_${TASK/math/dapo_math}}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-"$(basename "$MODEL_PATH")-${VARIANT}-${NNODES}x${GPUS_PER_NODE}"}
LOGGER=${LOGGER:-'["console"]'}
PYTHON=${PYTHON:-python3}

MINI_BATCH_PROMPTS=$((TRAIN_PROMPTS / MINI_BATCH_UPDATES))

ARGS=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    algorithm.kl_ctrl.kl_coef=0.0
    data.train_files="$TRAIN_FILE"
    data.val_files="$VAL_FILE"
    data.prompt_key=prompt
    data.truncation=left
    data.max_prompt_length="$MAX_PROMPT_LENGTH"
    data.max_response_length="$MAX_RESPONSE_LENGTH"
    data.train_batch_size="$TRAIN_PROMPTS"
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.ppo_mini_batch_size="$MINI_BATCH_PROMPTS"
    actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$ACTOR_MAX_TOKENS_PER_GPU"
    actor_rollout_ref.actor.ulysses_sequence_parallel_size="$SP_SIZE"
    actor_rollout_ref.actor.clip_ratio_low="$CLIP_RATIO_LOW"
    actor_rollout_ref.actor.clip_ratio_high="$CLIP_RATIO_HIGH"
    actor_rollout_ref.actor.clip_ratio_c=10.0
    actor_rollout_ref.actor.loss_agg_mode=token-mean
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.kl_loss_coef=0.0
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.grad_clip=1.0
    actor_rollout_ref.actor.optim.lr="$LR"
    actor_rollout_ref.actor.optim.lr_warmup_steps=10
    actor_rollout_ref.actor.optim.weight_decay=0.1
    actor_rollout_ref.actor.fsdp_config.param_offload="$OFFLOAD"
    actor_rollout_ref.actor.fsdp_config.optimizer_offload="$OFFLOAD"
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.n="$N_RESPONSES"
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.top_p=1.0
    actor_rollout_ref.rollout.top_k=-1
    actor_rollout_ref.rollout.tensor_model_parallel_size="$GEN_TP"
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION"
    actor_rollout_ref.rollout.max_num_batched_tokens=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu="$LOGPROB_MAX_TOKENS_PER_GPU"
    actor_rollout_ref.rollout.val_kwargs.do_sample=True
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7
    actor_rollout_ref.rollout.val_kwargs.n=1
    reward.reward_manager.name=dapo
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True
    +reward.reward_kwargs.overlong_buffer_cfg.len="$OVERLONG_BUFFER"
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor="$OVERLONG_PENALTY"
    +reward.reward_kwargs.overlong_buffer_cfg.log=False
    +reward.reward_kwargs.max_resp_len="$MAX_RESPONSE_LENGTH"
    trainer.project_name="$PROJECT_NAME"
    trainer.experiment_name="$EXPERIMENT_NAME"
    trainer.logger="$LOGGER"
    trainer.n_gpus_per_node="$GPUS_PER_NODE"
    trainer.val_before_train=False
    trainer.test_freq=10
    trainer.save_freq=50
)

if [ "$TASK" = tool_calling ]; then
    # The paper's second task: multi-turn code execution in a sandbox, up to MAX_TOOL_CALLS calls per trajectory.
    # verl's tool_agent loop (hermes format) with our code interpreter (local bubblewrap sandbox, or a
    # SandboxFusion-compatible endpoint set in the tool YAML); the reward scores the final `Answer:` after the last
    # tool output. Tool turns count as user turns in verl, so a trajectory has at most MAX_TOOL_CALLS + 1
    # assistant turns (the last one answers).
    MAX_TOOL_CALLS=${MAX_TOOL_CALLS:-8}
    TOOL_CONFIG=${TOOL_CONFIG:-"$RECIPES_DIR/tool_calling/code_interpreter_tool.yaml"}
    MAX_TOOL_RESPONSE_LENGTH=${MAX_TOOL_RESPONSE_LENGTH:-2048}
    ARGS+=(
        actor_rollout_ref.rollout.multi_turn.enable=True
        actor_rollout_ref.rollout.multi_turn.format=hermes
        actor_rollout_ref.rollout.multi_turn.max_user_turns="$MAX_TOOL_CALLS"
        actor_rollout_ref.rollout.multi_turn.max_assistant_turns=$((MAX_TOOL_CALLS + 1))
        actor_rollout_ref.rollout.multi_turn.max_tool_response_length="$MAX_TOOL_RESPONSE_LENGTH"
        actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOL_CONFIG"
        actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent
        # pkg:// resolves on whichever node runs the reward worker (a repository path may exist only on the head)
        reward.custom_reward_function.path=pkg://verl_laminar.reward.tool_answer
        reward.custom_reward_function.name=compute_score
    )
fi

case "$VARIANT" in
    sync)
        # verl's synchronous trainer: training and generation take turns on every GPU.
        ARGS+=(trainer.nnodes="$NNODES" trainer.v1.trainer_mode=sync)
        ;;
    separate_async)
        # verl's own asynchronous baseline: standalone rollout nodes, one global weight sync per step
        # (parameter_sync_step mini-batches = one step, so staleness is bounded like one-step-off).
        ARGS+=(
            trainer.nnodes="$TRAIN_NODES"
            actor_rollout_ref.hybrid_engine=False
            actor_rollout_ref.rollout.nnodes="$ROLLOUT_NODES"
            actor_rollout_ref.rollout.n_gpus_per_node="$GPUS_PER_NODE"
            actor_rollout_ref.rollout.checkpoint_engine.backend=nccl
            trainer.v1.trainer_mode=separate_async
            trainer.v1.separate_async.parameter_sync_step="$MINI_BATCH_UPDATES"
        )
        ;;
    laminar)
        # Same placement as separate_async; +laminar=enabled swaps in trajectory-level asynchrony and the relays.
        ARGS+=(
            trainer.nnodes="$TRAIN_NODES"
            actor_rollout_ref.hybrid_engine=False
            actor_rollout_ref.rollout.nnodes="$ROLLOUT_NODES"
            actor_rollout_ref.rollout.n_gpus_per_node="$GPUS_PER_NODE"
            +laminar=enabled
        )
        ;;
    *)
        echo "unknown VARIANT=$VARIANT: use sync, separate_async or laminar" >&2
        exit 2
        ;;
esac

if [ "${LAMINAR_PREFLIGHT:-0}" = 1 ]; then
    # check these overrides before GPUs are spent: python -m verl_laminar.preflight prints one table, exits 1 on a
    # check that would fail (PREFLIGHT_ARGS: its own options, e.g. "--json --link-gbps 100")
    # shellcheck disable=SC2086
    exec "$PYTHON" -m verl_laminar.preflight --target gpu ${PREFLIGHT_ARGS:-} "${ARGS[@]}" "$@"
fi
exec "$PYTHON" -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
