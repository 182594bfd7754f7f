"""Typed config of the code-interpreter tool, read from the `config:` block of a verl tool YAML."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from verl_laminar.sandbox.config import SandboxConfig


class ToolConfigError(ValueError):
    """A tool setting is invalid; the message names the key and the fix."""


# Keys verl itself puts into the tool's config block; accepted and ignored here.
_VERL_KEYS = {"type"}


@dataclass(frozen=True)
class CodeInterpreterConfig:
    # Wall-clock limit per call, seconds (local sandbox and remote run_timeout).
    timeout_s: float = 10.0
    # Memory limit per call, MiB (local RLIMIT_AS and remote memory_limit_MB).
    memory_mb: int = 1024
    # Calls running at once in one agent-loop worker; further calls wait.
    max_concurrency: int = 4
    # Characters of tool output returned to the model; the middle is cut so the head and the traceback stay.
    max_output_chars: int = 2048
    # A SandboxFusion-compatible `/run_code` URL; empty runs code in the local bubblewrap sandbox.
    sandbox_fusion_url: str = ""
    # Extra local-sandbox keys (see verl_laminar.sandbox.config.SandboxConfig), e.g. extra_ro_paths.
    sandbox: Mapping[str, Any] = field(default_factory=dict)
    # Extra seconds the HTTP request may take beyond timeout_s (queueing at the remote service).
    remote_grace_s: float = 30.0

    def __post_init__(self) -> None:
        for key in ("timeout_s", "memory_mb", "max_concurrency", "max_output_chars", "remote_grace_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ToolConfigError(f"code_interpreter {key}={value!r} is invalid: set it to a positive number")
        if self.max_output_chars < 64:
            raise ToolConfigError(
                f"code_interpreter max_output_chars={self.max_output_chars} leaves no room for a traceback: use >= 64"
            )
        url = self.sandbox_fusion_url
        if url and not url.startswith(("http://", "https://")):
            raise ToolConfigError(
                f"code_interpreter sandbox_fusion_url={url!r} must start with http:// or https:// "
                "(or be empty for the local sandbox)"
            )

    @property
    def remote(self) -> bool:
        return bool(self.sandbox_fusion_url)

    def sandbox_config(self) -> SandboxConfig:
        """Local sandbox limits: the tool's timeout/memory/concurrency, overridden by the `sandbox` block."""
        values: dict[str, Any] = {
            "timeout_s": self.timeout_s,
            "cpu_time_s": max(1, int(self.timeout_s)),
            "memory_mb": int(self.memory_mb),
            "max_concurrency": int(self.max_concurrency),
        }
        values.update(self.sandbox)
        return SandboxConfig.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "CodeInterpreterConfig":
        values = {k: v for k, v in dict(values or {}).items() if k not in _VERL_KEYS}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ToolConfigError(f"unknown code_interpreter key(s) {unknown}: valid keys are {sorted(known)}")
        if values.get("sandbox_fusion_url") is None:
            values.pop("sandbox_fusion_url", None)
        return cls(**values)
