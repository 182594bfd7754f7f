"""The pool's shards without Ray: routing by group (the same in every process), the derived shard count, the logs'
names, and the fleet-wide queries merged over shards."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import ray
from omegaconf import OmegaConf

from verl_laminar.config.schema import LaminarConfig, PoolConfig
from verl_laminar.config.sections import LaminarConfigError
from verl_laminar.pool.partial import PartialPool
from verl_laminar.pool.shards import (
    MAX_SHARDS,
    SEQUENCES_PER_SHARD,
    PoolShards,
    shard_index,
    shard_log,
    shard_name,
    shards_for,
)
from verl_laminar.trainer.pool import shard_count


def test_a_groups_shard_is_the_same_in_every_process():
    groups = [f"uid-{i}" for i in range(64)]
    here = [shard_index(g, 4) for g in groups]
    assert set(here) == {0, 1, 2, 3}  # the groups spread over every shard
    code = ("import sys; from verl_laminar.pool.shards import shard_index; "
            "print([shard_index(f'uid-{i}', 4) for i in range(64)])")
    for seed in ("1", "2"):  # Python's str hash differs per process; the routing must not
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert eval(out.stdout) == here  # noqa: S307 - a list literal this test printed
    assert all(shard_index(g, 1) == 0 for g in groups)


def test_the_shard_count_follows_the_running_sequences():
    assert shards_for(1) == 1 and shards_for(SEQUENCES_PER_SHARD) == 1  # the measured point: 64 x 128
    assert shards_for(SEQUENCES_PER_SHARD + 1) == 2
    assert shards_for(10**9) == MAX_SHARDS

    def cfg(**rollout):
        return OmegaConf.create({"trainer": {"nnodes": 128, "n_gpus_per_node": 8},
                                 "actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": 1,
                                                                   "max_num_seqs": 128, **rollout}}})

    derived = LaminarConfig(pool=PoolConfig(shards=None))
    assert shard_count(cfg(), derived) == 16  # 1,024 replicas x 128 sequences / 8,192 per shard
    assert shard_count(cfg(max_num_seqs=100), derived) == 13  # 102,400 / 8,192, rounded up
    assert shard_count(cfg(tensor_model_parallel_size=8), derived) == 2  # 128 replicas (a 72B at TP=8)
    assert shard_count(cfg(nnodes=16, n_gpus_per_node=8), derived) == 2  # the rollout's own 16 machines
    assert shard_count(OmegaConf.create({"trainer": {"nnodes": 1, "n_gpus_per_node": 1}}), derived) == 1
    # no more than two steps' trajectories run at once: 512 prompts x 16 responses x 2 = 16,384 -> 2 shards
    big = OmegaConf.merge(cfg(), {"data": {"train_batch_size": 512}, "actor_rollout_ref": {"rollout": {"n": 16}}})
    assert shard_count(big, derived) == 2
    assert shard_count(cfg(), LaminarConfig(pool=PoolConfig(shards=3))) == 3  # given: as given
    with pytest.raises(LaminarConfigError, match="laminar.pool.shards"):
        PoolConfig(shards=0)


def test_shard_names_and_logs_keep_shard_0_as_the_one_pool_was():
    assert shard_name(0) == "laminar_partial_pool" and shard_name(2) == "laminar_partial_pool.2"
    assert shard_log("/d/laminar_pool.log", 0) == "/d/laminar_pool.log"
    assert shard_log("/d/laminar_pool.log", 1) == "/d/laminar_pool.1.log"
    assert shard_log("/d.x/pool", 1) == "/d.x/pool.1"


class _Sync:
    """``handle.method.remote(*a)`` returns ``obj.method(*a)``; ``ray.get`` is the identity in the test using it."""

    def __init__(self, obj) -> None:
        self._obj = obj

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self._obj, name))


def test_fleet_wide_queries_merge_every_shard(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: refs)
    pools = [PartialPool(), PartialPool()]
    shards = PoolShards([_Sync(p) for p in pools])
    groups = [f"g{i}" for i in range(8)]
    for g in groups:  # each group's two responses on replica 0, written where a server would write them
        pool = pools[shards.index(g)]
        for s in range(2):
            pool.open(f"{g}.{s}", g, 1, [1], {}, 0, {"session": s, "turn": 0, "piece": 0})
            pool.append(f"{g}.{s}", 1, [5, 6], [-0.1, -0.2])
    assert {shards.index(g) for g in groups} == {0, 1} and all(len(p) > 0 for p in pools)
    assert shards.size() == 16 and shards.streamed_on(0, 2) == 16 and shards.streamed_on(0, 2, ["g1"]) == 2
    assert shards.adoptable_groups(2, running=True) == groups  # every group whole, from both shards, sorted
    assert shards.tokens_since(0.0) == 32
    # a replica's silence is its freshest shard's: it streams to both
    pools[0]._activity[0] -= 30.0
    assert shards.silence([0])[0] < 1.0
    pools[1]._activity[0] -= 30.0
    assert shards.silence([0])[0] >= 30.0
    with pytest.raises(ValueError, match="at least one shard"):
        PoolShards([])
