"""The run watchdog: a coroutine or a command past its limit ends with an error, not a hang."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from verl_laminar.watchdog import TIMED_OUT, RunTimeout, bounded, main, run_command


def test_bounded_returns_the_result_in_time_and_raises_naming_the_run_after():
    async def quick():
        return 7

    assert asyncio.run(bounded(quick(), 5, "quick")) == 7
    with pytest.raises(RunTimeout, match=r"bench.x did not finish within 0 s"):
        asyncio.run(bounded(asyncio.sleep(10), 0.2, "bench.x"))
    with pytest.raises(ValueError, match="must be positive"):
        asyncio.run(bounded(quick(), 0, "quick"))


def test_command_status_passes_through_and_a_hung_group_is_ended(tmp_path):
    assert run_command([sys.executable, "-c", "import sys; sys.exit(3)"], 30) == 3
    # the child spawns a grandchild in the same group; both must be gone after the limit
    marker = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f" open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    t0 = time.monotonic()
    assert run_command([sys.executable, "-c", code], 2, grace_s=5) == TIMED_OUT
    assert time.monotonic() - t0 < 15
    import psutil

    pid = int(marker.read_text())
    deadline = time.monotonic() + 10  # the group got SIGTERM; the grandchild takes a moment to go

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped
        except psutil.NoSuchProcess:
            return True

    while not gone() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(), f"the grandchild {pid} outlived the watchdog's SIGTERM to its process group"


def test_cli_takes_the_command_after_a_double_dash():
    assert main(["--limit-s", "30", "--", sys.executable, "-c", "pass"]) == 0
    with pytest.raises(SystemExit):
        main(["--limit-s", "0", "--", sys.executable, "-c", "pass"])
