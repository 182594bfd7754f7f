"""verl_laminar's config: the ``+laminar=enabled`` Hydra group (``laminar/enabled.yaml``, found through
``pkg://verl_laminar.config``) and its typed, validated view.

Importable without torch, ray, vLLM or verl.
"""

from verl_laminar.config.legacy_reward import check_legacy_reward_keys
from verl_laminar.config.schema import (
    BufferConfig,
    DispatchConfig,
    FaultInjectionConfig,
    HeartbeatConfig,
    LaminarConfig,
    LaminarConfigError,
    MetricsConfig,
    OffPolicyConfig,
    PoolConfig,
    RefreshConfig,
    RelayConfig,
    RepackConfig,
    ReplaceConfig,
)
from verl_laminar.config.validate import RELAY_BACKEND, RELAY_BACKEND_MODULE, resolve_replicas, validate_and_migrate

__all__ = [
    "BufferConfig",
    "DispatchConfig",
    "HeartbeatConfig",
    "ReplaceConfig",
    "LaminarConfig",
    "LaminarConfigError",
    "MetricsConfig",
    "FaultInjectionConfig",
    "OffPolicyConfig",
    "PoolConfig",
    "RELAY_BACKEND",
    "RELAY_BACKEND_MODULE",
    "RefreshConfig",
    "RelayConfig",
    "RepackConfig",
    "check_legacy_reward_keys",
    "resolve_replicas",
    "validate_and_migrate",
]
