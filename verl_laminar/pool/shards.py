"""The partial-response pool split across several actors, each owning whole groups.

One pool process keeps up with about 8K running sequences (64 replicas x 128, p99 0.52 s from send to durable;
``docs/results/bench_pool_64x128_2026-12-07.json``) and saturates near 12.4K appends a second; a larger fleet
needs more than one. A shard owns every entry of the groups that hash to it (``shard_index``: CRC-32 of the group
id, the same in every process), because the operations that read a group as a whole (``claim_group``, adoption)
must see all of it on one process; keys are request ids, which do not name their group, so every writer routes by
the group its request belongs to (the server has it in the request's pool tag, the client in its pin).

    spawn_shards (trainer, driver's node) -> shard i: a PoolProcess named shard_name(i), its own log file, its own
        Ray restart (one shard's death loses only its own unflushed chunks; the others keep serving)
    find_shards (any process) -> PoolShards: of(group) for a group's operations; silence / streamed_on /
        tokens_since / adoptable_groups / size ask every shard and merge
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Iterable, Optional

from verl_laminar.pool.actor import POOL_NAME

# running sequences one shard serves with p99 send-to-durable <= 1 s at 64-token chunks and 1 s flushes (measured:
# 64 replicas x 128 sequences, bench_pool_64x128_2026-12-07.json; 2x that saturated one process)
SEQUENCES_PER_SHARD = 8192
MAX_SHARDS = 16


def shard_name(i: int, base: str = POOL_NAME) -> str:
    """Shard 0 keeps the pool's one name, so a one-shard pool is named as before."""
    return base if i == 0 else f"{base}.{i}"


def shard_index(group_id: Any, n: int) -> int:
    """The shard that owns ``group_id``'s entries: stable across processes (Python's ``hash`` of a str is not)."""
    return zlib.crc32(str(group_id).encode()) % n if n > 1 else 0


def running_bound(replicas: int, max_num_seqs: int, step_trajectories: Optional[int] = None) -> int:
    """Sequences that can generate at once: what the engines admit, but no more than two steps' trajectories (the
    trainer takes them as they finish, so about a step's worth is in flight; the staleness bound lets some more: 2x
    is headroom, and a shard too many costs one mostly idle process on the driver's node)."""
    admitted = max(1, int(replicas)) * max(1, int(max_num_seqs))
    return admitted if not step_trajectories else min(admitted, 2 * int(step_trajectories))


def shards_for(running_sequences: int) -> int:
    """How many shards a fleet of ``running_sequences`` needs (``laminar.pool.shards: null``), at the measured
    ``SEQUENCES_PER_SHARD``, at most ``MAX_SHARDS``."""
    return max(1, min(MAX_SHARDS, math.ceil(max(0, int(running_sequences)) / SEQUENCES_PER_SHARD)))


class PoolShards:
    """The pool's shards as one handle (picklable: a list of Ray actor handles). A group's operations go to
    ``of(group)``'s actor as to the one pool before; the fleet-wide queries ask all and merge (blocking: they run in
    the trainer's threads, never in an event loop)."""

    def __init__(self, handles: list) -> None:
        if not handles:
            raise ValueError("a pool needs at least one shard")
        self.handles = list(handles)

    def __len__(self) -> int:
        return len(self.handles)

    def index(self, group_id: Any) -> int:
        return shard_index(group_id, len(self.handles))

    def of(self, group_id: Any) -> Any:
        return self.handles[self.index(group_id)]

    def _all(self, method: str, *args: Any) -> list:
        import ray

        return ray.get([getattr(h, method).remote(*args) for h in self.handles])

    def silence(self, replicas: Optional[Iterable[int]] = None) -> dict[int, float]:
        """A replica streams to every shard its groups hash to: its silence is the shortest of theirs."""
        wanted = None if replicas is None else [int(r) for r in replicas]
        out: dict[int, float] = {}
        for part in self._all("silence", wanted):
            for rid, s in part.items():
                out[rid] = min(s, out.get(rid, s))
        return out

    def streamed_on(self, replica_id: int, min_tokens: int = 1, groups: Optional[Iterable[str]] = None) -> int:
        wanted = None if groups is None else list(groups)
        return sum(self._all("streamed_on", replica_id, min_tokens, wanted))

    def tokens_since(self, since: float) -> int:
        return sum(self._all("tokens_since", since))

    def adoptable_groups(self, n: int, running: bool = False) -> list[str]:
        return sorted(g for part in self._all("adoptable_groups", n, running) for g in part)

    def size(self) -> int:
        """Open entries in all shards."""
        return sum(self._all("__len__"))

    def stop(self) -> None:
        """The trainer's end: each shard closes its log, then its actor is killed (a killed actor is not restarted)."""
        import ray

        ray.get([h.shutdown.remote() for h in self.handles])
        for h in self.handles:
            ray.kill(h)


def find_shards(base: str = POOL_NAME) -> PoolShards:
    """The running pool's shards, by name: shard 0, then shard i while one is registered. The trainer starts every
    shard before any replica or agent loop exists, and a shard that restarts keeps its name, so every process
    finds the same count."""
    import ray

    handles = [ray.get_actor(shard_name(0, base))]
    while True:
        try:
            handles.append(ray.get_actor(shard_name(len(handles), base)))
        except ValueError:
            return PoolShards(handles)


def spawn_shards(log_paths: list[str], base: str = POOL_NAME, node_id: Optional[str] = None,
                 detached: bool = False) -> PoolShards:
    """One restartable pool actor per log path, all on ``node_id`` (each log is on that node's disk)."""
    from verl_laminar.pool.actor import spawn_pool

    return PoolShards([spawn_pool(p, name=shard_name(i, base), node_id=node_id, detached=detached)
                       for i, p in enumerate(log_paths)])


def shard_log(path: str, i: int) -> str:
    """Shard i's log beside shard 0's (``laminar_pool.log`` -> ``laminar_pool.1.log``)."""
    if i == 0:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{i}.{ext}" if dot and "/" not in ext else f"{path}.{i}"
