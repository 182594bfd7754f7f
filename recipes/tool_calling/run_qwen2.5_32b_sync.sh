#!/usr/bin/env bash
# Tool calling (DAPO-Math with a code interpreter, up to 8 calls), Qwen2.5-32B: verl's synchronous trainer on all nodes (baseline).
# Settings and per-model GPU defaults live in ../dapo_math/common.sh; override any variable from the environment.
# Usage: bash $0 [extra hydra overrides]      print the config only: bash $0 --cfg job
MODEL_SIZE=32b VARIANT=sync TASK=tool_calling
source "$(dirname "${BASH_SOURCE[0]}")/../dapo_math/common.sh"
