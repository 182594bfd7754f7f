"""Contract: repack aborts a vLLM request by the id Laminar gave it, through verl's ``vLLMHttpServer.abort_request``.

vLLM 0.31 appends a random suffix to every request id unless ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION`` is set, and
verl 0.9.1's ``abort_request`` looks the given id up among the suffixed ones. ``+laminar=enabled`` sets the variable
for the job (``enabled.yaml``; ``tests/config`` checks the composed config). These pin both sides, so a vLLM or verl
bump that changes either fails here in seconds instead of silently turning every repack into a no-op.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest


def _assigned(monkeypatch, env_value):
    import vllm.envs as envs
    from vllm.v1.engine.input_processor import InputProcessor

    if env_value is None:
        monkeypatch.delenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", raising=False)
    else:
        monkeypatch.setenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", env_value)
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()  # vLLM may cache env reads; these must see the variable as set here
    req = SimpleNamespace(request_id="laminar-g7-2", external_req_id=None)
    InputProcessor.assign_request_id(req)
    return req


def test_vllm_keeps_the_given_id_only_with_the_variable_set(monkeypatch):
    suffixed = _assigned(monkeypatch, None)
    assert suffixed.request_id != "laminar-g7-2" and suffixed.request_id.startswith("laminar-g7-2-")
    kept = _assigned(monkeypatch, "1")
    assert kept.request_id == "laminar-g7-2" and kept.external_req_id == "laminar-g7-2"


def test_verls_abort_looks_the_id_up_among_vllms_internal_ids():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    src = inspect.getsource(vLLMHttpServer.abort_request)
    # the lookup that misses a suffixed id: when verl aborts by external id instead, the variable is unneeded
    assert "request_states.get(request_id)" in src, src


@pytest.mark.parametrize("found,expected", [(True, True), (False, False)])
def test_verls_abort_answers_by_that_lookup(found, expected):
    """verl's method against a stand-in engine whose internal ids are the given ones (the variable set) or not."""
    import asyncio

    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    queue = []
    state = SimpleNamespace(make_request_output=lambda *a, **k: "abort-output", queue=SimpleNamespace(put=queue.append))
    aborted = []

    async def abort_core(ids):
        aborted.extend(ids)

    ids = {"laminar-g7-2": state} if found else {"laminar-g7-2-1a2b3c4d": state}
    engine = SimpleNamespace(output_processor=SimpleNamespace(request_states=ids, abort_requests=lambda ids: None),
                             engine_core=SimpleNamespace(abort_requests_async=abort_core))
    server = SimpleNamespace(node_rank=0, engine=engine)
    res = asyncio.run(vLLMHttpServer.abort_request(server, "laminar-g7-2", reset_prefix_cache=False))
    assert bool(res.get("aborted")) is expected, res
    assert aborted == (["laminar-g7-2"] if expected else [])
