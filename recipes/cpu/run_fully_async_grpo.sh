#!/usr/bin/env bash
# verl's fully_async_policy (partial rollout: the AReaL-like design) on CPU, on the workload the other CPU
# recipes share. Its own entry point and config (verl.experimental.fully_async_policy), not main_ppo.
#
#   STEPS=4 REPLICAS=2 bash recipes/cpu/run_fully_async_grpo.sh [extra hydra overrides...]
#
# Resources: TRAINER_RANKS (default 1) FSDP ranks for the trainer + REPLICAS standalone rollout replicas; weights move through the
# laminar checkpoint engine (verl's default nccl backend needs CUDA), as in run_separate_async_grpo.sh.
set -euo pipefail
REPLICAS=${REPLICAS:-2}
TRAINER_RANKS=${TRAINER_RANKS:-1}  # FSDP ranks of the trainer (logical Ray GPUs; on CPU they share the cores)
OUT=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/runs/cpu_fully_async}
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
if [ "$ENTRY" = verl.trainer.main_ppo ]; then ENTRY=verl.experimental.fully_async_policy.fully_async_main; fi
# fully_async_policy streams prompts one at a time and asserts data.train_batch_size == 0; its trainer steps
# every ppo_mini_batch_size prompts (BATCH, as in the other recipes). Its rollout pool is the top-level rollout.*
# block; actor_rollout_ref.rollout.{nnodes,n_gpus_per_node} say the same so that the CPU platform sizes Ray's
# logical GPUs for it (without them the rollouter's placement group waited forever for GPUs Ray did not have).
# Its rollouter actor asks for 10 logical CPUs, more than the CPU platform's default 16 leave free: 32.
FA_WORKLOAD=()
for kv in "${WORKLOAD[@]}"; do
  case "$kv" in data.train_batch_size=*) FA_WORKLOAD+=(data.train_batch_size=0) ;; *) FA_WORKLOAD+=("$kv") ;; esac
done

exec "$PY" -m "$ENTRY" \
  actor_rollout_ref.hybrid_engine=False \
  rollout.nnodes=1 \
  actor_rollout_ref.rollout.nnodes=1 \
  actor_rollout_ref.rollout.n_gpus_per_node="$REPLICAS" \
  rollout.n_gpus_per_node="$REPLICAS" \
  rollout.n="$GROUP" \
  rollout.total_rollout_steps=$((STEPS * BATCH)) \
  data.gen_batch_size=1 \
  async_training.trigger_parameter_sync_step=1 \
  async_training.require_batches=1 \
  actor_rollout_ref.model.use_remove_padding=False \
  actor_rollout_ref.rollout.checkpoint_engine.backend=laminar \
  actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_laminar.relay.verl_backend \
  trainer.n_gpus_per_node="$TRAINER_RANKS" \
  trainer.experiment_name=fully_async_grpo \
  ray_kwargs.ray_init.num_cpus=32 \
  "${FA_WORKLOAD[@]}" \
  "$@"
