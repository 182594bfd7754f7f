"""Logic of the two weight-sync patches, with fakes for the sockets and the vLLM worker (the real engines are in
test_vllm_weight_update_on_cpu.py and e2e/test_fail_fast_on_cpu.py)."""

from __future__ import annotations

import pytest
import torch

from verl_laminar.patches import vllm_reload, weight_sync_guard
from verl_laminar.patches.vllm_reload import WeightLoadError, load_buckets_layerwise
from verl_laminar.patches.weight_sync_guard import ReceiverGoneError, WatchedSocket, ack_timeout_s, root_cause


class FakeSocket:
    def __init__(self, ready_after: int) -> None:
        self.polls, self.ready_after, self.closed = 0, ready_after, False

    def poll(self, ms: int) -> bool:
        self.polls += 1
        return self.polls > self.ready_after

    def recv(self) -> bytes:
        return b"ack"

    def send_pyobj(self, obj) -> None:
        self.sent = obj

    def close(self) -> None:
        self.closed = True


def test_watched_socket_returns_the_ack_and_delegates_the_rest():
    sock = FakeSocket(ready_after=3)
    watched = WatchedSocket(sock, check_receiver=lambda: None, timeout_s=60)
    assert watched.recv() == b"ack" and watched.acks == 1 and sock.polls == 4
    watched.close()
    assert sock.closed


def test_watched_socket_raises_the_receivers_error_while_waiting():
    class Boom(RuntimeError):
        pass

    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise Boom("receiver failed")

    with pytest.raises(Boom, match="receiver failed"):
        WatchedSocket(FakeSocket(ready_after=10**9), check, timeout_s=60).recv()
    assert len(calls) == 2


def test_watched_socket_gives_up_on_a_stuck_receiver():
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    with pytest.raises(ReceiverGoneError, match="alive but stuck"):
        WatchedSocket(FakeSocket(ready_after=10**9), None, timeout_s=5, clock=clock).recv()


def test_a_receiver_that_returned_after_the_last_bucket_is_its_ack():
    """verl's receiver acks the last bucket from its clean-up just before its rpc returns: the rpc's success may be
    seen first (an emulated cluster's run failed on it), so after the last bucket it counts as the ack."""
    done = lambda: True  # noqa: E731 - the receiving rpc ended without error
    late = WatchedSocket(FakeSocket(ready_after=1), done, timeout_s=60)  # its ack readable at the grace poll
    late.send_pyobj({"bucket_meta": {}, "is_last": True})
    assert late.recv() == b"ack" and late.acks == 1
    lost = WatchedSocket(FakeSocket(ready_after=10**9), done, timeout_s=60)  # never readable
    lost.send_pyobj({"bucket_meta": {}, "is_last": True})
    assert lost.recv() == b"" and lost.acks == 1
    early = WatchedSocket(FakeSocket(ready_after=10**9), done, timeout_s=60)
    early.send_pyobj({"bucket_meta": {}, "is_last": False})
    with pytest.raises(ReceiverGoneError, match="bucket 1, which was not the last"):
        early.recv()


def test_ack_timeout_reads_the_env_and_rejects_bad_values(monkeypatch):
    monkeypatch.delenv("LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S", raising=False)
    assert ack_timeout_s() == weight_sync_guard.DEFAULT_ACK_TIMEOUT_S
    monkeypatch.setenv("LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S", "7.5")
    assert ack_timeout_s() == 7.5
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv("LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match="LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S"):
            ack_timeout_s()


def test_root_cause_unwraps_ray_errors_and_cause_chains():
    first = KeyError("layers.0.q_proj.weight")
    try:
        try:
            raise first
        except KeyError as e:
            raise WeightLoadError("load failed") from e
    except WeightLoadError as e:
        wrapped = e

    class RayTaskErrorLike(RuntimeError):
        def __init__(self, cause):
            super().__init__("ray task failed")
            self.cause = cause

    assert root_cause(RayTaskErrorLike(wrapped)) is first
    plain = ValueError("x")
    assert root_cause(plain) is plain


class FakeReloadApi:
    def __init__(self) -> None:
        self.events: list[str] = []

    def initialize_layerwise_reload(self, model) -> None:
        self.events.append(f"init:{model}")

    def finalize_layerwise_reload(self, model, config) -> None:
        self.events.append(f"finalize:{model}")


class FakeWorker:
    rank = 3

    def __init__(self, fail_on: str | None = None) -> None:
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.fail_on = fail_on

    def _iter_all_models_with_config(self):
        yield "main", "cfg"

    def _update_weights(self, weights, peft_config, base_sync_done) -> None:
        for name, tensor in weights:
            if name == self.fail_on:
                raise KeyError(name)
            self.loaded.append((name, tensor))


def reused_buffer_receiver(buckets: list[list[tuple[str, torch.Tensor]]]):
    """Like verl's shm receiver: every bucket is a view of the same buffer, overwritten by the next one."""
    buffer = torch.zeros(8)

    def receive(callback) -> None:
        for i, bucket in enumerate(buckets):
            views, offset = [], 0
            for name, tensor in bucket:
                n = tensor.numel()
                buffer[offset:offset + n] = tensor
                views.append((name, buffer[offset:offset + n]))
                offset += n
            callback(views, i == len(buckets) - 1)
        # a failing callback leaves views alive; the real receiver's cleanup then fails like this:
    return receive


@pytest.fixture(autouse=True)
def _no_moe_patch(monkeypatch):
    import verl.utils.vllm.patch as vpatch

    monkeypatch.setattr(vpatch, "patch_vllm_moe_model_weight_loader", lambda model: None)
    monkeypatch.delenv("LAMINAR_FAULT_WEIGHT_LOAD", raising=False)


def test_buckets_load_inside_one_layerwise_reload_with_owned_tensors():
    api, worker = FakeReloadApi(), FakeWorker()
    buckets = [[("a", torch.full((4,), 1.0)), ("b", torch.full((4,), 2.0))], [("c", torch.full((4,), 3.0))]]
    load_buckets_layerwise(worker, reused_buffer_receiver(buckets), None, False, reload_api=api)
    assert api.events == ["init:main", "finalize:main"]
    # layerwise reload keeps a layer's tensors until the layer is complete: they must survive the next bucket
    assert [(n, t.tolist()) for n, t in worker.loaded] == [("a", [1.0] * 4), ("b", [2.0] * 4), ("c", [3.0] * 4)]


def test_a_failed_bucket_reports_the_first_error_not_the_cleanups():
    api, worker = FakeReloadApi(), FakeWorker(fail_on="c")

    def receive(callback) -> None:
        try:
            reused_buffer_receiver([[("a", torch.ones(2))], [("c", torch.ones(2))]])(callback)
        finally:
            raise BufferError("cannot close exported pointers exist")  # what verl's cleanup raises then

    with pytest.raises(WeightLoadError) as info:
        load_buckets_layerwise(worker, receive, None, False, reload_api=api)
    msg = str(info.value)
    assert "rank 3" in msg and "bucket 2" in msg and "KeyError" in msg and "'c'" in msg, msg
    assert "BufferError" not in msg
    assert isinstance(info.value.__cause__, KeyError)
    assert api.events == ["init:main"]  # a failed load is not finalized as if it were whole


def test_injected_fault_fires_on_the_chosen_load_only(monkeypatch):
    monkeypatch.setattr(vllm_reload, "_LOADS", [0])
    monkeypatch.setenv("LAMINAR_FAULT_WEIGHT_LOAD", "2")
    api = FakeReloadApi()
    load_buckets_layerwise(FakeWorker(), reused_buffer_receiver([[("a", torch.ones(2))]]), None, False, api)
    with pytest.raises(WeightLoadError, match="InjectedLoadFault"):
        load_buckets_layerwise(FakeWorker(), reused_buffer_receiver([[("a", torch.ones(2))]]), None, False, api)
    monkeypatch.setenv("LAMINAR_FAULT_WEIGHT_LOAD", "first")
    with pytest.raises(WeightLoadError, match="1-based index"):
        load_buckets_layerwise(FakeWorker(), reused_buffer_receiver([[("a", torch.ones(2))]]), None, False, api)


def test_plain_weights_leaves_quantized_lora_and_qat_to_verl(monkeypatch):
    import verl.utils.vllm.vllm_quant_utils as quant

    monkeypatch.setattr(quant, "is_quantized_model", lambda cfg: cfg == "fp8")

    class W:
        def __init__(self, cfg="bf16", qat=False):
            self.model_runner = type("R", (), {"vllm_config": cfg})()
            self._is_qat_model, self._is_modelopt_qat = qat, False

    assert vllm_reload.plain_weights(W(), None, False)
    assert vllm_reload.plain_weights(W(), {"r": 8}, False)  # LoRA's first sync loads the base weights
    assert not vllm_reload.plain_weights(W(), {"r": 8}, True)  # an adapter: add_lora
    assert not vllm_reload.plain_weights(W("fp8"), None, False)
    assert not vllm_reload.plain_weights(W(qat=True), None, False)
