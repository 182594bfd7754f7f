"""Ending what a benchmark started: SIGTERM runs its cleanup, and reap ends a process tree by PID."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil

from verl_laminar.platform.procs import reap


def test_sigterm_runs_the_finally_that_ends_a_child(tmp_path):
    # a stand-in benchmark: starts a child, then waits; its finally must end the child when it is terminated
    marker = tmp_path / "child.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        from verl_laminar.platform.procs import exit_on_sigterm
        exit_on_sigterm()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(marker)!r}, "w").write(str(child.pid))
        try:
            time.sleep(60)
        finally:
            child.terminate()
            child.wait()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the stand-in never started its child"
        time.sleep(0.1)
    child = int(marker.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_reap_ends_a_process_and_its_children():
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(60)
    """)])
    deadline = time.monotonic() + 30
    while not psutil.Process(parent.pid).children():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = psutil.Process(parent.pid).children()[0].pid
    ended = reap([parent.pid], grace_s=5.0)
    assert set(ended) == {parent.pid, child}
    parent.wait(timeout=10)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
