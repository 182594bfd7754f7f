"""A benchmark worker process that raises tells its parent why, on the queue, before it exits."""

from __future__ import annotations

import multiprocessing as mp
import operator

from verl_laminar.bench.tree import FAILED, reporting

# spawned children import their target by name, and test modules are not importable there: stdlib callables
# stand in for a worker (reporting calls target(name, *args))


def test_a_failing_worker_puts_its_traceback_on_the_queue():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=reporting, args=(operator.truediv, out, "e0", 151644))  # "e0" / 151644 raises
    p.start()
    kind, name, text = out.get(timeout=60)
    p.join(timeout=60)
    assert (kind, name) == (FAILED, "e0")
    assert "TypeError: unsupported operand type(s) for /: 'str' and 'int'" in text
    assert p.exitcode != 0


def test_a_worker_that_succeeds_puts_nothing_of_its_own():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=reporting, args=(operator.truediv, out, 6.0, 3.0))  # 6.0 / 3.0 returns
    p.start()
    p.join(timeout=60)
    assert p.exitcode == 0 and out.empty()


def test_tree_watch_ends_what_a_finished_run_left_running():
    """A run that exits and leaves a process behind (as a killed Ray job leaves vLLM engines): the watch recorded it
    while the run lived and ends it after; the run's own PID is gone by then."""
    import subprocess
    import sys
    import time

    import psutil

    from verl_laminar.bench.tree import TreeWatch

    run = subprocess.Popen([sys.executable, "-c",
                            "import subprocess, sys, time; "
                            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
                            "print(c.pid, flush=True); time.sleep(1.5)"], stdout=subprocess.PIPE, text=True)
    watch = TreeWatch(run.pid, period_s=0.2)
    left = int(run.stdout.readline())
    try:
        run.wait(30)
        assert psutil.Process(left).is_running()  # the run ended, its child did not
        watch.stop_and_reap("test")
        time.sleep(0.5)
        assert not psutil.pid_exists(left) or psutil.Process(left).status() == psutil.STATUS_ZOMBIE
    finally:
        try:
            psutil.Process(left).kill()  # the process this test started
        except psutil.NoSuchProcess:
            pass
