"""Typed limits for the local code sandbox.

Every field is validated when the object is built, so a bad YAML value fails at start-up with a message
that names the key, the value and the fix, not halfway through a training step.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Mapping


class SandboxConfigError(ValueError):
    """A sandbox setting is out of range; the message names the key and the fix."""


def _default_python() -> str:
    # The interpreter that runs verl is known to work on this machine; the sandbox binds only its prefix.
    return os.path.realpath(sys.executable)


@dataclass(frozen=True)
class SandboxConfig:
    # Wall-clock limit for one snippet; the whole process group is killed when it passes.
    timeout_s: float = 10.0
    # CPU-seconds limit (RLIMIT_CPU) per process; catches busy loops even when the wall clock is generous.
    cpu_time_s: int = 10
    # Address-space limit (RLIMIT_AS) per process, in MiB.
    memory_mb: int = 1024
    # Processes/threads the snippet may hold at once (RLIMIT_NPROC under a non-root uid).
    max_processes: int = 32
    # Bytes of stdout and of stderr kept; more than this kills the snippet and marks the output truncated.
    max_output_bytes: int = 1 << 20
    # Size of the throw-away writable /tmp inside the sandbox, in MiB (also bounds RLIMIT_FSIZE).
    tmpfs_mb: int = 64
    # Open file descriptors per process (RLIMIT_NOFILE).
    max_open_files: int = 256
    # Snippets run at once by one LocalSandbox; more callers wait for a slot.
    max_concurrency: int = 4
    # Interpreter run inside the sandbox; its installation prefix is bound read-only.
    python: str = field(default_factory=_default_python)
    # Extra host paths bound read-only inside the sandbox (data files, for example).
    extra_ro_paths: tuple[str, ...] = ()
    # Directories bound read-only and appended to the snippet's sys.path (e.g. a site-packages with sympy/numpy).
    python_path: tuple[str, ...] = ()
    # Run the interpreter's own `site` (its site-packages and .pth files). Off by default: it costs start-up
    # time on every snippet and exposes whatever that installation holds.
    import_site: bool = False
    # When the caller is root, snippets run as host uids from this range (one per concurrent slot),
    # so RLIMIT_NPROC applies: the kernel ignores it for uid 0.
    uid_base: int = 61000
    uid_count: int = 1024

    def __post_init__(self) -> None:
        positive = {
            "timeout_s": self.timeout_s,
            "cpu_time_s": self.cpu_time_s,
            "memory_mb": self.memory_mb,
            "max_processes": self.max_processes,
            "max_output_bytes": self.max_output_bytes,
            "tmpfs_mb": self.tmpfs_mb,
            "max_open_files": self.max_open_files,
            "max_concurrency": self.max_concurrency,
            "uid_count": self.uid_count,
        }
        for key, value in positive.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SandboxConfigError(f"sandbox.{key}={value!r} is invalid: set it to a positive number")
        if self.memory_mb < 64:
            raise SandboxConfigError(
                f"sandbox.memory_mb={self.memory_mb} is too small for a Python interpreter: use at least 64"
            )
        if self.max_processes < 2:
            raise SandboxConfigError(
                f"sandbox.max_processes={self.max_processes} leaves no room for the interpreter: use at least 2"
            )
        if not 1000 <= self.uid_base or self.uid_base + self.uid_count > 65534:
            raise SandboxConfigError(
                f"sandbox.uid_base={self.uid_base} with uid_count={self.uid_count} must lie in [1000, 65534): "
                "pick an unused uid range"
            )
        if self.uid_count < self.max_concurrency:
            raise SandboxConfigError(
                f"sandbox.uid_count={self.uid_count} is below max_concurrency={self.max_concurrency}: "
                "raise uid_count"
            )
        if not os.path.isabs(self.python):
            raise SandboxConfigError(f"sandbox.python={self.python!r} must be an absolute path to an interpreter")
        for key in ("extra_ro_paths", "python_path"):
            for path in getattr(self, key):
                if not os.path.isabs(path):
                    raise SandboxConfigError(f"sandbox.{key} entry {path!r} must be an absolute path")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "SandboxConfig":
        """Build from a YAML/dict section; unknown keys are errors so a typo is not silently ignored."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SandboxConfigError(f"unknown sandbox key(s) {unknown}: valid keys are {sorted(known)}")
        for key in ("extra_ro_paths", "python_path"):
            if key in values:
                values[key] = tuple(values[key] or ())
        return cls(**values)
