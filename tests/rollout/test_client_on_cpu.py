"""LaminarLLMServerClient + GROUP_PIN: every turn of every response of a group lands on the group's replica,
two groups running concurrently never see each other's pin, and a wrong version label raises."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.policy.dispatch import Assignment, RoutingError
from verl_laminar.rollout.client import GROUP_PIN, LaminarLLMServerClient
from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles


class _Remote:
    """``handle.method.remote(...)`` for an in-process object: the call returns an awaitable."""

    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs):
        return asyncio.ensure_future(self._fn(*args, **kwargs))


class ActorShell:
    def __init__(self, obj) -> None:
        self._obj = obj

    def __getattr__(self, name):
        fn = getattr(self._obj, name)
        if asyncio.iscoroutinefunction(fn):
            return _Remote(fn)

        async def call(*a, **k):
            return fn(*a, **k)

        return _Remote(call)


class FakeServer:
    def __init__(self, rid: int, version: int) -> None:
        self.rid, self.version, self.calls = rid, version, []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.calls.append(prompt_ids[0])  # verl sends a fresh vLLM request id per turn; the prompt tells
        await asyncio.sleep(0.001)
        return SimpleNamespace(token_ids=[1], extra_fields={"global_steps": self.version})


def _config():
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}})


def test_multi_turn_groups_stay_on_their_pinned_replica():
    async def main():
        servers = {i: FakeServer(i, 0) for i in range(2)}

        async def refresher(replica, version):
            servers[replica.replica_id].version = version

        router = LaminarRouter([ReplicaHandles(i, f"a{i}", ActorShell(servers[i])) for i in range(2)], 1,
                               refresher=refresher)
        await router.start(0)
        client = LaminarLLMServerClient(_config(), load_balancer_handle=ActorShell(router))

        async def group(gid: str):
            pin = await router.assign_group(gid, 2)
            GROUP_PIN.set(pin)

            async def session(s: int):
                for turn in range(3):
                    await client.generate(f"{gid}-{s}", prompt_ids=[gid, turn], sampling_params={})

            # create_task copies the context: the sessions see the pin, as verl's _run_prompt sessions do
            await asyncio.gather(*[asyncio.create_task(session(s)) for s in range(2)])
            await router.finish_group(gid)
            return pin

        pins = await asyncio.gather(group("ga"), group("gb"))
        seen = {g: {r for r, srv in servers.items() if g in srv.calls} for g in ("ga", "gb")}
        assert {p.replica_id for p in pins} == {0, 1}
        for p in pins:
            assert seen[p.group_id] == {p.replica_id}
        assert sum(len(s.calls) for s in servers.values()) == 12
        assert router.get_total_inflight() == 0

    asyncio.run(main())


def test_no_pin_and_wrong_label_raise():
    async def main():
        server = FakeServer(0, 5)
        router = LaminarRouter([ReplicaHandles(0, "a0", ActorShell(server))], 1)
        client = LaminarLLMServerClient(_config(), load_balancer_handle=ActorShell(router))
        with pytest.raises(RoutingError, match="no group pin"):
            await client.generate("r", prompt_ids=[1], sampling_params={})
        # a pin whose version differs from what the server reports (a refresh slipped under the group)
        router._published = 4
        router._state = router._state.__class__(
            tuple(r.__class__(0, 4, frozenset({"g"}), 1) for r in router._state.replicas),
            {"g": Assignment("g", 0, 4)})
        GROUP_PIN.set(Assignment("g", 0, 4))
        with pytest.raises(InvariantViolation, match="pinned to version 4"):
            await client.generate("r", prompt_ids=[1], sampling_params={})

    asyncio.run(main())
