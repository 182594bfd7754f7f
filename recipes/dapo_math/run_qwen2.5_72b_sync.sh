#!/usr/bin/env bash
# DAPO-Math, Qwen2.5-72B: verl's synchronous trainer on all nodes (baseline).
# Settings and per-model GPU defaults live in common.sh; override any variable from the environment.
# Usage: bash $0 [extra hydra overrides]      print the config only: bash $0 --cfg job
MODEL_SIZE=72b VARIANT=sync
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
