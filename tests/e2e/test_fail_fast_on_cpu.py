"""A weight load that fails inside a vLLM worker ends the whole run within 60 s, with the root cause.

``LAMINAR_FAULT_WEIGHT_LOAD=1`` makes the first weight load of every vLLM worker raise (``InjectedLoadFault``).
Before the ``weight_sync_fail_fast`` patch, verl's sender waited forever for that receiver's ack and the run hung;
now the run must exit non-zero within 60 s of the fault, and its last error must name the replica, the version
and the injected error, not the secondary ``BufferError`` of the receiver's cleanup.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from laminar_testing import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

BOUND_S = 60.0


def run_until_exit(cmd: list[str], env: dict, limit_s: float) -> tuple[int | None, str, float | None, float]:
    """Run ``cmd``; returns (exit status or None if killed at ``limit_s``, output, time of the fault, exit time)."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    fault_at: list[float] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if not fault_at and "InjectedLoadFault" in line:
                fault_at.append(time.monotonic())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the group this test started
        proc.wait()
        rc = None
    ended = time.monotonic()
    reader.join(10)
    return rc, "".join(lines), (fault_at[0] if fault_at else None), ended


# the sync recipe's case is slow (a whole launch, ~3 min here); CI keeps Laminar's, whose weight path is ours
@pytest.mark.parametrize("recipe", [pytest.param("run_sync_grpo.sh", marks=pytest.mark.slow), "run_laminar_grpo.sh"])
def test_failed_weight_load_ends_the_run_with_its_cause(tiny_model_dir, tmp_path, recipe):
    env = {**os.environ, "STEPS": "1", "RESP": "32", "OUT": str(tmp_path), "MODEL": str(tiny_model_dir),
           "LAMINAR_FAULT_WEIGHT_LOAD": "1", "PYTHONUNBUFFERED": "1"}
    rc, log, fault_at, ended = run_until_exit(["bash", str(REPO / "recipes/cpu" / recipe)], env, limit_s=600)
    (tmp_path / "run.log").write_text(log)
    assert fault_at is not None, "the injected fault never fired:\n" + log[-3000:]
    assert rc is not None, f"the run hung after the fault (killed at 600 s):\n{log[-3000:]}"
    assert rc != 0
    assert ended - fault_at <= BOUND_S, f"the run took {ended - fault_at:.0f} s to end after the fault"
    # the job's error: verl's driver re-raises the TaskRunner's, whose cause is the replica's WeightSyncError
    assert "Error executing job" in log or "RayTaskError(WeightSyncError)" in log, log[-3000:]
    lines = [x for x in log.splitlines() if "weight_sync_guard.WeightSyncError: " in x]
    assert lines, "no WeightSyncError raised:\n" + log[-3000:]
    line = lines[0]
    assert "replica" in line and "version 0" in line and "InjectedLoadFault" in line, line
    assert "BufferError" not in line, line
    print(f"ended {ended - fault_at:.1f} s after the fault: {line}")  # recorded in the test log (-s / -rA)
