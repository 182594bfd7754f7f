"""Runs one command in its own session with a wall-clock deadline and capped output.

Dataflow: Popen(start_new_session) -> select() on stdout/stderr until both close, the deadline passes, or a
stream exceeds its cap -> SIGKILL to the whole process group -> wait. The group is killed on every path,
including normal exit, so nothing the command started can hold the pipes open or outlive the call.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_CHUNK = 1 << 16


@dataclass(frozen=True)
class ProcessOutcome:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_over: bool
    wall_s: float


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone: nothing left to kill
    except PermissionError:
        # The group leader exec'd into something we may not signal; it is still our child, so the caller's
        # wait() reaps it, and bwrap's pid namespace takes the rest down with it.
        logger.warning("could not signal process group %d", pgid)


def run_capped(argv: list[str], *, timeout_s: float, max_bytes: int, env: dict[str, str] | None = None) -> ProcessOutcome:
    start = time.monotonic()
    deadline = start + timeout_s
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        env=env if env is not None else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    timed_out = output_over = False
    selector = selectors.DefaultSelector()
    try:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(timeout=remaining):
                data = os.read(key.fd, _CHUNK)
                if not data:
                    selector.unregister(key.fd)
                    continue
                buf = buffers[key.fd]
                room = max_bytes - len(buf)
                buf += data[:room]
                if len(data) > room:
                    output_over = True
            if output_over:
                break
        if not (timed_out or output_over):
            # Both pipes closed; let the leader report its own exit status before the group is killed
            # (killing first would turn every exit code into -9). A snippet that closed its pipes but keeps
            # running is still bound by the deadline.
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        selector.close()
        _kill_group(proc.pid)
        exit_code = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return ProcessOutcome(
        exit_code=exit_code,
        stdout=bytes(buffers[out_fd]),
        stderr=bytes(buffers[err_fd]),
        timed_out=timed_out,
        output_over=output_over,
        wall_s=time.monotonic() - start,
    )
