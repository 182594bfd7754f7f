"""Publishing side of the relay: versions stored in the rollout's dtype, the first publish made warm by
``prepare``, and the page-locking logic of the publish buffer (driven by a fake CUDA runtime here; only a
GPU shows that ``cudaHostRegister`` accepts the tmpfs mapping and that the copies overlap)."""

import asyncio
import types

import pytest
import torch

from laminar_testing import recording_handle
from verl_laminar.relay import publish as publish_mod
from verl_laminar.relay import tensors as tensors_mod
from verl_laminar.relay.publish import LocalHandle, Publisher, WarmBuffer, pin_mapping
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.tensors import (
    VersionWriter,
    copy_is_async,
    publish_tensors,
    read_tensors,
    resolve_dtype,
    stored_dtype,
)
from verl_laminar.relay.verl_backend import RelayCheckpointEngine


@pytest.fixture
def relay(tmp_path):
    r = Relay("solo", root=str(tmp_path / "solo"))
    yield r
    r.close(destroy=True)


def _fp32_weights():
    torch.manual_seed(0)
    return [("layer.weight", torch.randn(64, 32)), ("layer.bias", torch.randn(64)),
            ("pos_ids", torch.arange(16, dtype=torch.int64)), ("mask", torch.tensor([True, False, True])),
            ("half.weight", torch.randn(8).to(torch.float16))]


def _engine(relay, handle, **kw):
    """A master engine wired to an in-process relay (no Ray): its publisher and its rollout-side reader."""
    eng = RelayCheckpointEngine(is_master=True, **kw)
    pub = Publisher(handle)
    eng._get_publisher = lambda: pub
    eng._open = lambda version: relay.reader().open(version)
    return eng, pub


@pytest.mark.parametrize("spec,want", [(None, None), ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16),
                                       ("torch.float16", torch.float16), ("fp32", torch.float32),
                                       (torch.bfloat16, torch.bfloat16)])
def test_resolve_dtype(spec, want):
    assert resolve_dtype(spec) is want


@pytest.mark.parametrize("bad", ["int8", "bfloat17", torch.int32])
def test_resolve_dtype_rejects_non_float(bad):
    with pytest.raises(ValueError, match="floating-point"):
        resolve_dtype(bad)


def test_only_floats_take_the_version_dtype():
    assert stored_dtype(torch.float32, torch.bfloat16) is torch.bfloat16
    assert stored_dtype(torch.float16, torch.bfloat16) is torch.bfloat16
    assert stored_dtype(torch.int64, torch.bfloat16) is torch.int64
    assert stored_dtype(torch.bool, torch.bfloat16) is torch.bool
    assert stored_dtype(torch.float32, None) is torch.float32


def test_fp32_in_bf16_manifest_and_values(relay):
    named = _fp32_weights()
    pub = Publisher(LocalHandle(relay))
    for v in (1, 2):  # cold (host gather) and warm (straight into the mapping) paths
        publish_tensors(pub, v, named, dtype="bfloat16")
        assert relay.wait_version(v, 10)  # the relay verifies and commits in the background
        m, view = relay.reader().open(v)
        dtypes = {e.name: e.dtype for e in m.tensors}
        assert dtypes == {"layer.weight": "bfloat16", "layer.bias": "bfloat16", "pos_ids": "int64",
                          "mask": "bool", "half.weight": "bfloat16"}
        got = dict(read_tensors(m, view))
        for name, t in named:
            want = t.to(torch.bfloat16) if t.is_floating_point() else t
            assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    pub.close()


def test_engine_dtype_halves_the_version_and_receive_yields_bf16(relay):
    named = _fp32_weights()
    plain, pub_a = _engine(relay, LocalHandle(relay))
    asyncio.run(plain.send_weights(iter(named), global_steps=1))
    cast, pub_b = _engine(relay, LocalHandle(relay), dtype="bfloat16")
    cast._last_version = 1
    asyncio.run(cast.send_weights(iter(named), global_steps=2))
    assert relay.wait_version(1, 10) and relay.wait_version(2, 10)
    assert relay.reader().manifest(2).total_bytes < 0.6 * relay.reader().manifest(1).total_bytes
    got = dict(cast.receive_weights(2))
    assert cast.served_version == 2
    for name, t in named:
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    pub_a.close()
    pub_b.close()


def test_expected_bytes_makes_the_first_publish_warm(relay):
    handle = recording_handle(relay)
    named = _fp32_weights()
    eng, pub = _engine(relay, handle, dtype="bfloat16", expected_bytes=64 * 32 * 2 + 64 * 2 + 16 * 8 + 3 + 8 * 2)
    eng.prepare()  # what verl's CheckpointEngineManager calls on every worker before the sync
    assert handle.calls == ["prepare_publish"]
    asyncio.run(eng.send_weights(iter(named), global_steps=1))
    assert "publish_prepared" in handle.calls and "begin_publish" not in handle.calls
    assert relay.wait_version(1, 10)
    assert eng._last_nbytes == relay.reader().manifest(1).total_bytes
    assert pub.warm_buffer() is not None  # waits for the background re-preparation after publish 1
    handle.calls.clear()
    eng.prepare()  # that buffer has the last publish's size: nothing is mapped again
    assert handle.calls == []
    asyncio.run(eng.send_weights(iter(named), global_steps=2))
    assert "begin_publish" not in handle.calls and relay.wait_version(2, 10)
    got = dict(eng.receive_weights(2))
    assert torch.equal(got["layer.weight"], named[0][1].to(torch.bfloat16))
    pub.close()


def test_too_small_expected_bytes_still_publishes_correctly(relay):
    named = _fp32_weights()
    eng, pub = _engine(relay, LocalHandle(relay), expected_bytes=1)
    eng.prepare()
    asyncio.run(eng.send_weights(iter(named), global_steps=1))
    assert relay.wait_version(1, 10)
    got = dict(eng.receive_weights(1))
    for name, t in named:
        assert torch.equal(got[name], t)
    pub.close()


def test_warm_is_for_the_master_only():
    with pytest.raises(ValueError, match="is_master=True"):
        RelayCheckpointEngine(is_master=False).warm(1 << 20)
    assert RelayCheckpointEngine(is_master=False).prepare() == {}  # rollout workers: no relay call at all


# ---- page-locking, with a fake CUDA runtime ----
class FakeCudart:
    def __init__(self, register_error=0):
        self.calls = []
        self.register_error = register_error
        self.live = {}  # address -> mapping, to check it is still open when unregistered

    def cudaHostRegister(self, addr, size, flags):
        self.calls.append(("register", addr, size, flags))
        return self.register_error

    def cudaHostUnregister(self, addr):
        self.calls.append(("unregister", addr, self.live[addr].closed if addr in self.live else None))
        return 0


def test_no_pinning_without_cuda(relay):
    assert not torch.cuda.is_available()  # this machine: the real runtime is not reached at all
    pub = Publisher(LocalHandle(relay))
    pub.prepare(4096)
    assert pub.warm_buffer() is not None and not pub.warm_is_pinned()
    pub.close()


def test_pinning_requested_with_cuda_and_undone_before_unmap(relay):
    rt = FakeCudart()
    pub = Publisher(LocalHandle(relay), cudart=lambda: rt)
    pub.prepare(1 << 16)
    (kind, addr, size, flags), = rt.calls
    assert kind == "register" and size == 1 << 16 and flags == publish_mod.CUDA_HOST_REGISTER_PORTABLE
    assert pub.warm_is_pinned()
    rt.live[addr] = pub.warm_buffer()
    publish_tensors(pub, 1, _fp32_weights())  # published from the pinned buffer, then re-prepared
    pub.close()
    unregisters = [c for c in rt.calls if c[0] == "unregister"]
    registers = [c for c in rt.calls if c[0] == "register"]
    assert len(unregisters) == len(registers) == 2
    assert unregisters[0] == ("unregister", addr, False)  # the mapping was still open when unpinned
    assert rt.live[addr].closed


def test_release_unpins_then_closes(relay):
    rt = FakeCudart()
    pub = Publisher(LocalHandle(relay), cudart=lambda: rt)
    pub.prepare(4096)
    buf = pub._warm
    pub._warm = None
    rt.live[buf.pinned_at] = buf.mapping
    buf.release(lambda: rt)
    assert rt.calls[-1] == ("unregister", rt.calls[0][1], False) and buf.mapping.closed
    assert isinstance(buf, WarmBuffer) and buf.pinned_at is None
    pub.close()


def test_failed_registration_only_costs_speed(relay, caplog):
    rt = FakeCudart(register_error=1)
    pub = Publisher(LocalHandle(relay), cudart=lambda: rt)
    pub.prepare(4096)
    assert not pub.warm_is_pinned() and "cudaHostRegister" in caplog.text
    pub.close()
    assert [c[0] for c in rt.calls] == ["register"]  # nothing to unregister


def test_pin_mapping_skips_empty_and_missing_runtime():
    import mmap

    m = mmap.mmap(-1, 4096)
    assert pin_mapping(m, 4096, cudart=lambda: None) is None
    assert pin_mapping(m, 0, cudart=lambda: FakeCudart()) is None
    m.close()


def test_async_copies_only_from_a_device_into_pinned_memory():
    cuda_like = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert copy_is_async(cuda_like, target_pinned=True)
    assert not copy_is_async(cuda_like, target_pinned=False)
    assert not copy_is_async(torch.zeros(2), target_pinned=True)


def test_writer_synchronizes_once_and_only_for_async_copies(relay, monkeypatch):
    synced = []
    monkeypatch.setattr(tensors_mod, "_synchronize", lambda devices: synced.append(set(devices)))
    rt = FakeCudart()
    pub = Publisher(LocalHandle(relay), cudart=lambda: rt)
    pub.prepare(1 << 16)
    w = VersionWriter(pub, "bfloat16")
    for name, t in _fp32_weights():
        w.add(name, t)
    assert w._pending == set()  # host tensors: copies were synchronous even into the pinned buffer
    w._pending.add(torch.device("cuda", 0))  # what a GPU tensor's copy would have left in flight
    w.publish(1)
    assert synced == [{torch.device("cuda", 0)}]
    pub.close()
