"""Resharding at the master: the trainer's full tensors -> the rollouts' tensor-parallel shards.

The trainer (FSDP) hands over full tensors, gathered one at a time. The rollouts run tensor
parallelism of size ``tp``: rank r of a column-parallel layer holds rows [r*n/tp, (r+1)*n/tp), of a
row-parallel layer the same columns, and every rank holds the small replicated tensors (norms, row-
parallel biases). Key/value projections with fewer heads than ranks are replicated per head group,
as vLLM does. ``shard_rule`` is pure (names only); ``reshard`` applies it to tensors as views (no
copies), streaming in the trainer's order, each shard tagged with its rank for the manifest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch

# vLLM / Megatron naming of decoder-only LLMs (Qwen2, Llama, Mistral ...)
_COLUMN = re.compile(r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$|(embed_tokens|lm_head)\.weight$")
_ROW = re.compile(r"(o_proj|down_proj)\.weight$")
_KV = re.compile(r"(k_proj|v_proj)\.(weight|bias)$")


class ReshardError(ValueError):
    """A tensor cannot be split for the requested tensor-parallel size (the message says why and the fix)."""


@dataclass(frozen=True)
class ShardRule:
    dim: Optional[int]  # None: replicated on every rank
    kv: bool = False  # a key/value projection (replicated per head when heads < tp)


def shard_rule(name: str) -> ShardRule:
    if _ROW.search(name):
        return ShardRule(dim=1)
    if _COLUMN.search(name):
        return ShardRule(dim=0, kv=bool(_KV.search(name)))
    return ShardRule(dim=None)


def reshard(named: Iterable[tuple[str, torch.Tensor]], tp: int, num_kv_heads: Optional[int] = None
            ) -> Iterator[tuple[str, torch.Tensor, Optional[int]]]:
    """``(name, shard, rank)`` for every rank's shard of every tensor; rank None = replicated."""
    if tp < 1:
        raise ReshardError(f"tensor-parallel size {tp} must be >= 1")
    for name, t in named:
        rule = shard_rule(name)
        if tp == 1 or rule.dim is None:
            yield name, t, None
            continue
        if rule.kv and num_kv_heads is not None and num_kv_heads < tp:
            if tp % num_kv_heads:
                raise ReshardError(f"{name}: {num_kv_heads} kv heads cannot be replicated evenly over tp={tp}")
            head = t.shape[0] // num_kv_heads
            for r in range(tp):
                h = r * num_kv_heads // tp
                yield name, t.narrow(0, h * head, head), r
            continue
        size = t.shape[rule.dim]
        if size % tp:
            raise ReshardError(f"{name}: dimension {rule.dim} of size {size} does not split over tp={tp}; "
                               "pad it (vocab) or choose a tp size that divides it")
        for r, part in enumerate(torch.chunk(t, tp, dim=rule.dim)):
            yield name, part, r


def merge_shards(shards: dict[int, torch.Tensor], name: str, num_kv_heads: Optional[int] = None) -> torch.Tensor:
    """Inverse of ``reshard`` for one tensor (tests, and loaders that want the full tensor back)."""
    rule = shard_rule(name)
    tp = len(shards)
    if rule.dim is None:
        return shards[0]
    parts = [shards[r] for r in range(tp)]
    if rule.kv and num_kv_heads is not None and num_kv_heads < tp:
        parts = parts[:: tp // num_kv_heads]
    return torch.cat(parts, dim=rule.dim)
