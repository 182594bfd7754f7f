# Shared by the CPU recipes: one workload, so the sync baseline and Laminar are compared on identical settings.
# Sourced (not run). Expects OUT set by the caller; exports WORKLOAD, the Hydra overrides both recipes pass.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PY:-$repo/.venv/bin/python}
# LAMINAR_PREFLIGHT=1: check the run's overrides (python -m verl_laminar.preflight) instead of training
if [ "${LAMINAR_PREFLIGHT:-0}" = 1 ]; then ENTRY=verl_laminar.preflight; else ENTRY=verl.trainer.main_ppo; fi
MODEL=${MODEL:-$("$PY" -c 'from verl_laminar.fixtures import model_dir; print(model_dir())')}
DATA=${DATA:-$repo/verl_laminar/data/toy_math}
STEPS=${STEPS:-3}
BATCH=${BATCH:-8}              # prompts per step
GROUP=${GROUP:-4}              # responses per prompt (GRPO group)
SKEW=${SKEW:-0}                # 1: seeded long-tailed response lengths (skewed_agent_loop.yaml), p99 ~10x median
TASK=${TASK:-math}             # math: single-turn toy math; tool: multi-turn code-interpreter calls in the sandbox
case "$TASK" in
  math) PROMPT=${PROMPT:-128} ;;
  tool) PROMPT=${PROMPT:-512}  # the chat template puts the tool's JSON schema in the system prompt (~300 tokens)
        if [ "$SKEW" = 1 ]; then echo "SKEW=1 applies to TASK=math only (tool turns end at their own stop)" >&2; exit 2; fi ;;
  *) echo "unknown TASK=$TASK: use math or tool" >&2; exit 2 ;;
esac
if [ "$SKEW" = 1 ]; then RESP=${RESP:-256}; else RESP=${RESP:-128}; fi  # max response tokens
MICRO=${MICRO:-8}              # micro-batch per rank for log-prob and update passes (memory vs speed)
LR=${LR:-1e-4}                 # actor learning rate (Adam)

if [ ! -f "$MODEL/MANIFEST.json" ]; then
  echo "fixture model missing at $MODEL; build it with: $PY -m verl_laminar.fixtures" >&2
  exit 2
fi
mkdir -p "$OUT"
if [ "$TASK" = tool ]; then
  # The toy problems as tool-calling rows (agent_name laminar_tool_guided), rebuilt per run: ~1 s.
  "$PY" -m verl_laminar.data.tool_math --toy --agent laminar_tool_guided --out "$OUT/tool_math" >/dev/null
  DATA=$OUT/tool_math
fi
TRAIN_ROWS=${TRAIN_ROWS:-}    # set: train on the first TRAIN_ROWS rows only, seen again every TRAIN_ROWS/BATCH steps
if [ -n "$TRAIN_ROWS" ]; then
  "$PY" -m verl_laminar.data.subset "$DATA" "$OUT/train_subset" "$TRAIN_ROWS"
  DATA=$OUT/train_subset
fi
export VERL_FILE_LOGGER_PATH=${VERL_FILE_LOGGER_PATH:-$OUT/verl_metrics.jsonl}  # see trainer.logger below
KV_BYTES=${KV_BYTES:-268435456}  # vLLM KV cache per replica (256 MiB holds ~250k tokens of the tiny model)

WORKLOAD=(
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=False
  data.train_files="$DATA/train.parquet"
  data.val_files="$DATA/val.parquet"
  data.train_batch_size="$BATCH"
  data.max_prompt_length="$PROMPT"
  data.max_response_length="$RESP"
  data.filter_overlong_prompts=True  # never left-truncate a prompt silently (verl's agent loop would)
  data.seed=1
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.actor.optim.lr="$LR"
  actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH"
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO"
  actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.clip_ratio_low=0.2
  actor_rollout_ref.actor.clip_ratio_high=0.28
  actor_rollout_ref.actor.loss_agg_mode=token-mean
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n="$GROUP"
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO"
  actor_rollout_ref.rollout.max_num_seqs=32
  +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes="$KV_BYTES"
  trainer.nnodes=1
  trainer.total_training_steps="$STEPS"
  trainer.total_epochs=100
  trainer.val_before_train=False
  trainer.test_freq=-1
  trainer.save_freq=-1
  trainer.logger="${LOGGER:-[console,file]}"
  # verl's file tracker: every step's metrics, one JSON line each; what the benchmarks, the chaos run and the
  # e2e tests read (never the console). The path reaches the trainer process through the job's runtime env.
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH="$VERL_FILE_LOGGER_PATH"
  trainer.project_name=verl_laminar_cpu
  trainer.default_local_dir="$OUT/checkpoints"
)
if [ "$SKEW" = 1 ]; then
  # Every response runs to a length drawn per (prompt index, response index) from one seeded lognormal, and
  # the reward reads only the first answer line; identical in every recipe that sources this file.
  WORKLOAD+=(
    actor_rollout_ref.rollout.agent.default_agent_loop="${SKEW_LOOP:-laminar_skewed}"
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$repo/recipes/cpu/skewed_agent_loop.yaml"
    reward.custom_reward_function.path="$repo/verl_laminar/reward/first_answer.py"
    reward.custom_reward_function.name=compute_score
  )
fi
if [ "$TASK" = tool ]; then
  WORKLOAD+=(
    actor_rollout_ref.rollout.multi_turn.enable=True
    actor_rollout_ref.rollout.multi_turn.format=hermes
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=8
    actor_rollout_ref.rollout.multi_turn.max_tool_response_length=256
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$repo/recipes/tool_calling/code_interpreter_tool.yaml"
    actor_rollout_ref.rollout.agent.default_agent_loop=laminar_tool_guided
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$repo/recipes/cpu/tool_agent_loop.yaml"
    reward.custom_reward_function.path="$repo/verl_laminar/reward/tool_answer.py"
    reward.custom_reward_function.name=compute_score
  )
fi
