"""A restarted trainer's adopted groups (laminar.fleet.detached, policy.adopt): the router pins them to their version
on no replica, the client answers each session from the pool without a server call, and every request the client
sends carries its place in the group (session, turn, piece) for a later adoption."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from laminar_testing import ActorShell, client_config, router_over
from verl_laminar.policy.adopt import ADOPTED_REPLICA
from verl_laminar.policy.dispatch import RoutingError
from verl_laminar.policy.replica_loss import ReplicaLost
from verl_laminar.pool.partial import PartialPool
from verl_laminar.pool.shards import PoolShards
from verl_laminar.rollout.client import ADOPTED, GROUP_PIN, SESSION, LaminarLLMServerClient
from verl_laminar.rollout.streaming_server import POOL_KEY_ARG, where_of


class TagServer:
    def __init__(self, version: int) -> None:
        self.version, self.tags = version, []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.tags.append(sampling_params["extra_args"][POOL_KEY_ARG])
        return SimpleNamespace(token_ids=[1], log_probs=None, extra_fields={"global_steps": self.version})


async def _fleet(version: int = 1):
    server = TagServer(version)
    router, _ = router_over([server], 2)
    await router.start(version)
    pool = PartialPool()
    client = LaminarLLMServerClient(client_config(), load_balancer_handle=ActorShell(router),
                                    pool_handle=PoolShards([ActorShell(pool)]))
    return router, pool, client, server


def _finished(pool, key, group, session, version, tokens):
    pool.open(key, group, version, [9, 9], {"max_tokens": 8}, 0, {"session": session, "turn": 0, "piece": 0})
    pool.append(key, version, tokens, [-0.5] * len(tokens), offset=0)
    pool.finish(key)


async def _sessions(client, gid, n, turns=1):
    async def session(s):
        SESSION.set([s, 0])  # the agent-loop worker sets this per session task
        return [await client.generate(f"{gid}-{s}-{t}", prompt_ids=[9, 9], sampling_params={"logprobs": True})
                for t in range(turns)]

    return await asyncio.gather(*[asyncio.create_task(session(s)) for s in range(n)])


def test_an_adopted_group_is_answered_from_the_pool_on_no_replica():
    async def main():
        router, pool, client, server = await _fleet(version=1)
        _finished(pool, "old.0", "g", 0, 0, [4, 5])
        _finished(pool, "old.1", "g", 1, 0, [6])
        claim = pool.claim_group("g", 2)
        pin = await router.adopt_group("g", 2, claim["version"])
        assert (pin.replica_id, pin.version) == (ADOPTED_REPLICA, 0)
        GROUP_PIN.set(pin)
        ADOPTED.set(dict(enumerate(claim["keys"])))
        outs = await _sessions(client, "g", 2)
        assert [o[0].token_ids for o in outs] == [[4, 5], [6]]
        assert [o[0].log_probs for o in outs] == [[-0.5, -0.5], [-0.5]]
        assert {o[0].extra_fields["global_steps"] for o in outs} == {0}
        assert server.tags == []  # no replica ran them
        for s, o in enumerate(outs):
            assert await router.trajectory_finished(f"g_{s}", "g", 2, len(o[0].token_ids)) == 1
        await router.finish_group("g")
        await asyncio.sleep(0)  # the client's close calls are not awaited
        assert len(pool) == 0  # read and closed
        ev = router.drain_events()
        assert [(e.key, e.replica_id, e.version) for e in ev.started] == [("g_0", ADOPTED_REPLICA, 0),
                                                                           ("g_1", ADOPTED_REPLICA, 0)]
        assert [(e.replica_id, e.version, e.n) for e in ev.finished] == [(ADOPTED_REPLICA, 0, 1)] * 2

    asyncio.run(main())


def test_adoption_above_the_published_version_or_twice_is_refused():
    async def main():
        router, *_ = await _fleet(version=1)
        with pytest.raises(RoutingError, match="above the published"):
            await router.adopt_group("g", 2, 2)  # a discarded branch's responses
        await router.adopt_group("g", 2, 1)
        with pytest.raises(RoutingError, match="twice"):
            await router.adopt_group("g", 2, 1)

    asyncio.run(main())


def test_an_adopted_group_asking_for_a_second_turn_is_lost_not_generated_on_another_version():
    async def main():
        router, pool, client, _ = await _fleet(version=1)
        _finished(pool, "old.0", "g", 0, 1, [4])
        claim = pool.claim_group("g", 1)
        GROUP_PIN.set(await router.adopt_group("g", 1, claim["version"]))
        ADOPTED.set(dict(enumerate(claim["keys"])))
        with pytest.raises(ReplicaLost, match="first turn only"):
            await _sessions(client, "g", 1, turns=2)

    asyncio.run(main())


def test_every_request_carries_its_place_in_the_group():
    async def main():
        router, pool, client, server = await _fleet(version=0)
        GROUP_PIN.set(await router.assign_group("g", 2))
        await _sessions(client, "g", 2, turns=2)
        places = sorted((t["session"], t["turn"], t["piece"]) for t in server.tags)
        assert places == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
        assert all(where_of(t) == {"session": t["session"], "turn": t["turn"], "piece": 0} for t in server.tags)
        assert where_of({"key": "k", "group": "g", "version": 0}) is None  # an untagged request: never adopted

    asyncio.run(main())
