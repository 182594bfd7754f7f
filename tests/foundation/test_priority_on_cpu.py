"""renice_tree changes every thread of a process tree (Linux niceness is per thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from verl_laminar.platform.priority import renice_tree

CHILD = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
sub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(sub.pid, flush=True)
time.sleep(60)
"""


def _nice_of_threads(pid: int) -> set[int]:
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        out.add(os.getpriority(os.PRIO_PROCESS, int(tid)))
    return out


def test_every_thread_of_every_process_in_the_tree_is_reniced():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(proc.stdout.readline())
        time.sleep(0.2)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) >= 2  # a second thread exists
        done = renice_tree(proc.pid, 19)
        assert done["processes"] == 2 and done["threads"] >= 3
        assert _nice_of_threads(proc.pid) == {19} and _nice_of_threads(grandchild) == {19}
    finally:
        if grandchild is not None:
            os.kill(grandchild, 9)  # started by the child on our behalf; it would outlive it
        proc.kill()
        proc.wait()


def test_out_of_range_niceness_is_rejected():
    with pytest.raises(ValueError, match="outside -20..19"):
        renice_tree(os.getpid(), 25)
