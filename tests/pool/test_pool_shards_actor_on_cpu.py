"""Two real pool shards (Ray actors, their own logs): every process finds both, a group's chunks stream through its
shard's batcher and stay whole there, and a killed shard comes back with its own entries while the other keeps its
process and its entries."""

from __future__ import annotations

import asyncio
import os

import pytest
import ray

from laminar_testing import wait_process_gone
from verl_laminar.pool.batch import PoolBatcher
from verl_laminar.pool.partial import ChunkPolicy
from verl_laminar.pool.shards import find_shards, shard_log, spawn_shards
from verl_laminar.pool.stream import PoolStreamer

pytestmark = pytest.mark.ray_driver  # starts a Ray driver: runs in a child interpreter

BASE = "test_pool_shards"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def _pid(handle) -> int:
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=120)


async def _stream(shards, groups: list[str]) -> None:
    """Two responses per group, as a server streams them: open, then 3 chunks of 4 tokens, through one batcher per
    shard."""
    batchers = {i: PoolBatcher(h, tick_s=0.01) for i, h in enumerate(shards.handles)}

    async def one(g: str, s: int) -> None:
        i = shards.index(g)
        key = f"{g}.{s}"
        batchers[i].send("open", key, g, 1, [1, 2], {}, s, {"session": s, "turn": 0, "piece": 0})
        st = PoolStreamer(shards.handles[i], key, 1, 0, ChunkPolicy(flush_tokens=4), batcher=batchers[i])
        tokens = list(range(100, 112))
        for n in (4, 8, 12):
            st.maybe_flush(tokens[:n], [-0.5] * n)
        await st.flush(tokens, [-0.5] * 12, finished=True)

    await asyncio.gather(*(one(g, s) for g in groups for s in range(2)))


def test_two_shards_route_by_group_and_restart_on_their_own(local_ray, tmp_path):
    paths = [shard_log(str(tmp_path / "laminar_pool.log"), i) for i in range(2)]
    made = spawn_shards(paths, base=BASE)
    shards = find_shards(BASE)  # what a server or client in another process finds by name
    assert len(shards) == 2
    groups = [f"uid-{i}" for i in range(12)]
    by_shard = {i: [g for g in groups if shards.index(g) == i] for i in range(2)}
    assert by_shard[0] and by_shard[1]
    asyncio.run(_stream(shards, groups))
    assert all(os.path.getsize(p) > 0 for p in paths)  # each shard logged its own
    for i, h in enumerate(shards.handles):
        assert ray.get(h.__len__.remote()) == 2 * len(by_shard[i])  # whole groups, on their shard only
        assert ray.get(h.adoptable_groups.remote(2)) == sorted(by_shard[i])
    assert shards.size() == 24 and shards.adoptable_groups(2) == sorted(groups)

    # shard 1's process dies: it restarts and replays its log; shard 0 keeps its process and its entries
    pid0, pid1 = _pid(shards.handles[0]), _pid(shards.handles[1])
    ray.kill(shards.handles[1], no_restart=False)
    wait_process_gone(pid1, "shard 1's process")
    assert _pid(shards.handles[0]) == pid0 and ray.get(shards.handles[0].__len__.remote()) == 2 * len(by_shard[0])
    assert _pid(shards.handles[1]) != pid1
    g = by_shard[1][0]
    claim = ray.get(shards.of(g).claim_group.remote(g, 2), timeout=120)
    assert claim["version"] == 1 and claim["keys"] == [f"{g}.0", f"{g}.1"] and claim["tokens"] == 24
    assert ray.get(shards.of(g).get.remote(f"{g}.1")).tokens == list(range(100, 112))  # replayed whole
    assert shards.size() == 24

    made.stop()
    for h in made.handles:  # stopped for good: killed, not restarted
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(h.__len__.remote(), timeout=60)
