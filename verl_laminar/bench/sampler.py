"""verl's built-in samplers with the poll interval Laminar's own sampler uses, for the benchmark's baselines.

verl's ``ReplayBuffer`` sleeps 2.0 s between reads of TransferQueue while a trainer waits for its batch, so every
wait for generation is rounded up to the next multiple of 2 s. On a GPU step of minutes that is noise; on this
benchmark's CPU steps of seconds it is most of a short step's generation time, and Laminar's sampler already
polls every ``POLL_S``. ``bench.e2e`` gives every baseline these subclasses (via verl's own hook,
``trainer.v1.sampler.custom_sampler``), so the modes differ in how they schedule work, not in how often they
look for it. Nothing else changes: the built-in classes' sampling, staleness and refill logic run unmodified.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from verl_laminar.buffer import POLL_S


class FastPollReplayBuffer(ReplayBuffer):
    """verl's synchronous sampler (sync, sync_bypass), reading every ``POLL_S`` seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["poll_interval"] = POLL_S
        super().__init__(*args, **kwargs)


class FastPollReplayBufferAsync(ReplayBufferAsync):
    """verl's asynchronous sampler (separate_async), reading every ``POLL_S`` seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["poll_interval"] = POLL_S
        super().__init__(*args, **kwargs)
