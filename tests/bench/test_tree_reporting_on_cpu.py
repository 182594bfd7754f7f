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
