"""Rollout side of the relay with verl's CUDA weight sender, run without a GPU.

verl's ``BucketedWeightSender`` (IPC branch, taken where the platform supports CUDA IPC) copies each
tensor into a device bucket, except a tensor larger than the bucket, which it passes by
``reduce_tensor(tensor)`` as a CUDA IPC handle; the receiver rebuilds it with ``rebuild_ipc``, which
overwrites the device argument of a CUDA handle (``list_args[6]``). Here verl's real sender loop runs
with a recording socket and a host bucket (the one allocation that needs CUDA), on tensors mapped from a
relay version, to show what the relay used to hand it and what it hands it now. Only a GPU run can show
that the moved tensor's handle is a ``rebuild_cuda_tensor`` one and that the vLLM worker loads it.
"""

import asyncio
import pickle

import pytest
import torch
from torch.multiprocessing.reductions import rebuild_tensor
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender, rebuild_ipc

from verl_laminar.relay import verl_backend
from verl_laminar.relay.publish import LocalHandle, Publisher
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.tensors import publish_tensors, read_tensors
from verl_laminar.relay.verl_backend import (
    BucketTooSmallError,
    RelayCheckpointEngine,
    check_bucket_fits,
    transport_device,
)

BUCKET = 4096  # bytes; stands for update_weights_bucket_megabytes << 20 (the same value reaches both sides)


class RecordingSocket:
    """The sender's ZMQ REQ socket: keeps every message, acknowledges at once."""

    def __init__(self):
        self.sent = []

    def send_pyobj(self, obj):
        self.sent.append(obj)

    def recv(self):
        return b""

    def close(self):
        pass


def _sender(use_shm=False):
    sender = BucketedWeightSender(zmq_handle="inproc://laminar-test", bucket_size_mb=1, use_shm=use_shm)
    sender.bucket_size = BUCKET
    sock = RecordingSocket()

    def init_socket():
        sender.socket = sock

    def init_host_bucket():  # verl allocates this on the GPU; everything after it is verl's code
        sender.buffer, sender.shm = torch.empty(BUCKET, dtype=torch.uint8), None

    sender._init_socket = init_socket
    if not use_shm:
        sender._init_buffer = init_host_bucket
    return sender, sock


def _direct_sends(sock):
    """(name, handle) of every tensor verl sent by handle instead of through the bucket."""
    return [(n, meta["handle"]) for msg in sock.sent for n, meta in msg["bucket_meta"].items()
            if meta["handle"] is not None]


@pytest.fixture
def version(tmp_path):
    """A published version: one tensor of exactly the bucket size, one just over it, two small ones."""
    relay = Relay("solo", root=str(tmp_path / "solo"))
    torch.manual_seed(0)
    named = [("norm.weight", torch.randn(16)), ("exact.weight", torch.randn(BUCKET // 4)),
             ("lm_head.weight", torch.randn(BUCKET // 4 + 1)), ("layer.bias", torch.randn(8))]
    pub = Publisher(LocalHandle(relay))
    publish_tensors(pub, 1, named)
    assert relay.wait_version(1, 10)
    yield relay, dict(named)
    pub.close()
    relay.close(destroy=True)


def _rollout_engine(relay, monkeypatch, ipc, device="cuda:0"):
    eng = RelayCheckpointEngine(bucket_size=BUCKET)
    eng._open = lambda v: relay.reader().open(v)
    monkeypatch.setattr(verl_backend, "_rollout_platform", lambda: (ipc, device))
    return eng


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_mmap_tensor_through_verls_cuda_branch_is_not_a_cuda_handle(version):
    """The failure: the relay's host tensor reaches verl's direct path as a CPU-storage pickle."""
    relay, _ = version
    m, view = relay.reader().open(1)
    sender, sock = _sender()
    asyncio.run(sender.async_send_weights(read_tensors(m, view)))
    (name, handle), = _direct_sends(sock)
    assert name == "lm_head.weight"  # only the tensor over the bucket; the one of exactly its size fits
    func, args = handle
    assert func is rebuild_tensor and len(args) == 3  # (cls, storage, metadata), not rebuild_cuda_tensor's 15
    storage = args[1]
    # the storage is the whole mapped version, so ZMQ's pickle ships all of it (145 GB for a 72B model)
    assert storage.nbytes() == m.total_bytes and len(pickle.dumps(handle)) > m.total_bytes
    with pytest.raises(IndexError):  # the receiver's rebuild, with the rollout GPU's index as on CUDA
        rebuild_ipc(handle, device_id=0)


def test_transport_device_matches_verls_direct_send_threshold(version):
    relay, named = version
    m, view = relay.reader().open(1)
    sender, sock = _sender()
    asyncio.run(sender.async_send_weights(read_tensors(m, view)))
    direct = {n for n, _ in _direct_sends(sock)}
    for name, t in named.items():
        assert (transport_device(t.nbytes, BUCKET, True, "cuda:0") is not None) == (name in direct), name


def test_oversized_tensor_is_handed_to_verl_on_the_device(version, monkeypatch):
    """The fix: with IPC the oversized tensor is copied to the rollout worker's device before verl sees it.

    Without a GPU the copy is replaced by one to the meta device: that shows which tensors move and that
    verl's ``reduce_tensor`` then takes a device branch, not the CPU-storage one.
    """
    relay, named = version
    moved = []

    def to_device(t, device):
        moved.append(device)
        return t.to("meta")

    monkeypatch.setattr(verl_backend, "_copy_to_device", to_device)
    eng = _rollout_engine(relay, monkeypatch, ipc=True)
    sender, sock = _sender()
    asyncio.run(sender.async_send_weights(eng.receive_weights(1)))
    assert moved == ["cuda:0"]
    (name, (func, args)), = _direct_sends(sock)
    assert name == "lm_head.weight" and func is not rebuild_tensor
    assert not any(isinstance(a, (torch.TypedStorage, torch.UntypedStorage)) for a in args)
    # the bucketed tensors still travel from the mapping, as verl copies them into its device bucket
    buckets = [msg["bucket_meta"] for msg in sock.sent]
    assert {n for b in buckets for n, meta in b.items() if meta["handle"] is None} == set(named) - {name}


def test_small_tensors_stay_zero_copy(version, monkeypatch):
    relay, _ = version
    monkeypatch.setattr(verl_backend, "_copy_to_device", lambda t, d: pytest.fail("nothing should move"))
    m, view = relay.reader().open(1)
    eng = _rollout_engine(relay, monkeypatch, ipc=True)
    eng._open = lambda v: (m, view)
    eng.bucket_size = 1 << 20
    mapped = torch.frombuffer(view, dtype=torch.uint8).data_ptr()
    for _, t in eng.receive_weights(1):
        assert mapped <= t.data_ptr() < mapped + m.total_bytes


def test_without_ipc_an_oversized_tensor_fails_before_any_bucket(version, monkeypatch):
    """verl's shared-memory branch asserts on the oversized tensor after sending earlier buckets; the relay
    refuses before the first, naming the setting to raise."""
    relay, _ = version
    m, view = relay.reader().open(1)
    sender, sock = _sender(use_shm=True)
    with pytest.raises(AssertionError, match="update_weights_bucket_megabytes"):
        asyncio.run(sender.async_send_weights(read_tensors(m, view)))
    assert sock.sent[1:]  # (sock.sent[0] is the shm name) a bucket went out before the assertion
    eng = _rollout_engine(relay, monkeypatch, ipc=False, device="cpu")
    with pytest.raises(BucketTooSmallError, match="update_weights_bucket_megabytes >= 1"):
        next(eng.receive_weights(1))


@pytest.mark.parametrize("nbytes,bucket,ipc,want", [
    (10, 8, True, "cuda:3"), (8, 8, True, None), (10, 8, False, None), (10, 0, True, None),
    (2_491_416_576, 2048 << 20, True, "cuda:3"),  # bf16 lm_head of Qwen2.5-72B, default 2048 MiB bucket
])
def test_transport_device_table(nbytes, bucket, ipc, want):
    assert transport_device(nbytes, bucket, ipc, "cuda:3") == want


def test_check_bucket_fits_only_without_ipc(version):
    relay, _ = version
    entries = relay.reader().manifest(1).tensors
    check_bucket_fits(entries, BUCKET, ipc_supported=True)
    check_bucket_fits(entries, 0, ipc_supported=False)  # no bucketed consumer
    check_bucket_fits(entries, 1 << 20, ipc_supported=False)
    with pytest.raises(BucketTooSmallError, match="lm_head.weight"):
        check_bucket_fits(entries, BUCKET, ipc_supported=False)
