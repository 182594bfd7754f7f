"""A few worker processes that run a score function and can be killed one at a time.

Why processes: a score function that hangs (catastrophic regex backtracking, a sympy simplify that never
returns) cannot be stopped inside a thread; a process can be SIGKILLed and replaced while the others keep
scoring. Workers are started from multiprocessing's fork server: it is a fresh single-threaded process (safe
to fork, unlike a Ray worker full of threads), and it imports the score function's module once, so a
replacement worker starts in milliseconds.

Dataflow per call: take an idle worker -> send kwargs -> poll(timeout) -> recv result | kill + replace.
Workers that cannot be started are retried on their next use; the call fails, the run goes on.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import queue
from dataclasses import dataclass
from typing import Any

from verl_laminar.reward import fn_spec
from verl_laminar.reward._worker import worker_main

logger = logging.getLogger(__name__)


class WorkerLoadError(RuntimeError):
    """The score function could not be loaded in a worker (bad spec, import error, load timeout)."""


@dataclass(frozen=True)
class CallOutcome:
    ok: bool
    value: Any = None
    reason: str = ""
    # The worker was killed for overrunning its time; the caller can name its timeout setting in the message.
    timed_out: bool = False


def _context(spec: fn_spec.ScoreFnSpec) -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    preload = ["verl_laminar.reward._worker"] + ([spec.preload_module] if spec.preload_module else [])
    # Only takes effect if the fork server is not running yet; later specs are imported by each worker.
    ctx.set_forkserver_preload(preload)
    return ctx


class _Worker:
    def __init__(self, ctx: multiprocessing.context.BaseContext, spec: fn_spec.ScoreFnSpec, load_timeout_s: float):
        self._ctx, self._spec, self._load_timeout_s = ctx, spec, load_timeout_s
        self.proc = None
        self.conn = None

    def start(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=worker_main, args=(child, self._spec), daemon=True, name="laminar-reward")
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        if not parent.poll(self._load_timeout_s):
            self.stop()
            raise WorkerLoadError(f"score function did not load within {self._load_timeout_s}s")
        try:
            kind, message = parent.recv()
        except EOFError:
            code = self.stop()
            raise WorkerLoadError(f"reward worker exited with code {code} while loading") from None
        if kind != "ready":
            self.stop()
            raise WorkerLoadError(message)

    def stop(self) -> int | None:
        code = None
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
            code = self.proc.exitcode
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None
        return code

    @property
    def started(self) -> bool:
        return self.proc is not None


class ScorePool:
    def __init__(self, spec: fn_spec.ScoreFnSpec, size: int, load_timeout_s: float = 300.0) -> None:
        ctx = _context(spec)
        self._workers = [_Worker(ctx, spec, load_timeout_s) for _ in range(size)]
        self._idle: queue.Queue[_Worker] = queue.Queue()
        # Start every worker now: a wrong score_fn is a configuration error and must stop the run at start-up.
        try:
            for worker in self._workers:
                worker.start()
        except WorkerLoadError:
            self.close()
            raise
        for worker in self._workers:
            self._idle.put(worker)

    def call(self, kwargs: dict[str, Any], timeout_s: float) -> CallOutcome:
        worker = self._idle.get()
        try:
            return self._call(worker, kwargs, timeout_s)
        finally:
            self._idle.put(worker)

    def _call(self, worker: _Worker, kwargs: dict[str, Any], timeout_s: float) -> CallOutcome:
        if not worker.started:
            try:
                worker.start()
            except WorkerLoadError as e:
                return CallOutcome(False, reason=f"reward worker could not be restarted: {e}")
        try:
            worker.conn.send(kwargs)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            # Pickling fails before anything is written, so the worker and its pipe are still usable.
            return CallOutcome(False, reason=f"arguments cannot be sent to the reward worker: {e}")
        if not worker.conn.poll(timeout_s):
            worker.stop()
            return CallOutcome(False, reason=f"timed out after {timeout_s}s; the reward worker was killed", timed_out=True)
        try:
            kind, payload = worker.conn.recv()
        except (EOFError, OSError):
            code = worker.stop()
            return CallOutcome(False, reason=f"the reward worker died (exit code {code})")
        if kind == "ok":
            return CallOutcome(True, value=payload)
        return CallOutcome(False, reason=f"raised {payload}")

    def close(self) -> None:
        for worker in self._workers:
            if worker.started:
                try:
                    worker.conn.send(None)
                except (OSError, EOFError):
                    pass  # already gone; stop() below reaps it
            worker.stop()
