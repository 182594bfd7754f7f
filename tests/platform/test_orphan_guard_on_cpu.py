"""The orphan guard ends what a SIGKILLed process left running (a vLLM server actor's engine core and workers),
and never a process that merely reused a recorded PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from verl_laminar.platform.procs import same_processes

# A parent that starts its guard, then a child and a grandchild that would run for 10 minutes (as vLLM's engine
# core and its worker do); it prints their PIDs and waits to be killed.
PARENT = """
import subprocess, sys, time
from verl_laminar.platform.orphan_guard import watch
guard = watch(poll_s=0.2)
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print(g.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
print(guard.pid, child.pid, grandchild, flush=True)
time.sleep(600)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_killed_parent_leaves_nothing_running():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    guard, child, grandchild = map(int, parent.stdout.readline().split())
    try:
        time.sleep(1.0)  # the guard records the descendants at least once
        assert psutil.Process(grandchild).is_running()
        os.kill(parent.pid, signal.SIGKILL)  # as Ray ends an actor
        parent.wait(10)
        assert _gone(child, 10) and _gone(grandchild, 10), "the orphaned processes outlived the guard's poll"
        assert _gone(guard, 10), "the guard did not exit after its work"
    finally:
        for pid in (child, grandchild, guard, parent.pid):  # the processes this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_live_parent_keeps_its_children_and_its_guard():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    guard, child, grandchild = map(int, parent.stdout.readline().split())
    try:
        time.sleep(1.5)
        for pid in (guard, child, grandchild):
            assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        for pid in (child, grandchild, guard, parent.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait(10)


def test_only_the_same_processes_are_ended():
    recorded = {11: 100.0, 12: 200.0, 13: 300.0}
    now = {11: 100.0, 12: 250.0}  # 12 is another process that reused the PID; 13 exited
    assert same_processes(recorded, now.get) == [11]
    assert same_processes({}, now.get) == []
