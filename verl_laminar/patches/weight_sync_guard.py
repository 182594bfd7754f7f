"""Patch ``weight_sync_fail_fast``: a weight update whose receiving vLLM worker fails ends at once, with its cause.

Why. ``ServerAdapter.update_weights`` starts the worker-side receiver (``collective_rpc("update_weights_from_ipc")``,
non-blocking) and then runs ``BucketedWeightSender.async_send_weights``, which waits for the receiver's ack of
every bucket with a blocking ``socket.recv()``. When the receiver raises (a failed load, a dead engine), no ack
ever comes: the sender waits forever, the trainer's ``ray.get`` with it, and the run hangs with every process idle.
The receiver's error sits unread in the rpc's result.

Fix. The sender's socket is wrapped so that each wait for an ack polls in short slices; between slices it checks
the receiving rpc, and as soon as that has finished without acking (it failed, or its actor died) the rpc's own
error is raised. One ending is not a failure: verl's receiver acks the last bucket from its clean-up, just before
its rpc returns, so the rpc's success can be seen before that ack can be read (it was seen on a loaded host of
emulated machines); a receiver that returned without error after the sender's last bucket applied every bucket, so
the sender waits a moment for the ack and then takes the rpc's success as it. A receiver that stays alive without acking is given up after ``LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S``
(default 120 s). ``update_weights`` then raises ``WeightSyncError`` naming the replica, the weight version (verl's
global step) and the receiver's first error. The sender is the same on GPUs, so the hang is too; the patch is
applied with the CPU patches only until it has been run on a GPU host (the project changes no GPU run unchecked).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import time
from typing import Any, Callable, Optional

from verl_laminar.patches import Patch

logger = logging.getLogger(__name__)

TARGET_MODULE = "verl.workers.rollout.vllm_rollout.vllm_rollout"
TARGET = f"{TARGET_MODULE}.ServerAdapter.update_weights"
POLL_MS = 200
FINAL_ACK_GRACE_MS = 2000  # a receiver that returned after the last bucket: how long its ack may still take
DEFAULT_ACK_TIMEOUT_S = 120.0

# The receiving rpc of the update running in this task: set where verl starts it, read by the sender's socket.
_PENDING_RECEIVE: contextvars.ContextVar[Optional[Callable[[], None]]] = contextvars.ContextVar(
    "laminar_pending_receive", default=None)


class ReceiverGoneError(RuntimeError):
    """The receiving worker finished or died without acknowledging a bucket."""


class WeightSyncError(RuntimeError):
    """A rollout replica's weight update failed; the message names the replica, the version and the cause."""


def ack_timeout_s() -> float:
    raw = os.environ.get("LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S", "")
    try:
        value = float(raw) if raw else DEFAULT_ACK_TIMEOUT_S
    except ValueError:
        raise ValueError(f"LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S={raw!r}: give seconds as a number, e.g. 120") from None
    if value <= 0:
        raise ValueError(f"LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S={raw!r} must be positive")
    return value


class WatchedSocket:
    """The sender's REQ socket, whose ``recv`` gives up when the receiver can no longer answer.

    ``check_receiver`` returns True once the receiving call ended without error, and raises its error once it
    failed (``rpc_checker``)."""

    def __init__(self, sock: Any, check_receiver: Optional[Callable[[], bool]], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sock, self._check, self._timeout_s, self._clock = sock, check_receiver, timeout_s, clock
        self.acks = 0
        self._sent_last = False  # the message awaiting its ack is verl's last bucket (``is_last``)

    def send_pyobj(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        self._sent_last = isinstance(obj, dict) and bool(obj.get("is_last"))
        return self._sock.send_pyobj(obj, *args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        start = self._clock()
        while not self._sock.poll(POLL_MS):
            if self._check is not None and self._check():  # raises the receiver's error once its call failed
                if not self._sent_last:
                    raise ReceiverGoneError(f"the receiving vLLM worker returned without acknowledging bucket "
                                            f"{self.acks + 1}, which was not the last")
                if self._sock.poll(FINAL_ACK_GRACE_MS):
                    break
                logger.info("the receiving vLLM worker returned after the last bucket before its ack could be read; "
                            "its success is the ack")
                self.acks += 1
                return b""
            if self._clock() - start > self._timeout_s:
                raise ReceiverGoneError(
                    f"no acknowledgement from the receiving vLLM worker for {self._timeout_s:.0f} s after "
                    f"{self.acks} bucket(s); it is alive but stuck (raise LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S if "
                    "loading one bucket legitimately takes longer)")
        self.acks += 1
        return self._sock.recv(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def rpc_checker(ref: Any) -> Callable[[], bool]:
    """A check of the Ray call ``ref``: False while it runs, True once it ended without error, its error (or
    ``ActorDiedError``) raised once it failed."""
    import ray

    def check() -> bool:
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return False
        ray.get(ref)
        return True

    return check


def root_cause(exc: BaseException) -> BaseException:
    """The first error: Ray's wrapper unwrapped, then the oldest cause in the chain."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None)  # RayTaskError keeps the remote exception here
        if isinstance(inner, BaseException) and inner is not exc:
            exc = inner
            continue
        if exc.__cause__ is not None:
            exc = exc.__cause__
            continue
        break
    return exc


def _apply_to(module: Any) -> None:
    rollout_cls = module.ServerAdapter
    if getattr(rollout_cls.update_weights, "_laminar_guarded", False):
        return
    base_sender = module.BucketedWeightSender

    class WatchedSender(base_sender):  # type: ignore[misc, valid-type]
        def _init_socket(self) -> None:
            super()._init_socket()
            self.socket = WatchedSocket(self.socket, _PENDING_RECEIVE.get(), ack_timeout_s())

        def _cleanup(self) -> None:
            if isinstance(self.socket, WatchedSocket):
                self.socket = self.socket._sock
            super()._cleanup()

    execute = rollout_cls._execute_method
    update = rollout_cls.update_weights

    @functools.wraps(execute)
    async def _execute_method(self, method, *args, non_block: bool = False, **kwargs):
        result = await execute(self, method, *args, non_block=non_block, **kwargs)
        if method == "update_weights_from_ipc" and non_block and result is not None:
            _PENDING_RECEIVE.set(rpc_checker(result))
        return result

    @functools.wraps(update)
    async def update_weights(self, weights, global_steps: int = None, *args, **kwargs):
        token = _PENDING_RECEIVE.set(None)
        try:
            return await update(self, weights, global_steps, *args, **kwargs)
        except Exception as exc:
            cause = root_cause(exc)
            raise WeightSyncError(
                f"rollout replica {self.replica_rank} (rank {self.rollout_rank}): weight update to version "
                f"{global_steps} (verl global step) failed: {type(cause).__name__}: {cause}") from exc
        finally:
            _PENDING_RECEIVE.reset(token)

    update_weights._laminar_guarded = True
    module.BucketedWeightSender = WatchedSender
    rollout_cls._execute_method = _execute_method
    rollout_cls.update_weights = update_weights


def _apply() -> None:
    from verl_laminar.patches.import_hook import on_import

    on_import(TARGET_MODULE, _apply_to)


WEIGHT_SYNC_FAIL_FAST = Patch("weight_sync_fail_fast", TARGET, _apply)
