"""Local code sandbox: bubblewrap namespaces plus resource limits, no server to run."""

from verl_laminar.sandbox.config import SandboxConfig, SandboxConfigError
from verl_laminar.sandbox.result import SandboxResult, SandboxStatus
from verl_laminar.sandbox.runner import INSTALL_HINT, LocalSandbox, SandboxUnavailable

__all__ = [
    "INSTALL_HINT",
    "LocalSandbox",
    "SandboxConfig",
    "SandboxConfigError",
    "SandboxResult",
    "SandboxStatus",
    "SandboxUnavailable",
]
