"""The patch ``relay_in_place_refresh`` (``patches/relay_refresh.py``): how verl's vLLM server adapter refreshes a
replica from the relay when the engine's wire format is ``wire.RELAY_WIRE``.

Unit tests of the adapter's logic against a stand-in adapter class (verl's real one needs a running server); the
wrapped class is verl's own shape (``_ensure_server_handle``, ``_execute_method``, ``server_handle``), which
``tests/foundation/test_verl_contract_on_cpu.py`` pins. The workers' side runs in a real engine in
``tests/relay/test_vllm_load_on_cpu.py`` and in every Laminar e2e run (``test_laminar_e2e_on_cpu.py``).
"""

from __future__ import annotations

import asyncio
import types

import pytest

from verl_laminar.patches import relay_refresh
from verl_laminar.patches.relay_refresh import InPlaceLoadError, check_loaded, in_place_blocker
from verl_laminar.relay import wire
from verl_laminar.relay.wire import NAMED_TENSORS, RELAY_WIRE, RelayVersion


class _Remote:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def remote(self, *args, **kwargs):
        self.calls.append((self.name, args, kwargs))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class _Adapter:
    """verl's ServerAdapter as the patch uses it; ``update_weights`` records the bucket path."""

    def __init__(self, has_server=True, results=None, config=None, model_config=None):
        self._has_server, self.replica_rank, self.calls = has_server, 3, []
        self.results = results
        self.config = config or types.SimpleNamespace(quantization=None, mtp=types.SimpleNamespace(enable=False))
        self.model_config = model_config or types.SimpleNamespace(lora_rank=0, mtp=types.SimpleNamespace(enable=False),
                                                                  hf_config=types.SimpleNamespace())
        self.server_handle = types.SimpleNamespace(clear_kv_cache=_Remote(self.calls, "clear_kv_cache"),
                                                   set_global_steps=_Remote(self.calls, "set_global_steps"))

    def _ensure_server_handle(self):
        return self._has_server

    async def _execute_method(self, method, non_block=False, timeout=None, args=(), kwargs=None):
        self.calls.append(("rpc", method, kwargs, timeout))
        return self.results

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        self.calls.append(("buckets", wire_format, list(weights)))


@pytest.fixture
def adapter_cls(monkeypatch):
    """A fresh stand-in class wrapped by the patch; the process-wide in-place flag is restored afterwards. The
    workers' time limit is the guard's silence bound plus the version's read time (no store here: 42 s)."""
    monkeypatch.setattr(wire, "_IN_PLACE", [False])
    monkeypatch.setattr(relay_refresh, "load_timeout_s", lambda root, version: 42.0)
    cls = type("ServerAdapter", (_Adapter,), {})
    relay_refresh._wrap_adapter(types.SimpleNamespace(ServerAdapter=cls))
    assert wire.in_place_enabled()
    return cls


class _Located:
    """What ``receive_weights`` hands the adapter: iterable tensors that also ``locate()``."""

    def __init__(self, where=("/store/r0", 5)):
        self.where, self.located = where, 0

    def __iter__(self):
        return iter([("w", 1)])

    def locate(self):
        self.located += 1
        return self.where


def _ok(version, *reads):
    return [{"version": version, "read_bytes": r, "total_bytes": 100} for r in reads]


def test_the_server_rank_has_every_worker_load_in_place_then_clears_the_cache_and_labels_the_step(adapter_cls):
    a, weights = adapter_cls(results=_ok(5, 52, 48)), _Located()
    assert asyncio.run(a.update_weights(weights, global_steps=5, wire_format=RELAY_WIRE)) is None
    assert weights.located == 1
    assert a.calls == [("rpc", "laminar_refresh", {"root": "/store/r0", "version": 5}, 42.0),
                       ("clear_kv_cache", (), {}), ("set_global_steps", (5,), {})]


def test_the_other_ranks_of_a_replica_send_nothing(adapter_cls):
    a, weights = adapter_cls(has_server=False), _Located()
    asyncio.run(a.update_weights(weights, global_steps=5, wire_format=RELAY_WIRE))
    assert a.calls == [] and weights.located == 0


def test_verls_own_wire_formats_take_verls_path(adapter_cls):
    a = adapter_cls(results=_ok(5, 1))
    asyncio.run(a.update_weights(_Located(), global_steps=5, wire_format=NAMED_TENSORS))
    assert a.calls == [("buckets", NAMED_TENSORS, [("w", 1)])]


@pytest.mark.parametrize("results", [_ok(4, 10, 10), _ok(5, 10) + _ok(4, 10), []])
def test_a_worker_serving_another_version_fails_the_refresh_before_the_step_is_labelled(adapter_cls, results):
    a = adapter_cls(results=results)
    with pytest.raises(InPlaceLoadError, match="replica 3: asked to load weight version 5 in place"):
        asyncio.run(a.update_weights(_Located(), global_steps=5, wire_format=RELAY_WIRE))
    assert [c[0] for c in a.calls] == ["rpc"]


def test_a_rollout_that_cannot_load_in_place_keeps_verls_buckets_on_every_rank(adapter_cls):
    quantized = types.SimpleNamespace(quantization="fp8", mtp=types.SimpleNamespace(enable=False))
    for has_server in (True, False):
        a = adapter_cls(has_server=has_server, config=quantized)
        asyncio.run(a.update_weights(_Located(), global_steps=5, wire_format=RELAY_WIRE))
        assert a.calls == [("buckets", NAMED_TENSORS, [("w", 1)])]


def test_in_place_blockers_name_their_reason():
    plain_cfg = types.SimpleNamespace(quantization=None, mtp=types.SimpleNamespace(enable=False))
    plain_model = types.SimpleNamespace(lora_rank=0, mtp=types.SimpleNamespace(enable=False),
                                        hf_config=types.SimpleNamespace())
    assert in_place_blocker(plain_cfg, plain_model) is None
    assert "fp8" in in_place_blocker(types.SimpleNamespace(quantization="fp8"), plain_model)
    assert "MTP" in in_place_blocker(types.SimpleNamespace(quantization=None, mtp=types.SimpleNamespace(enable=True)),
                                     plain_model)
    assert "LoRA" in in_place_blocker(plain_cfg, types.SimpleNamespace(lora_rank=8))
    assert "quantized checkpoint" in in_place_blocker(
        plain_cfg, types.SimpleNamespace(lora_rank=0, hf_config=types.SimpleNamespace(quantization_config={})))


def test_check_loaded_gives_each_ranks_bytes_in_rank_order():
    assert check_loaded(_ok(2, 7, 9), 2, 0) == [7, 9]
    with pytest.raises(InPlaceLoadError):
        check_loaded(_ok(2, 7) + [{"version": None}], 2, 0)


def test_the_engine_announces_the_relay_wire_only_where_the_adapter_understands_it(monkeypatch):
    from verl_laminar.relay.verl_backend import RelayCheckpointEngine

    monkeypatch.setattr(wire, "_IN_PLACE", [False])
    engine = RelayCheckpointEngine()
    assert engine.wire_format == NAMED_TENSORS
    wire.enable_in_place()
    assert engine.wire_format == RELAY_WIRE


def test_a_relay_version_reads_nothing_until_it_is_iterated_or_located():
    class Engine:
        def __init__(self):
            self.opened = []

        def tensors(self, version):
            self.opened.append(("tensors", version))
            yield from [("a", 1), ("b", 2)]

        def locate(self, version):
            self.opened.append(("locate", version))
            return "/root", version

    engine = Engine()
    v = RelayVersion(engine, 4)
    assert engine.opened == []
    assert next(v) == ("a", 1) and list(v) == [("b", 2)]
    assert RelayVersion(engine, 4).locate() == ("/root", 4)
    assert engine.opened == [("tensors", 4), ("locate", 4)]


def test_a_worker_loads_the_version_through_the_stores_lock_and_an_evicted_one_is_gone(tmp_path):
    """``laminar_refresh`` opens the version with ``StoreReader`` (shared lock, identity check), never by bare
    path: a version the store no longer holds is a ``VersionGoneError``, not another version's pages."""
    import torch

    from verl_laminar.relay.publish import LocalHandle, Publisher
    from verl_laminar.relay.relay import Relay
    from verl_laminar.relay.store import VersionGoneError
    from verl_laminar.relay.tensors import publish_tensors
    from verl_laminar.relay.vllm_ext import RelayWorkerExtension

    class Worker:
        loads = []

        def _laminar_load(self, manifest, view):
            self.loads.append((manifest.version, bytes(view[:8])))
            self._laminar_read_bytes = len(view)
            return manifest.version

    relay = Relay("local", root=str(tmp_path / "relay"))
    try:
        publish_tensors(Publisher(LocalHandle(relay)), 7, [("w", torch.arange(16, dtype=torch.float32))])
        assert relay.wait_version(7, 30)
        got = RelayWorkerExtension.laminar_refresh(Worker(), relay.store.root, 7)
        total = relay.reader().manifest(7).total_bytes
        assert got == {"version": 7, "read_bytes": total, "total_bytes": total}
        assert Worker.loads == [(7, torch.arange(2, dtype=torch.float32).numpy().tobytes())]
        with pytest.raises(VersionGoneError):
            RelayWorkerExtension.laminar_refresh(Worker(), relay.store.root, 8)
    finally:
        relay.close(destroy=True)


def test_replicas_wider_than_a_machine_or_with_data_parallel_shards_keep_the_buckets():
    def cfg(**kw):
        return types.SimpleNamespace(quantization=None, mtp=types.SimpleNamespace(enable=False), **kw)

    model = types.SimpleNamespace(lora_rank=0, mtp=types.SimpleNamespace(enable=False), hf_config=None)
    assert in_place_blocker(cfg(tensor_model_parallel_size=8), model, local_world=8) is None
    assert "spans machines" in in_place_blocker(cfg(tensor_model_parallel_size=16), model, local_world=8)
    assert "data_parallel_size=2" in in_place_blocker(cfg(data_parallel_size=2), model, local_world=8)


def test_the_server_returns_what_its_workers_answered():
    class Engine:
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            return [(method, kwargs)] * 2

    class Server:  # verl's vLLMHttpServer.collective_rpc awaits the engine's and returns nothing
        engine = Engine()

        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)

    assert asyncio.run(Server().collective_rpc("m")) is None
    relay_refresh._return_rpc_results(types.SimpleNamespace(vLLMHttpServer=Server))
    assert asyncio.run(Server().collective_rpc("m", kwargs={"a": 1})) == [("m", {"a": 1})] * 2


def test_a_workers_failure_names_its_type_rank_and_version(monkeypatch):
    """vLLM's collective_rpc passes on only a worker error's message, so the message carries the type (the
    fail-fast e2e looks for ``InjectedLoadFault`` in the run's WeightSyncError)."""
    from verl_laminar.patches import vllm_reload

    monkeypatch.setenv("LAMINAR_FAULT_WEIGHT_LOAD", str(vllm_reload._LOADS[0] + 1))
    with pytest.raises(vllm_reload.WeightLoadError) as err:
        relay_refresh.worker_refresh(types.SimpleNamespace(rank=1), "/store", 4)
    msg = str(err.value)
    assert msg.startswith("vLLM worker rank 1: loading weight version 4 in place from /store failed: "
                          "InjectedLoadFault: injected failure of weight load"), msg
    assert " at vllm_reload.py:" in msg


def test_a_server_without_the_patchs_answers_is_named_not_taken_for_failed_workers(adapter_cls):
    a = adapter_cls(results=None)
    with pytest.raises(InPlaceLoadError, match="the server returned no answers"):
        asyncio.run(a.update_weights(_Located(), global_steps=5, wire_format=RELAY_WIRE))


def test_lora_in_verls_dict_form_and_disaggregation_keep_the_buckets():
    cfg = types.SimpleNamespace(quantization=None, mtp=types.SimpleNamespace(enable=False))
    assert "LoRA (rank 16)" == in_place_blocker(cfg, types.SimpleNamespace(lora_rank=0, lora={"rank": 16}))
    pd = types.SimpleNamespace(quantization=None, disaggregation=types.SimpleNamespace(enabled=True))
    assert "disaggregation" in in_place_blocker(pd, types.SimpleNamespace(lora_rank=0))


def test_the_workers_time_limit_grows_with_the_version(tmp_path, monkeypatch):
    import torch

    from verl_laminar.relay.publish import LocalHandle, Publisher
    from verl_laminar.relay.relay import Relay
    from verl_laminar.relay.tensors import publish_tensors

    monkeypatch.setenv("LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S", "30")
    relay = Relay("local", root=str(tmp_path / "relay"))
    try:
        publish_tensors(Publisher(LocalHandle(relay)), 1, [("w", torch.zeros(1 << 20))])
        assert relay.wait_version(1, 30)
        total = relay.reader().manifest(1).total_bytes
        assert relay_refresh.load_timeout_s(relay.store.root, 1) == pytest.approx(30 + total / (256 << 20))
    finally:
        relay.close(destroy=True)
