#!/usr/bin/env bash
# verl's own separate_async trainer (one-step-off-like: standalone rollouts keep generating while the trainer
# trains; every parameter_sync_step steps all replicas are aborted, synced and resumed together) on the same
# workload as run_sync_grpo.sh and run_laminar_grpo.sh. The comparison point between sync and Laminar.
#
#   REPLICAS=4 SKEW=1 bash recipes/cpu/run_separate_async_grpo.sh
#
# Weights go through the relay checkpoint engine (verl's naive engine is refused by separate_async, and the
# nccl/hccl engines need an accelerator); trainer.v1.trainer_mode=separate_async_relays is verl's separate_async
# trainer unchanged, with the relay group started for it (verl_laminar/trainer/baselines.py).
set -euo pipefail
REPLICAS=${REPLICAS:-2}        # standalone rollout replicas
TRAINER_RANKS=${TRAINER_RANKS:-1}  # FSDP ranks of the trainer (logical Ray GPUs; on CPU they share the cores)
SYNC_STEP=${SYNC_STEP:-1}      # trainer steps between verl's global weight syncs
OUT=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/runs/cpu_separate_async}
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

exec "$PY" -m "$ENTRY" \
  trainer.v1.trainer_mode=separate_async_relays \
  +trainer.v1.separate_async_relays='${trainer.v1.separate_async}' \
  trainer.v1.separate_async.parameter_sync_step="$SYNC_STEP" \
  actor_rollout_ref.hybrid_engine=False \
  actor_rollout_ref.rollout.nnodes=1 \
  actor_rollout_ref.rollout.n_gpus_per_node="$REPLICAS" \
  actor_rollout_ref.rollout.checkpoint_engine.backend=laminar \
  actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_laminar.relay.verl_backend \
  trainer.n_gpus_per_node="$TRAINER_RANKS" \
  trainer.experiment_name=separate_async_grpo \
  "${WORKLOAD[@]}" \
  "$@"
