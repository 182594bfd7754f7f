"""LaminarLLMServerClient + GROUP_PIN: every turn of every response of a group lands on the group's replica,
two groups running concurrently never see each other's pin, and a wrong version label raises."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

from laminar_testing import ActorShell, client_config, router_over
from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.policy.dispatch import Assignment, RoutingError
from verl_laminar.policy.replica_loss import ReplicaLost
from verl_laminar.rollout.client import GROUP_PIN, LaminarLLMServerClient
from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles


class FakeServer:
    def __init__(self, rid: int, version: int) -> None:
        self.rid, self.version, self.calls = rid, version, []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.calls.append(prompt_ids[0])  # verl sends a fresh vLLM request id per turn; the prompt tells
        await asyncio.sleep(0.001)
        return SimpleNamespace(token_ids=[1], extra_fields={"global_steps": self.version})


def _config(tmp_path, vocab: int = 151936):
    return client_config(vocab)


def test_multi_turn_groups_stay_on_their_pinned_replica(tmp_path):
    async def main():
        servers = {i: FakeServer(i, 0) for i in range(2)}
        router, _ = router_over(servers, 1)
        await router.start(0)
        client = LaminarLLMServerClient(_config(tmp_path), load_balancer_handle=ActorShell(router))

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


def test_no_pin_and_wrong_label_raise(tmp_path):
    async def main():
        server = FakeServer(0, 5)
        router = LaminarRouter([ReplicaHandles(0, "a0", ActorShell(server))], 1)
        client = LaminarLLMServerClient(_config(tmp_path), load_balancer_handle=ActorShell(router))
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


def _next_token(prefix):
    return (sum(prefix) * 31 + len(prefix)) % 1000  # a function of the prefix, like greedy decoding


class StreamingServer:
    """Generates one token every 2 ms as a function of the prefix; ``abort_request`` ends a request early
    with what it has so far, as verl's vLLM server does (stop_reason "aborted")."""

    def __init__(self, rid: int, version: int = 0) -> None:
        self.rid, self.version, self.live, self.stop = rid, version, {}, set()
        self.prompts = []  # every request's prompt, in arrival order

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.prompts.append(list(prompt_ids))
        seq, out = list(prompt_ids), []
        self.live[request_id] = out
        try:
            for _ in range(sampling_params["max_tokens"]):
                if request_id in self.stop:
                    break
                await asyncio.sleep(0.002)
                t = _next_token(seq)
                seq.append(t)
                out.append(t)
        finally:
            self.live.pop(request_id, None)
        aborted = len(out) < sampling_params["max_tokens"]
        return SimpleNamespace(token_ids=out, log_probs=[-(t % 7) / 10 for t in out],
                               stop_reason="aborted" if aborted else "completed",
                               extra_fields={"global_steps": self.version})

    async def abort_request(self, request_id, reset_prefix_cache=True):
        if request_id not in self.live:
            return {"aborted": False}
        self.stop.add(request_id)
        return {"aborted": True}


@pytest.mark.parametrize("constrained", [False, True], ids=["resumed", "structured_outputs_restarted"])
def test_repack_moves_a_tail_and_the_client_resumes_it_unchanged(tmp_path, constrained):
    """A migrated tail continues on the target from prompt + partial response; under structured outputs (a regex
    over the whole response, as the guided tool-calling turn has) it restarts from its prompt instead, since the
    constraint would otherwise apply to the continuation alone. Either way the output is the whole response."""
    from verl_laminar.policy.repack import RepackPolicy
    from verl_laminar.rollout.router import RepackSettings
    from verl_laminar.rollout.vllm_metrics import VllmReading

    async def main():
        servers = {i: StreamingServer(i) for i in range(2)}
        peaks = {}

        def reader(address):
            # KV use from the live requests (tokens held), as vLLM would report it; capacity 10,000 tokens
            s = servers[int(address[1:])]
            kv = sum(20 + len(o) for o in s.live.values())
            peaks[address] = max(peaks.get(address, 0), kv)
            return VllmReading(kv / 10_000, len(s.live), 0, 10_000)

        router, _ = router_over(servers, 1, repack=RepackSettings(RepackPolicy(max_batch=4), interval_s=3600),
                                reader=reader)
        await router.start(0)
        client = LaminarLLMServerClient(_config(tmp_path), load_balancer_handle=ActorShell(router))
        lengths = {"ga": (40, 400), "gb": (60, 300)}  # one short and one long response per group

        async def group(gid):
            pin = await router.assign_group(gid, 2)
            GROUP_PIN.set(pin)

            async def session(s):
                prompt = [ord(gid[-1]), s]
                params = {"max_tokens": lengths[gid][s]}
                if constrained:
                    params["structured_outputs"] = {"regex": "[0-9]+"}  # the stand-in server ignores it
                return prompt, await client.generate(f"{gid}-{s}", prompt_ids=prompt, sampling_params=params)

            outs = await asyncio.gather(*[asyncio.create_task(session(s)) for s in range(2)])
            await router.finish_group(gid)
            return pin, outs

        work = asyncio.gather(group("ga"), group("gb"))
        await asyncio.sleep(0.05)
        await router._repack.round()  # both replicas at their peak: nothing falls yet
        assert router.snapshot()["repack"]["laminar/repack/migrations"] == 0
        await asyncio.sleep(0.25)  # the short responses are done: each replica holds one long tail
        await router._repack.round()
        results = await work
        snap = router.snapshot()
        assert snap["repack"]["laminar/repack/migrations"] == 1
        moved = 0
        for pin, outs in results:
            for prompt, out in outs:
                seq, expect = list(prompt), []
                for _ in range(len(out.token_ids)):
                    expect.append(_next_token(seq))
                    seq.append(expect[-1])
                assert out.token_ids == expect and len(out.token_ids) in lengths[pin.group_id]
                assert out.log_probs == [-(t % 7) / 10 for t in expect]
                assert out.stop_reason == "completed" and out.extra_fields["global_steps"] == 0
                moved += out.extra_fields.get("laminar_migrations", 0)
        assert moved == 1
        longest_prompt = max(len(p) for srv in servers.values() for p in srv.prompts)
        # resumed: some request's prompt carried the partial response; restarted: every prompt is an original one
        assert (longest_prompt == 2) is constrained, longest_prompt
        assert sum(len(srv.prompts) for srv in servers.values()) == 5  # 4 responses + the one resumed or restarted
        assert router.get_total_inflight() == 0 and all(not s for s in router._book.requests.values())

    asyncio.run(main())


def test_garbage_token_ids_fail_the_request_by_name(tmp_path):
    from verl_laminar.rollout.badinput import GarbageOutputError

    class GarbageServer(FakeServer):
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            return SimpleNamespace(token_ids=[3, 9], log_probs=[-0.1, -0.2], extra_fields={"global_steps": 0})

    async def main():
        router, _ = router_over([GarbageServer(0, 0)], 1)
        await router.start(0)
        client = LaminarLLMServerClient(_config(tmp_path, vocab=8), load_balancer_handle=ActorShell(router))
        GROUP_PIN.set(await router.assign_group("g", 1))
        # the replica is fenced; with no other replica of the version the group is lost, the garbage named as cause
        with pytest.raises(ReplicaLost, match="fenced for garbage output") as err:
            await client.generate("req-7", prompt_ids=[1], sampling_params={})
        assert isinstance(err.value.__cause__, GarbageOutputError)
        assert re.search(r"req-7.*token_ids\[1\]=9", str(err.value.__cause__))
        assert router.dead_replicas() == [0]

    asyncio.run(main())


def test_a_replica_answering_garbage_is_fenced_and_the_request_reruns_on_a_live_replica(tmp_path):
    class GarbageServer(FakeServer):
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            self.calls.append(prompt_ids[0])
            return SimpleNamespace(token_ids=[3, 9], log_probs=[-0.1, -0.2], extra_fields={"global_steps": 0})

    async def main():
        bad, good = GarbageServer(0, 0), FakeServer(1, 0)
        router, _ = router_over([bad, good], 1)
        await router.start(0)
        client = LaminarLLMServerClient(_config(tmp_path, vocab=8), load_balancer_handle=ActorShell(router))
        pin = await router.assign_group("g", 1)
        assert pin.replica_id == 0  # the first replica takes the first group
        GROUP_PIN.set(pin)
        out = await client.generate("req-8", prompt_ids=[1], sampling_params={})
        assert all(0 <= t < 8 for t in out.token_ids) and out.token_ids  # the live replica's answer
        assert len(bad.calls) == 1 and len(good.calls) == 1  # fenced after its first garbage answer: asked nothing again
        assert router.dead_replicas() == [0]
        failures = router.drain_events().failures
        assert [f.replica_id for f in failures] == [0] and "fenced: " in failures[0].error
        assert [g for g, _ in failures[0].moved] == ["g"]

    asyncio.run(main())


def test_more_tokens_than_max_tokens_fail_the_request(tmp_path):
    from verl_laminar.rollout.badinput import GarbageOutputError

    class VerboseServer(FakeServer):
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            return SimpleNamespace(token_ids=[1, 2, 3, 4], log_probs=None, extra_fields={"global_steps": 0})

    async def main():
        router, _ = router_over([VerboseServer(0, 0)], 1)
        await router.start(0)
        client = LaminarLLMServerClient(_config(tmp_path), load_balancer_handle=ActorShell(router))
        GROUP_PIN.set(await router.assign_group("g", 1))
        with pytest.raises(ReplicaLost) as err:
            await client.generate("req-3", prompt_ids=[1], sampling_params={"max_tokens": 3})
        assert isinstance(err.value.__cause__, GarbageOutputError)
        assert re.search(r"req-3.*4 tokens returned for a request of max_tokens=3", str(err.value.__cause__))

    asyncio.run(main())


def test_an_unreadable_model_config_is_an_error_not_a_skipped_check(tmp_path):
    from verl_laminar.rollout.client import ModelConfigError, read_vocab_size

    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ModelConfigError, match="no usable vocab_size"):
        read_vocab_size(str(tmp_path))
    with pytest.raises(ModelConfigError, match="model.path='/nonexistent/model'"):
        read_vocab_size("/nonexistent/model")
    (tmp_path / "config.json").write_text('{"vocab_size": 64}')
    assert read_vocab_size(str(tmp_path)) == 64


def test_requests_of_a_fenced_replica_that_then_fail_start_over_instead_of_continuing_from_the_pool():
    async def main():
        router, _ = router_over([FakeServer(i, 0) for i in range(2)], 2)
        await router.start(0)
        for g in ("ga", "gb", "gc", "gd"):
            await router.assign_group(g, 1)
        on_0 = [g for g, a in router._state.pins.items() if a.replica_id == 0]
        assert len(on_0) >= 2, router._state.pins  # two groups share replica 0 (two groups per batch)
        # one of its answers is garbage: fenced, that group moves
        assert await router.replica_misbehaved(on_0[0], 0, "garbage", "a0") == "moved"
        # a request of its other group then fails with an actor error (the trainer ended the fenced replica): it
        # moves too, but what the replica streamed is not to be continued from
        assert await router.replica_failed(on_0[1], 0, "ActorDiedError()", "a0") == "moved_fresh"
        assert router.dead_replicas() == [0]

    asyncio.run(main())


def test_full_determinism_ids_are_unique_and_repeat_across_runs(tmp_path):
    """verl's TransferQueue path names every request ``det-0`` under full_determinism; the vLLM ids (the pool keys)
    must still be unique in a run, and the same in a second run of the same inputs."""
    class IdServer(FakeServer):
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            self.calls.append(request_id)
            return SimpleNamespace(token_ids=[1], extra_fields={"global_steps": self.version})

    async def run() -> list:
        server = IdServer(0, 0)
        router, _ = router_over([server], 2)
        await router.start(0)
        config = _config(tmp_path)
        config.actor_rollout_ref.rollout.full_determinism = True
        client = LaminarLLMServerClient(config, load_balancer_handle=ActorShell(router))
        for gid in ("ga", "gb"):
            GROUP_PIN.set(await router.assign_group(gid, 2))
            for _session in range(2):
                for _turn in range(2):
                    await client.generate("det-0", prompt_ids=[1], sampling_params={})
            await router.finish_group(gid)
        return server.calls

    first, second = asyncio.run(run()), asyncio.run(run())
    assert len(first) == 8 and len(set(first)) == 8, first
    assert first == second
    assert all(v.startswith("det-0.g") for v in first)
