"""Chain-broadcast planning for the relay weight service (pure: no ray/torch/vllm/verl).

Cost model (Laminar, Step 2): a chain of ``p`` relays (master included) broadcasts ``W`` bytes in
``c`` chunks; ``Tb`` is the time to send one byte between neighbours (1 / bandwidth), ``Ts`` the
fixed start-up cost of one message. The first chunk crosses ``p - 1`` hops and the other ``c - 1``
follow one chunk time apart:

    T(p, c) = (p + c - 2) * (W*Tb/c + Ts)
    c*      = sqrt((p - 2) * W*Tb / Ts)
    T*(p)   = W*Tb + (p - 2)*Ts + 2*sqrt((p - 2) * W*Tb * Ts)

Plans are frozen dataclasses: ``plan_chain`` builds one, ``rebuild_chain`` returns the plan after a
relay leaves (a new master when the master leaves) and ``fallback_source`` names the relay a machine
whose relay died should pull from until it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence


class ChainPlanError(ValueError):
    """A chain cannot be planned from the given inputs (the message names the value and the fix)."""


def _check_costs(p: int, W: float, Tb: float, Ts: float) -> None:
    if int(p) != p or p < 1:
        raise ChainPlanError(f"relay count p={p!r} must be an integer >= 1 (the master counts as one relay)")
    if W < 0:
        raise ChainPlanError(f"weight size W={W!r} bytes must be >= 0")
    if Tb < 0 or Ts < 0:
        raise ChainPlanError(f"per-byte time Tb={Tb!r} and start-up time Ts={Ts!r} must be >= 0 seconds")


def chain_time(p: int, c: int, W: float, Tb: float, Ts: float) -> float:
    """Time for ``p`` relays to all hold ``W`` bytes sent in ``c`` pipelined chunks."""
    _check_costs(p, W, Tb, Ts)
    if int(c) != c or c < 1:
        raise ChainPlanError(f"chunk count c={c!r} must be an integer >= 1")
    if p == 1:
        return 0.0  # the master already holds the bytes; no hop to cross
    return (p + c - 2) * (W * Tb / c + Ts)


def continuous_best_chunks(p: int, W: float, Tb: float, Ts: float) -> float:
    """Real-valued minimiser of ``chain_time`` over c (inf when Ts == 0 and p > 2)."""
    _check_costs(p, W, Tb, Ts)
    if p <= 2 or W * Tb == 0:
        return 1.0
    if Ts == 0:
        return math.inf
    return math.sqrt((p - 2) * W * Tb / Ts)


def best_chunks(p: int, W: float, Tb: float, Ts: float, c_min: int = 1, c_max: int = 4096) -> int:
    """Integer chunk count minimising ``chain_time``, clamped to ``[c_min, c_max]``.

    ``chain_time`` is convex in c, so the best integer is the floor or the ceiling of the continuous
    optimum; the tie goes to fewer chunks (fewer messages).
    """
    if c_min < 1 or c_max < c_min:
        raise ChainPlanError(f"chunk bounds c_min={c_min!r}, c_max={c_max!r} need 1 <= c_min <= c_max")
    x = continuous_best_chunks(p, W, Tb, Ts)
    if math.isinf(x):
        return c_max
    lo = min(max(int(math.floor(x)), c_min), c_max)
    hi = min(max(int(math.ceil(x)), c_min), c_max)
    return lo if chain_time(p, lo, W, Tb, Ts) <= chain_time(p, hi, W, Tb, Ts) else hi


def t_star(p: int, W: float, Tb: float, Ts: float) -> float:
    """Lower bound of ``chain_time`` over real c: ``W*Tb + (p-2)*Ts + 2*sqrt((p-2)*W*Tb*Ts)``."""
    _check_costs(p, W, Tb, Ts)
    if p == 1:
        return 0.0
    return W * Tb + (p - 2) * Ts + 2.0 * math.sqrt((p - 2) * W * Tb * Ts)


def t_model(p: int, W: float, Tb: float, Ts: float, c_min: int = 1, c_max: int = 4096) -> float:
    """Predicted broadcast time at the integer chunk count ``best_chunks`` would choose."""
    return chain_time(p, best_chunks(p, W, Tb, Ts, c_min, c_max), W, Tb, Ts)


@dataclass(frozen=True)
class ChainPlan:
    """An ordered broadcast chain: ``relays[0]`` is the master, bytes flow towards the end."""

    relays: tuple[str, ...]
    chunks: int = 1
    epoch: int = 0  # bumped on every rebuild so relays can ignore stale plans
    predicted_s: float = 0.0
    dropped: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.relays:
            raise ChainPlanError("a chain needs at least one live relay; start a relay on a rollout machine")
        if len(set(self.relays)) != len(self.relays):
            raise ChainPlanError(f"relay ids must be unique, got {self.relays!r}")
        if self.chunks < 1:
            raise ChainPlanError(f"chunks={self.chunks!r} must be >= 1")

    @property
    def master(self) -> str:
        return self.relays[0]

    def upstream(self, relay: str) -> Optional[str]:
        """The relay that sends to ``relay`` (None for the master)."""
        i = self._index(relay)
        return self.relays[i - 1] if i > 0 else None

    def downstream(self, relay: str) -> Optional[str]:
        """The relay ``relay`` forwards to (None for the tail)."""
        i = self._index(relay)
        return self.relays[i + 1] if i + 1 < len(self.relays) else None

    def _index(self, relay: str) -> int:
        try:
            return self.relays.index(relay)
        except ValueError:
            raise ChainPlanError(f"relay {relay!r} is not in the chain {self.relays!r}") from None


def plan_chain(
    relays: Iterable[str],
    W: float = 0.0,
    Tb: float = 0.0,
    Ts: float = 0.0,
    master: Optional[str] = None,
    c_min: int = 1,
    c_max: int = 4096,
    epoch: int = 0,
) -> ChainPlan:
    """Order ``relays`` into a chain (``master`` first, the rest sorted for determinism) and pick c."""
    ids = list(dict.fromkeys(relays))
    if master is not None:
        if master not in ids:
            raise ChainPlanError(f"master {master!r} is not among the relays {ids!r}; pass one of them or None")
        ids.remove(master)
        order = [master] + sorted(ids)
    else:
        order = sorted(ids)
    p = len(order)
    c = best_chunks(p, W, Tb, Ts, c_min, c_max) if p else 1
    pred = chain_time(p, c, W, Tb, Ts) if p else 0.0
    return ChainPlan(relays=tuple(order), chunks=c, epoch=epoch, predicted_s=pred)


def rebuild_chain(
    plan: ChainPlan,
    gone: Sequence[str] | str,
    W: float = 0.0,
    Tb: float = 0.0,
    Ts: float = 0.0,
    c_min: int = 1,
    c_max: int = 4096,
) -> ChainPlan:
    """The chain after ``gone`` relays leave: order kept, the first survivor becomes master if needed."""
    gone_set = {gone} if isinstance(gone, str) else set(gone)
    unknown = gone_set - set(plan.relays)
    if unknown:
        raise ChainPlanError(f"relays {sorted(unknown)!r} are not in the chain {plan.relays!r}")
    survivors = tuple(r for r in plan.relays if r not in gone_set)
    if not survivors:
        raise ChainPlanError(f"every relay of {plan.relays!r} is gone; start a new relay before publishing")
    p = len(survivors)
    c = best_chunks(p, W, Tb, Ts, c_min, c_max) if (W and Tb) else plan.chunks
    return ChainPlan(
        relays=survivors,
        chunks=c,
        epoch=plan.epoch + 1,
        predicted_s=chain_time(p, c, W, Tb, Ts),
        dropped=plan.dropped + tuple(r for r in plan.relays if r in gone_set),
    )


def add_relay(plan: ChainPlan, relay: str, master: bool = False) -> ChainPlan:
    """The chain after ``relay`` (re)joins: appended at the tail so no live link is cut.

    ``master``: put it first instead (the trainer publishes only to a relay on its own machine, so after
    the master died there a new relay on that machine must lead the chain; it sends to the old head).
    """
    if relay in plan.relays:
        return plan
    return ChainPlan(
        relays=(relay,) + plan.relays if master else plan.relays + (relay,),
        chunks=plan.chunks,
        epoch=plan.epoch + 1,
        predicted_s=plan.predicted_s,
        dropped=tuple(r for r in plan.dropped if r != relay),
    )


def fallback_source(old: ChainPlan, dead: str, alive: Iterable[str]) -> str:
    """Where rollouts on ``dead``'s machine pull from: its nearest live upstream, else the first live relay."""
    live = set(alive)
    i = old._index(dead)
    for r in reversed(old.relays[:i]):
        if r in live:
            return r
    for r in old.relays[i + 1 :]:
        if r in live:
            return r
    raise ChainPlanError(f"no live relay left to replace {dead!r} in {old.relays!r}; restart a relay")


# ---- chunk count of one broadcast ----
MiB = 1 << 20
# Assumptions of the chunk-count model when nothing was measured (laminar.relay.chunk_mb=null). Override them per
# relay (Relay(link_bytes_per_s=..., chunk_latency_s=...), RelayGroup.spawn(...)) with values measured by
# ``python -m verl_laminar.bench.relay`` (Relay.probe_copy gives Tb, Relay.probe_latency Ts).
DEFAULT_LINK_BYTES_PER_S = 1.25e9  # one TCP stream on a 10 Gbit/s link: Tb = 0.8 ns per byte
DEFAULT_CHUNK_LATENCY_S = 2e-4  # Ts: 42-409 us measured on TCP between relays (docs/relay.md)
MIN_CHUNK_BYTES = MiB  # below this, per-chunk syscalls and CRC calls dominate whatever the model says
MAX_CHUNKS = 4096  # bounds the manifest (one CRC per chunk) and per-chunk bookkeeping


def broadcast_chunks(
    total_bytes: int,
    relays: int,
    chunk_mb: Optional[float] = None,
    link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S,
    chunk_latency_s: float = DEFAULT_CHUNK_LATENCY_S,
    min_chunk_bytes: int = MIN_CHUNK_BYTES,
    max_chunks: int = MAX_CHUNKS,
) -> int:
    """Chunk count for broadcasting one ``total_bytes`` version down a chain of ``relays`` (master included).

    ``chunk_mb`` set (``laminar.relay.chunk_mb``): ``ceil(total_bytes / chunk_mb MiB)``, within ``[1, max_chunks]``.
    Otherwise the count minimising the chain time (``best_chunks``) with ``Tb = 1 / link_bytes_per_s`` and
    ``Ts = chunk_latency_s``, with no chunk under ``min_chunk_bytes``. The master's checksum pass over the
    published bytes is one more pipeline stage ahead of the first hop (a chunk is forwarded only once its CRC is
    recorded), so the chain is planned as ``relays + 1`` stages: with one downstream relay this still pipelines
    the checksum with the send instead of choosing one chunk.
    """
    if int(total_bytes) != total_bytes or total_bytes < 0:
        raise ChainPlanError(f"total_bytes={total_bytes!r} must be an integer >= 0 (the version's size)")
    if int(relays) != relays or relays < 1:
        raise ChainPlanError(f"relays={relays!r} must be an integer >= 1 (the master counts as one relay)")
    if max_chunks < 1 or min_chunk_bytes < 1:
        raise ChainPlanError(f"max_chunks={max_chunks!r} and min_chunk_bytes={min_chunk_bytes!r} must be >= 1")
    if total_bytes == 0:
        return 1
    if chunk_mb is not None:
        if not chunk_mb > 0:
            raise ChainPlanError(f"laminar.relay.chunk_mb={chunk_mb!r}: must be null (cost model) or MiB > 0")
        chunk_bytes = max(1, int(chunk_mb * MiB))
        return min(max(1, -(-int(total_bytes) // chunk_bytes)), max_chunks)
    if link_bytes_per_s <= 0 or chunk_latency_s < 0:
        raise ChainPlanError(f"link_bytes_per_s={link_bytes_per_s!r} must be > 0 and chunk_latency_s="
                             f"{chunk_latency_s!r} >= 0 (measure them with python -m verl_laminar.bench.relay)")
    cap = max(1, min(max_chunks, int(total_bytes) // min_chunk_bytes))
    return best_chunks(relays + 1, float(total_bytes), 1.0 / link_bytes_per_s, chunk_latency_s, 1, cap)
