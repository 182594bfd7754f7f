"""A deadline for a whole run, so the demo, a benchmark or an e2e launch ends with an error instead of hanging.

* ``bounded(coro, limit_s, what)``: awaits ``coro``, or raises ``RunTimeout`` naming ``what`` and the limit.
* ``python -m verl_laminar.watchdog --limit-s N -- CMD ...``: runs CMD in its own session; at the limit it logs
  what it ends, sends SIGTERM to CMD's process group, SIGKILL after ``--grace-s``, and exits 124 (like
  coreutils' ``timeout``). Otherwise it exits with CMD's status.

Failures inside a run are reported by the run itself (``WeightSyncError`` and friends); this is the backstop for
a hang nobody anticipated.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
from typing import Any, Awaitable, Optional, TypeVar

logger = logging.getLogger("verl_laminar.watchdog")

T = TypeVar("T")
TIMED_OUT = 124


class RunTimeout(TimeoutError):
    """A run passed its deadline."""


async def bounded(coro: Awaitable[T], limit_s: float, what: str) -> T:
    if limit_s <= 0:
        raise ValueError(f"{what}: the time limit must be positive, got {limit_s}")
    try:
        return await asyncio.wait_for(coro, limit_s)
    except asyncio.TimeoutError:
        raise RunTimeout(f"{what} did not finish within {limit_s:.0f} s; ended by the watchdog "
                         "(raise the limit if the run is only slow)") from None


def run_command(cmd: list[str], limit_s: float, grace_s: float = 30.0, **popen: Any) -> int:
    """Run ``cmd`` in its own session; end its whole process group at ``limit_s``. Returns its exit status.

    ``popen``: more ``subprocess.Popen`` arguments (``stdout``, ``env``, ``cwd``)."""
    if not cmd:
        raise ValueError("no command given: python -m verl_laminar.watchdog --limit-s N -- CMD ...")
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        return proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        logger.error("%s did not finish within %.0f s: ending its process group %d", " ".join(cmd), limit_s,
                     proc.pid)
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        return TIMED_OUT
    except KeyboardInterrupt:
        _signal_group(proc.pid, signal.SIGTERM)
        raise


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)  # the session this module started, and only it
    except ProcessLookupError:
        pass


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit-s", type=float, required=True)
    p.add_argument("--grace-s", type=float, default=30.0)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if a.limit_s <= 0:
        p.error(f"--limit-s must be positive, got {a.limit_s}")
    return run_command(cmd, a.limit_s, a.grace_s)


if __name__ == "__main__":
    sys.exit(main())
