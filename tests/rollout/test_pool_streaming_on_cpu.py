"""The partial-response pool on verl's path (laminar.pool.enabled): verl's server streams each tagged request's
tokens to the pool (rollout.streaming_server.StreamingEngine), and when a replica dies the pinned client continues
the response on the group's new replica from what reached the pool instead of from the prompt."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError

from laminar_testing import ActorShell, client_config, router_over
from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.pool.partial import FINISHED, ChunkPolicy, PartialPool
from verl_laminar.pool.shards import PoolShards
from verl_laminar.rollout.client import GROUP_PIN, LaminarLLMServerClient
from verl_laminar.rollout.pool_client import RECOVERED
from verl_laminar.rollout.streaming_server import POOL_KEY_ARG, StreamingEngine, pool_tag


class Pool(PartialPool):
    pass


class FakeEngine:
    """vLLM's AsyncLLM.generate shape: cumulative RequestOutputs, one token per step; ``aborted`` is a flag."""

    def __init__(self, tokens: int, logprobs: bool = True) -> None:
        self.tokens, self.logprobs, self.other = tokens, logprobs, "engine attribute"

    async def generate(self, prompt=None, sampling_params=None, request_id=None, **kw):
        ids: list[int] = []
        for i in range(self.tokens):
            await asyncio.sleep(0)
            ids.append(100 + i)
            lps = [{t: SimpleNamespace(logprob=-0.1 * (j + 1))} for j, t in enumerate(ids)] if self.logprobs else None
            reason = "length" if i == self.tokens - 1 else None  # vLLM names why it ended on the last output
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(ids), logprobs=lps, finish_reason=reason)])


def _params(key=None, version=0, group="g"):
    tag = None if key is None else {POOL_KEY_ARG: {"key": key, "group": group, "version": version}}
    return SimpleNamespace(extra_args=tag, max_tokens=64, temperature=1.0)


def test_a_tagged_request_streams_every_token_and_log_prob_to_the_pool():
    async def main():
        pool = Pool()
        eng = StreamingEngine(FakeEngine(10), lambda: PoolShards([ActorShell(pool)]), lambda: 3, ChunkPolicy(flush_tokens=4),
                              replica=1)
        outs = [o async for o in eng.generate(prompt={"prompt_token_ids": [1, 2]},
                                              sampling_params=_params("r1", version=3), request_id="r1")]
        assert len(outs) == 10  # verl sees every output, unchanged
        t = pool.get("r1")  # the server opened the entry with the prompt, the pinned version and its replica
        assert (t.prompt_ids, t.version, t.group_id, t.replica_id) == ([1, 2], 3, "g", 1)
        assert t.state.get(FINISHED) is True  # the engine ended it: a resume must not extend it
        assert t.tokens == list(range(100, 110))
        assert t.logprobs == pytest.approx([-0.1 * (j + 1) for j in range(10)])
        assert eng.other == "engine attribute" and eng.streamed_requests == 1  # everything else passes through

    asyncio.run(main())


def test_untagged_requests_stream_nothing_and_missing_log_probs_are_placeholders():
    async def main():
        pool = Pool()
        eng = StreamingEngine(FakeEngine(3), lambda: pytest.fail("no pool lookup for an untagged request"),
                              lambda: 0)
        assert len([o async for o in eng.generate(prompt={}, sampling_params=_params(), request_id="x")]) == 3
        eng = StreamingEngine(FakeEngine(3, logprobs=False), lambda: PoolShards([ActorShell(pool)]), lambda: 0)
        [o async for o in eng.generate(prompt={}, sampling_params=_params("r2"), request_id="r2")]
        assert pool.get("r2").tokens == [100, 101, 102] and all(math.isnan(x) for x in pool.get("r2").logprobs)

    asyncio.run(main())
    assert pool_tag(_params("k"))["key"] == "k" and pool_tag(SimpleNamespace()) is None


def test_a_corrupted_answer_carries_ids_outside_any_vocabulary_that_the_client_check_rejects():
    from verl.workers.rollout.replica import TokenOutput

    from verl_laminar.rollout.badinput import GarbageOutputError, check_output_tokens
    from verl_laminar.rollout.streaming_server import GARBAGE_ID_OFFSET, corrupted

    out = corrupted(TokenOutput(token_ids=[100, 101], log_probs=[-0.1, -0.2], extra_fields={"global_steps": 0}))
    assert out.token_ids == [GARBAGE_ID_OFFSET + 100, GARBAGE_ID_OFFSET + 101]
    assert out.log_probs == [-0.1, -0.2]  # paired as before: only the ids are impossible
    with pytest.raises(GarbageOutputError, match="2 of 2 token ids are outside"):
        check_output_tokens(out.token_ids, out.log_probs, 151936, "r3")


def test_a_server_on_another_version_than_the_entry_is_refused_by_the_pool():
    async def main():
        pool = Pool()
        eng = StreamingEngine(FakeEngine(2), lambda: PoolShards([ActorShell(pool)]), lambda: 5, ChunkPolicy(flush_tokens=1))
        with pytest.raises(InvariantViolation, match="of version 2 got tokens of version 5"):
            [o async for o in eng.generate(prompt={}, sampling_params=_params("r3", version=2), request_id="r3")]

    asyncio.run(main())


def _next(prefix):
    return (sum(prefix) * 31 + len(prefix)) % 1000


class StreamingMortalServer:
    """Like verl's server with the streaming engine: one token every 2 ms as a function of the prefix, each token
    sent to the pool entry named in extra_args at once; ``die()`` makes every call fail as a dead actor's."""

    def __init__(self, rid: int, pool: Pool) -> None:
        self.rid, self.pool, self.version, self.dead = rid, pool, -1, False
        self.prompts, self.tokens_made = [], 0
        self.die_before_answering = False

    def die(self) -> None:
        self.dead = True

    async def __ray_ready__(self):
        if self.dead:
            raise ActorDiedError()
        return True

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        if self.dead:
            raise ActorDiedError()
        self.prompts.append(list(prompt_ids))
        tag = (sampling_params.get("extra_args") or {}).get(POOL_KEY_ARG)
        key = None if tag is None else tag["key"]
        if tag is not None:
            self.pool.open(key, tag["group"], tag["version"], list(prompt_ids), {}, self.rid)
        seq, out = list(prompt_ids), []
        for _ in range(sampling_params["max_tokens"]):
            await asyncio.sleep(0.002)
            if self.dead:
                raise ActorDiedError()
            t = _next(seq)
            seq.append(t)
            out.append(t)
            self.tokens_made += 1
            if key is not None:
                self.pool.append(key, self.version, [t], [-(t % 7) / 10], None, len(out) - 1)
        if key is not None:
            self.pool.finish(key)
        if self.die_before_answering:  # the whole response is in the pool, the answer never leaves
            self.dead = True
            raise ActorDiedError()
        return SimpleNamespace(token_ids=out, log_probs=[-(t % 7) / 10 for t in out], stop_reason="completed",
                               extra_fields={"global_steps": self.version})


def _expected(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(_next(seq))
    return seq[len(prompt):]


async def _two_replicas(pool, response_length: int, with_pool: bool = True):
    """Two streaming replicas on version 0 behind a router, a pinned client, and two groups ("g", "h"), one on
    each replica, so that either replica's death moves its group to the other."""
    servers = {i: StreamingMortalServer(i, pool) for i in range(2)}
    router, _ = router_over(servers, 1)
    router._failover.probe_timeout_s = 1.0
    await router.start(0)
    client = LaminarLLMServerClient(client_config(response_length=response_length),
                                    load_balancer_handle=ActorShell(router),
                                    pool_handle=PoolShards([ActorShell(pool)]) if with_pool else None)
    pin = await router.assign_group("g", 1)
    other = await router.assign_group("h", 1)
    GROUP_PIN.set(pin)
    return servers, router, client, pin, other


@pytest.mark.parametrize("with_pool", [True, False], ids=["continued_from_pool", "restarted_without_pool"])
def test_a_dead_replicas_request_continues_from_its_streamed_tokens(with_pool):
    async def main():
        pool = Pool()
        servers, router, client, pin, other = await _two_replicas(pool, 60, with_pool)
        victim = servers[pin.replica_id]
        task = asyncio.create_task(client.generate("g-0", prompt_ids=[5, 6], sampling_params={"logprobs": True,
                                                                                           "max_tokens": 60}))
        while victim.tokens_made < 20 and not task.done():
            await asyncio.sleep(0.002)
        victim.die()
        out = await task
        assert out.token_ids == _expected([5, 6], 60)  # the whole response, as if nothing had happened
        assert len(out.log_probs) == 60
        survivor = servers[other.replica_id]
        resumed = survivor.prompts[-1]
        events = router.drain_events()
        if with_pool:
            # the survivor got prompt + the tokens that reached the pool, and generated only the rest
            assert len(resumed) > 2 + 15 and resumed[:2] == [5, 6]
            assert [(c.group_id, c.tokens) for c in events.continued] == [("g", len(resumed) - 2)]
            await asyncio.sleep(0.01)  # the client's close is not awaited
            assert len(pool) == 0  # every piece's entry is closed
        else:
            assert resumed == [5, 6] and events.continued == ()
        assert out.extra_fields.get(RECOVERED) is None  # the final output is the assembled response

    asyncio.run(main())


def test_a_response_the_engine_ended_is_not_extended_when_its_replica_dies_before_answering():
    """The last chunk and the engine's end reached the pool, then the replica died: the client returns the pool's
    tokens as the whole response (a resume would generate past its stop token)."""
    async def main():
        pool = Pool()
        servers, router, client, pin, _ = await _two_replicas(pool, 30)
        servers[pin.replica_id].die_before_answering = True
        out = await client.generate("g-0", prompt_ids=[5, 6], sampling_params={"logprobs": True, "max_tokens": 30})
        assert out.token_ids == _expected([5, 6], 30) and out.stop_reason == "completed"
        assert servers[1 - pin.replica_id].prompts == []  # nothing ran again
        assert [c.tokens for c in router.drain_events().continued] == [30]

    asyncio.run(main())


class CountingShell(ActorShell):
    """An ``ActorShell`` that records which pool methods were called."""

    def __init__(self, obj, calls: list) -> None:
        super().__init__(obj)
        self._calls = calls

    def __getattr__(self, name):
        self._calls.append(name)
        return super().__getattr__(name)


@pytest.mark.parametrize("tick", [0.01, None])
def test_a_servers_requests_share_one_pool_call_a_tick_unless_batching_is_off(tick):
    """laminar.pool.batch_tick_s: the chunks of all the server's requests go as one ``apply_many`` a tick; with
    null, one ``append`` call a chunk. The pool holds the same tokens either way."""

    async def main():
        pool, calls = Pool(), []
        eng = StreamingEngine(FakeEngine(32), lambda: PoolShards([CountingShell(pool, calls)]), lambda: 0,
                              ChunkPolicy(flush_tokens=4, batch_tick_s=tick))
        await asyncio.gather(*(_drain(eng.generate(prompt={"prompt_token_ids": [1]}, sampling_params=_params(f"r{i}"),
                                                    request_id=f"r{i}")) for i in range(8)))
        return pool, calls

    pool, calls = asyncio.run(main())
    for i in range(8):
        assert pool.get(f"r{i}").tokens == list(range(100, 132)) and pool.get(f"r{i}").state.get(FINISHED)
    chunks = 8 * (32 // 4)
    if tick is None:
        assert calls.count("append") == chunks and "apply_many" not in calls
    else:
        assert "append" not in calls and 1 <= calls.count("apply_many") < chunks // 4


async def _drain(gen) -> None:
    async for _ in gen:
        pass


def test_a_nonsense_batch_tick_is_refused():
    with pytest.raises(ValueError, match="batch_tick_s"):
        ChunkPolicy(batch_tick_s=0)


@pytest.mark.parametrize("tick", [0.2, None])
def test_a_request_aborted_before_its_first_token_has_its_entry_when_the_server_answers(tick):
    """No chunk follows such a request's open, so the server waits for the open itself before it answers: the
    client closes the entry as soon as it hears the answer, and a close that overtook a batched open was refused as
    a close of an unknown trajectory (an invariant violation in a CI run, with repack's aborts)."""

    async def main():
        pool = Pool()
        eng = StreamingEngine(FakeEngine(0), lambda: PoolShards([ActorShell(pool)]), lambda: 0,
                              ChunkPolicy(flush_tokens=4, batch_tick_s=tick))
        await _drain(eng.generate(prompt={"prompt_token_ids": [1]}, sampling_params=_params("r0"), request_id="r0"))
        entry = pool.get("r0")  # before anything else runs: the answer came after the open was applied
        pool.close("r0")  # what the client does next
        return entry

    entry = asyncio.run(main())
    assert entry.tokens == [] and not entry.state.get(FINISHED)
