#!/usr/bin/env bash
# verl's own synchronous GRPO trainer on CPU, on the project's fixtures (tiny Qwen2 + toy math set).
# This is also the baseline the Laminar trainer is compared with (same workload, same seeds).
#
#   bash recipes/cpu/run_sync_grpo.sh [extra hydra overrides...]
#   STEPS=3 N_RANKS=2 bash recipes/cpu/run_sync_grpo.sh trainer.logger='[console]'
#
# Nothing here is CPU-specific: the CPU platform of verl_laminar (active automatically when no accelerator is
# present) supplies the values a CPU host needs (fsdp2, sdpa, gloo, no sleep mode, logical Ray GPUs).
set -euo pipefail
N_RANKS=${N_RANKS:-2}          # FSDP ranks = rollout replicas (tp 1) in verl's colocated sync mode
OUT=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/runs/cpu_sync}
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

exec "$PY" -m "$ENTRY" \
  trainer.n_gpus_per_node="$N_RANKS" \
  trainer.experiment_name=sync_grpo \
  "${WORKLOAD[@]}" \
  "$@"
