#!/usr/bin/env bash
# First contact with a GPU machine (2+ GPUs, CUDA torch, vLLM, Ray and verl 0.9.1 installed, this package
# installed with `pip install -e .`): builds the fixture model, runs the preflight, then +laminar=enabled for
# 3 steps (1 GPU trains, the others serve vLLM replicas, relays as on a cluster, a weight bucket below the largest
# tensor), and prints a JSON verdict: every replica loaded trained weights, 0 invariant violations, nothing left
# in /dev/shm. Exit status 0 only when every check passed.
#   bash scripts/gpu_smoke.sh [--steps 3] [--gpus N] [--bucket-mb 16] [--dry-run]
set -euo pipefail
PY=${PY:-python3}
export PY
"$PY" -m verl_laminar.fixtures >&2
exec "$PY" -m verl_laminar.smoke "$@"
