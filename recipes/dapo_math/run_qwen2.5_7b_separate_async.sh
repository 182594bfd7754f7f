#!/usr/bin/env bash
# DAPO-Math, Qwen2.5-7B: verl's separate_async trainer, same trainer/rollout split as Laminar (baseline).
# Settings and per-model GPU defaults live in common.sh; override any variable from the environment.
# Usage: bash $0 [extra hydra overrides]      print the config only: bash $0 --cfg job
MODEL_SIZE=7b VARIANT=separate_async
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
