"""Seeded long-tailed response lengths: the CPU benchmark's stand-in for reasoning-length skew.

A tiny model answers the toy math set in a dozen tokens, so left alone every trajectory ends together and no
rollout ever waits for a straggler. The benchmark instead fixes each trajectory's length from a lognormal
distribution whose p99 is ``p99_ratio`` times its median (paper: about 10x), keyed by (seed, prompt index,
response index). The same key gives the same length in every run and every process, so the sync baseline and
Laminar generate exactly the same tokens for the same prompts.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist

Z99 = NormalDist().inv_cdf(0.99)  # 2.326: a lognormal's p99/median = exp(sigma * Z99)


@dataclass(frozen=True)
class SkewedLengths:
    max_tokens: int  # the rollout's response_length: no length may exceed it
    median: int = 32
    p99_ratio: float = 10.0
    min_tokens: int = 16  # room for the short answer the reward reads (see reward.first_answer)
    seed: int = 20261130

    def __post_init__(self) -> None:
        if not 1 <= self.min_tokens <= self.median <= self.max_tokens:
            raise ValueError(f"need 1 <= min_tokens ({self.min_tokens}) <= median ({self.median}) <= max_tokens "
                             f"({self.max_tokens}); raise data.max_response_length or lower the median")
        if self.p99_ratio < 1.0:
            raise ValueError(f"p99_ratio={self.p99_ratio}: the p99 cannot be below the median; use >= 1")

    @property
    def sigma(self) -> float:
        return math.log(self.p99_ratio) / Z99

    def quantile(self, u: float) -> int:
        """Length at uniform quantile u in (0, 1), clamped to [min_tokens, max_tokens]."""
        raw = self.median * math.exp(self.sigma * NormalDist().inv_cdf(u))
        return int(min(self.max_tokens, max(self.min_tokens, round(raw))))

    def length(self, index: int, session: int) -> int:
        """The length of response ``session`` of prompt ``index`` (stable across processes and runs)."""
        digest = hashlib.blake2b(f"{self.seed}:{int(index)}:{int(session)}".encode(), digest_size=8).digest()
        u = (int.from_bytes(digest, "big") + 0.5) / 2.0**64  # strictly inside (0, 1)
        return self.quantile(u)
