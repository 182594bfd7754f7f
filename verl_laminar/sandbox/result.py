"""Outcome of one sandboxed snippet, and the pure rule that names it."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass


class SandboxStatus(str, enum.Enum):
    OK = "ok"  # exited 0
    ERROR = "error"  # exited non-zero (an exception, sys.exit(n), a MemoryError under the memory limit)
    KILLED = "killed"  # ended by a signal: CPU-time limit (SIGXCPU/SIGKILL) or a crash
    TIMEOUT = "timeout"  # wall-clock limit passed; the sandbox was killed
    OUTPUT_LIMIT = "output_limit"  # printed more than max_output_bytes; the sandbox was killed


@dataclass(frozen=True)
class SandboxResult:
    status: SandboxStatus
    # Exit code as bwrap reports it: the snippet's own code, or 128+signal when a signal ended it.
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    # True when stdout or stderr was cut at max_output_bytes.
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status is SandboxStatus.OK

    def describe(self) -> str:
        """One line for logs and for the model: what happened, without the output itself."""
        if self.status is SandboxStatus.KILLED and self.exit_code is not None and self.exit_code > 128:
            try:
                name = signal.Signals(self.exit_code - 128).name
            except ValueError:
                name = f"signal {self.exit_code - 128}"
            return f"killed by {name} (CPU-time or memory limit, or a crash)"
        return {
            SandboxStatus.OK: "finished",
            SandboxStatus.ERROR: f"exited with code {self.exit_code}",
            SandboxStatus.KILLED: "killed",
            SandboxStatus.TIMEOUT: f"timed out after {self.wall_s:.1f}s and was killed",
            SandboxStatus.OUTPUT_LIMIT: "printed more than the output limit and was killed",
        }[self.status]


def classify(exit_code: int | None, *, timed_out: bool, output_over: bool) -> SandboxStatus:
    """Timeouts and output overruns win over the exit code: we killed the process, so its code says nothing."""
    if timed_out:
        return SandboxStatus.TIMEOUT
    if output_over:
        return SandboxStatus.OUTPUT_LIMIT
    if exit_code == 0:
        return SandboxStatus.OK
    if exit_code is not None and (exit_code < 0 or exit_code > 128):
        return SandboxStatus.KILLED
    return SandboxStatus.ERROR
