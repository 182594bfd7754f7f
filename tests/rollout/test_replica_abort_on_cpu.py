"""Repack's abort on verl's vLLM server: the request must stop in vLLM's engine core, not only in the client.

verl 0.9.1's ``vLLMHttpServer.abort_request`` calls ``OutputProcessor.abort_requests([id])``; the installed vLLM's
takes ``(request_ids, internal)``, so verl's call raises, after it queued the ABORT output that ends the client's
stream: the client resumed on the repack target while the source went on decoding the request to its end.
``LaminarVLLMHttpServer.abort_request`` uses vLLM's own ``AsyncLLM.abort`` where the signature needs it.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest

from verl_laminar.rollout.streaming_server import abort_takes_internal, streaming_server_class


def test_verl_calls_abort_requests_without_internal_which_this_vllm_requires():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer
    from vllm.v1.engine.output_processor import OutputProcessor

    assert "output_processor.abort_requests([request_id])" in inspect.getsource(vLLMHttpServer.abort_request)
    assert abort_takes_internal(OutputProcessor)  # when this fails, vLLM changed again: re-check the override


def test_an_older_vllm_signature_keeps_verls_own_abort():
    class Old:
        def abort_requests(self, request_ids):
            pass

    class New:
        def abort_requests(self, request_ids, internal):
            pass

    assert not abort_takes_internal(Old()) and abort_takes_internal(New())


def _server(engine):
    # the Ray-less object: only what abort_request reads (verl's constructor needs a whole rollout config)
    server = object.__new__(streaming_server_class())
    server.node_rank, server.engine = 0, engine
    return server


@pytest.mark.e2e
def test_an_aborted_request_leaves_vllms_engine_core(tiny_model_dir, monkeypatch):
    """A request aborted mid-stream ends its stream with ABORT, and the engine core's next step runs only the
    request submitted after it (with verl's call on this vLLM it ran both)."""
    monkeypatch.setenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "1")  # as +laminar=enabled sets it
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from verl_laminar.rollout.engine_replica import EngineReplica

    prompt = {"prompt_token_ids": [11, 305, 77, 1024, 9, 4, 600, 31]}
    # the aborted request asks for the longest response the model allows, so the abort lands mid-stream on any
    # machine: with 300 tokens a fast Xeon finished it before the abort arrived ("Request ... not found")
    long = 2000

    def params(n):
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False,
                              output_kind=RequestOutputKind.DELTA)

    async def main():
        rep = EngineReplica(0, str(tiny_model_dir), kv_cache_bytes=8 << 20, max_num_seqs=8, max_model_len=2048,
                            dtype="float32")  # 2 KB of fp32 KV a token: 4,096 tokens of cache
        await rep.start()
        engine, outs = rep._engine, []
        try:
            async def consume():
                async for o in engine.generate(prompt, params(long), "laminar-abort-me"):
                    outs.append(o)

            task = asyncio.create_task(consume())
            deadline = time.monotonic() + 60
            while sum(len(o.outputs[0].token_ids) for o in outs) < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            streamed = sum(len(o.outputs[0].token_ids) for o in outs)
            assert 4 <= streamed < long, f"the request streamed {streamed} tokens in 60 s before the abort"
            res = await _server(engine).abort_request("laminar-abort-me", reset_prefix_cache=False)
            await asyncio.wait_for(task, 30)
            missing = await _server(engine).abort_request("laminar-never-was", reset_prefix_cache=False)
            # the next request's steps: the engine core's scheduler reports what it runs on every step
            running = []
            async for _ in engine.generate(prompt, params(8), "laminar-after"):
                running.append(rep._stats["running"])
            return res, missing, outs, running
        finally:
            rep.shutdown()

    res, missing, outs, running = asyncio.run(main())
    assert res == {"aborted": True, "request_id": "laminar-abort-me"}, res
    assert missing["aborted"] is False, missing
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort", outs[-1]
    assert sum(len(o.outputs[0].token_ids) for o in outs) < 2000
    assert running and max(running) == 1, running  # the aborted request no longer decodes beside it
