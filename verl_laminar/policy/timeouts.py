"""Refresh deadlines from the chain's cost model (pure: no ray/torch/vllm/verl).

A replica refreshing to version v first waits until its machine-local relay has committed v, then loads v
from that relay's host memory. Both steps take time that grows with the version's size ``W``; a fixed
deadline is either far too long for a small model (a hung chain goes unnoticed for minutes) or too short for
a large one (a 72B bf16 version, ~145 GB, needs minutes to cross a chain of TCP hops). So the deadlines are
derived from the same model the chain planner uses (``policy.chain``, Laminar Step 2):

    T*(p)        = chain_time(p, c, W, Tb, Ts)   Tb = 1 / (link bytes per second), Ts = per-chunk latency
    wait_readable = max(min_wait_s, wait_factor * T*(p))
    load          = min_wait_s + wait_factor * W / load rate

The factor absorbs what the model leaves out (a link shared with other traffic, checksum verification, the
trainer's own publish before the first hop), the floor covers fixed costs that do not scale with ``W``
(connection set-up, vLLM's per-load bookkeeping) and the time before ``W`` is known at all. A deadline here
is a hang detector, not a schedule: it errs long, and the router retries a miss before it gives up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

from verl_laminar.policy.chain import DEFAULT_CHUNK_LATENCY_S, chain_time, t_model

# The per-chunk start-up cost Ts is the relays' own (policy.chain, measured between relays): one value for the
# chunk count the relays choose and for the deadlines the router derives from it.
# A replica reads its version from host shared memory and copies it into the engine tensor by tensor;
# 1 GB/s is well below what one host-to-device copy sustains, so a healthy load never hits the deadline.
DEFAULT_LOAD_GBYTES_S = 1.0


class TimeoutPolicyError(ValueError):
    """A refresh setting that cannot give a deadline (the message names the config key and the fix)."""


@dataclass(frozen=True)
class RefreshSettings:
    """What the router needs to derive its refresh deadlines (``laminar.relay`` / ``laminar.refresh``)."""

    link_gbps: float = 10.0  # laminar.relay.link_gbps: sustained Gbit/s of one relay hop
    wait_factor: float = 3.0  # laminar.refresh.wait_factor
    min_wait_s: float = 120.0  # laminar.refresh.min_wait_s
    retries: int = 2  # laminar.refresh.retries: further attempts of a failed wait or load
    chunk_latency_s: float = DEFAULT_CHUNK_LATENCY_S
    load_gbytes_s: float = DEFAULT_LOAD_GBYTES_S
    retry_backoff_s: float = 1.0  # pause before a retry: a transient fault (a restarting relay) may pass

    def __post_init__(self) -> None:
        checks = [
            ("laminar.relay.link_gbps", self.link_gbps, self.link_gbps > 0, "must be > 0 Gbit/s, e.g. 10.0"),
            ("laminar.refresh.wait_factor", self.wait_factor, self.wait_factor >= 1,
             "must be >= 1 (a deadline shorter than the modelled time fails healthy transfers), e.g. 3.0"),
            ("laminar.refresh.min_wait_s", self.min_wait_s, self.min_wait_s > 0, "must be > 0 seconds, e.g. 120"),
            ("laminar.refresh.retries", self.retries, int(self.retries) == self.retries and self.retries >= 0,
             "must be an integer >= 0, e.g. 2"),
            ("chunk_latency_s", self.chunk_latency_s, self.chunk_latency_s >= 0, "must be >= 0 seconds"),
            ("load_gbytes_s", self.load_gbytes_s, self.load_gbytes_s > 0, "must be > 0 GB/s, e.g. 1.0"),
            ("retry_backoff_s", self.retry_backoff_s, self.retry_backoff_s >= 0, "must be >= 0 seconds"),
        ]
        for key, value, ok, requirement in checks:
            if not ok:
                raise TimeoutPolicyError(f"{key}={value!r}: {requirement}")


@dataclass(frozen=True)
class RefreshDeadlines:
    wait_readable_s: float  # longest a relay may go without a new chunk before the wait fails
    load_s: float  # longest one load of the version from the local relay may take
    retries: int  # further attempts after a failed wait or load, before the run stops


def _check_size(version_bytes: float, relays: int) -> None:
    if version_bytes < 0:
        raise TimeoutPolicyError(f"version_bytes={version_bytes!r} must be >= 0 (the manifest's total_bytes)")
    if int(relays) != relays or relays < 1:
        raise TimeoutPolicyError(f"relays={relays!r} must be an integer >= 1 (the chain's length, master included)")


def broadcast_time_s(version_bytes: float, relays: int, link_gbps: float,
                     chunk_latency_s: float = DEFAULT_CHUNK_LATENCY_S, chunks: Optional[int] = None) -> float:
    """Expected seconds until every relay of a ``relays``-long chain holds ``version_bytes``.

    ``chunks``: the version's chunk count (from its manifest); None: the count the cost model would choose,
    which is the best case, so the caller's factor should cover a worse actual count.
    """
    _check_size(version_bytes, relays)
    if link_gbps <= 0:
        raise TimeoutPolicyError(f"laminar.relay.link_gbps={link_gbps!r}: must be > 0 Gbit/s, e.g. 10.0")
    tb = 8.0 / (link_gbps * 1e9)  # seconds per byte
    if chunks is None:
        return t_model(relays, version_bytes, tb, chunk_latency_s)
    return chain_time(relays, chunks, version_bytes, tb, chunk_latency_s)


def load_time_s(version_bytes: float, load_gbytes_s: float = DEFAULT_LOAD_GBYTES_S) -> float:
    """Expected seconds for a replica to read ``version_bytes`` from its local relay into its engine."""
    _check_size(version_bytes, 1)
    return version_bytes / (load_gbytes_s * 1e9)


def chunk_count(total_bytes: int, chunk_size: int) -> int:
    """Chunks of a version from its manifest's ``total_bytes`` and ``chunk_size`` (at least one)."""
    return max(1, math.ceil(total_bytes / max(1, chunk_size)))


def refresh_deadlines(version_bytes: Optional[float], relays: int, settings: RefreshSettings,
                      chunks: Optional[int] = None) -> RefreshDeadlines:
    """Deadlines of one refresh; ``version_bytes`` None (no version seen yet): the floor for both."""
    if version_bytes is None:
        return RefreshDeadlines(settings.min_wait_s, settings.min_wait_s, settings.retries)
    t = broadcast_time_s(version_bytes, relays, settings.link_gbps, settings.chunk_latency_s, chunks)
    wait = max(settings.min_wait_s, settings.wait_factor * t)
    load = settings.min_wait_s + settings.wait_factor * load_time_s(version_bytes, settings.load_gbytes_s)
    return RefreshDeadlines(wait, load, settings.retries)


def arrival_mark(progress: Mapping[int, int], version: int) -> tuple:
    """What of ``version`` (or newer) a relay holds in flight, from its ``progress()`` (version -> chunks
    received): a wait for a version stays alive while this changes, since the chain is still delivering."""
    return tuple(sorted((int(v), int(n)) for v, n in (progress or {}).items() if int(v) >= version))
