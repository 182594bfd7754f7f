"""``bench.router_run`` with fake engines: the benchmark's runs are the product router's decisions.

Each fake engine answers a request with ``max_tokens`` tokens whose ids are the version it serves, so every
trajectory shows which version made it. Checks that groups take their replica and version from the router,
that a replica loads a version only when nothing runs on it, that the trainer stand-in's publications reach the
replicas, and that a piece that ends unfinished without a repack move stops the run loudly."""

from __future__ import annotations

import asyncio

import pytest

from laminar_testing import ActorShell
from verl_laminar import metrics as lm
from verl_laminar.bench.repack import PlannedGroups, check_run
from verl_laminar.bench.router_run import RouterRun


class FakeEngine:
    def __init__(self, rid: int, unfinished: frozenset = frozenset()) -> None:
        self.rid, self.version, self.live, self.loads = rid, -1, 0, []
        self.unfinished = unfinished  # request ids answered with finished=False (as if aborted)

    def stats(self) -> dict:
        return {"kv_used": 0.1 * self.live, "kv_tokens": self.live, "kv_capacity": 100, "waiting": 0}

    def abort_request(self, vid: str, reset_prefix_cache: bool = False) -> dict:
        return {"aborted": False}

    def __ray_ready__(self) -> bool:
        return True

    async def generate(self, vid, prompt, params, pool_key=None, pool_offset=0):
        self.live += 1
        await asyncio.sleep(0.001 * params["max_tokens"] / 8)
        self.live -= 1
        n = params["max_tokens"] if vid not in self.unfinished else params["max_tokens"] // 2
        return {"token_ids": [self.version] * n, "log_probs": [0.0] * n, "finished": vid not in self.unfinished,
                "version": self.version, "replica_id": self.rid}

    async def load_weights(self, version, blob):
        assert self.live == 0, f"replica {self.rid} loads version {version} with {self.live} requests running"
        assert blob == f"bytes of v{version}"
        self.version = version
        self.loads.append(version)


def _run(engines: dict, work: PlannedGroups, publish_every: int = 2):
    blobs = [f"bytes of v{v}" for v in range(8)]
    sampling = {"temperature": 0.0, "ignore_eos": True, "logprobs": True}
    return asyncio.run(RouterRun(engines, blobs, work, 1, publish_every, sampling, poll_s=0.01).run())


def test_every_group_runs_on_one_version_and_publications_reach_the_replicas():
    work = PlannedGroups.make(n_groups=8, n=3, max_tokens=96, median=20, seed=1)
    engines = {i: FakeEngine(i) for i in range(2)}
    res = _run({i: ActorShell(e) for i, e in engines.items()}, work)
    assert check_run(res, work) == {"lost_trajectories": 0, "mixed_version": 0, "migrated_trajectories": 0}
    for key, t in res.trajectories.items():
        assert set(t.token_ids()) == {t.version}, key  # made by the version its pieces are labelled with
    # v1, v2 and v3 are published after groups 2, 4 and 6 (none after the last); replicas load them in order
    for e in engines.values():
        assert e.loads[0] == 0 and e.loads == sorted(e.loads) and max(e.loads) <= 3, e.loads
    assert {t.version for t in res.trajectories.values()} > {0}
    assert res.refreshes == sum(len(e.loads) - 1 for e in engines.values()) >= 1  # v0's loads not counted
    assert res.tokens == work.total_tokens and res.makespan_s > 0 and len(res.latency_s) == 8 * 3
    assert res.repack is False and res.repack_metrics[lm.REPACK_MIGRATIONS] == 0


def test_a_piece_that_ends_unfinished_without_a_move_stops_the_run():
    work = PlannedGroups.make(n_groups=2, n=2, max_tokens=48, median=20, seed=1)
    engines = {i: ActorShell(FakeEngine(i, unfinished=frozenset({"g0001_1.0"}))) for i in range(2)}
    with pytest.raises(RuntimeError, match=r"g0001_1\.0: ended unfinished on replica \d without being moved"):
        _run(engines, work)
