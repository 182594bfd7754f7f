"""The load the partial-response pool benchmark offers, and how its measurements are summarised (pure).

A rollout fleet of ``replicas`` x ``seqs`` running sequences, each decoding ``tokens_per_s`` tokens a second and
streaming them to the pool by its chunk policy (``flush_tokens`` tokens or ``flush_interval_s`` seconds, whichever
comes first: ``pool.partial.ChunkPolicy``). Response lengths are drawn from a log-normal law cut at ``max_tokens``
(median ``median_tokens``): an assumption shaped like long reasoning responses, not a histogram from the paper.
A finished sequence is replaced at once, so the number of running sequences stays ``replicas * seqs``. Beside them
the pool holds ``held`` finished responses still open (default one per running sequence): a GRPO group's responses
stay in the pool until the group's last one ends, so a fleet's pool holds more entries than it runs sequences.

``Schedule`` says when each sequence's next chunk is due, so the load generator wakes once per chunk rather than
once per sequence per tick; ``summarize`` turns ``(send, acknowledged)`` times into the benchmark's keys.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import asdict, dataclass
from typing import Iterable, Optional, Sequence


@dataclass(frozen=True)
class Load:
    replicas: int = 64
    seqs: int = 128  # running sequences per replica
    flush_tokens: int = 64
    flush_interval_s: float = 1.0
    tokens_per_s: float = 40.0  # decode rate of one running sequence
    median_tokens: int = 2048
    sigma: float = 1.0
    max_tokens: int = 16384
    prompt_tokens: int = 256
    held_entries: Optional[int] = None  # finished, still-open entries (None: one per running sequence)

    def __post_init__(self) -> None:
        if min(self.replicas, self.seqs, self.flush_tokens, self.max_tokens, self.median_tokens) < 1:
            raise ValueError(f"every count of the pool load must be >= 1: {self}")
        if self.held_entries is not None and self.held_entries < 0:
            raise ValueError(f"held_entries must be >= 0 (or None: one per running sequence): {self}")
        if self.flush_interval_s <= 0 or self.tokens_per_s <= 0 or self.sigma < 0:
            raise ValueError(f"flush_interval_s and tokens_per_s must be > 0, sigma >= 0: {self}")

    @property
    def running(self) -> int:
        return self.replicas * self.seqs

    @property
    def held(self) -> int:
        return self.running if self.held_entries is None else self.held_entries

    def held_on(self, replica: int) -> int:
        """Held entries of replica ``replica`` (``held`` spread over the replicas, the first ones taking the rest)."""
        base, extra = divmod(self.held, self.replicas)
        return base + (1 if replica < extra else 0)

    def chunk_period_s(self) -> float:
        """Seconds between two chunks of one running sequence (whichever of the two rules comes first)."""
        return min(self.flush_tokens / self.tokens_per_s, self.flush_interval_s)

    def nominal_appends_per_s(self) -> float:
        """Chunks a second the fleet sends at steady state (the ends' last chunks left out: at most one per
        response, a few per cent of the stream)."""
        return self.running / self.chunk_period_s()

    def draw_length(self, rng: random.Random) -> int:
        n = rng.lognormvariate(math.log(self.median_tokens), self.sigma) if self.sigma else self.median_tokens
        return max(1, min(self.max_tokens, int(n)))

    def to_dict(self) -> dict:
        return asdict(self)


def tokens_at(t: float, start: float, rate: float, length: int) -> int:
    """Tokens a sequence started at ``start`` decoding ``rate`` tokens/s holds at ``t`` (at most ``length``)."""
    return max(0, min(length, int((t - start) * rate)))


def next_due(start: float, rate: float, length: int, sent: int, last: float, load: Load) -> float:
    """When the sequence must act next: its chunk is full, its interval ran out (with a token to send), or it ends."""
    full = start + (sent + load.flush_tokens) / rate
    first_new = start + (sent + 1) / rate  # the interval rule fires only with a token pending
    interval = max(last + load.flush_interval_s, first_new)
    end = start + length / rate
    return min(full, interval, end)


def pack_sends(rows: Iterable[Sequence[Optional[float]]]) -> tuple[bytes, bytes]:
    """``(sent, acknowledged)`` rows as two float64 arrays' bytes (NaN: no answer): a generator's 10^5-10^6 rows
    go to the driver as two flat buffers in a file (``write_records``)."""
    rows = list(rows)
    sent = array("d", (r[0] for r in rows))
    acked = array("d", (math.nan if r[1] is None else r[1] for r in rows))
    return sent.tobytes(), acked.tobytes()


def unpack_sends(sent: bytes, acked: bytes) -> list[tuple[float, Optional[float]]]:
    """The rows ``pack_sends`` packed."""
    s, a = array("d"), array("d")
    s.frombytes(sent)
    a.frombytes(acked)
    if len(s) != len(a):
        raise ValueError(f"{len(s)} send times against {len(a)} acknowledgements")
    return [(x, None if math.isnan(y) else y) for x, y in zip(s, a)]


def write_records(path: str, sends: tuple[bytes, bytes], end_waits: Sequence[tuple[float, float]]) -> None:
    """A generator's records as one file: the packed send and acknowledgment times, then the end waits' pairs."""
    sent, acked = sends
    waits = array("d", (x for pair in end_waits for x in pair))
    with open(path, "wb") as f:
        for part in (sent, acked, waits.tobytes()):
            f.write(len(part).to_bytes(8, "little"))
            f.write(part)


def read_records(path: str) -> tuple[list[tuple[float, Optional[float]]], list[tuple[float, float]]]:
    """What ``write_records`` wrote: ``(sends, end_waits)``."""
    with open(path, "rb") as f:
        data = f.read()
    parts, at = [], 0
    while at < len(data):
        n = int.from_bytes(data[at:at + 8], "little")
        parts.append(data[at + 8:at + 8 + n])
        at += 8 + n
    if len(parts) != 3:
        raise ValueError(f"{path}: {len(parts)} record parts, expected 3")
    waits = array("d")
    waits.frombytes(parts[2])
    return unpack_sends(parts[0], parts[1]), list(zip(waits[::2], waits[1::2]))


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-quantile (0..1) by the nearest-rank rule; None when there is nothing to rank."""
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def summarize(sends: Iterable[tuple[float, Optional[float]]], window: tuple[float, float]) -> dict:
    """The benchmark's rates and delays over ``window`` (monotonic seconds).

    ``sends``: one ``(sent, acknowledged)`` per chunk, ``acknowledged`` None when no answer came. Offered: chunks
    sent in the window per second; sustained: chunks the pool acknowledged in the window per second (it acknowledges
    after the record's ``write``, so the delay is an upper bound on send-to-durable); delays of the chunks sent in
    the window, an unanswered one counted as lasting to the window's end.
    """
    t0, t1 = window
    if t1 <= t0:
        raise ValueError(f"empty measurement window {window}")
    span = t1 - t0
    sent = acked = unanswered = 0
    delays: list[float] = []
    for s, a in sends:
        if a is not None and t0 <= a < t1:
            acked += 1
        if t0 <= s < t1:
            sent += 1
            if a is None:
                unanswered += 1
            delays.append((a if a is not None else t1) - s)
    return {"window_s": span, "offered_appends_per_s": sent / span, "sustained_appends_per_s": acked / span,
            "delay_p50_s": percentile(delays, 0.5), "delay_p99_s": percentile(delays, 0.99),
            "delay_max_s": max(delays, default=None), "chunks_in_window": sent, "unanswered_in_window": unanswered}
